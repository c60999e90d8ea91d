"""A job's parts as `cocaq job 123` and the read API's /v1/jobs/123 show them: an array's tasks or a het
job's components, and their sum.

`sacct -j 123` accepts a base id and lists every part: an array's tasks (`123_0`, `123_1`, ...) or a
heterogeneous job's components (`123+0`, `123+1`). cocaq's jobs table holds one row per part, with the
base id in `array_job_id` or `het_job_id`. The base id is not a lookup by raw id: Slurm gives an array's
last task the base id as its raw id (tests/data/sacct/README.md: array 10's tasks 10_0 to 10_3 have raw
ids 18, 19, 20 and 10), and a het job's leader (`123+0`) too, so the job whose raw id is 123 is one part,
not the whole.

A task list as squeue and sacct print it (`123_[0-9]`, `123_[1,3-5%2]`, the throttle ignored) is accepted
too and shows those tasks. One row per part is read with one query (no per-part ledger or advice, which
`cocaq job 123_4` or `cocaq job 123+1` gives): arrays of thousands of tasks stay fast. Standard library
only at import: `cocaq job` runs on every login node (tests/test_user_imports.py).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cocaq.errors import UsageError
from cocaq.slurm.record import JOB_ID_PATTERN
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

if TYPE_CHECKING:
    from sqlalchemy import Connection

# An array's tasks as squeue/sacct print them: 123_[0-9], 123_[1,3,5-7], 123_[0-99%4] (the throttle).
_RANGE = r"[0-9]{1,10}(?:-[0-9]{1,10})?"
ARRAY_LIST_PATTERN = rf"[0-9]{{1,20}}_\[{_RANGE}(?:,{_RANGE}){{0,99}}(?:%[0-9]{{1,10}})?\]"
# What `cocaq job` and /v1/jobs/{id} accept: one job, a base id (the same digits) or an array's task list.
ASK_PATTERN = rf"{JOB_ID_PATTERN}|{ARRAY_LIST_PATTERN}"


# A base id's parts by kind: the jobs column that holds the base id, the one that numbers the parts, and
# what a part is called (the JSON's list and count: `tasks`, `n_tasks`; `components`, `n_components`).
KINDS: dict[str, tuple[str, str, str]] = {
    "array": ("array_job_id", "array_task_id", "task"),
    "het": ("het_job_id", "het_job_offset", "component"),
}


@dataclass(frozen=True, slots=True)
class JobAsk:
    """What a job id asks for: `job_id` (a job or part as sacct names it; None for a task list) and, for
    digits alone or a task list, the base id `base` whose parts (an array's tasks, a het job's
    components) to show, within the array tasks `tasks` if given (inclusive ranges; then no het job)."""

    text: str
    job_id: str | None
    base: int | None
    tasks: tuple[tuple[int, int], ...] | None = None

    def wants(self, kind: str, index: int | None) -> bool:
        """Whether a part (its kind, its task id or offset) is one of those asked for."""
        if self.tasks is None:
            return True
        return kind == "array" and index is not None and any(lo <= index <= hi for lo, hi in self.tasks)


def parse_job_ask(text: str) -> JobAsk:
    """A job id as people type or paste it; UsageError (exit 2, one line) for anything else."""
    s = text.strip()
    if re.fullmatch(JOB_ID_PATTERN, s):
        return JobAsk(s, s, int(s) if s.isdigit() else None)
    if re.fullmatch(ARRAY_LIST_PATTERN, s):
        base, _, inner = s.partition("_[")
        ranges = []
        for part in inner.rstrip("]").partition("%")[0].split(","):
            lo, _, hi = part.partition("-")
            if int(hi or lo) < int(lo):
                raise UsageError(f"{s!r}: task range {part} runs backwards")
            ranges.append((int(lo), int(hi or lo)))
        return JobAsk(s, None, int(base), tuple(ranges))
    raise UsageError(
        f"{s!r} is not a Slurm job id (like 12345, an array task 12345_7, an array's tasks 12345_[0-9] or "
        "a het job part 12345+1)"
    )


def job_parts(conn: Connection, ask: JobAsk, cluster: str | None = None) -> list[dict[str, Any]]:
    """The parts of base id `ask.base` that cocaq has records of (pending tasks have none): an array's
    tasks and a het job's components, those `ask` names, by cluster, kind, index and submission; each as
    a JSON-ready dict with its `kind`, energy and CO2. Empty for a job that has no parts (or an ask
    without a base id)."""
    from sqlalchemy import or_, select

    from cocaq.db.schema import Cluster, Job

    if ask.base is None:
        return []
    q = (
        select(
            Cluster.name.label("cluster"),
            Job.job_id,
            Job.job_id_raw,
            Job.array_job_id,
            Job.array_task_id,
            Job.het_job_id,
            Job.het_job_offset,
            Job.user_name,
            Job.account,
            Job.name.label("job_name"),
            Job.partition,
            Job.state,
            Job.state_detail,
            Job.is_open,
            Job.exit_code,
            Job.exit_signal,
            Job.submit_time,
            Job.start_time,
            Job.end_time,
            Job.elapsed_s,
            Job.alloc_cpus,
            Job.alloc_gpus,
            Job.gpu_type,
            Job.node_list,
            Job.energy_j,
            Job.energy_measured_j,
            Job.energy_est_low_j,
            Job.energy_est_high_j,
            Job.pue,
            Job.co2_g,
        )
        .join(Cluster, Cluster.id == Job.cluster_id)
        .where(or_(Job.array_job_id == ask.base, Job.het_job_id == ask.base))  # (both indexed)
    )
    if cluster:
        q = q.where(Cluster.name == cluster)
    out = []
    for r in conn.execute(q).mappings():
        kind = "het" if r["het_job_id"] == ask.base else "array"
        base_col, index_col, _ = KINDS[kind]
        if not ask.wants(kind, r[index_col]):
            continue
        energy_j = float(r["energy_j"] or 0.0)
        measured_j = float(r["energy_measured_j"] or 0.0)
        est_j = energy_j - measured_j
        pue = 1.0 if r["pue"] is None else float(r["pue"])
        elapsed = float(r["elapsed_s"] or 0.0)
        out.append(
            {
                "kind": kind,
                "job_id": r["job_id"],
                "job_id_raw": r["job_id_raw"],
                base_col: ask.base,
                index_col: r[index_col],
                "cluster": r["cluster"],
                "user_name": r["user_name"],
                "account": r["account"],
                "name": r["job_name"],
                "partition": r["partition"],
                "state": r["state"],
                "state_detail": r["state_detail"],
                "is_open": bool(r["is_open"]),
                "exit_code": r["exit_code"],
                "exit_signal": r["exit_signal"],
                "submit_time": r["submit_time"],
                "start_time": r["start_time"],
                "end_time": r["end_time"],
                "elapsed_s": elapsed,
                "alloc_cpus": r["alloc_cpus"] or 0,
                "alloc_gpus": r["alloc_gpus"] or 0,
                "gpu_type": r["gpu_type"],
                "node_list": r["node_list"],
                "gpu_hours": (r["alloc_gpus"] or 0) * elapsed / S_PER_HOUR,
                "cpu_hours": (r["alloc_cpus"] or 0) * elapsed / S_PER_HOUR,
                "energy_kwh": energy_j / J_PER_KWH,
                "energy_kwh_with_pue": energy_j * pue / J_PER_KWH,
                "energy_measured_kwh": measured_j / J_PER_KWH,
                "energy_estimated_kwh": est_j / J_PER_KWH,
                "energy_estimated_low_kwh": (
                    est_j if r["energy_est_low_j"] is None else r["energy_est_low_j"]
                )
                / J_PER_KWH,
                "energy_estimated_high_kwh": (
                    est_j if r["energy_est_high_j"] is None else r["energy_est_high_j"]
                )
                / J_PER_KWH,
                "pue": pue,
                "co2_kg": float(r["co2_g"] or 0.0) / G_PER_KG,
            }
        )
    # (sorted here, not in SQL: the databases put NULLs at opposite ends, and each part has one index)
    out.sort(key=lambda p: (p["cluster"], p["kind"], p[KINDS[p["kind"]][1]] or 0, p["submit_time"]))
    return out


SUM_KEYS = (
    "gpu_hours",
    "cpu_hours",
    "energy_kwh",
    "energy_kwh_with_pue",
    "energy_measured_kwh",
    "energy_estimated_kwh",
    "energy_estimated_low_kwh",
    "energy_estimated_high_kwh",
    "co2_kg",
)


def wholes(parts: list[dict[str, Any]], ask: JobAsk, kind: str) -> list[dict[str, Any]]:
    """The parts of one kind (job_parts, after the caller kept those its asker may see) as one whole per
    cluster (an array, a het job): its sums, states and time span, with every part under `tasks` or
    `components`."""
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        if p["kind"] == kind:
            by_cluster.setdefault(p["cluster"], []).append(p)
    return [_whole(kind, cluster, ps, ask) for cluster, ps in by_cluster.items()]


def _one_or_all(values: list[Any]) -> Any:
    """A field the parts share (the user, lab, name), or each distinct value, comma-separated."""
    distinct = sorted({str(v) for v in values if v is not None})
    return None if not distinct else ", ".join(distinct)


def _whole(kind: str, cluster: str, parts: list[dict[str, Any]], ask: JobAsk) -> dict[str, Any]:
    base_col, _, noun = KINDS[kind]
    sums = {k: sum(p[k] for p in parts) for k in SUM_KEYS}
    states = Counter(p["state"] for p in parts)
    starts = [p["start_time"] for p in parts if p["start_time"] is not None]
    running = sum(1 for p in parts if p["is_open"])
    ends = [p["end_time"] for p in parts if p["end_time"] is not None]
    start = min(starts) if starts else None
    end = max(ends) if ends and not running else None  # a running part's end is not known yet
    return {
        "kind": kind,
        "job_id": str(ask.base),
        base_col: ask.base,
        "asked": ask.text,  # 123, or the task list as given (123_[0-9])
        "cluster": cluster,
        "user_name": _one_or_all([p["user_name"] for p in parts]),
        "account": _one_or_all([p["account"] for p in parts]),
        "name": _one_or_all([p["name"] for p in parts]),
        f"n_{noun}s": len(parts),
        "states": dict(sorted(states.items(), key=lambda kv: (-kv[1], kv[0]))),
        "running": running,
        "submit_time": min(p["submit_time"] for p in parts),
        "start_time": start,
        "end_time": end,
        "span_s": (end - start).total_seconds() if start is not None and end is not None else None,
        "run_time_s": sum(p["elapsed_s"] for p in parts),
        **sums,
        "pue_min": min(p["pue"] for p in parts),
        "pue_max": max(p["pue"] for p in parts),
        "measured_share": (
            sums["energy_measured_kwh"] / sums["energy_kwh"] if sums["energy_kwh"] > 0 else None
        ),
        f"{noun}s": [{k: v for k, v in p.items() if k != "kind"} for p in parts],  # (the whole's kind)
    }
