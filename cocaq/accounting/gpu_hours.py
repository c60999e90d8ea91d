"""GPU use by hour, from the collector's GPU samples: the job_gpu_hours table the aggregator reads.

Per cluster, raw job id and hour: the energy the job's GPUs' power samples stand for, that energy weighted
by utilisation, the seconds sampled, the seconds and energy under the idle threshold, and the peak memory.
They are derived in SQL from the samples, for every job or only for jobs with newly shipped samples (from
the hour before the first new one on), and read back per job by the aggregator (`cocaq.accounting.aggregate`),
which turns them into the job's GPU utilisation, idle energy and the weights of its carbon intensity.
They depend on the idle threshold and the collector's step (`gpu_params_key`): a change of either
derives them all again, from the samples still there: the hours before the samples' horizon
(`aggregator_state` SAMPLES_FROM, which cocaq.accounting.retention moves when it drops old samples) are
kept as they were derived, since their samples are gone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, delete, func, insert, select

from cocaq.accounting.rollups import big_work_mem
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import AggregatorState, JobGpuHour, Sample
from cocaq.db.sqlfuncs import epoch, least
from cocaq.units import S_PER_HOUR

S = cast(Table, Sample.__table__).c
GH = cast(Table, JobGpuHour.__table__)
AS = cast(Table, AggregatorState.__table__).c
# aggregator_state: the samples before its watermark (an hour's start) were dropped by retention; the
# job_gpu_hours derived from them are all that is left of them, never derived again
SAMPLES_FROM = "samples_from"


@dataclass
class GpuUse:
    energy_j: float = 0.0  # of the samples (GPU power x time)
    util_energy: float = 0.0  # sum(util% x power x dt)
    seconds: float = 0.0
    idle_s: float = 0.0
    idle_j: float = 0.0
    mem_peak_mb: float | None = None  # the most memory one of the job's GPUs held in the hour


def gpu_params(cfg: Config) -> tuple[float, float, float]:
    """(idle threshold %, collector step, longest gap a sample stands for): job_gpu_hours depend on them."""
    step = cfg.collector.interval_s
    return cfg.aggregate.idle_gpu_util_pct, step, max(3 * step, 60.0)


def gpu_params_key(cfg: Config) -> str:
    threshold, step, max_dt = gpu_params(cfg)
    return f"v2 idle<{threshold!r} step={step!r} max_dt={max_dt!r}"  # v2: with the memory peak


def _gpu_hours_select(
    cfg: Config,
    cluster_id: int | None,
    raw_ids: Sequence[str] | None,
    since: datetime | None = None,
) -> Any:
    """Per cluster, raw job id and hour: what the job's GPU samples say (a job_gpu_hours row).

    A sample stands for the time to the next one of the same GPU (the last: one collector step), capped
    so that a gap in the samples is not filled with the power before it. A job's figures depend only on
    its own samples, so one pass over all of them gives what per-job queries give.
    """
    threshold, step, max_dt = gpu_params(cfg)
    where = [S.source == "nvml", S.metric.in_(("power_w", "util_pct", "mem_used_mb")), S.job_id.is_not(None)]
    if cluster_id is not None:
        where.append(S.cluster_id == cluster_id)
    if raw_ids is not None:
        where.append(S.job_id.in_(list(raw_ids)))
    if since is not None:  # on an hour's start: the hours from there on come out whole
        where.append(S.ts >= since)
    p = (
        select(
            S.cluster_id,
            S.job_id,
            S.node,
            S.device,
            S.ts,
            func.max(_when(S.metric == "power_w", S.value)).label("power"),
            func.max(_when(S.metric == "util_pct", S.value)).label("util"),
            func.max(_when(S.metric == "mem_used_mb", S.value)).label("mem"),
        )
        .where(*where)
        .group_by(S.cluster_id, S.job_id, S.node, S.device, S.ts)
        .subquery()
    )
    t = func.round(epoch(p.c.ts), 3)  # (SQLite's julianday arithmetic is a few µs off a whole hour)
    nxt = func.lead(t).over(partition_by=(p.c.cluster_id, p.c.job_id, p.c.node, p.c.device), order_by=p.c.ts)
    dt = func.coalesce(nxt - t, step)
    d = select(
        p.c.cluster_id, p.c.job_id, t.label("t"), p.c.power, p.c.util, p.c.mem, dt.label("dt")
    ).subquery()
    hour = cast_bigint(func.floor(d.c.t / float(S_PER_HOUR)))
    dtc = least(d.c.dt, max_dt)
    pw = func.coalesce(d.c.power, 0.0)
    idle = d.c.util < threshold
    return select(
        d.c.cluster_id,
        d.c.job_id,
        hour.label("hour"),
        func.coalesce(func.sum(pw * dtc), 0.0),
        func.coalesce(func.sum(func.coalesce(d.c.util, 0.0) * pw * dtc), 0.0),
        func.coalesce(func.sum(dtc), 0.0),
        func.coalesce(func.sum(_when(idle, dtc, 0.0)), 0.0),
        func.coalesce(func.sum(_when(idle, pw * dtc, 0.0)), 0.0),
        func.max(d.c.mem),
    ).group_by(d.c.cluster_id, d.c.job_id, hour)


def cast_bigint(x: Any) -> Any:
    from sqlalchemy import BigInteger
    from sqlalchemy import cast as sql_cast

    return sql_cast(x, BigInteger)


_GH_COLS = (
    "cluster_id", "job_id", "hour", "energy_j", "util_energy", "seconds", "idle_s", "idle_j", "mem_peak_mb"
)  # fmt: skip


Scope = dict[int, dict[str, float | None]]  # cluster -> raw job id -> from when (epoch s; None: all)


def samples_horizon(conn: Connection) -> datetime | None:
    """The start of the hour before which retention dropped the samples (None: none dropped)."""
    return as_utc(conn.execute(select(AS.watermark).where(AS.name == SAMPLES_FROM)).scalar())


def refresh_gpu_hours(conn: Connection, cfg: Config, scope: Scope | None) -> int:
    """Derive job_gpu_hours again from the samples: of every job (scope None), or of these jobs from the
    hour before their first new sample on (that hour's last sample now has a successor; earlier hours
    cannot change, and a week-long job's older samples are not read again every hour). Never before the
    samples' horizon: those hours' samples are gone, and their rows are what remains of them."""
    big_work_mem(conn)
    horizon = samples_horizon(conn)
    first = None if horizon is None else int(horizon.timestamp() // S_PER_HOUR)  # the first hour with samples
    if scope is None:
        conn.execute(delete(GH) if first is None else delete(GH).where(GH.c.hour >= first))
        since = None if first is None else datetime.fromtimestamp(first * float(S_PER_HOUR), UTC)
        ins = insert(GH).from_select(list(_GH_COLS), _gpu_hours_select(cfg, None, None, since))
        return int(conn.execute(ins.execution_options(preserve_rowcount=True)).rowcount or 0)
    n = 0
    for cid, jobs in scope.items():
        by_hour: dict[int | None, list[str]] = defaultdict(list)
        for jid, t in jobs.items():
            h0 = None if t is None else int(t // S_PER_HOUR) - 1
            if first is not None:
                h0 = first if h0 is None else max(h0, first)
            by_hour[h0].append(jid)
        for h0, ids_ in by_hour.items():
            ids = sorted(ids_)
            for i in range(0, len(ids), 5000):
                chunk = ids[i : i + 5000]
                gone = delete(GH).where(GH.c.cluster_id == cid, GH.c.job_id.in_(chunk))
                if h0 is not None:
                    gone = gone.where(GH.c.hour >= h0)
                conn.execute(gone)
                since = None if h0 is None else datetime.fromtimestamp(h0 * float(S_PER_HOUR), UTC)
                sel = _gpu_hours_select(cfg, cid, chunk, since)
                ins = insert(GH).from_select(list(_GH_COLS), sel)
                n += int(conn.execute(ins.execution_options(preserve_rowcount=True)).rowcount or 0)
    return n


def read_gpu_hours(
    conn: Connection, keys: dict[int, list[str]] | None
) -> dict[tuple[int, str], dict[float, GpuUse]]:
    """job_gpu_hours of these (cluster, raw id)s (None: all), keyed by the hour's start in epoch seconds."""
    out: dict[tuple[int, str], dict[float, GpuUse]] = defaultdict(dict)
    cols = [GH.c[k] for k in _GH_COLS]
    queries = []
    if keys is None:
        queries.append(select(*cols))
    else:
        for cid, ids in keys.items():
            for i in range(0, len(ids), 5000):
                queries.append(
                    select(*cols).where(GH.c.cluster_id == cid, GH.c.job_id.in_(ids[i : i + 5000]))
                )
    for q in queries:
        for cid, jid, h, e, ue, sec, idle_s, idle_j, mem in conn.execute(q):
            out[(cid, jid)][float(h) * S_PER_HOUR] = GpuUse(e, ue, sec, idle_s, idle_j, mem)
    return out


def _when(cond: Any, value: Any, other: Any = None) -> Any:
    from sqlalchemy import case, literal

    return case((cond, value), else_=literal(other) if other is not None else None)
