"""Output files written whole or not at all (`cocaq export -o`), and standard output that cannot be
written, each as one line (OutputError), never a traceback.

A file is written to a temporary file in its own directory and renamed over the target once complete, so
a full disk, a missing directory or no permission leaves neither a partial file nor the temporary one;
the target keeps its mode where it exists (else the umask's, as `open` would). A target that is no
regular file (`/dev/stdout`, `/dev/full`, a named pipe) is written in place: it cannot be renamed over,
and replacing a device node would be far worse than an error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Callable

from cocaq.errors import OutputError


def _error(shown: str, exc: OSError) -> OutputError:
    return OutputError(f"cannot write {shown}: {exc.strerror or exc}")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str, write: Callable[[str], None]) -> None:
    """Have `write(tmp)` write the whole output to the path `tmp`, then rename it to `path`."""
    if not path or path.endswith(os.sep):  # (open() refuses these too; realpath would drop the slash)
        code = errno.EISDIR if path else errno.ENOENT
        raise _error(path or "''", OSError(code, os.strerror(code)))
    target = os.path.realpath(path)  # through a symlink, as open() would: the link stays a link
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _error(path, exc) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise _error(path, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
    if st is not None and not stat.S_ISREG(st.st_mode):
        try:
            write(target)
        except OSError as exc:
            raise _error(path, exc) from None
        return
    try:
        fd, tmp = tempfile.mkstemp(
            dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.", suffix=".tmp"
        )
    except OSError as exc:
        raise _error(path, exc) from None
    try:
        os.close(fd)
        write(tmp)
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _error(path, exc) from None
        raise


def write_text(path: str, text: str) -> None:
    """`text` as the whole of `path` (UTF-8, newlines as they are), by `write_atomic`."""

    def write(p: str) -> None:
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(text)

    write_atomic(path, write)


def stdout(text: str) -> None:
    """`text` to standard output, flushed; a failure (a full disk under `> file`) is one line. A closed
    pipe is not an error (cocaq.cli.app.main exits quietly); for any other, standard output is pointed at
    /dev/null first, so that the interpreter's own last flush does not print a second error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        raise OutputError(f"cannot write standard output: {exc.strerror or exc}") from None
