"""The per-job annotation file, root's side: the prolog makes it, the collector and the epilog read it.

`cocaq.annotate()` and `cocaq tag` (running as the job's user) write a job's model metadata into
`{annotate_dir}/{job_id}.json`. The prolog creates that file empty, owned by the job's user with mode
0600, in a directory root owns (0711: users reach their file by name but cannot list, create, rename or
unlink anything there). So a user can change only the contents of their own job's file, never swap it
for a symlink; the readers still refuse anything that is not a regular file of the job's user, read at
most 64 KiB, and treat the contents as hostile (cocaq.ml.meta validates them). Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat

from cocaq.ml.annotation import DEFAULT_DIR
from cocaq.ml.meta import MAX_FILE, validate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DEFAULT_DIR", "prepare", "read", "remove"]
DIR_MODE = 0o711


def path_of(directory: str, job_id: str) -> str:
    if not job_id.isdigit() or len(job_id) > 20:
        raise ValueError(f"bad job id {job_id!r}")
    return os.path.join(directory, f"{job_id}.json")


def _root_dir(directory: str) -> None:
    """Create the directory if missing; refuse one that is a symlink or not root's (ours)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, DIR_MODE)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{directory} is not a directory owned by uid {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(directory, DIR_MODE)


def prepare(directory: str, job_id: str, uid: int, gid: int) -> None:
    """Create the job's empty annotation file for its user (prolog). Raises OSError with the reason."""
    _root_dir(directory)
    path = path_of(directory, job_id)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by a job of the same id (requeue, a lost epilog): start clean
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def read(directory: str, job_id: str, uid: int | None) -> tuple[dict[str, Any] | None, float, list[str]]:
    """(validated values or None when there is no file or nothing in it, its mtime, problems)."""
    problems: list[str] = []
    try:
        path = path_of(directory, job_id)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, 0.0, problems
    except (OSError, ValueError) as exc:
        return None, 0.0, [f"annotation file refused: {exc}"]
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, 0.0, ["annotation file refused: not a regular file"]
        if uid is not None and st.st_uid != uid:
            return None, 0.0, [f"annotation file refused: owned by uid {st.st_uid}, the job's user is {uid}"]
        if st.st_size > MAX_FILE:
            emptied = _empty(path, st)
            return (
                None,
                0.0,
                [
                    f"annotation file refused: {st.st_size} bytes (at most {MAX_FILE})"
                    + ("; emptied" if emptied else "")
                ],
            )
        data = os.read(fd, MAX_FILE + 1)
    finally:
        os.close(fd)
    if not data.strip():
        return None, st.st_mtime, problems
    if len(data) > MAX_FILE:
        return None, 0.0, [f"annotation file refused: over {MAX_FILE} bytes"]
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return None, st.st_mtime, [f"annotation file is not valid JSON, ignored: {str(exc)[:120]}"]
    values = doc.get("values") if isinstance(doc, dict) and "values" in doc else doc
    try:
        got = validate(values, problems)
    except Exception as exc:  # root reads what a user wrote: a bug here must not spread
        return None, st.st_mtime, [f"annotation file refused: {type(exc).__name__}"]
    return (got or None), st.st_mtime, [f"annotation: {p}" for p in problems[:20]]


def _empty(path: str, st: os.stat_result) -> bool:
    """Truncate an oversized annotation file (it lives in RAM, under /run: a user once wrote 50 MB):
    only the very file that was checked (same inode, not a link), never through a symlink."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        now = os.fstat(fd)
        if (now.st_ino, now.st_dev, now.st_uid) != (st.st_ino, st.st_dev, st.st_uid) or now.st_nlink != 1:
            return False
        if not stat.S_ISREG(now.st_mode):
            return False
        os.ftruncate(fd, 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove(directory: str, job_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path_of(directory, job_id))
