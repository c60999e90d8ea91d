"""The spool's files, as the hooks write them: atomic, bounded, symlink-proof, and cheap to import.

A Slurm prolog/epilog has a budget of tens of milliseconds for the whole process, so this module
imports only what the interpreter has loaded anyway (os, marshal, the C half of json): no `json`
package, no `typing`, no `dataclasses`. Events are JSON (read by the collector with the real json);
the prolog's state for its epilog is marshal, in a root-only directory written only by us.
"""

from __future__ import annotations

import marshal
import os
import stat
from _json import encode_basestring as _quote

TYPE_CHECKING = False
if TYPE_CHECKING:
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
