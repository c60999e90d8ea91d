"""The node's spool: the files hooks and the collector write, until the shipper has them in the database.

Hooks write one JSON file per event (atomically: temp file, fsync, rename, fsync of the directory), so
a hook never takes a lock another process holds and a torn write is impossible; the collector reads
them back (bounded, never through a symlink a user could plant) and moves aside what cannot be shipped.
The prolog's state for its epilog (and for the collector: which GPUs the job owns) is marshal, in a
root-only directory written only by us. What the records hold is `cocaq.collector.records`; the
collector's own samples and energy are in `collector.db` (`cocaq.collector.localdb`).

A Slurm prolog/epilog has a budget of tens of milliseconds for the whole process, so this module
imports only what the interpreter has loaded anyway (os, marshal, the C half of json): no `json`
package, no `typing`, no `dataclasses`; the collector's reading side imports json when it runs.
"""

from __future__ import annotations

import marshal
import os
import stat
from _json import encode_basestring as _quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

EVENTS = "events"
JOBS = "jobs"
QUARANTINE = "quarantine"
MAX_EVENT_BYTES = 256 * 1024
MAX_STATE_BYTES = 256 * 1024


class SpoolError(Exception):
    """The spool cannot be used (unsafe ownership, a symlink, not writable); the message says why."""


def check_dir(path: str) -> None:
    """Refuse a spool directory that someone other than us could swap or write into."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise SpoolError(f"spool: {path} is a symlink; refusing to use it")
    if not stat.S_ISDIR(st.st_mode):
        raise SpoolError(f"spool: {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise SpoolError(f"spool: {path} is owned by uid {st.st_uid}, not {os.geteuid()}; refusing to use it")
    if st.st_mode & 0o022:
        raise SpoolError(f"spool: {path} is group- or world-writable (mode {st.st_mode & 0o777:o})")


def ensure_dir(path: str, mode: int = 0o700) -> str:
    """Create `path` (and parents) if missing, then check it is ours and private."""
    if not os.path.isdir(path):
        os.makedirs(path, mode=mode, exist_ok=True)
    check_dir(path)
    return path


def subdir(spool_dir: str, name: str) -> str:
    ensure_dir(spool_dir, 0o755)
    return ensure_dir(os.path.join(spool_dir, name))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(directory: str, name: str, data: bytes) -> str:
    """Write `directory/name` so that it either exists complete or not at all, even after a crash."""
    if "/" in name or name.startswith("."):
        raise SpoolError(f"spool: bad file name {name!r}")
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    final = os.path.join(directory, name)
    os.rename(tmp, final)
    _fsync_dir(directory)
    return final


def read_bounded(path: str, limit: int = MAX_EVENT_BYTES) -> bytes:
    """Read a regular file we own, without following a symlink and without reading more than `limit`."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpoolError(f"spool: {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise SpoolError(f"spool: {path} is owned by uid {st.st_uid}, not {os.geteuid()}")
        if st.st_size > limit:
            raise SpoolError(f"spool: {path} is {st.st_size} bytes, over the {limit}-byte limit")
        chunks = []
        left = limit + 1
        while left > 0:
            b = os.read(fd, min(left, 65536))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > limit:
            raise SpoolError(f"spool: {path} grew over the {limit}-byte limit while being read")
        return data
    finally:
        os.close(fd)


def _enc(v: Any, out: list[str]) -> None:
    if v is None or v is True or v is False:
        out.append("null" if v is None else ("true" if v else "false"))
    elif isinstance(v, str):
        out.append(_quote(v))
    elif isinstance(v, int):
        out.append(int.__repr__(v))
    elif isinstance(v, float):
        out.append(float.__repr__(v) if v - v == 0.0 else "null")  # NaN and infinities are not JSON
    elif isinstance(v, dict):
        out.append("{")
        first = True
        for k, x in v.items():
            if not first:
                out.append(",")
            first = False
            out.append(_quote(str(k)))
            out.append(":")
            _enc(x, out)
        out.append("}")
    elif isinstance(v, list | tuple):
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _enc(x, out)
        out.append("]")
    else:
        out.append(_quote(str(v)))


def dumps(record: dict[str, Any]) -> bytes:
    """JSON text of plain data (what json.dumps(ensure_ascii=False) gives), without importing json."""
    out: list[str] = []
    _enc(record, out)
    return "".join(out).encode("utf-8", "surrogatepass")


def event_name(ts_ns: int, job_id: str, event: str) -> str:
    return f"{ts_ns:020d}-{job_id}-{event}.json"


def write_event(spool_dir: str, record: dict[str, Any]) -> str:
    """Spool one hook record; `record` must carry `ts_ns`, `job_id` and `event`."""
    name = event_name(record["ts_ns"], record["job_id"], record["event"])
    return write_atomic(subdir(spool_dir, EVENTS), name, dumps(record))


def write_job_state(spool_dir: str, job_id: str, state: dict[str, Any]) -> str:
    """What the prolog saw at job start, for the epilog and the collector (which GPUs the job owns)."""
    if not job_id.isdigit():
        raise SpoolError(f"spool: bad job id {job_id!r}")
    return write_atomic(subdir(spool_dir, JOBS), f"{job_id}.state", marshal.dumps(state))


def read_job_state(spool_dir: str, job_id: str) -> dict[str, Any] | None:
    if not job_id.isdigit():
        raise SpoolError(f"spool: bad job id {job_id!r}")
    path = os.path.join(spool_dir, JOBS, f"{job_id}.state")
    try:
        check_dir(os.path.join(spool_dir, JOBS))
        data = read_bounded(path, MAX_STATE_BYTES)
    except FileNotFoundError:
        return None
    try:
        state = marshal.loads(data)
    except (EOFError, ValueError, TypeError) as exc:
        raise SpoolError(f"spool: {path}: unreadable job state ({exc})") from None
    if not isinstance(state, dict):
        raise SpoolError(f"spool: {path}: not a job state")
    return state


def remove_job_state(spool_dir: str, job_id: str) -> None:
    try:
        os.unlink(os.path.join(spool_dir, JOBS, f"{job_id}.state"))
    except FileNotFoundError:
        pass


def running_jobs(spool_dir: str) -> dict[str, dict[str, Any]]:
    """Job states the prologs left and no epilog removed yet: the jobs running on this node."""
    out: dict[str, dict[str, Any]] = {}
    try:
        entries = os.listdir(os.path.join(spool_dir, JOBS))
    except FileNotFoundError:
        return out
    for name in entries:
        if not name.endswith(".state") or not name[:-6].isdigit():
            continue
        try:
            st = read_job_state(spool_dir, name[:-6])
        except (OSError, SpoolError):
            continue
        if st is not None:
            out[name[:-6]] = st
    return out


# --- reading the spool back (the collector) -------------------------------------------------------------


class SpooledEvent:
    """One spooled event: its file (removed once shipped) and its record."""

    __slots__ = ("path", "record")

    def __init__(self, path: str, record: dict[str, Any]) -> None:
        self.path = path
        self.record = record


def quarantine(spool_dir: str, path: str, reason: str) -> str:
    """Move a file that cannot be shipped out of the way, with its reason beside it."""
    import time

    qdir = ensure_dir(os.path.join(spool_dir, QUARANTINE))
    base = os.path.basename(path)
    dest = os.path.join(qdir, f"{base}.{int(time.time())}")
    os.rename(path, dest)
    with open(dest + ".why", "w") as fh:
        fh.write(reason + "\n")
    return dest


def iter_events(spool_dir: str, limit: int, bad: list[tuple[str, str]]) -> Iterator[SpooledEvent]:
    """Spooled hook events, oldest first; unreadable ones are quarantined and listed in `bad`."""
    import json

    from cocaq.collector.records import validate_event

    events = os.path.join(spool_dir, EVENTS)
    try:
        names = sorted(n for n in os.listdir(events) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return
    n = 0
    for name in names:
        if n >= limit:
            return
        path = os.path.join(events, name)
        try:
            record = json.loads(read_bounded(path))
            why = validate_event(record)
        except FileNotFoundError:
            continue
        except (OSError, ValueError, SpoolError) as exc:
            why = f"unreadable: {exc}"
            record = None
        if why is not None:
            try:
                quarantine(spool_dir, path, why)
            except OSError as exc:
                why += f" (and could not be moved aside: {exc})"
            bad.append((name, why))
            continue
        n += 1
        yield SpooledEvent(path, record)


def count_events(spool_dir: str) -> int:
    try:
        return sum(1 for n in os.listdir(os.path.join(spool_dir, EVENTS)) if n.endswith(".json"))
    except FileNotFoundError:
        return 0
