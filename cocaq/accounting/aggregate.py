"""The aggregator: per-job carbon over time, embodied CO2, GPU use, and the daily rollups.

For each job that changed since the last run (or in a window, or all of them):
- its carbon intensity is the energy-weighted average of the zone's series over its run time (weighted
  by its GPU power samples where there are some, uniformly otherwise), with the fallbacks
  `cocaq.carbon.intensity` records; PUE is the month's when configured; CO2 = kWh x PUE x intensity;
- embodied (scope 3) CO2 from GPU-hours and node-hours, kept apart (`job_metrics.co2_embodied_g`);
- from the GPU samples: energy-weighted utilisation, and the seconds and energy of allocated GPUs
  that sat under the idle threshold.
Then every day those jobs touch (now, and where they were counted before) is rebuilt from all the jobs
that ran in it, pro rata to the hours in the day, exactly as the CLI's windows count them. Rebuilding
whole days is what makes a re-run idempotent and an incremental run equal to a full recompute.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    Text,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy import cast as sql_cast

from cocaq.accounting.ledger import (
    OUTCOMES,
    SOURCE_NODE,
    SOURCE_SAMPLES,
    clamp_idle,
    count_sql,
    outcome_of,
    outcome_sql,
    split_node,
    waste,
)
from cocaq.accounting.window import overlap, overlap_sql, share, share_sql
from cocaq.carbon.zones import co2_grams
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import (
    AggregatorState,
    DailyRollup,
    Job,
    JobEnergy,
    JobGpuHour,
    JobMetrics,
    NodeShipment,
    Sample,
)
from cocaq.db.sqlfuncs import epoch, epoch_exact, utcnow
from cocaq.hostlist import expand_hostlist

log = logging.getLogger(__name__)

DAY = 86400.0
BATCH = 20_000
WORK_MEM = "256MB"  # PostgreSQL, for the aggregator's big statements (SET LOCAL)
ONE_PASS = 50_000  # jobs to derive at or over which the GPU samples are read in one pass
WATERMARK = "jobs"
GPU_HOURS = "gpu_hours"  # aggregator_state: when job_gpu_hours were brought up to date, and with what
# Changes are picked up from `watermark - MARGIN`: a transaction that started before the last run (its
# now() is earlier) but committed after it is still seen. Re-deriving a few jobs twice costs little.
MARGIN = timedelta(minutes=10)

J = cast(Table, Job.__table__).c
M = cast(Table, JobMetrics.__table__)
R = cast(Table, DailyRollup.__table__)
E = cast(Table, JobEnergy.__table__).c
S = cast(Table, Sample.__table__).c
GH = cast(Table, JobGpuHour.__table__)
NS = cast(Table, NodeShipment.__table__).c


@dataclass
class AggregateSummary:
    jobs: int = 0
    co2_changed: int = 0
    days: int = 0
    rollup_rows: int = 0
    gpu_hours_jobs: int = 0  # jobs whose GPU use by hour was derived again from samples (-1: all)
    gpu_hours_rows: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per part of the run, for -v

    def lap(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - since
        return now

    def line(self) -> str:
        gpu = "every job's" if self.gpu_hours_jobs < 0 else f"{self.gpu_hours_jobs:,} jobs'"
        return (
            f"aggregated {self.jobs:,} jobs ({self.co2_changed:,} with new CO2), rebuilt {self.days:,} days"
            f" ({self.rollup_rows:,} rollup rows), GPU samples read again for {gpu}"
            f" in {self.seconds:.1f} s"
        )


def _day_floor(ts: float) -> float:
    return ts - (ts % DAY)


# --- which jobs ---------------------------------------------------------------------------------------


def _changed_jobs(
    conn: Connection,
    since: datetime | None,
    full: bool,
    watermark: datetime | None,
    sampled: Scope,
) -> tuple[list[int], set[int]]:
    """The jobs to derive, and among them those whose days must be rebuilt whatever comes out.

    The rest (running jobs that did not change) are derived again because their CO2 can move with new
    intensity data; their days are rebuilt only if something they contribute did.
    """
    q = select(J.id, J.is_open).where(J.start_time.is_not(None))
    if full:
        pass
    elif since is not None:
        q = q.where(or_(J.end_time >= since, J.end_time.is_(None), J.updated_at >= since))
    elif watermark is None:  # never run: every job without up-to-date metrics
        # (ties count as changed: SQLite keeps CURRENT_TIMESTAMP to the second)
        stale = or_(M.c.job_pk.is_(None), M.c.computed_at <= J.updated_at, J.is_open)
        q = q.outerjoin(M, M.c.job_pk == J.id).where(stale)
    else:
        # Whatever changed since the last completed run started (new jobs too: inserts set updated_at),
        # and the running jobs, whose hours grow. Both by index: no scan of every job.
        q = q.where(or_(J.updated_at >= watermark - MARGIN, J.is_open))
    if conn.dialect.name == "postgresql":  # a million ids: straight from the driver, no Row objects
        compiled = q.compile(dialect=conn.dialect)
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur:
            rows = cur.execute(str(compiled), compiled.params).fetchall()
    else:
        rows = conn.execute(q).all()
    if full or since is not None or watermark is None:
        pks = must = {r[0] for r in rows}
    else:
        pks = {r[0] for r in rows}
        must = {r[0] for r in rows if not r[1]}
    if not full and since is None:
        marked = _jobs_by_raw_id(conn, sampled)  # finished jobs with new samples
        pks |= marked
        must |= marked
    return sorted(pks), must


def _jobs_by_raw_id(conn: Connection, ids: Scope) -> set[int]:
    out: set[int] = set()
    for cid, raw in ids.items():
        nums = sorted(int(x) for x in raw if x.isdigit() and len(x) < 19)
        for i in range(0, len(nums), 5000):
            q = select(J.id).where(
                J.cluster_id == cid, J.job_id_raw.in_(nums[i : i + 5000]), J.start_time.is_not(None)
            )
            out.update(conn.execute(q).scalars())
    return out


# --- GPU samples --------------------------------------------------------------------------------------


@dataclass
class GpuUse:
    energy_j: float = 0.0  # of the samples (GPU power x time)
    util_energy: float = 0.0  # sum(util% x power x dt)
    seconds: float = 0.0
    idle_s: float = 0.0
    idle_j: float = 0.0
    mem_peak_mb: float | None = None  # the most memory one of the job's GPUs held in the hour


def _gpu_params(cfg: Config) -> tuple[float, float, float]:
    """(idle threshold %, collector step, longest gap a sample stands for): job_gpu_hours depend on them."""
    step = cfg.collector.interval_s
    return cfg.aggregate.idle_gpu_util_pct, step, max(3 * step, 60.0)


def _gpu_params_key(cfg: Config) -> str:
    threshold, step, max_dt = _gpu_params(cfg)
    return f"v2 idle<{threshold!r} step={step!r} max_dt={max_dt!r}"  # v2: with the memory peak


def _gpu_hours_select(
    conn: Connection,
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
    threshold, step, max_dt = _gpu_params(cfg)
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
    hour = cast_bigint(func.floor(d.c.t / 3600.0))
    dtc = func.min(d.c.dt, max_dt) if conn.dialect.name == "sqlite" else func.least(d.c.dt, max_dt)
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


def _refresh_gpu_hours(conn: Connection, cfg: Config, scope: Scope | None) -> int:
    """Derive job_gpu_hours again from the samples: of every job (scope None), or of these jobs from the
    hour before their first new sample on (that hour's last sample now has a successor; earlier hours
    cannot change, and a week-long job's older samples are not read again every hour)."""
    _big_work_mem(conn)
    if scope is None:
        conn.execute(delete(GH))
        ins = insert(GH).from_select(list(_GH_COLS), _gpu_hours_select(conn, cfg, None, None))
        return int(conn.execute(ins.execution_options(preserve_rowcount=True)).rowcount or 0)
    n = 0
    for cid, jobs in scope.items():
        by_hour: dict[int | None, list[str]] = defaultdict(list)
        for jid, t in jobs.items():
            by_hour[None if t is None else int(t // 3600) - 1].append(jid)
        for h0, ids_ in by_hour.items():
            ids = sorted(ids_)
            for i in range(0, len(ids), 5000):
                chunk = ids[i : i + 5000]
                gone = delete(GH).where(GH.c.cluster_id == cid, GH.c.job_id.in_(chunk))
                if h0 is not None:
                    gone = gone.where(GH.c.hour >= h0)
                conn.execute(gone)
                since = None if h0 is None else datetime.fromtimestamp(h0 * 3600.0, UTC)
                sel = _gpu_hours_select(conn, cfg, cid, chunk, since)
                ins = insert(GH).from_select(list(_GH_COLS), sel)
                n += int(conn.execute(ins.execution_options(preserve_rowcount=True)).rowcount or 0)
    return n


def _read_gpu_hours(
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
            out[(cid, jid)][float(h) * 3600.0] = GpuUse(e, ue, sec, idle_s, idle_j, mem)
    return out


def _new_samples(conn: Connection, after: datetime | None) -> Scope:
    """The jobs (per cluster, raw id) that sample batches shipped since `after` have samples of, each with
    its earliest new sample's time (None where a batch did not say: the whole job)."""
    out: Scope = defaultdict(dict)
    if after is None:
        return out
    q = select(NS.cluster_id, NS.job_ids).where(NS.shipped_at >= after - MARGIN, NS.job_ids.is_not(None))
    for cid, ids in conn.execute(q):
        jobs = out[cid]
        for token in ids.split():
            jid, _, t = token.partition("@")
            ts = float(t) if t.isdigit() else None
            if jid not in jobs:
                jobs[jid] = ts
            else:
                prev = jobs[jid]
                jobs[jid] = None if prev is None or ts is None else min(prev, ts)
    return out


def _when(cond: Any, value: Any, other: Any = None) -> Any:
    from sqlalchemy import case, literal

    return case((cond, value), else_=literal(other) if other is not None else None)


# --- per-job metrics -----------------------------------------------------------------------------------


def _process_batch(
    conn: Connection,
    cfg: Config,
    pks: list[int],
    must: set[int],
    all_use: dict[tuple[int, str], dict[float, GpuUse]] | None = None,
) -> tuple[int, set[float]]:
    """Derive these jobs' metrics and write what changed; returns (jobs with new CO2, days to rebuild).

    A job's days go to the rebuild if it is in `must` (it changed) or if what it contributes did.
    """
    from cocaq.carbon.intensity import IntensityIndex

    jobs = conn.execute(
        select(
            J.id, J.cluster_id, J.job_id_raw, J.partition, J.node_list, _ts(J.start_time), J.elapsed_s,
            J.alloc_gpus, J.n_nodes, J.energy_j, J.pue, J.carbon_zone, J.carbon_g_per_kwh, J.co2_g,
            J.carbon_source, J.carbon_flag, _ts(J.updated_at), J.energy_measured_j,
        ).where(_among(conn, J.id, pks))
    ).all()  # fmt: skip
    if len(jobs) > len(pks):  # read by range: only the batch's jobs
        want = set(pks)
        jobs = [j for j in jobs if j.id in want]
    read = [
        *_METRIC_READ[: 1 + _N_PLAIN],
        *(_ts(M.c[k]) for k in ("rolled_from", "rolled_to", "computed_at")),
    ]
    old = {r[0]: r for r in conn.execute(select(*read).where(_among(conn, M.c.job_pk, pks))).all()}
    days: set[float] = set()
    # GPU use by hour (job_gpu_hours), per cluster and raw id
    if all_use is not None:
        use = all_use
    else:
        keys: dict[int, list[str]] = defaultdict(list)
        for j in jobs:
            if j.alloc_gpus and j.job_id_raw is not None:
                keys[j.cluster_id].append(str(j.job_id_raw))
        use = _read_gpu_hours(conn, keys) if keys else {}
    # one intensity index per batch, over the batch's span
    hw_cache: dict[tuple[str | None, str | None], Any] = {}
    plans = []
    zones: set[str] = set()
    t_lo, t_hi = float("inf"), float("-inf")
    for j in jobs:
        key = (j.partition, j.node_list if cfg.node_groups else None)
        hw = hw_cache.get(key)
        if hw is None:
            try:
                nodes = expand_hostlist(j.node_list or "") if cfg.node_groups else []
            except ValueError:
                nodes = []
            hw = hw_cache[key] = cfg.hardware_for(j.partition, nodes)[0]
        zone = hw.carbon_zone or cfg.cluster.carbon_zone
        t0 = _epoch_of(j.start_time)
        t1 = t0 + max(j.elapsed_s or 0.0, 0.0)
        zones.add(zone)
        t_lo, t_hi = min(t_lo, t0), max(t_hi, t1)
        plans.append((j, hw, zone, t0, t1))
    if not plans:
        return 0, days
    index = IntensityIndex.load(
        conn,
        zones,
        datetime.fromtimestamp(t_lo, UTC),
        datetime.fromtimestamp(t_hi, UTC) + timedelta(seconds=1),
        cfg.carbon.basis,
        cfg.carbon.gap_tolerance_s,
    )
    job_updates, metrics = [], []
    split_updates: list[tuple[int, list[tuple[str, str, float]]]] = []
    # Only the jobs whose ledger can need them: those with GPU samples (their GPU energy caps the idle
    # energy; a node row to split), and those whose samples are gone since a split (measured, and sampled
    # when last derived: their node row is made whole again). A full recompute of a million jobs would
    # otherwise read every GPU job's rows for nothing.
    energy_rows = _energy_rows(
        conn,
        [
            j.id
            for j in jobs
            if j.alloc_gpus
            and (
                use.get((j.cluster_id, str(j.job_id_raw)))
                or ((j.energy_measured_j or 0.0) > 0 and (old.get(j.id) or _UNSAMPLED)[_AT_SAMPLES_S])
            )
        ],
    )
    changed = 0
    emb = cfg.embodied
    for j, hw, zone, t0, t1 in plans:
        hours = use.get((j.cluster_id, str(j.job_id_raw)), {}) if j.alloc_gpus else {}
        hours = {
            h: u for h, u in hours.items() if h + 3600.0 > t0 - 60 and h < t1 + 60
        }  # a reused id: its own run
        weights = [
            (max(h, t0), min(h + 3600.0, t1), u.energy_j) for h, u in sorted(hours.items()) if u.energy_j > 0
        ]
        weights = [w for w in weights if w[1] > w[0]]
        choice = index.for_interval(zone, t0, max(t1, t0 + 1e-3), weights or None)
        pue = cfg.pue_at(hw, datetime.fromtimestamp(t0, UTC) if cfg.pue_monthly else None)
        co2 = co2_grams(j.energy_j or 0.0, pue, choice.g_per_kwh)
        co2_changed = (
            j.co2_g != co2 or j.pue != pue or j.carbon_g_per_kwh != choice.g_per_kwh or j.carbon_zone != zone
            or j.carbon_source != choice.source or j.carbon_flag != choice.flag
        )  # fmt: skip
        if co2_changed:
            changed += 1
            job_updates.append(
                {
                    "_pk": j.id,
                    "co2_g": co2,
                    "pue": pue,
                    "carbon_zone": zone,
                    "carbon_g_per_kwh": choice.g_per_kwh,
                    "carbon_source": choice.source[:128],
                    "carbon_flag": choice.flag[:64] if choice.flag else None,
                    "carbon_year": choice.detail.get("year"),
                }
            )
        elapsed_h = (t1 - t0) / 3600.0
        d0, d1 = _day_floor(t0), _day_floor(t1 if t1 > t0 else t0)
        if hours:
            e = sum(u.energy_j for u in hours.values())
            seconds = sum(u.seconds for u in hours.values())
            peaks = [u.mem_peak_mb for u in hours.values() if u.mem_peak_mb is not None]
            # the job's ledger: the GPUs' share of a node-level measurement, then idle energy within it
            rows = energy_rows.get(j.id, [])
            split_to = _split_rows(rows, e, seconds, j.alloc_gpus or 0, t1 - t0)
            if split_to is not None:
                split_updates.append((j.id, split_to))
                rows = [r for r in rows if r[1] not in _SPLIT_SOURCES] + [(*w, "") for w in split_to]
            gpu_j = sum(r[2] for r in rows if r[0] == "gpu")
            gpu = (
                (sum(u.util_energy for u in hours.values()) / e) if e > 0 else None,
                seconds,
                sum(u.idle_s for u in hours.values()),
                clamp_idle(sum(u.idle_j for u in hours.values()), j.energy_j or 0.0, gpu_j),
                e,
                max(peaks) if peaks else None,
            )
        else:
            gpu = _NO_GPU_USE
            erows = energy_rows.get(j.id)
            split_to = _split_rows(erows, 0.0, 0.0, j.alloc_gpus or 0, t1 - t0) if erows else None
            if split_to is not None:  # a split whose samples are gone: the node's row whole again
                split_updates.append((j.id, split_to))
        embodied = (j.alloc_gpus or 0) * elapsed_h * emb.g_per_gpu_hour + max(
            j.n_nodes or 0, 1 if t1 > t0 else 0
        ) * elapsed_h * emb.g_per_node_hour
        detail = choice.detail_json or json.dumps(choice.detail)  # compared as stored (json keeps the text)
        values = (embodied, *gpu, detail, d0, d1)
        prev = old.get(j.id)
        same = _same_metrics(prev, values, j.updated_at)
        if not same:
            metrics.append(
                {
                    "job_pk": j.id,
                    **dict(zip(_METRIC_VALUES[:7], values[:7], strict=True)),
                    "carbon_detail": choice.detail,
                    "rolled_from": datetime.fromtimestamp(d0, UTC),
                    "rolled_to": datetime.fromtimestamp(d1, UTC),
                    "computed_at": datetime.now(UTC),
                    "_detail": detail,
                }
            )
        resplit = bool(split_updates) and split_updates[-1][0] == j.id
        if j.id in must or not same or co2_changed or resplit:
            days.add(d0)
            if d1 > d0:
                days.update(_days(d0, d1))
            if prev is not None and prev[1 + _N_PLAIN] is not None and prev[2 + _N_PLAIN] is not None:
                days.update(_days(_epoch_of(prev[1 + _N_PLAIN]), _epoch_of(prev[2 + _N_PLAIN])))
    _write_splits(conn, split_updates)
    if conn.dialect.name == "postgresql":
        _write_pg(conn, job_updates, metrics)
        return changed, days
    if job_updates:
        conn.execute(
            update(cast(Table, Job.__table__))
            .where(J.id == bindparam("_pk"))
            .values({**{k: bindparam(k) for k in job_updates[0] if k != "_pk"}, "updated_at": J.updated_at}),
            job_updates,
        )
    if metrics:
        conn.execute(delete(M).where(M.c.job_pk.in_([m["job_pk"] for m in metrics])))
        conn.execute(insert(M), [{k: v for k, v in m.items() if k != "_detail"} for m in metrics])
    return changed, days


# What a job_metrics row holds besides its key and computed_at: a row whose values come out the same and
# that is newer than the job's last change is left as it is (a full recompute then writes nothing).
_METRIC_VALUES = (
    "co2_embodied_g", "gpu_util_pct", "gpu_samples_s", "idle_gpu_s", "idle_gpu_energy_j", "gpu_samples_j",
    "gpu_mem_peak_mb", "carbon_detail", "rolled_from", "rolled_to",
)  # fmt: skip
_N_PLAIN = len(_METRIC_VALUES) - 2  # compared as they are (the detail as JSON text); then the days
_AT_SAMPLES_S = 1 + _METRIC_VALUES.index("gpu_samples_s")  # in a row read as _METRIC_READ
_UNSAMPLED = (None,) * (2 + len(_METRIC_VALUES))
_METRIC_READ = (
    M.c.job_pk,
    *(sql_cast(M.c[k], Text) if k == "carbon_detail" else M.c[k] for k in _METRIC_VALUES),
    M.c.computed_at,
)
_JOB_UPDATE = (
    "co2_g", "pue", "carbon_zone", "carbon_g_per_kwh", "carbon_source", "carbon_flag", "carbon_year",
)  # fmt: skip


_NO_GPU_USE: tuple[float | None, float, float, float, float, float | None] = (None, 0.0, 0.0, 0.0, 0.0, None)
_SPLIT_SOURCES = (SOURCE_SAMPLES, SOURCE_NODE)


Rows = list[tuple[str, str, float, str]]  # a job's job_energy rows: (component, source, J, node)


def _energy_rows(conn: Connection, pks: list[int]) -> dict[int, Rows]:
    """These jobs' job_energy rows that the ledger reads: GPU rows and those of a node-level measurement."""
    out: dict[int, Rows] = defaultdict(list)
    pks = sorted(pks)
    for i in range(0, len(pks), 5000):
        q = select(E.job_pk, E.component, E.source, E.energy_j, E.node).where(
            _among(conn, E.job_pk, pks[i : i + 5000]),
            or_(E.component == "gpu", E.source.in_(_SPLIT_SOURCES)),  # all that _split_rows reads
        )
        for pk, comp, src, e, node in conn.execute(q):
            out[pk].append((comp, src, float(e or 0.0), node or ""))
    return out


def _split_rows(
    rows: Rows, samples_j: float, samples_s: float, gpus: int, elapsed_s: float
) -> list[tuple[str, str, float]] | None:
    """The rows (component, source, J) a job's node-level measurement should be
    (cocaq.accounting.ledger.split_node),
    or None where they already are, or the job has no such measurement of the whole job (or GPU energy
    of its own: counters, estimates)."""
    mine = [r for r in rows if r[1] in _SPLIT_SOURCES]
    if not any(r[1] == SOURCE_NODE for r in mine) or any(r[3] for r in mine):
        return None
    if any(r[0] == "gpu" and r[1] != SOURCE_SAMPLES for r in rows):
        return None
    total = sum(r[2] for r in mine)
    split = split_node(total, samples_j, samples_s, gpus, elapsed_s)
    want = (
        [("node", SOURCE_NODE, total)]
        if split is None
        else [("gpu", SOURCE_SAMPLES, split.gpu_j), ("node", SOURCE_NODE, split.node_j)]
    )
    have = sorted((c, s, e) for c, s, e, _n in mine)
    if len(have) == len(want) and all(
        a[:2] == b[:2] and abs(a[2] - b[2]) <= 1e-9 * max(total, 1.0)
        for a, b in zip(have, sorted(want), strict=True)
    ):
        return None
    return want


def _write_splits(conn: Connection, splits: list[tuple[int, list[tuple[str, str, float]]]]) -> None:
    """Replace the split rows of these jobs (the job's total and measured energy do not change)."""
    if not splits:
        return
    et = cast(Table, JobEnergy.__table__)
    pks = [pk for pk, _ in splits]
    for i in range(0, len(pks), 5000):
        conn.execute(
            delete(et).where(
                et.c.job_pk.in_(pks[i : i + 5000]), et.c.source.in_(_SPLIT_SOURCES), et.c.node == ""
            )
        )
    conn.execute(
        insert(et),
        [
            {"job_pk": pk, "node": "", "component": c, "method": "measured", "source": src, "energy_j": e}
            for pk, rows in splits
            for c, src, e in rows
        ],
    )


def _epoch_of(d: datetime | float) -> float:
    if isinstance(d, float):
        return d
    return (d if d.tzinfo is not None else d.replace(tzinfo=UTC)).timestamp()


def _ts(col: Any) -> Any:
    """A time as _process_batch reads it: epoch seconds, exact on both dialects (no datetime objects to
    make for a million rows)."""
    return epoch_exact(col).label(col.name)


def _same_metrics(prev: Any, values: tuple[Any, ...], updated_at: datetime | None) -> bool:
    """Whether the stored row `prev` (as _METRIC_READ) already says `values` (the _METRIC_VALUES, the
    detail as JSON text, the days as epoch seconds), and was computed after the job last changed."""
    n = _N_PLAIN
    if prev is None or prev[n + 3] is None or updated_at is None:
        return False
    if not _epoch_of(prev[n + 3]) > _epoch_of(updated_at):
        return False  # stale: computed_at must move past updated_at (see _changed_jobs)
    if prev[1 : n + 1] != values[:n] or prev[n + 1] is None or prev[n + 2] is None:
        return False
    return _epoch_of(prev[n + 1]) == values[n] and _epoch_of(prev[n + 2]) == values[n + 1]


def _write_pg(conn: Connection, job_updates: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> None:
    """PostgreSQL: COPY into temporary tables, then one UPDATE ... FROM and one INSERT ... ON CONFLICT."""

    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cur:
        if job_updates:
            cur.execute(
                "CREATE TEMP TABLE IF NOT EXISTS cocaq_agg_jobs ON COMMIT DELETE ROWS AS "
                f"SELECT id, {', '.join(_JOB_UPDATE)} FROM jobs WITH NO DATA"
            )
            with cur.copy(f"COPY cocaq_agg_jobs (id, {', '.join(_JOB_UPDATE)}) FROM STDIN") as cp:
                for u in job_updates:
                    cp.write_row([u["_pk"], *(u[k] for k in _JOB_UPDATE)])
            cur.execute(
                f"UPDATE jobs SET {', '.join(f'{k} = t.{k}' for k in _JOB_UPDATE)} "
                "FROM cocaq_agg_jobs t WHERE jobs.id = t.id"
            )
        if metrics:
            cols = ("job_pk", *_METRIC_VALUES, "computed_at")
            cur.execute(
                "CREATE TEMP TABLE IF NOT EXISTS cocaq_agg_metrics ON COMMIT DELETE ROWS AS "
                f"SELECT {', '.join(cols)} FROM job_metrics WITH NO DATA"
            )
            with cur.copy(f"COPY cocaq_agg_metrics ({', '.join(cols)}) FROM STDIN") as cp:
                for m in metrics:
                    cp.write_row([m["_detail"] if k == "carbon_detail" else m[k] for k in cols])
            cur.execute(
                f"INSERT INTO job_metrics ({', '.join(cols)}) "
                f"SELECT {', '.join(cols)} FROM cocaq_agg_metrics ON CONFLICT (job_pk) DO UPDATE SET "
                + ", ".join(f"{k} = EXCLUDED.{k}" for k in cols[1:])
            )


def _among(conn: Connection, col: Any, pks: list[int]) -> Any:
    """`col IN pks` (sorted ids), cheap on PostgreSQL: a range where the ids are dense, else one array."""
    if conn.dialect.name != "postgresql" or not pks:
        return col.in_(pks)
    if pks[-1] - pks[0] < 2 * len(pks):
        return col.between(pks[0], pks[-1])
    from sqlalchemy import BigInteger, any_
    from sqlalchemy.dialects.postgresql import ARRAY

    return col == any_(bindparam("pks", pks, type_=ARRAY(BigInteger)))


def _big_work_mem(conn: Connection) -> None:
    """PostgreSQL: a bigger work_mem for this transaction (the year-wide sorts and hashes stay in memory)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL work_mem = '{WORK_MEM}'")


def _days(d0: float, d1: float) -> list[float]:
    out = []
    d = d0
    while d <= d1:
        out.append(d)
        d += DAY
    return out


# --- daily rollups ------------------------------------------------------------------------------------


def _ranges(days: Iterable[float]) -> list[tuple[float, float]]:
    """Contiguous [first, last] runs of day starts."""
    out: list[tuple[float, float]] = []
    for d in sorted(days):
        if out and d - out[-1][1] <= DAY + 1:
            out[-1] = (out[-1][0], d)
        else:
            out.append((d, d))
    return out


def _rebuild_days(
    conn: Connection, days: set[float], *, in_sql: bool | None = None, wide: bool | None = None
) -> int:
    """Rebuild the rollups of these days; on PostgreSQL in one statement per range (`in_sql`, `wide`:
    force the way, for tests)."""
    if in_sql is None:
        in_sql = conn.dialect.name == "postgresql"
    rows = 0
    for first, last in _ranges(days):
        lo, hi = datetime.fromtimestamp(first, UTC), datetime.fromtimestamp(last + DAY, UTC)
        if in_sql:
            rows += _rebuild_range_pg(conn, lo, hi, first, last, wide)
            continue
        jobs = conn.execute(
            select(
                J.id, J.cluster_id, J.user_name, J.account, J.partition, J.start_time, J.elapsed_s,
                J.alloc_cpus, J.alloc_gpus, J.state, J.energy_j, J.energy_measured_j, J.co2_g,
                J.energy_est_low_j, J.energy_est_high_j, M.c.co2_embodied_g, M.c.gpu_util_pct,
                M.c.gpu_samples_s, M.c.idle_gpu_s, M.c.gpu_samples_j, M.c.idle_gpu_energy_j,
            )
            .outerjoin(M, M.c.job_pk == J.id)
            .where(J.start_time < hi, or_(J.end_time >= lo, J.end_time.is_(None)), J.start_time.is_not(None))
        ).all()  # fmt: skip
        comp: dict[int, dict[str, float]] = defaultdict(dict)
        ids = [j.id for j in jobs]
        for i in range(0, len(ids), 20_000):
            for pk, c, e in conn.execute(
                select(E.job_pk, E.component, func.sum(E.energy_j))
                .where(E.job_pk.in_(ids[i : i + 20_000]))
                .group_by(E.job_pk, E.component)
            ):
                comp[pk][c] = e or 0.0
        acc: dict[tuple[Any, ...], list[float]] = {}
        for j in jobs:
            start = as_utc(j.start_time)
            assert start is not None
            t0 = start.timestamp()
            el = max(j.elapsed_s or 0.0, 0.0)
            t1 = t0 + el
            d = _day_floor(t0)
            while d <= t1 and d <= last:
                if d >= first:
                    frac = share(t0, el, d, d + DAY)
                    if frac > 0:
                        _add(acc, j, d, frac, overlap(t0, el, d, d + DAY), comp.get(j.id, {}))
                d += DAY
        conn.execute(delete(R).where(R.c.day >= lo, R.c.day < hi))
        if acc:
            batch = [_rollup_row(k, v) for k, v in acc.items()]
            for i in range(0, len(batch), 10_000):
                conn.execute(insert(R), batch[i : i + 10_000])
            rows += len(batch)
    return rows


_KEYS = ("cluster_id", "day", "user_name", "account", "partition")


def _rebuild_range_pg(
    conn: Connection, lo: datetime, hi: datetime, first: float, last: float, wide: bool | None
) -> int:
    """One range of days on PostgreSQL: the rows computed into a temporary table, then only the
    differences written (most rows of a recompute come out the same, and rewriting a year's rows and
    their five indexes costs more than computing them). Returns the range's row count."""
    _big_work_mem(conn)
    if wide is None:
        wide = (last - first) / DAY + 1 > WIDE_DAYS
    # One query that runs once: compiling it (JIT) costs seconds and saves nothing. Its groups (about a
    # quarter of the jobs) fit in memory: hashing them beats sorting a million job-days.
    conn.exec_driver_sql("SET LOCAL jit = off")
    conn.exec_driver_sql("SET LOCAL enable_sort = off")
    conn.exec_driver_sql("DROP TABLE IF EXISTS cocaq_rollup_new")
    sql = _ROLLUP_PG_WIDE if wide else _ROLLUP_PG_NARROW
    params = {"lo": lo, "hi": hi, "first": first, "last": last}
    conn.execute(text(f"CREATE TEMP TABLE cocaq_rollup_new ON COMMIT DROP AS {sql}"), params)
    conn.exec_driver_sql("SET LOCAL enable_sort = on")
    conn.exec_driver_sql("ANALYZE cocaq_rollup_new")
    same_key = " AND ".join(f"r.{k} = t.{k}" for k in _KEYS)
    vals = ", ".join(_FIELDS)
    conn.execute(
        text(
            "DELETE FROM daily_rollups r WHERE r.day >= :lo AND r.day < :hi"
            f" AND NOT EXISTS (SELECT 1 FROM cocaq_rollup_new t WHERE {same_key})"
        ),
        {"lo": lo, "hi": hi},
    )
    new_vals = ", ".join("t." + f for f in _FIELDS)
    old_vals = ", ".join("r." + f for f in _FIELDS)
    conn.exec_driver_sql(
        f"UPDATE daily_rollups r SET ({vals}, computed_at) = ({new_vals}, now())"
        f" FROM cocaq_rollup_new t WHERE {same_key} AND ({old_vals}) IS DISTINCT FROM ({new_vals})"
    )
    # New rows by the unique key's index. (An anti-join here was quadratic on a first run: the table's
    # statistics said empty, so each new row scanned the heap the statement itself was growing.)
    inserted = conn.exec_driver_sql(
        f"INSERT INTO daily_rollups ({', '.join(_KEYS)}, {vals}) SELECT {', '.join(_KEYS)}, {vals}"
        f" FROM cocaq_rollup_new t ON CONFLICT ({', '.join(_KEYS)}) DO NOTHING"
    ).rowcount
    if inserted > 10_000:  # the next ranges' plans must not take the table for the empty one it was
        conn.exec_driver_sql("ANALYZE daily_rollups")
    n = conn.exec_driver_sql("SELECT count(*) FROM cocaq_rollup_new").scalar_one()
    conn.exec_driver_sql("DROP TABLE cocaq_rollup_new")
    return int(n)


# PostgreSQL: the same rows as _add/_rollup_row below, computed in one query per range of days [first,
# last] (epoch seconds of UTC midnights): each job counts in the days d from its start's day while d <= its
# end and d <= last, kept where d >= first and it ran in d (or, with no run time, started in d).
# Two ways to get each job's energy by component: for a few days' jobs, an index lookup per job; for a
# long range (a full recompute), one pass over job_energy hashed by job. Jobs within one day (most of
# them) skip generate_series, whose row estimate would otherwise mislead the planner.
_ROLLUP_JOBS = """
WITH j AS (
    SELECT j.id, j.cluster_id, j.user_name, coalesce(j.account, '') AS account,
           coalesce(j.partition, '') AS partition, split_part(coalesce(j.state, ''), ' ', 1) AS st,
           extract(epoch FROM j.start_time)::float8 AS t0, greatest(coalesce(j.elapsed_s, 0.0), 0.0) AS el,
           coalesce(j.alloc_cpus, 0) AS cpus, coalesce(j.alloc_gpus, 0) AS gpus,
           coalesce(j.energy_j, 0.0) AS energy, coalesce(j.energy_measured_j, 0.0) AS measured,
           coalesce(j.energy_est_low_j, coalesce(j.energy_j, 0.0) - coalesce(j.energy_measured_j, 0.0))
               AS est_lo,
           coalesce(j.energy_est_high_j, coalesce(j.energy_j, 0.0) - coalesce(j.energy_measured_j, 0.0))
               AS est_hi,
           coalesce(j.co2_g, 0.0) AS co2, coalesce(m.co2_embodied_g, 0.0) AS embodied, m.gpu_util_pct AS util,
           coalesce(m.gpu_samples_j, 0.0) AS util_j,
           coalesce(m.idle_gpu_s, 0.0) AS idle_s, coalesce(m.idle_gpu_energy_j, 0.0) AS idle_j,
           coalesce(c.gpu, 0.0) AS e_gpu, coalesce(c.cpu, 0.0) AS e_cpu, coalesce(c.dram, 0.0) AS e_dram,
           coalesce(c.other, 0.0) AS e_other
    FROM jobs j LEFT JOIN job_metrics m ON m.job_pk = j.id
    {energy}
    WHERE j.start_time < :hi AND (j.end_time >= :lo OR j.end_time IS NULL) AND j.start_time IS NOT NULL
), x AS (
    SELECT j.*, k.day, {ov} AS ov
    FROM j CROSS JOIN LATERAL (SELECT floor(j.t0 / 86400.0) * 86400.0 AS day) k
    WHERE floor(j.t0 / 86400.0) = floor(least(j.t0 + j.el, CAST(:last AS float8)) / 86400.0)
    UNION ALL
    SELECT j.*, k.day, {ov} AS ov
    FROM j CROSS JOIN LATERAL (
        SELECT n * 86400.0::float8 AS day
        FROM generate_series(
            floor(j.t0 / 86400.0)::bigint, floor(least(j.t0 + j.el, CAST(:last AS float8)) / 86400.0)::bigint
        ) AS n
    ) k
    WHERE floor(j.t0 / 86400.0) <> floor(least(j.t0 + j.el, CAST(:last AS float8)) / 86400.0)
), d AS (
    SELECT x.*, {frac} AS frac
    FROM x WHERE x.day >= CAST(:first AS float8)
)
SELECT cluster_id, to_timestamp(day) AS day, user_name, account, partition, count(*)::int AS jobs,
       {counts},
       sum(cpus * ov / 3600.0) AS cpu_hours, sum(gpus * ov / 3600.0) AS gpu_hours,
       sum(e_gpu * frac) AS energy_gpu_j, sum(e_cpu * frac) AS energy_cpu_j,
       sum(e_dram * frac) AS energy_dram_j, sum(e_other * frac) AS energy_other_j,
       sum(measured * frac) AS energy_measured_j, sum((energy - measured) * frac) AS energy_estimated_j,
       sum(est_lo * frac) AS energy_est_low_j, sum(est_hi * frac) AS energy_est_high_j,
       {parts},
       sum(co2 * frac) AS co2_g, sum(embodied * frac) AS co2_embodied_g,
       sum(CASE WHEN util IS NOT NULL THEN util_j * frac ELSE 0.0 END) AS gpu_util_energy_j,
       sum(CASE WHEN util IS NOT NULL THEN util * (util_j * frac) ELSE 0.0 END) AS gpu_util_weighted,
       sum(idle_s * frac / 3600.0) AS idle_gpu_hours
FROM d
WHERE frac > 0
GROUP BY cluster_id, day, user_name, account, partition
"""
_ENERGY_SUMS = """
           sum(coalesce(e.energy_j, 0.0)) FILTER (WHERE e.component = 'gpu') AS gpu,
           sum(coalesce(e.energy_j, 0.0)) FILTER (WHERE e.component = 'cpu') AS cpu,
           sum(coalesce(e.energy_j, 0.0)) FILTER (WHERE e.component = 'dram') AS dram,
           sum(coalesce(e.energy_j, 0.0)) FILTER (WHERE e.component NOT IN ('gpu', 'cpu', 'dram')) AS other
"""
# The ledger's disjoint parts (cocaq.accounting.ledger: idle GPUs, then failed, out of memory, timed out,
# cancelled)
_PARTS_PG = ",\n       ".join(
    f"sum(({outcome_sql(o, 'st', 'energy', 'idle_j', 'postgresql')}) * frac) AS {col}"
    for o, col in (("idle", "idle_gpu_energy_j"), *((o, f"energy_{o}_j") for o in OUTCOMES))
)
_COUNTS_PG = ",\n       ".join(f"sum({count_sql(o, 'st')})::int AS jobs_{o}" for o in OUTCOMES)
# Each job's share of a day (cocaq.accounting.window): ov seconds of it in [day, day + 1 day).
_OV_PG = overlap_sql("j.t0", "j.el", "k.day", "k.day + 86400.0", "postgresql")
_FRAC_PG = share_sql("x.t0", "x.el", "x.ov", [("x.day", "x.day + 86400.0")])
_ROLLUP_PG_NARROW = _ROLLUP_JOBS.format(
    energy=f"LEFT JOIN LATERAL (SELECT {_ENERGY_SUMS} FROM job_energy e WHERE e.job_pk = j.id) c ON true",
    parts=_PARTS_PG,
    counts=_COUNTS_PG,
    ov=_OV_PG,
    frac=_FRAC_PG,
)
_ROLLUP_PG_WIDE = _ROLLUP_JOBS.format(
    energy=f"LEFT JOIN (SELECT e.job_pk, {_ENERGY_SUMS} FROM job_energy e GROUP BY e.job_pk) c"
    " ON c.job_pk = j.id",
    parts=_PARTS_PG,
    counts=_COUNTS_PG,
    ov=_OV_PG,
    frac=_FRAC_PG,
)
WIDE_DAYS = 31  # ranges of more days than this take the one-pass variant

_FIELDS = (
    "jobs", "jobs_failed", "jobs_oom", "jobs_timeout", "jobs_cancelled", "cpu_hours", "gpu_hours",
    "energy_gpu_j", "energy_cpu_j", "energy_dram_j", "energy_other_j", "energy_measured_j",
    "energy_estimated_j", "energy_failed_j", "energy_oom_j", "energy_timeout_j", "energy_cancelled_j",
    "co2_g", "co2_embodied_g", "gpu_util_energy_j", "gpu_util_weighted", "idle_gpu_hours",
    "idle_gpu_energy_j", "energy_est_low_j", "energy_est_high_j",
)  # fmt: skip
_AT = {name: i for i, name in enumerate(_FIELDS)}


def _add(
    acc: dict[tuple[Any, ...], list[float]],
    j: Any,
    day: float,
    frac: float,
    ov: float,
    comp: dict[str, float],
) -> None:
    key = (j.cluster_id, day, j.user_name, j.account or "", j.partition or "")
    v = acc.get(key)
    if v is None:
        v = acc[key] = [0.0] * len(_FIELDS)
    a = _AT
    energy = j.energy_j or 0.0
    parts = waste(j.state, energy, j.idle_gpu_energy_j or 0.0)
    outcome = outcome_of(j.state)
    v[a["jobs"]] += 1
    if outcome is not None:
        v[a[f"jobs_{outcome}"]] += 1
    v[a["cpu_hours"]] += (j.alloc_cpus or 0) * ov / 3600.0
    v[a["gpu_hours"]] += (j.alloc_gpus or 0) * ov / 3600.0
    v[a["energy_gpu_j"]] += comp.get("gpu", 0.0) * frac
    v[a["energy_cpu_j"]] += comp.get("cpu", 0.0) * frac
    v[a["energy_dram_j"]] += comp.get("dram", 0.0) * frac
    v[a["energy_other_j"]] += sum(e for c, e in comp.items() if c not in ("gpu", "cpu", "dram")) * frac
    v[a["energy_measured_j"]] += (j.energy_measured_j or 0.0) * frac
    estimated = energy - (j.energy_measured_j or 0.0)
    v[a["energy_estimated_j"]] += estimated * frac
    # the estimate's range where the job has one (calibrated GPUs), else the estimate itself
    low, high = j.energy_est_low_j, j.energy_est_high_j
    v[a["energy_est_low_j"]] += (estimated if low is None else low) * frac
    v[a["energy_est_high_j"]] += (estimated if high is None else high) * frac
    for o in OUTCOMES:
        v[a[f"energy_{o}_j"]] += getattr(parts, o) * frac
    v[a["co2_g"]] += (j.co2_g or 0.0) * frac
    v[a["co2_embodied_g"]] += (j.co2_embodied_g or 0.0) * frac
    if j.gpu_util_pct is not None:  # weighted by the GPU energy its samples saw (also node-measured jobs)
        ge = (j.gpu_samples_j or 0.0) * frac
        v[a["gpu_util_energy_j"]] += ge
        v[a["gpu_util_weighted"]] += j.gpu_util_pct * ge
    v[a["idle_gpu_hours"]] += (j.idle_gpu_s or 0.0) * frac / 3600.0
    v[a["idle_gpu_energy_j"]] += parts.idle * frac


def _rollup_row(key: tuple[Any, ...], v: list[float]) -> dict[str, Any]:
    cid, day, user, account, partition = key
    row: dict[str, Any] = {
        "cluster_id": cid,
        "day": datetime.fromtimestamp(day, UTC),
        "user_name": user,
        "account": account,
        "partition": partition,
    }
    for name, x in zip(_FIELDS, v, strict=True):
        row[name] = int(x) if name.startswith("jobs") else x
    return row


# --- the run ------------------------------------------------------------------------------------------


def run_aggregate(
    engine: Engine,
    cfg: Config,
    *,
    since: datetime | None = None,
    full: bool = False,
    rescan_samples: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> AggregateSummary:
    """Derive job metrics and rebuild the days they touch; returns what it did.

    GPU use by hour (job_gpu_hours) is derived from the samples again only for jobs with newly shipped
    samples, from the hour before the first new one, unless the parameters it depends on changed or
    `rescan_samples` asks for every job's: samples once shipped do not change, and re-reading a year of
    them is most of a full recompute.
    """
    t_start = time.monotonic()
    res = AggregateSummary()
    st = cast(Table, AggregatorState.__table__)
    key = _gpu_params_key(cfg)
    with engine.begin() as conn:
        db_now = as_utc(conn.execute(select(utcnow())).scalar_one())
        state = {r.name: r for r in conn.execute(select(st.c.name, st.c.watermark, st.c.params))}
        wm = as_utc(state[WATERMARK].watermark) if WATERMARK in state else None
        gh = state.get(GPU_HOURS)
        sampled: Scope = {}
        if rescan_samples or gh is None or gh.params != key:
            res.gpu_hours_rows = _refresh_gpu_hours(conn, cfg, None)
            res.gpu_hours_jobs = -1  # every job's
        else:
            sampled = _new_samples(conn, as_utc(gh.watermark))
            res.gpu_hours_rows = _refresh_gpu_hours(conn, cfg, sampled)
            res.gpu_hours_jobs = sum(len(v) for v in sampled.values())
        _set_state(conn, GPU_HOURS, db_now, key)
        t = res.lap("gpu hours from samples", t_start)
        pks, must = _changed_jobs(conn, since, full, wm, sampled)
        t = res.lap("choosing jobs", t)
    days: set[float] = set()
    done = 0
    all_use = None
    if len(pks) > ONE_PASS:  # many jobs: read all of job_gpu_hours once rather than by the batch's ids
        with engine.connect() as conn:
            all_use = _read_gpu_hours(conn, None)
        t = res.lap("reading gpu hours", t)
    batches = [pks[i : i + BATCH] for i in range(0, len(pks), BATCH)]
    workers = _workers(engine, cfg, len(pks))
    if workers > 1:
        results = _derive_in_processes(engine, cfg, batches, must, all_use, workers)
    else:
        results = (_derive(engine, cfg, b, must, all_use) for b in batches)
    for n, changed, d in results:
        res.co2_changed += changed
        days |= d
        done += n
        if progress:
            progress(done, len(pks))
    res.jobs = len(pks)
    t = res.lap("deriving jobs", t)
    with engine.begin() as conn:
        if full:  # from scratch: days that only old rollups cover (their jobs deleted since) go too
            if days:  # one range from the first day to the last: days with no jobs in between are emptied
                d_lo, d_hi = min(days), max(days)
                outside = or_(
                    R.c.day < datetime.fromtimestamp(d_lo, UTC),
                    R.c.day >= datetime.fromtimestamp(d_hi + DAY, UTC),
                )
                conn.execute(delete(R).where(outside))
                days = set(_days(d_lo, d_hi))
            else:
                conn.execute(delete(R))
        res.rollup_rows = _rebuild_days(conn, days)
        res.days = len(days)
        _set_state(conn, WATERMARK, db_now, None)
    res.lap("rollups", t)
    res.seconds = time.monotonic() - t_start
    log.info("aggregate: %s", ", ".join(f"{k} {v:.2f} s" for k, v in res.phases.items()))
    return res


PARALLEL_MIN = 100_000  # jobs to derive from which worker processes pay for their start-up


def _workers(engine: Engine, cfg: Config, n_jobs: int) -> int:
    """Processes to derive jobs in: only for many jobs on PostgreSQL (SQLite has one writer)."""
    if engine.dialect.name != "postgresql" or n_jobs < PARALLEL_MIN:
        return 1
    import os

    return min(cfg.aggregate.workers or os.cpu_count() or 1, (n_jobs + BATCH - 1) // BATCH)


def _derive(
    engine: Engine,
    cfg: Config,
    batch: list[int],
    must: set[int],
    all_use: dict[tuple[int, str], dict[float, GpuUse]] | None,
) -> tuple[int, int, set[float]]:
    with engine.begin() as conn:
        changed, days = _process_batch(conn, cfg, batch, must, all_use)
    return len(batch), changed, days


# In a worker process (spawned: the scheduler runs the aggregator in a thread, and forking a threaded
# process is unsafe): its own engine, the run's config and GPU use, set once by _init_worker.
_WORKER: dict[str, Any] = {}


def _init_worker(url: str, cfg: Config, all_use: dict[tuple[int, str], dict[float, GpuUse]] | None) -> None:
    from cocaq.db.engine import make_engine

    _WORKER.update(engine=make_engine(url, check=False), cfg=cfg, all_use=all_use)


def _derive_in_worker(task: tuple[list[int], set[int]]) -> tuple[int, int, set[float]]:
    batch, must = task
    return _derive(_WORKER["engine"], _WORKER["cfg"], batch, must, _WORKER["all_use"])


def _derive_in_processes(
    engine: Engine,
    cfg: Config,
    batches: list[list[int]],
    must: set[int],
    all_use: dict[tuple[int, str], dict[float, GpuUse]] | None,
    workers: int,
) -> Iterable[tuple[int, int, set[float]]]:
    """Batches derived by `workers` processes, each with its own connection and transactions (a batch is
    a transaction either way). A failing batch raises here, as it would in-process."""
    import multiprocessing

    log.info("aggregate: deriving %d batches in %d processes", len(batches), workers)
    tasks = [(b, must.intersection(b)) for b in batches]
    ctx = multiprocessing.get_context("spawn")
    url = engine.url.render_as_string(hide_password=False)
    with ctx.Pool(workers, initializer=_init_worker, initargs=(url, cfg, all_use)) as pool:
        yield from pool.imap_unordered(_derive_in_worker, tasks)


def _set_state(conn: Connection, name: str, watermark: datetime | None, params: str | None) -> None:
    st = cast(Table, AggregatorState.__table__)
    values = {"watermark": watermark, "params": params}
    if conn.execute(update(st).where(st.c.name == name).values(values)).rowcount == 0:
        conn.execute(insert(st).values(name=name, **values))
