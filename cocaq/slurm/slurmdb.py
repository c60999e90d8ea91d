"""Jobs read from slurmdbd through pyslurm (`pyslurm.db.Jobs`), with no sacct process.

pyslurm links against libslurm, so a pyslurm build works only with the Slurm major release it was built
for (pyslurm 25.11.x: Slurm 25.11). Each job is turned into a dict of `sacct --json`'s shape and goes
through the same reader as sacct's JSON (cocaq.slurm.sacct.iter_job_dicts): one set of rules for states,
array and het jobs, steps, energy and what is skipped, whichever way the jobs came.

What pyslurm gives differently from sacct, and so from this reader's records (docs/node-side.md):
- CPU time: whole seconds per step (pyslurm reads `tot_cpu_sec`, sacct adds the microseconds);
- exit codes of 128 and above: pyslurm takes 128 off (a job that exited 137 reads 9), sacct does not.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from cocaq.errors import InputError
from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import ParseStats, iter_job_dicts
from cocaq.units import MS_PER_S


class PyslurmMissing(InputError):
    """pyslurm is not installed (as opposed to installed and not loading)."""


_PROBE = "import pyslurm, sys; sys.stdout.write(pyslurm.__version__)"


def probe_pyslurm() -> str:
    """The installed pyslurm's version, found by importing it in a child process; InputError with one
    line when it is missing or cannot load its libslurm.

    Importing pyslurm initialises libslurm, which ends the whole process (exit 1, "fatal: Unable to process
    configuration file") where it finds no usable slurm.conf, and sets SLURM_CONF in the environment that
    a later sacct would inherit: so the question is asked in a child, and pyslurm is imported here only
    once it is the backend."""
    import subprocess
    import sys

    if "pyslurm" in sys.modules:
        return str(sys.modules["pyslurm"].__version__)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"pyslurm could not be tried: {exc}") from None
    if probe.returncode != 0:
        lines = [ln.strip() for ln in probe.stderr.splitlines() if ln.strip()]
        if any("No module named 'pyslurm'" in ln for ln in lines):
            raise PyslurmMissing(
                "pyslurm is not installed: pip install 'cocaq[pyslurm]' against the site's Slurm"
                ' (README: Slurm and pyslurm), or use [slurm] backend = "cli"'
            )
        why = next((ln for ln in lines if "fatal" in ln or "Error" in ln), lines[-1] if lines else "")
        raise InputError(f"pyslurm does not load ({why or f'exit {probe.returncode}'})")
    return probe.stdout.strip()


def load_pyslurm() -> Any:
    """pyslurm, imported (after probe_pyslurm said it loads)."""
    probe_pyslurm()
    try:
        import pyslurm  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:  # it loaded in the child, so unlikely here; still one line
        raise InputError(f"pyslurm does not load: {type(exc).__name__}: {exc}") from None
    return pyslurm


def built_for(version: str) -> tuple[int, int] | None:
    """The Slurm release a pyslurm version is for: it is SLURM_MAJOR.PATCH ("25.11.2" -> (25, 11))."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _tres(tres: Any) -> list[dict[str, Any]]:
    """pyslurm's TrackableResources -> sacct --json's list of {type, name, count}."""
    if tres is None:
        return []
    out: list[dict[str, Any]] = []

    def add(item: Any) -> None:
        if not isinstance(item, dict) or item.get("count") is None:
            return
        typ, _, name = str(item.get("type_and_name") or "").partition("/")
        if typ:
            out.append({"type": typ, "name": name, "count": item["count"]})

    for value in tres.to_dict(recursive=True).values():
        if isinstance(value, dict) and "type_and_name" in value:
            add(value)
        elif isinstance(value, dict):  # gres, license, fs, ...: name -> item
            for item in value.values():
                add(item)
    return out


def _number(v: Any) -> dict[str, Any]:
    return {"set": v is not None, "number": v if v is not None else 0}


def job_dict(job: Any) -> dict[str, Any]:
    """One pyslurm.db.Job as a job of sacct --json (data_parser v0.0.4x), the fields cocaq reads."""
    steps = []
    # pyslurm keys a job's steps by their ids, special ones as words ("batch", "extern", "interactive"),
    # as sacct --json's step.id ends: the reader tells a batch job from an srun/salloc session by them
    for sid, step in job.steps.items():
        stats = step.stats
        rss = getattr(stats, "max_resident_memory", None)
        # the least CPU time of one task and where (pyslurm: seconds, the node's name, the task), as
        # sacct --json's tres.requested.min has them (milliseconds), for cocaq.slurm.idle_nodes
        min_node = getattr(stats, "min_cpu_time_node", None)
        least = (
            [{"type": "cpu", "name": "", "count": (getattr(stats, "min_cpu_time", 0) or 0) * MS_PER_S,
              "node": min_node, "task": getattr(stats, "min_cpu_time_task", None)}]
            if min_node else []
        )  # fmt: skip
        nodelist = getattr(step, "nodelist", None)
        nodes = {"count": step.num_nodes, **({"range": nodelist} if isinstance(nodelist, str) else {})}
        steps.append(
            {
                "step": {"id": f"{job.id}.{sid}"},
                "statistics": {"energy": {"consumed": getattr(stats, "consumed_energy", None)}},
                "tres": {
                    "requested": {
                        "max": [{"type": "mem", "name": "", "count": rss}] if rss else [],
                        "min": least,
                    }
                },
                "nodes": nodes,
                "tasks": {"count": step.ntasks},
                "time": {"total": {"seconds": getattr(stats, "total_cpu_time", 0) or 0, "microseconds": 0}},
            }
        )
    limit = job.time_limit
    # pyslurm reads 0 as "not set" for these (u32_parse's zero_is_noval): a started array task without a
    # task id is task 0 (only the pending array's own record has none, with its tasks as a string), and
    # a het job's component without an offset is its leader, offset 0
    array_task = job.array_task_id
    if job.array_id and array_task is None and not job.array_tasks_waiting:
        array_task = 0
    alloc = _tres(job.allocated_tres)
    het_offset = job.heterogeneous_offset
    if job.heterogeneous_id and het_offset is None:
        het_offset = 0
    return {
        "job_id": job.id,
        "array": {
            "job_id": job.array_id or 0,
            "task_id": _number(array_task),
            "task": job.array_tasks_waiting or "",
        },
        "het": {"job_id": job.heterogeneous_id or 0, "job_offset": _number(het_offset)},
        "state": {"current": [job.state or ""]},
        "kill_request_user": job.cancelled_by,
        "time": {
            "submission": job.submit_time or 0,
            "start": job.start_time or 0,
            "end": job.end_time or 0,
            "elapsed": job.elapsed_time or 0,
            "limit": _number(limit if isinstance(limit, int) else None),
            "total": {"seconds": job.stats.total_cpu_time or 0, "microseconds": 0},
        },
        "user": job.user_name or "",
        "cluster": job.cluster,
        "account": job.account,
        "partition": job.partition,
        "qos": job.qos,
        "name": job.name,
        "nodes": job.nodelist or "",
        "allocation_nodes": job.num_nodes or 0,
        # the reader takes the requested TRES only where nothing was allocated; pyslurm parses a TRES
        # string on each access (most of this function's time), so the requested one only then
        "tres": {"allocated": alloc, "requested": [] if alloc else _tres(job.requested_tres)},
        # no signal is 0 in pyslurm, unset in sacct's JSON (there is no signal 0)
        "exit_code": {"return_code": job.exit_code, "signal": {"id": _number(job.exit_code_signal or None)}},
        "comment": {"job": job.comment},
        "steps": steps,
    }


def iter_slurmdb(
    start: datetime,
    end: datetime,
    *,
    all_users: bool,
    default_cluster: str | None = None,
    stats: ParseStats | None = None,
    pyslurm: Any = None,
) -> Iterator[JobRecord]:
    """The jobs that ran in [start, end], as `sacct -S start -E end [--allusers]` selects them: root and
    --allusers see every user's jobs, anyone else only their own."""
    ps = pyslurm if pyslurm is not None else load_pyslurm()
    kwargs: dict[str, Any] = {"start_time": int(start.timestamp()), "end_time": int(end.timestamp())}
    if not all_users and os.getuid() != 0:
        kwargs["users"] = [pwd.getpwuid(os.getuid()).pw_name]
    try:
        jobs = ps.db.Jobs.load(ps.db.JobFilter(**kwargs))
    except Exception as exc:  # RPCError when slurmdbd cannot be reached or refuses
        raise InputError(f"pyslurm: reading jobs from slurmdbd failed: {exc}") from None
    dicts = (job_dict(job) for per_cluster in jobs.data.values() for job in per_cluster.values())
    yield from iter_job_dicts(dicts, default_cluster=default_cluster, stats=stats)
