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

This module chooses the jobs, derives each one's metrics and runs the whole; the GPU use by hour it reads
is derived from the samples in `cocaq.accounting.gpu_hours`, and the days are rebuilt by
`cocaq.accounting.rollups`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

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
    update,
)
from sqlalchemy import cast as sql_cast

from cocaq.accounting import shifting
from cocaq.accounting.gpu_hours import GpuUse, Scope, gpu_params_key, read_gpu_hours, refresh_gpu_hours
from cocaq.accounting.ledger import SOURCE_NODE, SOURCE_SAMPLES, clamp_idle, split_node
from cocaq.accounting.rollups import (
    DAY,
    PARALLEL_DAYS,
    day_floor,
    day_starts,
    rebuild_days,
    rebuild_days_parallel,
)
from cocaq.accounting.sessions import Sessions
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import (
    AggregatorState,
    CarbonIntensity,
    DailyRollup,
    Job,
    JobEnergy,
    JobMetrics,
    NodeShipment,
)
from cocaq.db.sqlfuncs import epoch_exact, utcnow
from cocaq.hostlist import expand_hostlist
from cocaq.units import S_PER_HOUR, co2_grams

if TYPE_CHECKING:
    from cocaq.carbon.intensity import Choice, IntensityIndex

log = logging.getLogger(__name__)

BATCH = 20_000
ONE_PASS = 50_000  # jobs to derive at or over which the GPU samples are read in one pass
WATERMARK = "jobs"
SHIFTS = "shifts"  # aggregator_state: the data and settings behind the jobs' when-to-run figures
GPU_HOURS = "gpu_hours"  # aggregator_state: when job_gpu_hours were brought up to date, and with what
# Changes are picked up from `watermark - MARGIN`: a transaction that started before the last run (its
# now() is earlier) but committed after it is still seen. Re-deriving a few jobs twice costs little.
MARGIN = timedelta(minutes=10)

J = cast(Table, Job.__table__).c
M = cast(Table, JobMetrics.__table__)
R = cast(Table, DailyRollup.__table__)
E = cast(Table, JobEnergy.__table__).c
NS = cast(Table, NodeShipment.__table__).c
CI = cast(Table, CarbonIntensity.__table__).c


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


# --- per-job metrics -----------------------------------------------------------------------------------


_Plan = tuple[Any, Any, str, float, float]  # a job (as _read_batch reads it), its hardware, zone, start, end
_GpuFigures = tuple[float | None, float, float, float, float, float | None]  # as _METRIC_VALUES[1:7]
_Split = list[tuple[str, str, float]]  # the rows (component, source, J) a node-level measurement becomes


@dataclass
class _Batch:
    """What each job of a batch is derived with, and what the jobs come out as (written at the end)."""

    cfg: Config
    use: dict[tuple[int, str], dict[float, GpuUse]]  # GPU use by hour, per cluster and raw id
    energy_rows: dict[int, Rows]  # the job_energy rows the ledger reads (_ledger_rows)
    index: IntensityIndex
    shifts: dict[int, shifting.Figures]
    old: dict[int, Any]  # the stored job_metrics rows (as _METRIC_READ, then the days and computed_at)
    must: set[int]  # jobs whose days are rebuilt whatever comes out
    changed: int = 0  # jobs with new CO2
    job_updates: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    splits: list[tuple[int, _Split]] = field(default_factory=list)
    days: set[float] = field(default_factory=set)


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
    jobs, old = _read_batch(conn, pks)
    use = all_use if all_use is not None else _read_use(conn, jobs)
    plans, zones, t_lo, t_hi = _plan(cfg, jobs)
    if not plans:
        return 0, set()
    index, shifts = _intensity_and_shifts(conn, cfg, plans, zones, t_lo, t_hi)
    b = _Batch(cfg, use, _ledger_rows(conn, jobs, use, old), index, shifts, old, must)
    for plan in plans:
        _derive_job(b, plan)
    _write_splits(conn, b.splits)
    if conn.dialect.name == "postgresql":
        _write_pg(conn, b.job_updates, b.metrics)
    else:
        _write_sqlite(conn, b.job_updates, b.metrics)
    return b.changed, b.days


def _read_batch(conn: Connection, pks: list[int]) -> tuple[list[Any], dict[int, Any]]:
    """The batch's jobs, and their stored metrics rows by job (what a new derivation is compared with)."""
    jobs = conn.execute(
        select(
            J.id, J.cluster_id, J.job_id_raw, J.partition, J.node_list, _ts(J.start_time), J.elapsed_s,
            J.alloc_gpus, J.n_nodes, J.energy_j, J.pue, J.carbon_zone, J.carbon_g_per_kwh, J.co2_g,
            J.carbon_source, J.carbon_flag, _ts(J.updated_at), J.energy_measured_j, J.time_limit_s, J.name,
            J.is_open, J.slurm_gpu_util, J.slurm_gpu_mem_mb, J.qos, J.batch_step,
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
    return list(jobs), old


def _read_use(conn: Connection, jobs: list[Any]) -> dict[tuple[int, str], dict[float, GpuUse]]:
    """The GPU jobs' use by hour (job_gpu_hours), per cluster and raw id."""
    keys: dict[int, list[str]] = defaultdict(list)
    for j in jobs:
        if j.alloc_gpus and j.job_id_raw is not None:
            keys[j.cluster_id].append(str(j.job_id_raw))
    return read_gpu_hours(conn, keys) if keys else {}


def _plan(cfg: Config, jobs: list[Any]) -> tuple[list[_Plan], set[str], float, float]:
    """Each job with its hardware, carbon zone and run [t0, t1); the zones and the span they cover."""
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
    return plans, zones, t_lo, t_hi


def _intensity_and_shifts(
    conn: Connection, cfg: Config, plans: list[_Plan], zones: set[str], t_lo: float, t_hi: float
) -> tuple[IntensityIndex, dict[int, shifting.Figures]]:
    """One intensity index per batch, over the batch's span and the hours after the runs that their best
    starts read; and each job's when-to-run figures from it."""
    from cocaq.carbon.intensity import IntensityIndex

    slack = cfg.shifting.slack_s
    sessions = Sessions.of(cfg.advice)
    shift_jobs = [
        shifting.Job(
            j.id, zone, t0, t1 - t0, j.time_limit_s,
            sessions.holds(j.name, j.partition, j.qos, None if j.batch_step is None else bool(j.batch_step)),
            bool(j.is_open),
        )
        for j, _, zone, t0, t1 in plans
    ]  # fmt: skip
    t_hi = max([t_hi, *(shifting.window_end(s, slack) for s in shift_jobs if not s.running)])
    index = IntensityIndex.load(
        conn,
        zones,
        datetime.fromtimestamp(t_lo, UTC),
        datetime.fromtimestamp(t_hi, UTC) + timedelta(seconds=1),
        cfg.carbon.basis,
        cfg.carbon.gap_tolerance_s,
    )
    return index, shifting.derive(index, shift_jobs, slack)


def _ledger_rows(
    conn: Connection, jobs: list[Any], use: dict[tuple[int, str], dict[float, GpuUse]], old: dict[int, Any]
) -> dict[int, Rows]:
    """The job_energy rows of only the jobs whose ledger can need them: those with GPU samples (their GPU
    energy caps the idle energy; a node row to split), and those whose samples are gone since a split
    (measured, and sampled when last derived: their node row is made whole again). A full recompute of a
    million jobs would otherwise read every GPU job's rows for nothing."""
    return _energy_rows(
        conn,
        [
            j.id
            for j in jobs
            if j.alloc_gpus
            and (
                use.get((j.cluster_id, str(j.job_id_raw)))
                or ((j.energy_measured_j or 0.0) > 0 and (old.get(j.id) or _UNSAMPLED)[_AT_SAMPLES_S])
                or j.slurm_gpu_util is not None
            )
        ],
    )


def _derive_job(b: _Batch, plan: _Plan) -> None:
    """One job: its CO2, GPU use, ledger split, embodied CO2 and when-to-run figures; what changed goes
    to `b`'s updates, and its days (now, and where it was counted before) to the rebuild."""
    j, hw, zone, t0, t1 = plan
    hours = _own_hours(b.use, j, t0, t1)
    choice, co2, co2_changed = _carbon(b, j, hw, zone, t0, t1, hours)
    elapsed_h = (t1 - t0) / S_PER_HOUR
    d0, d1 = day_floor(t0), day_floor(t1 if t1 > t0 else t0)
    gpu, source, split_to = _gpu_use(b, j, t0, t1, hours)
    if split_to is not None:
        b.splits.append((j.id, split_to))
    emb = b.cfg.embodied
    embodied = (j.alloc_gpus or 0) * elapsed_h * emb.g_per_gpu_hour + max(
        j.n_nodes or 0, 1 if t1 > t0 else 0
    ) * elapsed_h * emb.g_per_node_hour
    detail = choice.detail_json or json.dumps(choice.detail)  # compared as stored (json keeps the text)
    sh = b.shifts[j.id]
    shift = (
        sh.state, sh.slack_s, sh.now_g, sh.best_g, sh.best_start, sh.pause_g, *sh.saved(co2),
    )  # fmt: skip
    values = (embodied, *gpu, source, detail, *shift, d0, d1)
    prev = b.old.get(j.id)
    same = _same_metrics(prev, values, j.updated_at)
    if not same:
        b.metrics.append(_metrics_row(j.id, values, choice, sh, shift, detail))
    if j.id in b.must or not same or co2_changed or split_to is not None:
        b.days.add(d0)
        if d1 > d0:
            b.days.update(day_starts(d0, d1))
        if prev is not None and prev[1 + _N_PLAIN] is not None and prev[2 + _N_PLAIN] is not None:
            b.days.update(day_starts(_epoch_of(prev[1 + _N_PLAIN]), _epoch_of(prev[2 + _N_PLAIN])))


def _own_hours(
    use: dict[tuple[int, str], dict[float, GpuUse]], j: Any, t0: float, t1: float
) -> dict[float, GpuUse]:
    """A GPU job's use by hour within its own run (a reused raw id's other runs are not its)."""
    hours = use.get((j.cluster_id, str(j.job_id_raw)), {}) if j.alloc_gpus else {}
    return {h: u for h, u in hours.items() if h + 3600.0 > t0 - 60 and h < t1 + 60}


def _carbon(
    b: _Batch, j: Any, hw: Any, zone: str, t0: float, t1: float, hours: dict[float, GpuUse]
) -> tuple[Choice, float, bool]:
    """The job's intensity (weighted by its GPU energy by hour where it has some), PUE and CO2; the job's
    row is updated where any of them changed. Returns (the intensity's choice, CO2, whether it changed)."""
    weights = [
        (max(h, t0), min(h + 3600.0, t1), u.energy_j) for h, u in sorted(hours.items()) if u.energy_j > 0
    ]
    weights = [w for w in weights if w[1] > w[0]]
    choice = b.index.for_interval(zone, t0, max(t1, t0 + 1e-3), weights or None)
    pue = b.cfg.pue_at(hw, datetime.fromtimestamp(t0, UTC) if b.cfg.pue_monthly else None)
    co2 = co2_grams(j.energy_j or 0.0, pue, choice.g_per_kwh)
    co2_changed = (
        j.co2_g != co2 or j.pue != pue or j.carbon_g_per_kwh != choice.g_per_kwh or j.carbon_zone != zone
        or j.carbon_source != choice.source or j.carbon_flag != choice.flag
    )  # fmt: skip
    if co2_changed:
        b.changed += 1
        b.job_updates.append(
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
    return choice, co2, co2_changed


def _gpu_use(
    b: _Batch, j: Any, t0: float, t1: float, hours: dict[float, GpuUse]
) -> tuple[_GpuFigures, str | None, _Split | None]:
    """The job's GPU use (utilisation, sampled seconds, idle seconds and energy, sampled energy, memory
    peak), where it comes from ("samples", "slurm", None), and the rows its node-level measurement should
    become (None: as they are)."""
    if hours:
        return _sampled_use(b, j, t0, t1, hours)
    erows = b.energy_rows.get(j.id)
    # no samples: a split whose samples are gone makes the node's row whole again
    split_to = _split_rows(erows, 0.0, 0.0, j.alloc_gpus or 0, t1 - t0) if erows else None
    if j.alloc_gpus and (j.slurm_gpu_util is not None or j.slurm_gpu_mem_mb is not None):
        gpu_j = sum(r[2] for r in b.energy_rows.get(j.id, []) if r[0] == "gpu")
        gpu = slurm_gpu_use(
            j.slurm_gpu_util, j.slurm_gpu_mem_mb, j.alloc_gpus, t1 - t0, j.energy_j or 0.0, gpu_j,
            b.cfg.aggregate.idle_gpu_util_pct,
        )  # fmt: skip
        return gpu, "slurm", split_to
    return _NO_GPU_USE, None, split_to


def _sampled_use(
    b: _Batch, j: Any, t0: float, t1: float, hours: dict[float, GpuUse]
) -> tuple[_GpuFigures, str | None, _Split | None]:
    """`_gpu_use` from the job's GPU samples by hour; the job's ledger: the GPUs' share of a node-level
    measurement, then idle energy within its GPU energy."""
    e = sum(u.energy_j for u in hours.values())
    seconds = sum(u.seconds for u in hours.values())
    peaks = [u.mem_peak_mb for u in hours.values() if u.mem_peak_mb is not None]
    rows = b.energy_rows.get(j.id, [])
    split_to = _split_rows(rows, e, seconds, j.alloc_gpus or 0, t1 - t0)
    if split_to is not None:
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
    return gpu, "samples", split_to


def _metrics_row(
    pk: int,
    values: tuple[Any, ...],
    choice: Choice,
    sh: shifting.Figures,
    shift: tuple[Any, ...],
    detail: str,
) -> dict[str, Any]:
    """The job_metrics row of these values (as _derive_job orders them), as both writers take it."""
    d0, d1 = values[-2], values[-1]
    return {
        "job_pk": pk,
        **dict(zip(_METRIC_VALUES[:8], values[:8], strict=True)),
        "carbon_detail": choice.detail,
        **dict(zip(_SHIFT_VALUES, shift, strict=True)),
        "shift_best_start": None if sh.best_start is None else datetime.fromtimestamp(sh.best_start, UTC),
        "rolled_from": datetime.fromtimestamp(d0, UTC),
        "rolled_to": datetime.fromtimestamp(d1, UTC),
        "computed_at": datetime.now(UTC),
        "_detail": detail,
    }


def _write_sqlite(conn: Connection, job_updates: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> None:
    """SQLite: the jobs' new carbon in one executemany, the metrics rows replaced (`_write_pg` elsewhere)."""
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


# What a job_metrics row holds besides its key and computed_at: a row whose values come out the same and
# that is newer than the job's last change is left as it is (a full recompute then writes nothing).
_METRIC_VALUES = (
    "co2_embodied_g", "gpu_util_pct", "gpu_samples_s", "idle_gpu_s", "idle_gpu_energy_j", "gpu_samples_j",
    "gpu_mem_peak_mb", "gpu_util_source", "carbon_detail", "shift_state", "shift_slack_s", "shift_now_g",
    "shift_best_g", "shift_best_start", "shift_pause_g", "shift_saved_g", "shift_pause_saved_g",
    "rolled_from", "rolled_to",
)  # fmt: skip
_SHIFT_VALUES = _METRIC_VALUES[9:-2]
_N_PLAIN = len(_METRIC_VALUES) - 2  # compared as they are (the detail as JSON text); then the days
_AT_SAMPLES_S = 1 + _METRIC_VALUES.index("gpu_samples_s")  # in a row read as _METRIC_READ
_UNSAMPLED = (None,) * (2 + len(_METRIC_VALUES))
_JOB_UPDATE = (
    "co2_g", "pue", "carbon_zone", "carbon_g_per_kwh", "carbon_source", "carbon_flag", "carbon_year",
)  # fmt: skip


_NO_GPU_USE: tuple[float | None, float, float, float, float, float | None] = (None, 0.0, 0.0, 0.0, 0.0, None)


def slurm_gpu_use(
    util_sum: float | None,
    mem_mb: float | None,
    gpus: int,
    elapsed_s: float,
    energy_j: float,
    gpu_j: float,
    idle_pct: float,
) -> tuple[float | None, float, float, float, float, float | None]:
    """A job's GPU use (as the samples' tuple) from Slurm's gres/gpuutil and gres/gpumem, for a job that
    no collector sampled: its mean utilisation per GPU over the whole run, and all of its GPU time and
    GPU energy idle when that mean is under the idle threshold (the mean is all Slurm keeps: a job whose
    GPUs idled part of the time and worked the rest is not counted as idle)."""
    gpu_s = gpus * max(elapsed_s, 0.0)
    util = None if util_sum is None else min(util_sum / gpus, 100.0)
    idle = util is not None and util < idle_pct and gpu_s > 0
    return (
        util,
        gpu_s if util is not None else 0.0,
        gpu_s if idle else 0.0,
        clamp_idle(gpu_j, energy_j, gpu_j) if idle else 0.0,
        gpu_j if util is not None else 0.0,
        mem_mb,
    )


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


_METRIC_READ = (
    M.c.job_pk,
    *(
        sql_cast(M.c[k], Text) if k == "carbon_detail" else _ts(M.c[k]) if k == "shift_best_start" else M.c[k]
        for k in _METRIC_VALUES
    ),
    M.c.computed_at,
)


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
    key = gpu_params_key(cfg)
    with engine.begin() as conn:
        db_now = as_utc(conn.execute(select(utcnow())).scalar_one())
        state = {r.name: r for r in conn.execute(select(st.c.name, st.c.watermark, st.c.params))}
        wm = as_utc(state[WATERMARK].watermark) if WATERMARK in state else None
        gh = state.get(GPU_HOURS)
        sampled: Scope = {}
        if rescan_samples or gh is None or gh.params != key:
            res.gpu_hours_rows = refresh_gpu_hours(conn, cfg, None)
            res.gpu_hours_jobs = -1  # every job's
        else:
            sampled = _new_samples(conn, as_utc(gh.watermark))
            res.gpu_hours_rows = refresh_gpu_hours(conn, cfg, sampled)
            res.gpu_hours_jobs = sum(len(v) for v in sampled.values())
        _set_state(conn, GPU_HOURS, db_now, key)
        t = res.lap("gpu hours from samples", t_start)
        shift_key = _shift_params(conn, cfg)
        before = _parse_shift_params(state[SHIFTS].params) if SHIFTS in state else None
        redo_all = before is not None and before[2] != shift_key[2]
        pks, must = _changed_jobs(conn, since, full or redo_all, wm, sampled)
        if not (full or redo_all) and before is not None and before[1] < shift_key[1]:
            # new intensity rows: the pending jobs of their zones (whose when-to-run window the series did
            # not reach) may have it now
            pks = sorted({*pks, *_pending_in(conn, shift_key[0], before[1])})
        _set_state(conn, SHIFTS, db_now, f"{shift_key[0]}:{shift_key[1]}|{shift_key[2]}")
        t = res.lap("choosing jobs", t)
    days: set[float] = set()
    done = 0
    all_use = None
    if len(pks) > ONE_PASS:  # many jobs: read all of job_gpu_hours once rather than by the batch's ids
        with engine.connect() as conn:
            all_use = read_gpu_hours(conn, None)
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
    sessions = Sessions.of(cfg.advice)
    with engine.begin() as conn:
        if full:  # from scratch: days that only old rollups cover (their jobs deleted since) go too
            if days:  # one range from the first day to the last: days with no jobs in between are emptied
                d_lo, d_hi = min(days), max(days)
                outside = or_(
                    R.c.day < datetime.fromtimestamp(d_lo, UTC),
                    R.c.day >= datetime.fromtimestamp(d_hi + DAY, UTC),
                )
                conn.execute(delete(R).where(outside))
                days = set(day_starts(d_lo, d_hi))
            else:
                conn.execute(delete(R))
        res.days = len(days)
        rollup_workers = _rollup_workers(engine, cfg, len(days))
        if rollup_workers == 1:  # the days and the watermark in one transaction
            res.rollup_rows = rebuild_days(conn, days, sessions=sessions)
            _set_state(conn, WATERMARK, db_now, None)
    if rollup_workers > 1:  # many days (a full recompute): the days in parts at once, then the watermark
        res.rollup_rows = rebuild_days_parallel(engine, days, rollup_workers, sessions=sessions)
        with engine.begin() as conn:
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


def _rollup_workers(engine: Engine, cfg: Config, n_days: int) -> int:
    """Connections to rebuild the days on: several only for many days on PostgreSQL."""
    if engine.dialect.name != "postgresql" or n_days <= PARALLEL_DAYS:
        return 1
    import os

    return max(min(cfg.aggregate.workers or os.cpu_count() or 1, n_days // PARALLEL_DAYS), 1)


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


def _shift_params(conn: Connection, cfg: Config) -> tuple[str, int, str]:
    """What the when-to-run figures depend on, as aggregator_state 'shifts' keeps it: the basis, the
    newest intensity row of it (ids only grow: rows added since are new hours, or new zones), and a hash
    of the settings, whose change makes every job's figures stale."""
    import hashlib

    from cocaq.carbon.series import kind_of

    kind = kind_of(cfg.carbon.basis)
    top = conn.execute(select(func.max(CI.id)).where(CI.kind == kind)).scalar()
    a = cfg.advice
    names = "\n".join(sorted(a.interactive_names))
    if a.interactive_partitions or a.interactive_qos:  # (only then: the settings' hash stays as it was)
        names += f"|{sorted(a.interactive_partitions)}|{sorted(a.interactive_qos)}"
    settings = hashlib.sha256(
        f"{cfg.shifting.slack_s!r}|{kind}|{cfg.carbon.gap_tolerance_s!r}|{names}".encode()
    ).hexdigest()[:16]
    return kind, int(top or 0), settings


def _parse_shift_params(params: str | None) -> tuple[str, int, str] | None:
    """`kind:top|settings` as _shift_params' caller stored it; None for anything else."""
    head, bar, settings = (params or "").partition("|")
    kind, colon, top = head.rpartition(":")
    if not (bar and colon and top.isdigit()):
        return None
    return kind, int(top), settings


def _pending_in(conn: Connection, kind: str, after: int) -> set[int]:
    """The pending jobs (when to run) in the zones with intensity rows newer than id `after`."""
    from cocaq.carbon.series import zone_key

    zones = set(conn.execute(select(CI.zone).where(CI.kind == kind, CI.id > after).distinct()).scalars())
    if not zones:
        return set()
    rows = conn.execute(
        select(M.c.job_pk, J.carbon_zone)
        .join(cast(Table, Job.__table__), J.id == M.c.job_pk)
        .where(M.c.shift_state == shifting.PENDING)
    )
    return {pk for pk, zone in rows if zone is not None and zone_key(zone) in zones}


def _set_state(conn: Connection, name: str, watermark: datetime | None, params: str | None) -> None:
    st = cast(Table, AggregatorState.__table__)
    values = {"watermark": watermark, "params": params}
    if conn.execute(update(st).where(st.c.name == name).values(values)).rowcount == 0:
        conn.execute(insert(st).values(name=name, **values))
