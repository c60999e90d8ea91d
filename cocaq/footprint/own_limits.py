"""The `--time` a kind of job needs, from the user's own completed runs of it, and what caps it.

A time limit is sized per kind of job (same name, partition and QOS: the same script asked of the same
queue), never one figure for everyone: a 1 h `debug` job and a 2-day training run get their own. The need
is the 95th percentile of the completed runs' elapsed time with headroom (x HEADROOM, at least
MIN_HEADROOM_H more), rounded up as `slurm_time` does; it never exceeds the partition's MaxTime or the
QOS's MaxWall where the site configured them (`[advice] partition_max_time`, `qos_max_time`): Slurm would
refuse or hold a job asking for more ("PartitionTimeLimit", "QOSMaxWallDurationPerJobLimit" in squeue's
reasons; slurm.conf's MaxTime, sacctmgr's MaxWall). The `time-limits` and `timeouts` rules
(cocaq.footprint.rules), over a window and on one job, and the advice's narrow read
(cocaq.footprint.advice_jobs) ask here, so that the same runs give the same line. Standard library only
(login nodes).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cocaq.footprint.advice_words import limit_hours
from cocaq.footprint.jobfacts import JobFacts

HEADROOM = 1.25
MIN_HEADROOM_H = 0.25
MIN_RUNS = 3  # completed runs of a kind before its need is said


Kind = tuple[str, str, str]  # (name, partition, qos)


def kind_of(j: JobFacts) -> Kind:
    part = (j.partition or "").split(",")[0]
    return (j.name or "", part, j.qos or "")


def kind_words(k: Kind) -> str:
    """`train` on gpu (QOS normal)."""
    name, part, qos = k
    where = f" on {part}" if part else ""
    return f"{name or '(no name)'}{where}" + (f" (QOS {qos})" if qos else "")


def max_time_h(j: JobFacts, partition_max: Mapping[str, float], qos_max: Mapping[str, float]) -> float | None:
    """The longest limit the job's partition and QOS allow, where the site said (None: not known)."""
    _, part, qos = kind_of(j)
    caps = [x for x in (partition_max.get(part), qos_max.get(qos)) if x]
    return min(caps) if caps else None


def p95(values: Iterable[float]) -> float:
    xs = sorted(values)
    return xs[max(0, math.ceil(0.95 * len(xs)) - 1)]


def needed_h(runs_p95_h: float) -> float:
    """The limit for runs whose 95th percentile is `runs_p95_h`, in hours, rounded up as `--time` is."""
    return limit_hours(max(runs_p95_h * HEADROOM, runs_p95_h + MIN_HEADROOM_H))


@dataclass(frozen=True)
class KindRuns:
    kind: Kind
    runs: tuple[JobFacts, ...]  # completed
    p95_h: float
    need_h: float  # p95 with headroom, rounded up; capped at cap_h
    cap_h: float | None  # MaxTime / MaxWall where known
    median_limit_h: float | None

    @property
    def capped(self) -> bool:
        return self.cap_h is not None and self.need_h >= self.cap_h


def completed_by_kind(
    jobs: Iterable[JobFacts], partition_max: Mapping[str, float], qos_max: Mapping[str, float]
) -> dict[Kind, KindRuns]:
    """Per kind, its completed runs (at least MIN_RUNS) and the limit they need."""
    acc: dict[Kind, list[JobFacts]] = defaultdict(list)
    for j in jobs:
        if j.ended and j.state.split(" ")[0] == "COMPLETED" and j.elapsed_h > 0:
            acc[kind_of(j)].append(j)
    out: dict[Kind, KindRuns] = {}
    for k, rs in acc.items():
        if len(rs) < MIN_RUNS:
            continue
        top = p95(j.elapsed_h for j in rs)
        cap = max_time_h(rs[0], partition_max, qos_max)
        need = needed_h(top)
        if cap is not None:
            need = min(need, cap)
        limits = sorted(j.time_limit_h for j in rs if j.time_limit_h)
        out[k] = KindRuns(k, tuple(rs), top, need, cap, limits[len(limits) // 2] if limits else None)
    return out
