"""Per-job CPU time, cores and memory from the cgroups Slurm's task/cgroup plugin creates.

Layouts (Slurm 22.05+):
- v2 (cgroup/v2): `{root}/system.slice/slurmstepd.scope/job_<id>/` with `cpu.stat` (usage_usec),
  `cpuset.cpus.effective`, `memory.current`.  Without systemd the scope sits elsewhere
  (`{root}/<anything>/slurmstepd.scope`): found by a bounded search (depth <= 3), then cached.
- v1 (cgroup/v1): `{root}/cpuacct/slurm/uid_<uid>/job_<id>/cpuacct.usage` (ns; or `cpu,cpuacct`),
  `{root}/cpuset/slurm/uid_<uid>/job_<id>/cpuset.cpus`, `{root}/memory/.../memory.usage_in_bytes`.

Runs as root: stdlib only, every directory below the controller mount is walked by file descriptor with
O_NOFOLLOW (a `job_<id>` symlink to a user's directory is never entered), reads are bounded, and a job
that ends mid-scan (its directory vanishes) is skipped silently.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cocaq.collector import sysfs
from cocaq.collector.sysfs import MAX_READ
from cocaq.collector.sysfs import OPEN_DIR as _OPEN_DIR
from cocaq.units import NS_PER_US

MAX_CPUS = 1 << 16  # a cpu list naming more CPUs than this is garbage
_JOB = re.compile(r"job_(\d{1,20})")
_UID = re.compile(r"uid_(\d{1,10})")
_SLURM_V1 = re.compile(r"slurm(?:_[A-Za-z0-9._-]{1,255})?")  # `slurm_<node>` with multiple slurmd
_SCOPE = re.compile(r"(?:[A-Za-z0-9._-]{1,255}_)?slurmstepd\.scope")


class CgroupUnavailable(Exception):
    """Neither a cgroup v2 nor a v1 cpuacct hierarchy is mounted at the root; the reason is one line."""


@dataclass(slots=True)
class JobCgroup:
    """One job's cgroup reading.  `inode` tells a re-created cgroup (requeue, id reuse) from the old one."""

    job_id: str
    uid: int | None  # from `uid_<uid>` (v1); v2 paths do not hold it
    cpu_usec: int
    cpus: int | None  # CPUs in the job's cpuset
    mem_bytes: int | None
    path: str
    inode: int = 0


def _opendir(name: str, dir_fd: int | None = None) -> int:
    """Open a directory without following a symlink in its last component (raises OSError)."""
    return os.open(name, _OPEN_DIR, dir_fd=dir_fd)


def _read(name: str, dir_fd: int, limit: int = MAX_READ) -> bytes | None:
    """A small regular file's bytes, or None: missing, symlink, FIFO, unreadable or over `limit`."""
    try:
        return sysfs.read_bounded(name, dir_fd, limit)
    except sysfs.SysfsReadError:
        return None


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _uint(data: bytes | None) -> int | None:
    if data is None:
        return None
    text = data.strip()
    if not text or len(text) > 20 or not text.isdigit():
        return None
    return int(text)


def parse_usage_usec(data: bytes | None) -> int | None:
    """`usage_usec N` from a v2 cpu.stat."""
    if data is None:
        return None
    for line in data.splitlines():
        key, _, value = line.partition(b" ")
        if key == b"usage_usec":
            return _uint(value)
    return None


def count_cpus(data: bytes | str | None) -> int | None:
    """How many CPUs a cpuset list ("0-3,8") names; None for empty or garbage."""
    if data is None:
        return None
    text = data.decode("ascii", "replace") if isinstance(data, bytes) else data
    text = text.strip()
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo_s, dash, hi_s = part.strip().partition("-")
        if not lo_s.isdigit() or (dash and not hi_s.isdigit()) or len(lo_s) > 7 or len(hi_s) > 7:
            return None
        lo = int(lo_s)
        hi = int(hi_s) if dash else lo
        if hi < lo or hi >= MAX_CPUS:
            return None
        cpus.update(range(lo, hi + 1))
    return len(cpus)


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


class Cgroups:
    """Finds Slurm job cgroups under `root` (v2 or v1, detected once) and reads their usage."""

    def __init__(self, root: str = "/sys/fs/cgroup", search_depth: int = 3, research_s: float = 60.0) -> None:
        self.root = root
        self.search_depth = search_depth
        self.research_s = research_s  # how often to look again for a v2 scope not found yet
        self.errors: list[str] = []  # notable problems of the last jobs() (never a vanished job)
        self._scopes: list[str] = []
        self._searched_at: float | None = None
        self._real_root = os.path.realpath(root)
        self.version: int
        self._cpuacct: str | None = None
        self._cpuset: str | None = None
        self._memory: str | None = None
        if stat.S_ISREG(self._lmode("cgroup.controllers")):
            self.version = 2
            return
        self._cpuacct = self._controller("cpu,cpuacct", "cpuacct,cpu", "cpuacct")
        if self._cpuacct is None:
            raise CgroupUnavailable(f"cgroup: {root} has neither cgroup.controllers (v2) nor cpuacct (v1)")
        self.version = 1
        self._cpuset = self._controller("cpuset")
        self._memory = self._controller("memory")

    def _lmode(self, name: str) -> int:
        try:
            return os.lstat(os.path.join(self.root, name)).st_mode
        except OSError:
            return 0

    def _controller(self, *names: str) -> str | None:
        """A v1 controller mount; `cpuacct -> cpu,cpuacct` style links are followed only inside root."""
        for name in names:
            path = os.path.join(self.root, name)
            real = os.path.realpath(path)
            if os.path.isdir(real) and _inside(real, self._real_root):
                return real
        return None

    def _note(self, msg: str) -> None:
        if len(self.errors) < 50:
            self.errors.append(msg)

    # -- v2 -------------------------------------------------------------------------------------------

    def _find_scopes(self) -> list[str]:
        """Directories named `slurmstepd.scope` at depth <= search_depth, owned by us (root), bounded."""
        found: list[str] = []
        level: list[str] = [""]
        budget = 20000  # directory entries looked at, at most
        for _depth in range(self.search_depth):
            nxt: list[str] = []
            for rel in level:
                try:
                    fd = _opendir(os.path.join(self.root, rel) if rel else self.root)
                except OSError:
                    continue
                try:
                    with os.scandir(fd) as it:
                        for entry in it:
                            budget -= 1
                            if budget < 0:
                                break
                            if not entry.is_dir(follow_symlinks=False):
                                continue
                            child = os.path.join(rel, entry.name) if rel else entry.name
                            if _SCOPE.fullmatch(entry.name):
                                # A delegated (user-owned) cgroup could be named so: only ours count.
                                if entry.stat(follow_symlinks=False).st_uid == os.geteuid():
                                    found.append(os.path.join(self.root, child))
                            elif not _JOB.fullmatch(entry.name):
                                nxt.append(child)
                except OSError:
                    pass
                finally:
                    os.close(fd)
            if found or budget < 0:
                break  # the shallowest match wins (system.slice/slurmstepd.scope is depth 2)
            level = sorted(nxt)
        return sorted(found)

    def _v2_scopes(self) -> list[str]:
        if self._scopes and all(os.path.isdir(s) and not os.path.islink(s) for s in self._scopes):
            return self._scopes
        now = time.monotonic()
        if self._scopes or self._searched_at is None or now - self._searched_at >= self.research_s:
            self._scopes = self._find_scopes()
            self._searched_at = now
        return self._scopes

    def _v2_job(self, scope_fd: int, scope: str, name: str, job_id: str) -> JobCgroup | None:
        try:
            fd = _opendir(name, dir_fd=scope_fd)
        except OSError:
            return None  # vanished, or a symlink
        try:
            ino = os.fstat(fd).st_ino
            usec = parse_usage_usec(_read("cpu.stat", fd))
            if usec is None:
                if _exists("cpu.stat", fd):  # present but garbage; a vanished job is not news
                    self._note(f"{scope}/{name}: unreadable cpu.stat")
                return None
            cpus = count_cpus(_read("cpuset.cpus.effective", fd))
            mem = _uint(_read("memory.current", fd))
        finally:
            os.close(fd)
        return JobCgroup(job_id, None, usec, cpus, mem, os.path.join(scope, name), ino)

    def _jobs_v2(self) -> Iterator[JobCgroup]:
        for scope in self._v2_scopes():
            try:
                sfd = _opendir(scope)
            except OSError:
                continue
            try:
                with os.scandir(sfd) as it:
                    entries = [(e.name, m.group(1)) for e in it if (m := _JOB.fullmatch(e.name))]
                for name, job_id in entries:
                    job = self._v2_job(sfd, scope, name, job_id)
                    if job is not None:
                        yield job
            except OSError:
                continue
            finally:
                os.close(sfd)

    # -- v1 -------------------------------------------------------------------------------------------

    def _v1_walk(self, base: str) -> Iterator[tuple[int, int, str, str]]:
        """(job dir fd, uid, job id, path) under `base/slurm*/uid_*/job_*`; the fd is closed after use."""
        try:
            bfd = _opendir(base)
        except OSError:
            return
        try:
            with os.scandir(bfd) as it:
                tops = sorted(e.name for e in it if _SLURM_V1.fullmatch(e.name))
            for top in tops:
                try:
                    tfd = _opendir(top, dir_fd=bfd)
                except OSError:
                    continue
                try:
                    with os.scandir(tfd) as it:
                        uids = [(e.name, int(m.group(1))) for e in it if (m := _UID.fullmatch(e.name))]
                    for uname, uid in uids:
                        try:
                            ufd = _opendir(uname, dir_fd=tfd)
                        except OSError:
                            continue
                        try:
                            with os.scandir(ufd) as it:
                                jobs = [(e.name, m.group(1)) for e in it if (m := _JOB.fullmatch(e.name))]
                            for jname, job_id in jobs:
                                try:
                                    jfd = _opendir(jname, dir_fd=ufd)
                                except OSError:
                                    continue
                                try:
                                    yield jfd, uid, job_id, os.path.join(base, top, uname, jname)
                                finally:
                                    os.close(jfd)
                        finally:
                            os.close(ufd)
                finally:
                    os.close(tfd)
        except OSError:
            return
        finally:
            os.close(bfd)

    def _v1_file(self, base: str | None, uid: int, name: str, job_id: str, file: str) -> bytes | None:
        """One file of the job's directory in another v1 controller, walked without following links."""
        if base is None:
            return None
        fds: list[int] = []
        try:
            fds.append(_opendir(base))
            for part in (name, f"uid_{uid}", f"job_{job_id}"):
                fds.append(_opendir(part, dir_fd=fds[-1]))
            return _read(file, fds[-1])
        except OSError:
            return None
        finally:
            for fd in fds:
                os.close(fd)

    def _jobs_v1(self) -> Iterator[JobCgroup]:
        assert self._cpuacct is not None
        for jfd, uid, job_id, path in self._v1_walk(self._cpuacct):
            ns = _uint(_read("cpuacct.usage", jfd))
            if ns is None:
                if _exists("cpuacct.usage", jfd):
                    self._note(f"{path}: unreadable cpuacct.usage")
                continue
            ino = os.fstat(jfd).st_ino
            top = os.path.basename(os.path.dirname(os.path.dirname(path)))
            cpus = count_cpus(self._v1_file(self._cpuset, uid, top, job_id, "cpuset.cpus"))
            mem = _uint(self._v1_file(self._memory, uid, top, job_id, "memory.usage_in_bytes"))
            yield JobCgroup(job_id, uid, ns // NS_PER_US, cpus, mem, path, ino)

    # -- public ---------------------------------------------------------------------------------------

    def jobs(self) -> dict[str, JobCgroup]:
        """Every Slurm job cgroup on the node now, by job id (digits only; other directories ignored)."""
        self.errors = []
        out: dict[str, JobCgroup] = {}
        for job in self._jobs_v2() if self.version == 2 else self._jobs_v1():
            out.setdefault(job.job_id, job)  # the same id twice (two uid dirs) is not counted twice
        return out

    def node_cpus(self) -> int:
        """The CPUs the node offers jobs: the root cpuset, else os.cpu_count()."""
        names: tuple[str, ...]
        if self.version == 2:
            where, names = self.root, ("cpuset.cpus.effective",)
        else:
            where, names = self._cpuset or "", ("cpuset.effective_cpus", "cpuset.cpus")
        try:
            fd = _opendir(where)
        except OSError:
            return os.cpu_count() or 1
        try:
            for name in names:
                n = count_cpus(_read(name, fd))
                if n:
                    return n
        finally:
            os.close(fd)
        return os.cpu_count() or 1


class CpuCounter:
    """CPU seconds per job between two `update()` calls, from the cgroups' cumulative counters.

    A job seen for the first time gives 0 s, or its whole usage so far with `first_seen_full=True`.
    The default suits a collector (re)starting while jobs run: their past CPU time does not belong to
    this interval.  The collector passes `first_seen_full=True` to `update` once it knows the previous
    cycle, so that a job starting while it runs keeps its first partial interval.
    A counter going backwards or a new cgroup inode means a new incarnation of the id (requeue, reuse):
    the old one was there at the previous update, so all of the new one's usage is from this interval.
    A job missing from a few updates (a failed read) keeps its previous value for `grace` updates.
    """

    def __init__(self, first_seen_full: bool = False, grace: int = 3) -> None:
        self.first_seen_full = first_seen_full
        self.grace = grace
        self.resets = 0
        self._n = 0
        self._prev: dict[str, tuple[int, int, int]] = {}  # job -> (usec, inode, update number seen)

    def update(self, jobs: Mapping[str, JobCgroup], first_seen_full: bool | None = None) -> dict[str, float]:
        """CPU seconds per job in `jobs` since the previous update (never negative). `first_seen_full`
        overrides the constructor's for this update: the collector passes True when it knows the
        previous cycle, since a job that was not there then started within this interval."""
        self._n += 1
        full = self.first_seen_full if first_seen_full is None else first_seen_full
        out: dict[str, float] = {}
        for jid, job in jobs.items():
            cur = max(0, job.cpu_usec)
            prev = self._prev.get(jid)
            if prev is None:
                delta = cur if full else 0
            elif cur < prev[0] or (job.inode and prev[1] and job.inode != prev[1]):
                self.resets += 1
                delta = cur
            else:
                delta = cur - prev[0]
            self._prev[jid] = (cur, job.inode, self._n)
            out[jid] = delta / 1e6
        self._prev = {j: p for j, p in self._prev.items() if self._n - p[2] <= self.grace}
        return out

    def to_state(self) -> dict[str, Any]:
        """JSON-able state for a restarted collector."""
        return {
            "v": 1,
            "n": self._n,
            "first_seen_full": self.first_seen_full,
            "prev": {j: list(p) for j, p in self._prev.items()},
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], grace: int = 3) -> CpuCounter:
        """Restore `to_state()`; malformed entries are dropped."""
        counter = cls(bool(state.get("first_seen_full", False)), grace)
        n = state.get("n")
        counter._n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0
        prev = state.get("prev")
        if isinstance(prev, Mapping):
            for j, p in prev.items():
                if (
                    isinstance(j, str)
                    and _JOB.fullmatch(f"job_{j}")
                    and isinstance(p, list | tuple)
                    and len(p) == 3
                    and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in p)
                ):
                    counter._prev[j] = (p[0], p[1], p[2])
        return counter
