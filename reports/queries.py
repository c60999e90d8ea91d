"""The queries every report kind shares: which jobs (the scope), the month's rollups, its jobs and their
groups, and the blocks built of them (totals, trend, basis, series, models, the ledger's per-job facts).

The builders of each kind (`reports.user_report`, `lab_report`, `admin_report`) are made of these, so a
figure that two reports both show is computed by the same code. Its public names are the interface
those builders share (the rest of cocaq reads cocaq.footprint instead). Where each figure comes from, and
why:

* Totals, trends, daily and weekly series, per-user/lab/partition tables and rankings come from
  `daily_rollups`. A rollup row holds a UTC day's share of every job that ran in it (pro rata to its
  hours), so a UTC month is exactly the sum of its days and two months compare like for like; a month is
  a few thousand rows to read whatever the number of jobs.
* What a rollup cannot hold comes from `jobs` (+ `job_metrics`), each job weighted by the share of its
  run inside the month, the rollups' own formula (`cocaq.accounting.window`): distinct jobs and their
  states (a rollup counts a job once in every day it ran), the CO2 of idle-GPU and failed-job energy (a
  rollup keeps their energy, not the intensity and PUE it was emitted at), the zones, sources and PUE
  used, the GPU-utilisation histogram, and per-job lists (top jobs, idle jobs, GPU jobs for
  `reports.suggest`).
* Per-GPU use of a multi-GPU job comes from `samples` (`reports.user_report`): `job_gpu_hours` and
  `job_metrics` add a job's GPUs together, so they cannot tell one idle GPU out of four from four GPUs
  each idle a quarter of the time.

Months are UTC months because the rollups' days are UTC days. The rollups are as fresh as the
aggregator's last run: `Basis.complete` says whether it ran after the month ended (run `cocaq aggregate`
before building reports). Energy is IT energy (before PUE); CO2 is operational (energy x PUE x intensity)
and embodied CO2 is always reported apart, never added in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Float, Table, and_, case, func, literal, literal_column, or_, select

from cocaq.accounting.ledger import OUTCOME, counts_as
from cocaq.accounting.sessions import Sessions
from cocaq.accounting.window import overlap_expr, share_expr
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.rollup_columns import ROLLUP_SUMS
from cocaq.db.schema import (
    AggregatorState,
    Cluster,
    DailyRollup,
    Job,
    JobEnergy,
    JobMetrics,
    ModelMetadata,
    NodeEnergy,
    Sample,
)
from cocaq.db.sqlfuncs import epoch_exact as _epoch_s
from cocaq.db.sqlfuncs import first_word as _first_word
from cocaq.db.sqlfuncs import greatest, least
from cocaq.errors import UsageError
from cocaq.footprint.advice import Context, site_context
from cocaq.footprint.by_model import UNNAMED
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.totals import equivalents
from cocaq.reports.data import (
    AccountingGaps,
    Basis,
    CarbonBasis,
    Change,
    DataDays,
    DayPoint,
    Equivalents,
    IdleWaste,
    ModelUse,
    Month,
    MonthTotals,
    Trend,
    WeekPoint,
)
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

J = cast(Table, Job.__table__).c
M = cast(Table, JobMetrics.__table__).c
R = cast(Table, DailyRollup.__table__).c
E = cast(Table, JobEnergy.__table__).c
CL = cast(Table, Cluster.__table__).c
MM = cast(Table, ModelMetadata.__table__).c
S = cast(Table, Sample.__table__).c
NE = cast(Table, NodeEnergy.__table__).c
AS = cast(Table, AggregatorState.__table__).c
JOBS = cast(Table, Job.__table__)
METRICS = cast(Table, JobMetrics.__table__)
MODELS = cast(Table, ModelMetadata.__table__)

WORK_MEM = "64MB"  # PostgreSQL, per sort or hash of these statements (SET LOCAL)
DAY_S = 86400.0
SUMS = ROLLUP_SUMS  # what a daily_rollups row sums (cocaq.db.rollup_columns)
# The range of the estimated part; days rolled up before it existed (NULL) read as the estimate itself.
_EST_RANGE = ("energy_est_low_j", "energy_est_high_j")
# What the daily and weekly series show.
DAY_SUMS = (
    "energy_measured_j",
    "energy_estimated_j",
    "co2_g",
    "gpu_hours",
    "gpu_util_energy_j",
    "gpu_util_weighted",
)
# What the peers are compared on: energy and utilisation.
PEER_SUMS = ("energy_measured_j", "energy_estimated_j", "gpu_util_energy_j", "gpu_util_weighted")

Sums = dict[str, float]


# --- SQL spellings that differ by dialect: cocaq.db.sqlfuncs ------------------------------------------------


def sql_float(x: float) -> Any:
    """A float as a bound SQL literal typed Float, so that the arithmetic around it stays floating point."""
    return literal(x, Float)


@dataclass
class JobScope:
    """Which jobs: a user or users, a lab, a cluster (None: all)."""

    users: Sequence[str] | None = None
    account: str | None = None
    cluster_id: int | None = None

    def jobs(self) -> list[Any]:
        out: list[Any] = []
        if self.users is not None:
            out.append(J.user_name == self.users[0] if len(self.users) == 1 else J.user_name.in_(self.users))
        if self.account is not None:
            out.append(J.account == self.account)
        if self.cluster_id is not None:
            out.append(J.cluster_id == self.cluster_id)
        return out

    def rollups(self) -> list[Any]:
        out: list[Any] = []
        if self.users is not None:
            out.append(R.user_name == self.users[0] if len(self.users) == 1 else R.user_name.in_(self.users))
        if self.account is not None:
            out.append(R.account == self.account)
        if self.cluster_id is not None:
            out.append(R.cluster_id == self.cluster_id)
        return out


def tune_postgres(conn: Connection) -> None:
    """PostgreSQL, for this transaction: no JIT (these scans of a month are costed high enough to be
    compiled, and compiling them takes longer than running them), and work_mem for grouping a month's
    jobs in memory rather than sorting them on disk. (In autocommit mode: a warning, no effect.)"""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL jit = off; SET LOCAL work_mem = '{WORK_MEM}'")


def cluster_id_of(conn: Connection, name: str | None) -> int | None:
    """The id of the cluster named `name` (None: all clusters); a name not in the database is refused."""
    if name is None:
        return None
    cid = conn.execute(select(CL.id).where(CL.name == name)).scalar()
    if cid is None:
        raise UsageError(f"no cluster named {name!r} in the database")
    return int(cid)


def cluster_names(conn: Connection) -> dict[int, str]:
    """Cluster id -> name, for the reports that list jobs of several clusters."""
    return {int(i): str(n) for i, n in conn.execute(select(CL.id, CL.name))}


def rollups_watermark(conn: Connection) -> datetime | None:
    """How far the aggregator has rolled the jobs up (None: never): where `Basis.complete` starts from."""
    return as_utc(conn.execute(select(AS.watermark).where(AS.name == "jobs")).scalar())


def rollup_sums(
    conn: Connection,
    lo: datetime,
    hi: datetime,
    keys: Sequence[Any],
    where: list[Any],
    sums: Sequence[str] = SUMS,
) -> dict[Any, Sums]:
    """Sums of the rollups of days [lo, hi) per key tuple (keys: rollup columns)."""
    cols = (func.coalesce(R[k], R.energy_estimated_j) if k in _EST_RANGE else R[k] for k in sums)
    q = select(*keys, *(func.sum(c) for c in cols)).where(R.day >= lo, R.day < hi, *where)
    if keys:
        q = q.group_by(*keys)
    out: dict[Any, Sums] = {}
    n = len(keys)
    for row in conn.execute(q).all():
        out[tuple(row[:n])] = {k: float(v or 0.0) for k, v in zip(sums, row[n:], strict=True)}
    return out


def add_sums(into: Sums, s: Mapping[str, float]) -> Sums:
    """Add the sums `s` into `into`, key by key (missing keys count as 0), and return `into`."""
    for k, v in s.items():
        into[k] = into.get(k, 0.0) + v
    return into


def total_sums(rows: Iterable[Mapping[str, float]]) -> Sums:
    """The sum of several rollup sums, every SUMS key present (0.0 where none had it)."""
    out: Sums = dict.fromkeys(SUMS, 0.0)
    for s in rows:
        add_sums(out, s)
    return out


def sums_util(s: Mapping[str, float]) -> float | None:
    """The energy-weighted GPU utilisation (%) of rollup sums; None where no GPU energy has a utilisation."""
    e = s.get("gpu_util_energy_j", 0.0)
    return s.get("gpu_util_weighted", 0.0) / e if e > 0 else None


def sums_kwh(s: Mapping[str, float]) -> float:
    """The IT energy of rollup sums in kWh: measured plus estimated, before PUE."""
    return (s.get("energy_measured_j", 0.0) + s.get("energy_estimated_j", 0.0)) / J_PER_KWH


def interactive_col(conn: Connection, cfg: Config) -> Any:
    """SQL: the job (of `jobs`) is an interactive session (cocaq.accounting.sessions), whose time limit
    puts none of its energy in the ledger's possibly lost part: `month_jobs`' `inter`."""
    sql = Sessions.of(cfg.advice).sql(
        "jobs.name", "jobs.partition", "jobs.qos", "jobs.batch_step", conn.dialect.name
    )
    return literal_column(sql)


def month_jobs(lo: datetime, hi: datetime, where: list[Any], inter: Any) -> Any:
    """The jobs that ran in [lo, hi) with job_metrics, and `f`: the share of each inside it; `inter`
    (interactive_col) says which are interactive sessions.

    The rollups' formula (cocaq.accounting.window): a job with run time counts by the share of its hours
    inside; one without, in the window its start is in. Only rows with f > 0 ran in the window (a job
    ending exactly at `lo` did not).
    """
    lo_s, hi_s = lo.timestamp(), hi.timestamp()
    w = (
        select(
            J.id,
            J.cluster_id,
            J.job_id,
            J.job_id_raw,
            J.name,
            J.user_name,
            func.coalesce(J.account, "").label("account"),
            func.coalesce(J.partition, "").label("partition"),
            J.node_list,
            J.state,
            _first_word(J.state).label("st"),
            J.is_open,
            J.start_time,
            J.end_time,
            func.coalesce(J.alloc_cpus, 0).label("cpus"),
            func.coalesce(J.alloc_gpus, 0).label("gpus"),
            J.total_cpu_s,
            J.time_limit_s,
            J.elapsed_s,
            func.coalesce(J.energy_j, 0.0).label("energy"),
            func.coalesce(J.energy_measured_j, 0.0).label("measured"),
            func.coalesce(J.co2_g, 0.0).label("co2"),
            func.coalesce(J.pue, 1.0).label("pue"),
            J.carbon_zone.label("zone"),
            J.carbon_g_per_kwh.label("g"),
            J.carbon_source.label("source"),
            J.carbon_flag.label("flag"),
            M.gpu_util_pct.label("util"),
            M.gpu_util_source.label("util_source"),
            J.gpus_unknown,
            func.coalesce(M.gpu_samples_s, 0.0).label("samples_s"),
            func.coalesce(M.idle_gpu_s, 0.0).label("idle_s"),
            # the ledger's idle GPU energy: at most the job's energy (cocaq.accounting.ledger.waste)
            greatest(
                sql_float(0.0),
                least(
                    func.coalesce(M.idle_gpu_energy_j, 0.0),
                    greatest(func.coalesce(J.energy_j, 0.0), sql_float(0.0)),
                ),
            ).label("idle_j"),
            func.coalesce(M.co2_embodied_g, 0.0).label("embodied"),
            _epoch_s(J.start_time).label("t0"),
            greatest(func.coalesce(J.elapsed_s, 0.0), sql_float(0.0)).label("el"),
            case((inter, 1), else_=0).label("inter"),
        )
        .select_from(JOBS.outerjoin(METRICS, M.job_pk == J.id))
        .where(
            J.start_time < hi, or_(J.end_time >= lo, J.end_time.is_(None)), J.start_time.is_not(None), *where
        )
        .subquery("w")
    )
    ov = overlap_expr(w.c.t0, w.c.el, lo_s, hi_s)
    x = select(w, ov.label("ov")).subquery("x")
    frac = share_expr(x.c.t0, x.c.el, x.c.ov, lo_s, hi_s)
    return select(x, frac.label("f")).subquery("y")


@dataclass
class JobStats:
    """Distinct jobs by how they ended, and the CO2 of the ledger's parts (cocaq.accounting.ledger), per
    key."""

    jobs: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # outcome -> jobs
    co2_g: dict[str, float] = field(default_factory=dict)  # part (idle or an outcome) -> CO2
    pue_min: float | None = None
    pue_max: float | None = None
    facility_j: float = 0.0  # energy x each job's PUE (the month's share): the energy with cooling

    def add(self, o: JobStats) -> None:
        self.jobs += o.jobs
        self.facility_j += o.facility_j
        for k, n in o.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        for k, c in o.co2_g.items():
            self.co2_g[k] = self.co2_g.get(k, 0.0) + c
        self.pue_min = _opt(min, self.pue_min, o.pue_min)
        self.pue_max = _opt(max, self.pue_max, o.pue_max)

    def count(self, outcome: str) -> int:
        return self.counts.get(outcome, 0)


def _opt(fn: Any, a: float | None, b: float | None) -> float | None:
    """fn(a, b) where both are known, else the known one (None where neither is)."""
    if a is None:
        return b
    return a if b is None else float(fn(a, b))


@dataclass
class JobGroup:
    """The month's jobs of one key, state and carbon basis: one row of `job_groups`."""

    key: tuple[Any, ...]
    st: str
    zone: str | None
    source: str | None
    flag: str | None
    jobs: int
    energy_j: float  # the month's share
    co2_g: float
    energy_x_g: float  # sum of energy x intensity, over the energy whose intensity is known
    energy_known_j: float
    idle_j: float  # the ledger's idle GPU energy (the month's share)
    idle_co2_g: float  # its CO2: each job's idle energy x its own CO2 per joule
    pue_min: float | None
    pue_max: float | None
    facility_j: float = 0.0  # energy x each job's PUE (the month's share)
    bin: int | None = None  # with `bins`: the utilisation bin (UTIL_BINS: no samples; -1: no GPU)
    gpu_hours: float = 0.0  # with `bins`
    interactive: bool = False  # interactive sessions (cocaq.accounting.sessions): no time-limit loss


UTIL_BINS = 10  # 10% wide; index UTIL_BINS counts GPU jobs without samples


def job_groups(conn: Connection, y: Any, keys: Sequence[Any], *, bins: bool = False) -> list[JobGroup]:
    """One pass over the month's jobs, grouped by `keys`, state and carbon basis (a few rows per key).

    Everything the reports take from jobs rather than rollups folds out of it: distinct jobs by state,
    energy and CO2 by state, zones and sources, the PUE range, the CO2 of idle GPU energy and (with
    `bins`, grouped by utilisation bin too) the GPU-utilisation histogram. One pass because each
    would read the month's jobs again.

    The CO2 of idle GPU energy is each job's idle energy (in the month) x its own PUE x its own carbon
    intensity, summed: the idle energy was drawn during the job's run, and the job's intensity is the
    energy-weighted average of the grid over that run, so this is the share of the job's CO2 its idle
    GPUs account for. (The hours the GPUs sat idle may have had a cleaner or dirtier grid than the run's
    average; per-hour idle energy is in job_gpu_hours if that precision is ever wanted.)
    """
    src, kcols = y, list(keys)
    if bins:
        # the utilisation bin as one more key: one CASE per job rather than conditional sums per bin
        u = y.c.util
        bin_ = case(
            (y.c.gpus <= 0, -1),
            (u.is_(None), UTIL_BINS),
            *((u < 10.0 * (i + 1), i) for i in range(UTIL_BINS - 1)),
            else_=UTIL_BINS - 1,  # the last bin holds 100%
        )
        src = select(y, bin_.label("bin"), (y.c.gpus * y.c.ov / float(S_PER_HOUR)).label("gh")).subquery("yb")
        kcols = [src.c[k.name] for k in keys] + [src.c.bin]
    c = src.c
    e = c.energy * c.f
    cols = [
        *kcols,
        c.st,
        c.zone,
        c.source,
        c.flag,
        func.count(),
        func.sum(e),
        func.sum(c.co2 * c.f),
        func.sum(e * func.coalesce(c.g, 0.0)),
        func.sum(case((c.g.is_not(None), e), else_=sql_float(0.0))),
        func.sum(c.idle_j * c.f),
        func.sum(case((c.energy > 0, c.idle_j * c.f * c.co2 / c.energy), else_=sql_float(0.0))),
        func.min(c.pue),
        func.max(c.pue),
        func.sum(e * c.pue),
    ]
    if bins:
        cols.append(func.sum(c.gh))
    cols.append(c.inter)
    q = select(*cols).where(c.f > 0).group_by(*kcols, c.st, c.zone, c.source, c.flag, c.inter)
    n = len(keys)
    m = len(kcols)
    out = []
    for r in conn.execute(q).all():
        out.append(
            JobGroup(
                tuple(r[:n]),
                r[m] or "",
                r[m + 1],
                r[m + 2],
                r[m + 3],
                int(r[m + 4]),
                float(r[m + 5] or 0.0),
                float(r[m + 6] or 0.0),
                float(r[m + 7] or 0.0),
                float(r[m + 8] or 0.0),
                float(r[m + 9] or 0.0),
                float(r[m + 10] or 0.0),
                opt_float(r[m + 11]),
                opt_float(r[m + 12]),
                float(r[m + 13] or 0.0),
                int(r[n]) if bins else None,
                float(r[m + 14] or 0.0) if bins else 0.0,
                bool(r[-1]),
            )
        )
    return out


def _same(key: tuple[Any, ...]) -> Any:
    """The default fold of `job_stats` and `carbon_parts`: each key stays its own."""
    return key


def job_stats(
    groups: Iterable[JobGroup], fold: Callable[[tuple[Any, ...]], Any] = _same
) -> dict[Any, JobStats]:
    """Per key (or per fold(key)): distinct jobs by how they ended, the CO2 of the ledger's parts (idle
    GPUs; the rest of a job that ended badly under its outcome), PUE."""
    out: dict[Any, JobStats] = defaultdict(JobStats)
    for g in groups:
        o = counts_as(OUTCOME.get(g.st), g.interactive)
        co2 = {"idle": g.idle_co2_g}
        if o is not None:
            co2[o] = g.co2_g - g.idle_co2_g
        out[fold(g.key)].add(
            JobStats(g.jobs, {o: g.jobs} if o is not None else {}, co2, g.pue_min, g.pue_max, g.facility_j)
        )
    return out


def carbon_parts(
    groups: Iterable[JobGroup], fold: Callable[[tuple[Any, ...]], Any] = _same
) -> dict[Any, list[tuple[Any, ...]]]:
    """Per key (or fold(key)): (zone, source, flag, energy J, CO2 g, energy x intensity, energy with a
    known intensity)."""
    acc: dict[Any, dict[tuple[Any, ...], list[float]]] = defaultdict(dict)
    for g in groups:
        a = acc[fold(g.key)].setdefault((g.zone, g.source, g.flag), [0.0, 0.0, 0.0, 0.0])
        a[0] += g.energy_j
        a[1] += g.co2_g
        a[2] += g.energy_x_g
        a[3] += g.energy_known_j
    return {k: [(*zsf, *v) for zsf, v in d.items()] for k, d in acc.items()}


def whole_key(key: tuple[Any, ...]) -> Any:
    """A fold of `job_stats` and `carbon_parts` that puts every key into one: the whole scope."""
    return ()


def opt_float(v: Any) -> float | None:
    """A number from the database as a float, None kept as None (a NULL is "not known", not 0)."""
    return None if v is None else float(v)


def month_basis(
    cfg: Config,
    s: Mapping[str, float],
    carbon: Sequence[tuple[Any, ...]],
    js: JobStats | None,
    watermark: datetime | None,
    month: Month,
) -> Basis:
    """What the month's figures rest on (`Basis`): the measured share, the carbon intensity used per zone and
    source (largest energy first), the PUE range and how fresh the rollups are."""
    total_e = sum(float(c[3] or 0.0) for c in carbon)
    parts = []
    for zone, source, flag, e, co2, eg, e_known in carbon:
        e, co2 = float(e or 0.0), float(co2 or 0.0)
        parts.append(
            CarbonBasis(
                zone,
                source,
                flag,
                e / J_PER_KWH,
                e / total_e if total_e > 0 else 0.0,
                co2 / G_PER_KG,
                float(eg) / float(e_known) if e_known else None,
            )
        )
    parts.sort(key=lambda p: (-p.energy_kwh, p.zone or "", p.source or "", p.flag or ""))
    e = sums_kwh(s)
    return Basis(
        measured_share=(s.get("energy_measured_j", 0.0) / J_PER_KWH / e) if e > 0 else None,
        carbon=tuple(parts),
        pue_min=js.pue_min if js else None,
        pue_max=js.pue_max if js else None,
        idle_threshold_pct=cfg.aggregate.idle_gpu_util_pct,
        rollups_through=watermark,
        complete=watermark is not None and watermark >= month.end,
    )


def month_totals(s: Mapping[str, float], js: JobStats | None) -> MonthTotals:
    """The month's totals (`MonthTotals`) from its rollup sums `s` and its jobs' stats `js` (None: no jobs):
    energy, CO2, hours, the ledger's parts with their CO2, and the when-to-run savings."""
    js = js or JobStats()
    g = {k: float(s.get(k, 0.0)) for k in SUMS}
    return MonthTotals(
        energy_kwh=sums_kwh(g),
        energy_kwh_with_pue=js.facility_j / J_PER_KWH,
        co2_kg=g["co2_g"] / G_PER_KG,
        co2_embodied_kg=g["co2_embodied_g"] / G_PER_KG,
        gpu_hours=g["gpu_hours"],
        cpu_hours=g["cpu_hours"],
        jobs=js.jobs,
        jobs_failed=js.count("failed"),
        jobs_cancelled=js.count("cancelled"),
        jobs_timeout=js.count("timeout"),
        jobs_oom=js.count("oom"),
        gpu_util_pct=sums_util(g),
        idle_gpu_hours=g["idle_gpu_hours"],
        idle_gpu_kwh=g["idle_gpu_energy_j"] / J_PER_KWH,
        idle_co2_kg=js.co2_g.get("idle", 0.0) / G_PER_KG,
        failed_kwh=g["energy_failed_j"] / J_PER_KWH,
        failed_co2_kg=js.co2_g.get("failed", 0.0) / G_PER_KG,
        oom_kwh=g["energy_oom_j"] / J_PER_KWH,
        oom_co2_kg=js.co2_g.get("oom", 0.0) / G_PER_KG,
        timeout_kwh=g["energy_timeout_j"] / J_PER_KWH,
        timeout_co2_kg=js.co2_g.get("timeout", 0.0) / G_PER_KG,
        cancelled_kwh=g["energy_cancelled_j"] / J_PER_KWH,
        cancelled_co2_kg=js.co2_g.get("cancelled", 0.0) / G_PER_KG,
        measured_kwh=g["energy_measured_j"] / J_PER_KWH,
        estimated_kwh=g["energy_estimated_j"] / J_PER_KWH,
        estimated_low_kwh=g["energy_est_low_j"] / J_PER_KWH,
        estimated_high_kwh=g["energy_est_high_j"] / J_PER_KWH,
        gpu_kwh=g["energy_gpu_j"] / J_PER_KWH,
        cpu_kwh=g["energy_cpu_j"] / J_PER_KWH,
        dram_kwh=g["energy_dram_j"] / J_PER_KWH,
        other_kwh=g["energy_other_j"] / J_PER_KWH,
        shift_co2_kg=g["shift_co2_g"] / G_PER_KG,
        shift_saved_kg=g["shift_saved_g"] / G_PER_KG,
        shift_pause_saved_kg=g["shift_pause_saved_g"] / G_PER_KG,
    )


def equivalents_of(t: MonthTotals) -> Equivalents:
    """The month's CO2 in everyday terms (km by car, phone charges), from cocaq.footprint.totals."""
    eq = equivalents(t.co2_kg)
    return Equivalents(car_km=float(eq["car_km"]), smartphone_charges=float(eq["smartphone_charges"]))


def data_start(conn: Connection, cluster_id: int | None) -> datetime | None:
    """The first day the rollups hold anything (on the cluster): where the data starts."""
    q = select(func.min(R.day))
    if cluster_id is not None:
        q = q.where(R.cluster_id == cluster_id)
    return as_utc(conn.execute(q).scalar())


def days_of_data(month: Month, start: datetime | None, watermark: datetime | None) -> DataDays:
    """Which days of the month the data covers: from the rollups' first day (`start`) to the aggregator's
    watermark, clipped to the month; a trend compares per day of data."""
    n = len(month.days())
    if start is None or watermark is None:
        return DataDays(None, None, 0, n)
    lo = max(utc_midnight(start), month.start)
    hi = min(utc_midnight(watermark), month.end)
    if hi <= lo:
        return DataDays(None, None, 0, n)
    return DataDays(lo.date(), hi.date(), (hi - lo).days, n)


def _day_label(d: date) -> str:
    """ "5 Mar": a day as a trend note names it."""
    return f"{d.day} {d:%b}"


def month_trend(
    prev: Month,
    cur: Mapping[str, float],
    old: Mapping[str, float],
    days: DataDays,
    prev_days: DataDays,
    min_days: int,
) -> Trend:
    """Per day of data (see Trend); no comparison with fewer than `min_days` days on either side."""
    name, this = f"{prev.start:%B}", "this month"
    if days.days < min_days or prev_days.days < min_days:
        if prev_days.days == 0:
            note = f"No comparison with {name}: there is no data for it."
        elif prev_days.days < min_days:
            assert prev_days.first is not None and prev_days.end is not None
            last = prev_days.end - timedelta(days=1)
            note = (
                f"No comparison with {name}: the data covers only {prev_days.days} of its days "
                f"({_day_label(prev_days.first)}-{_day_label(last)})."
            )
        else:
            note = f"No comparison with {name} yet: {this} has only {days.days} days of data so far."
        none = Change(None, None, None, None)
        return Trend(prev, none, none, none, none, days.days, prev_days.days, False, note)

    def rate(v: float, d: DataDays) -> float:
        return v / d.days

    partial = [f"{this}'s {days.days} days"] if days.partial else []
    if prev_days.partial:
        partial.append(f"{prev_days.days} days of {name}")
    note = f"Compared per day of data{': ' + ' and '.join(partial) if partial else ''}."
    return Trend(
        previous_month=prev,
        energy_kwh=Change.of(rate(sums_kwh(cur), days), rate(sums_kwh(old), prev_days)),
        co2_kg=Change.of(
            rate(cur.get("co2_g", 0.0) / G_PER_KG, days), rate(old.get("co2_g", 0.0) / G_PER_KG, prev_days)
        ),
        gpu_hours=Change.of(
            rate(cur.get("gpu_hours", 0.0), days), rate(old.get("gpu_hours", 0.0), prev_days)
        ),
        gpu_util_pct=Change.of(sums_util(cur), sums_util(old)),
        days=days.days,
        previous_days=prev_days.days,
        comparable=True,
        note=note,
    )


def daily_sums(
    conn: Connection, month: Month, keys: Sequence[Any], where: list[Any]
) -> dict[Any, dict[date, Sums]]:
    """Per key, per day of the month: the rollups' sums that the series show (DAY_SUMS)."""
    rows = rollup_sums(conn, month.start, month.end, [*keys, R.day], where, DAY_SUMS)
    out: dict[Any, dict[date, Sums]] = defaultdict(dict)
    for k, s in rows.items():
        add_sums(out[k[:-1]].setdefault(as_utc(k[-1]).date(), {}), s)
    return out


def day_points(month: Month, days: Mapping[date, Sums], span: DataDays) -> tuple[DayPoint, ...]:
    """The month's days, each as a `DayPoint` of the daily series (a day without rollups reads as 0)."""
    out = []
    for d in month.days():
        s = days.get(d, {})
        out.append(
            DayPoint(
                d,
                sums_kwh(s),
                s.get("co2_g", 0.0) / G_PER_KG,
                s.get("gpu_hours", 0.0),
                sums_util(s),
                span.holds(d),
            )
        )
    return tuple(out)


def week_points(month: Month, days: Mapping[date, Sums], span: DataDays) -> tuple[WeekPoint, ...]:
    """ISO weeks (Monday to Sunday), clipped to the month; each says how many of its days have data."""
    acc: dict[tuple[int, int], tuple[list[date], Sums]] = {}
    for d in month.days():
        iso = d.isocalendar()
        ds, s = acc.setdefault((iso[0], iso[1]), ([], dict.fromkeys(DAY_SUMS, 0.0)))
        ds.append(d)
        add_sums(s, days.get(d, {}))
    return tuple(
        WeekPoint(
            y,
            w,
            ds[0],
            ds[-1],
            len(ds),
            sums_kwh(s),
            s["co2_g"] / G_PER_KG,
            s["gpu_hours"],
            sums_util(s),
            sum(1 for d in ds if span.holds(d)),
        )
        for (y, w), (ds, s) in sorted(acc.items())
    )


def month_job_facts(
    conn: Connection,
    cfg: Config,
    month: Month,
    cluster: str | None,
    users: Sequence[str] | None,
    *,
    account: str | None = None,
) -> dict[str, list[JobFacts]]:
    """Each user's jobs of the month (cocaq.footprint.jobfacts, the ledger's figures), most energy first."""
    from cocaq.db.dbapi import wrap
    from cocaq.footprint import jobfacts

    db = wrap(conn)
    one = users[0] if users is not None and len(users) == 1 else None
    out: dict[str, list[JobFacts]] = defaultdict(list)
    want = set(users) if users is not None else None
    for j in jobfacts.load(db, cfg, month.start, month.end, user=one, account=account, cluster=cluster):
        if want is None or j.user in want:
            out[j.user].append(j)
    return out


def advice_context(month: Month, cfg: Config) -> Context:
    """What cocaq.footprint.advice needs to know of a month and the site."""
    return site_context(cfg, month.start, month.end, period=f"in {month.start:%B}")


def idle_waste(key: str, t: MonthTotals) -> IdleWaste:
    """The idle-GPU line (`IdleWaste`) of one user or lab (`key`) from its totals."""
    share = t.idle_gpu_hours / t.gpu_hours if t.gpu_hours > 0 else None
    return IdleWaste(key, t.gpu_hours, t.idle_gpu_hours, share, t.idle_gpu_kwh, t.idle_co2_kg)


def model_uses(
    conn: Connection, y: Any, month: Month, *, by_user: bool = False
) -> dict[str, tuple[ModelUse, ...]]:
    """Energy, CO2 and GPU-hours per (model, framework) of the runs in `y` with model metadata that
    ended in the month, whole, as `cocaq models` counts them (cocaq.footprint.by_model: a run's epochs and
    tokens
    belong to all of it), most energy first: per user (`by_user`), else all under "". One grouped
    statement (model_metadata has one row per job, so a job counts once)."""
    keys = [y.c.user_name] if by_user else []
    q = (
        select(
            *keys,
            MM.model_name,
            MM.framework,
            func.count(),
            func.count(y.c.user_name.distinct()),
            func.sum(y.c.energy),
            func.sum(y.c.co2),
            func.sum(y.c.gpus * y.c.el / float(S_PER_HOUR)),
        )
        .select_from(y.join(MODELS, MM.job_pk == y.c.id))
        .where(y.c.end_time >= month.start, y.c.end_time < month.end, y.c.is_open.is_(False))
        .group_by(*keys, MM.model_name, MM.framework)
    )
    out: dict[str, list[ModelUse]] = defaultdict(list)
    for row in conn.execute(q):
        key = row[0] if by_user else ""
        model, fw, n, users, e, c, gh = row[len(keys) :]
        out[key].append(
            ModelUse(
                model if model is not None else UNNAMED,
                fw,
                int(n),
                float(e or 0.0) / J_PER_KWH,
                float(c or 0.0) / G_PER_KG,
                float(gh or 0.0),
                int(users),
            )
        )
    return {
        k: tuple(sorted(v, key=lambda x: (-x.energy_kwh, x.model_name, x.framework or "")))
        for k, v in out.items()
    }


def utc_midnight(t: datetime) -> datetime:
    """The UTC midnight that starts the day `t` is in (the rollups' days are UTC days)."""
    return as_utc(t).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def accounting_gaps(
    conn: Connection, month: Month, cid: int | None, account: str | None = None
) -> AccountingGaps:
    """What Slurm's accounting did not record among the month's jobs (those that ran in it), of a cluster
    (or all) and a lab (or all): for the admin and lab reports."""
    from sqlalchemy import case

    from cocaq.db.schema import Job, JobMetrics

    one, zero = 1, 0
    ended_cpu_none = and_(
        Job.total_cpu_s.is_(None), Job.is_open.is_(False), Job.elapsed_s > 0, Job.alloc_cpus > 0
    )
    q = (
        select(
            func.coalesce(func.sum(case((Job.gpus_unknown, one), else_=zero)), 0),
            func.coalesce(func.sum(case((ended_cpu_none, one), else_=zero)), 0),
            func.coalesce(func.sum(case((Job.alloc_gpus > 0, one), else_=zero)), 0),
            func.coalesce(func.sum(case((JobMetrics.gpu_util_source == "slurm", one), else_=zero)), 0),
        )
        .select_from(Job.__table__.outerjoin(JobMetrics.__table__, JobMetrics.job_pk == Job.id))
        .where(
            Job.start_time < month.end,
            (Job.end_time >= month.start) | Job.end_time.is_(None),
            *((Job.cluster_id == cid,) if cid is not None else ()),
            *((Job.account == account,) if account is not None else ()),
        )
    )
    unknown, no_cpu, gpu, slurm = (int(v or 0) for v in conn.execute(q).one())
    parts: tuple[str, ...] = ()
    if unknown:
        pq = (
            select(Job.partition)
            .where(
                Job.gpus_unknown,
                Job.start_time < month.end,
                (Job.end_time >= month.start) | Job.end_time.is_(None),
                *((Job.cluster_id == cid,) if cid is not None else ()),
                *((Job.account == account,) if account is not None else ()),
            )
            .distinct()
        )
        parts = tuple(sorted(str(p or "(none)") for (p,) in conn.execute(pq)))[:10]
    return AccountingGaps(unknown, parts, no_cpu, gpu, slurm)
