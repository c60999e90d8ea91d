"""Slurm's GPU use (gres/gpuutil, gres/gpumem) for jobs read through pyslurm, from sacct.

pyslurm's step statistics (pyslurm.db.JobStatistics, 25.11) carry a step's CPU, memory, disk and page
usage, not its gres usage: the steps' TRESUsageInAve/Max that Slurm's gpu plugin fills are not reachable
through it. So the pyslurm backend asks sacct for exactly those fields of its GPU jobs (`sacct -j`, a few
hundred ids a call, no shell, a random delimiter as cocaq.slurm.run does), and folds them in as the sacct
reader does (cocaq.slurm.sacct: each step's average per task x its tasks x its elapsed time). Where sacct
is not there, or fails, the records stay as pyslurm gave them and the caller says why in one line.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterable

from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import _JOBID, _count, _step_gpu, finish_gpu

FIELDS = "JobID,ElapsedRaw,NTasks,TRESUsageInAve,TRESUsageInMax"
CHUNK = 400  # job ids per sacct call: well within any command line


def add_gpu_usage(records: Iterable[JobRecord], sacct: str | None, cluster: str) -> str | None:
    """Fill slurm_gpu_util and slurm_gpu_mem_mb of `cluster`'s GPU jobs from sacct; returns why not, or
    None (done, or no GPU job to ask about)."""
    wanted = {r.job_id: r for r in records if r.alloc_gpus > 0 and (r.cluster or cluster) == cluster}
    if not wanted:
        return None
    if sacct is None:
        return "Slurm's GPU use (gres/gpuutil) not read: pyslurm does not carry it, and sacct is not here"
    ids = sorted(wanted)
    for i in range(0, len(ids), CHUNK):
        why = _read(sacct, ids[i : i + CHUNK], wanted)
        if why is not None:
            return why
    return None


def _read(sacct: str, ids: list[str], wanted: dict[str, JobRecord]) -> str | None:
    delimiter = f"|{secrets.token_hex(8)}|"
    cmd = [sacct, "-j", ",".join(ids), "--allusers", "--parsable2", f"--delimiter={delimiter}"]
    try:
        proc = subprocess.run([*cmd, f"--format={FIELDS}"], capture_output=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Slurm's GPU use (gres/gpuutil) not read: sacct did not run ({exc})"
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"Slurm's GPU use (gres/gpuutil) not read: sacct failed ({msg[0] if msg else proc.returncode})"
    lines = proc.stdout.decode("utf-8", "replace").splitlines()
    if not lines:
        return None
    head = lines[0].split(delimiter)
    if len(head) == 1:  # a sacct that ignored --delimiter
        delimiter, head = "|", lines[0].split("|")
    idx = {h.strip().lower(): k for k, h in enumerate(head)}
    if "jobid" not in idx:
        return "Slurm's GPU use (gres/gpuutil) not read: sacct printed no JobID column"
    sums: dict[str, list[float | None]] = {}  # job -> [gpuutil x tasks x seconds, largest gpumem MB]
    for line in lines[1:]:
        parts = line.split(delimiter)
        if len(parts) != len(head):
            continue

        def get(name: str, parts: list[str] = parts) -> str:
            k = idx.get(name)
            return parts[k] if k is not None else ""

        m = _JOBID.match(get("jobid").strip())
        if not m or not m.group("step") or m.group("base") not in wanted:
            continue  # job lines carry no usage of their own here; steps do
        use = _step_gpu(get)
        if use is None:
            continue
        util, mem, elapsed = use
        acc = sums.setdefault(m.group("base"), [None, None])
        if util is not None:
            acc[0] = (acc[0] or 0.0) + util * (_count(get("ntasks")) or 1) * max(elapsed or 0.0, 0.0)
        if mem is not None:
            acc[1] = max(acc[1] or 0.0, mem)
    for jid, (util_s, mem_mb) in sums.items():
        finish_gpu(wanted[jid], util_s, mem_mb)
    return None
