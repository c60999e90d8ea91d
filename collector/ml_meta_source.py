"""The `jobmeta` source: what a running job declares (`cocaq.annotate`) and which ML framework it runs.

Every `detect_interval_s` it looks at each running job: the annotation file, when it changed since last
time (so metadata and counters such as tokens reach the database while the job runs, not only at its
end), and the job's processes, for the framework and its version (cocaq.collector.detect), once per job
until something is found and again when that changes. Each finding is a `meta` record in the spool,
shipped like the hooks' records; nothing here samples energy.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

from cocaq.collector import annotation_files
from cocaq.collector.records import meta_event
from cocaq.collector.sources import Cycle, Source, register
from cocaq.config import Collector

log = logging.getLogger("cocaq.collector")

_JOB_IN_CGROUP = re.compile(rb"/job_(\d{1,20})(?:/|$)", re.MULTILINE)
MAX_PROCS = 100_000


def pids_by_job(proc_root: str = "/proc") -> dict[str, list[int]]:
    """Each Slurm job's processes on this node, from /proc/PID/cgroup (cgroup v1 and v2 alike)."""
    out: dict[str, list[int]] = {}
    try:
        names = [n for n in os.listdir(proc_root) if n.isdigit()][:MAX_PROCS]
    except OSError:
        return out
    for n in names:
        try:
            fd = os.open(os.path.join(proc_root, n, "cgroup"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone, or a kernel thread we may not read
        try:
            data = os.read(fd, 8192)
        except OSError:
            continue
        finally:
            os.close(fd)
        m = _JOB_IN_CGROUP.search(data)
        if m:
            out.setdefault(m.group(1).decode(), []).append(int(n))
    return out


@register
class JobMetaSource(Source):
    name = "jobmeta"
    order = 60

    def __init__(self, cfg: Collector) -> None:
        super().__init__(cfg)
        self.proc_root = os.environ.get("COCAQ_PROC_ROOT", "/proc")  # tests point it at a fixture tree
        self.next_at = 0.0
        self.seen_mtime: dict[str, float] = {}
        self.detected: dict[str, dict[str, str]] = {}

    def collect(self, cycle: Cycle) -> None:
        if self.cfg.detect_interval_s <= 0 or cycle.ts < self.next_at:
            return
        self.next_at = cycle.ts + self.cfg.detect_interval_s
        for jid in list(self.seen_mtime):
            if jid not in cycle.jobs:
                self.seen_mtime.pop(jid, None)
                self.detected.pop(jid, None)
        procs = pids_by_job(self.proc_root)
        for jid, rj in cycle.jobs.items():
            try:
                self._job(cycle, jid, rj, procs)
            except Exception:  # one job's files or processes must not stop the others' metadata
                log.warning("job %s: model metadata not read", jid, exc_info=True)

    def _job(self, cycle: Cycle, jid: str, rj: Any, procs: dict[str, list[int]]) -> None:
        meta: dict[str, Any] = {}
        problems: list[str] = []
        values, mtime, probs = annotation_files.read(self.cfg.annotate_dir, jid, rj.uid)
        problems += probs
        if values and mtime != self.seen_mtime.get(jid):
            meta["api"] = values
            meta["api_ts"] = mtime
            self.seen_mtime[jid] = mtime
        found = self._detect(rj, procs.get(jid, []), problems)
        if found and found != self.detected.get(jid):
            meta["detected"] = found
            self.detected[jid] = found
        if problems:
            log.info("job %s: %s", jid, "; ".join(problems)[:500])
        if meta:
            cycle.events.append(meta_event(meta, time.time_ns(), jid))

    def _detect(self, rj: Any, job_pids: list[int], problems: list[str]) -> dict[str, str]:
        from cocaq.collector.detect import detect

        pids: list[int] = []
        nvml = getattr(self.peers.get("nvml"), "nvml", None)  # the nvml source's handle, when it is on
        if nvml is not None and rj.gpus:
            mine = set(job_pids)
            for u in rj.gpus:
                on_gpu = nvml.pids(u) or []
                # a shared or misattributed GPU can show other jobs' processes: only this job's count
                pids += [p for p in on_gpu if not mine or p in mine]
        if not pids:
            pids = job_pids
        if not pids:
            return {}
        d = detect(pids, proc_root=self.proc_root, uid=rj.uid)
        problems += list(d.problems)
        return d.as_meta()

    def state(self) -> dict[str, Any]:
        return {"mtime": dict(self.seen_mtime), "detected": dict(self.detected)}

    def restore(self, state: dict[str, Any]) -> None:
        m, d = state.get("mtime") or {}, state.get("detected") or {}
        self.seen_mtime = {str(k): float(v) for k, v in m.items()}
        self.detected = {str(k): dict(v) for k, v in d.items() if isinstance(v, dict)}
