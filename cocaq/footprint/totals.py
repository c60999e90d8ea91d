"""Per-user, per-lab and per-group footprints over a time window: daily rollups where they answer, jobs
for the rest.

A job counts in the window it ran in: a job that ran across the window's edge contributes the share of
its CPU/GPU-hours, energy and CO2 that falls inside (pro rata of run time), so months add up exactly.
The aggregator's `daily_rollups` hold exactly that per UTC day, so a window's totals are:

* the rollups of the whole UTC days inside the window that the aggregator has covered (days that end at
  or before the UTC midnight on or before its watermark, the start of its last completed run), plus
* for the partial days at the window's edges and the days after the watermark, the same quantities
  computed from `jobs` (with `job_energy` and `job_metrics`) with the rollups' own formulas
  (`cocaq.accounting.rollups._ROLLUP_JOBS`): one pass over the key's jobs in the window.

Three figures always come from that pass over the whole window: job counts (a rollup counts a job once
in each day it ran, so days do not add up to distinct jobs), energy with PUE and the range of the jobs'
PUE (no rollup holds either); the top jobs need the pass anyway. With no watermark (the aggregator never
ran), or `from_jobs`, everything comes from jobs, which is also what tests compare the rollup path with.

The queries go through `cocaq.db.dbapi` (plain psycopg or sqlite3): `cocaq user` runs on every login node,
and importing SQLAlchemy would be most of its run time. One job (`cocaq job`) is cocaq.footprint.one_job;
checking names and adding advice for `cocaq user/lab`, cocaq.footprint.lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cocaq.accounting.ledger import CERTAIN, OUTCOMES, count_sql, outcome_sql
from cocaq.accounting.sessions import Sessions
from cocaq.accounting.window import overlap_sql, share_sql
from cocaq.config import Advice
from cocaq.db.dialect import planner_fence
from cocaq.db.rollup_columns import ROLLUP_KEYS, ROLLUP_SUMS
from cocaq.footprint.dbsql import epoch, first_word, greatest, labs_bound
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db

# Everyday equivalents (US EPA Greenhouse Gas Equivalencies Calculator).
CAR_KG_PER_KM = 0.400 / 1.609344  # "about 400 grams of CO2 per mile" for a typical passenger vehicle
PHONE_CHARGE_KG = 8.22e-3  # kg CO2 per smartphone charge

DAY = timedelta(days=1)
# The range of the estimated part: days rolled up before it existed (NULL) read as the estimate itself.
_ROLLUP_READ = {
    c: f"coalesce(r.{c}, r.energy_estimated_j)" for c in ("energy_est_low_j", "energy_est_high_j")
}
# What always comes from jobs over the whole window: distinct jobs by how they ended, and energy x PUE.
JOB_SUMS = ("jobs", *(f"jobs_{o}" for o in OUTCOMES), "facility_j", "jobs_gpus_unknown", "jobs_gpu_slurm")
# ... and the lowest and highest PUE of those jobs: the label of the energy with PUE (`PUE 1.20-1.35` where
# clusters, hardware profiles or months have their own). Folded with min/max, absent where no job ran.
JOB_RANGES: dict[str, Any] = {"pue_min": min, "pue_max": max}
# Interactive sessions where no configuration is given (the default [advice]); the CLI, API and reports
# pass the site's (cocaq.accounting.sessions.Sessions.of(cfg.advice)), as the aggregator's rollups read it.
DEFAULT_SESSIONS = Sessions.of(Advice())
# The columns these queries read; tests/test_footprint_tables.py checks them against cocaq.db.schema.
READS: dict[str, tuple[str, ...]] = {
    "jobs": (
        "id", "cluster_id", "job_id", "name", "user_name", "account", "partition", "state", "start_time",
        "end_time", "elapsed_s", "alloc_cpus", "alloc_gpus", "energy_j", "energy_measured_j", "pue", "co2_g",
        "energy_est_low_j", "energy_est_high_j", "gpus_unknown", "slurm_gpu_util",
    ),
    "job_energy": ("job_pk", "component", "energy_j"),
    "job_metrics": (
        "job_pk", "co2_embodied_g", "gpu_util_pct", "idle_gpu_s", "idle_gpu_energy_j", "shift_state",
        "shift_saved_g", "shift_pause_saved_g",
    ),
    "daily_rollups": (*ROLLUP_KEYS, *ROLLUP_SUMS),
    "aggregator_state": ("name", "watermark"),
    "clusters": ("id", "name"),
}  # fmt: skip
WATERMARK = "jobs"  # aggregator_state.name of the jobs' watermark (cocaq.accounting.aggregate.WATERMARK)

Sums = dict[str, float]


@dataclass
class Window:
    """[since, until): aware datetimes (any zone; days are UTC days)."""

    since: datetime
    until: datetime

    @property
    def since_s(self) -> float:
        return self.since.timestamp()

    @property
    def until_s(self) -> float:
        return self.until.timestamp()


@dataclass
class Plan:
    """Where a window's numbers come from: rollup days [rollup_since, rollup_until), jobs for `edges`."""

    watermark: datetime | None  # the aggregator's, None if it never ran (or not read: from_jobs)
    rollups_through: datetime | None  # the UTC midnight on or before it: rollups are complete up to it
    rollup_since: datetime | None
    rollup_until: datetime | None
    edges: list[tuple[float, float]]  # epoch intervals computed from jobs
    from_jobs: bool

    @property
    def rollup_days(self) -> int:
        if self.rollup_since is None or self.rollup_until is None:
            return 0
        return (self.rollup_until - self.rollup_since) // DAY


def _midnight(d: datetime) -> datetime:
    return d.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def plan_window(w: Window, watermark: datetime | None, *, from_jobs: bool = False) -> Plan:
    """Split the window into the whole days the rollups cover and the rest (computed from jobs)."""
    through = None if watermark is None or from_jobs else _midnight(watermark)
    first = _midnight(w.since)
    if first < w.since:
        first += DAY
    last = _midnight(w.until) if through is None else min(_midnight(w.until), through)
    if through is None or last <= first:
        return Plan(watermark, through, None, None, [(w.since_s, w.until_s)], from_jobs)
    edges = []
    if w.since < first:
        edges.append((w.since_s, first.timestamp()))
    if last < w.until:
        edges.append((last.timestamp(), w.until_s))
    return Plan(watermark, through, first, last, edges, from_jobs)


@dataclass
class Totals:
    """A window's totals; the first eight are the original output, the rest what the rollups hold."""

    jobs: int
    cpu_hours: float
    gpu_hours: float
    energy_kwh: float
    energy_kwh_with_pue: float
    measured_energy_fraction: float | None
    co2_kg: float  # operational (with PUE); embodied is apart, never added in
    # What did no work, in disjoint parts of energy_kwh (cocaq.accounting.ledger): idle GPUs
    # (idle_gpu_energy_kwh below), then the rest of the energy of jobs that failed, ran out of memory, were
    # cancelled; and apart, possibly lost: the rest of jobs that hit their time limit (timeout_energy_kwh),
    # interactive sessions none (cocaq.accounting.sessions)
    failed_energy_kwh: float  # FAILED, NODE_FAIL, BOOT_FAIL (beyond their idle GPUs)
    jobs_failed: int = 0  # FAILED, NODE_FAIL, BOOT_FAIL
    jobs_cancelled: int = 0
    jobs_timeout: int = 0  # TIMEOUT, DEADLINE, not interactive sessions
    jobs_oom: int = 0
    oom_energy_kwh: float = 0.0
    timeout_energy_kwh: float = 0.0  # possibly lost: never in wasted_energy_kwh
    cancelled_energy_kwh: float = 0.0
    # did no work, certainly: idle GPUs, failed, out of memory, cancelled added up (never the time-limit
    # part, timeout_energy_kwh); with it, never more than energy_kwh
    wasted_energy_kwh: float = 0.0
    energy_gpu_kwh: float = 0.0
    energy_cpu_kwh: float = 0.0
    energy_dram_kwh: float = 0.0
    energy_other_kwh: float = 0.0  # node-level measurements (Slurm's ConsumedEnergy) and the like
    energy_measured_kwh: float = 0.0
    energy_estimated_kwh: float = 0.0
    # its range where estimates have one (GPUs calibrated on the site's measured jobs,
    # cocaq.accounting.calibrate);
    # equal to energy_estimated_kwh where none has
    energy_estimated_low_kwh: float = 0.0
    energy_estimated_high_kwh: float = 0.0
    gpu_util_pct: float | None = None  # energy-weighted, over the GPU energy that samples cover
    idle_gpu_hours: float = 0.0  # allocated GPU-hours under the idle threshold
    idle_gpu_energy_kwh: float = 0.0
    co2_embodied_kg: float = 0.0  # scope 3, reported apart from co2_kg
    # When to run (cocaq.accounting.shifting): the CO2 of the jobs that could have waited and have figures,
    # and what their best start within the slack, or pausing, would have saved (parts of that CO2)
    shift_co2_kg: float = 0.0
    shift_saved_kg: float = 0.0
    shift_pause_saved_kg: float = 0.0
    # the lowest and highest PUE of the window's jobs (energy_kwh_with_pue's label); None: no jobs
    pue_min: float | None = None
    pue_max: float | None = None
    # jobs on a GPU partition whose GPU count Slurm's accounting does not tell (jobs.gpus_unknown): their
    # GPUs are in none of these figures; and GPU jobs whose utilisation Slurm recorded (gres/gpuutil)
    jobs_gpus_unknown: int = 0
    jobs_gpu_slurm: int = 0

    @classmethod
    def from_sums(cls, s: Mapping[str, float]) -> Totals:
        g = {k: float(s.get(k) or 0.0) for k in (*ROLLUP_SUMS, *JOB_SUMS)}
        e = g["energy_measured_j"] + g["energy_estimated_j"]
        util_e = g["gpu_util_energy_j"]
        wasted = g["idle_gpu_energy_j"] + sum(g[f"energy_{o}_j"] for o in CERTAIN)
        return cls(
            jobs=round(g["jobs"]),
            cpu_hours=g["cpu_hours"],
            gpu_hours=g["gpu_hours"],
            energy_kwh=e / J_PER_KWH,
            energy_kwh_with_pue=g["facility_j"] / J_PER_KWH,
            measured_energy_fraction=(g["energy_measured_j"] / e) if e > 0 else None,
            co2_kg=g["co2_g"] / G_PER_KG,
            failed_energy_kwh=g["energy_failed_j"] / J_PER_KWH,
            jobs_failed=round(g["jobs_failed"]),
            jobs_cancelled=round(g["jobs_cancelled"]),
            jobs_timeout=round(g["jobs_timeout"]),
            jobs_oom=round(g["jobs_oom"]),
            oom_energy_kwh=g["energy_oom_j"] / J_PER_KWH,
            timeout_energy_kwh=g["energy_timeout_j"] / J_PER_KWH,
            cancelled_energy_kwh=g["energy_cancelled_j"] / J_PER_KWH,
            wasted_energy_kwh=wasted / J_PER_KWH,
            energy_gpu_kwh=g["energy_gpu_j"] / J_PER_KWH,
            energy_cpu_kwh=g["energy_cpu_j"] / J_PER_KWH,
            energy_dram_kwh=g["energy_dram_j"] / J_PER_KWH,
            energy_other_kwh=g["energy_other_j"] / J_PER_KWH,
            energy_measured_kwh=g["energy_measured_j"] / J_PER_KWH,
            energy_estimated_kwh=g["energy_estimated_j"] / J_PER_KWH,
            energy_estimated_low_kwh=g["energy_est_low_j"] / J_PER_KWH,
            energy_estimated_high_kwh=g["energy_est_high_j"] / J_PER_KWH,
            gpu_util_pct=(g["gpu_util_weighted"] / util_e) if util_e > 0 else None,
            idle_gpu_hours=g["idle_gpu_hours"],
            idle_gpu_energy_kwh=g["idle_gpu_energy_j"] / J_PER_KWH,
            co2_embodied_kg=g["co2_embodied_g"] / G_PER_KG,
            shift_co2_kg=g["shift_co2_g"] / G_PER_KG,
            shift_saved_kg=g["shift_saved_g"] / G_PER_KG,
            shift_pause_saved_kg=g["shift_pause_saved_g"] / G_PER_KG,
            pue_min=_opt_float(s.get("pue_min")),
            pue_max=_opt_float(s.get("pue_max")),
            jobs_gpus_unknown=round(g["jobs_gpus_unknown"]),
            jobs_gpu_slurm=round(g["jobs_gpu_slurm"]),
        )


def _opt_float(v: float | None) -> float | None:
    return None if v is None else float(v)


def equivalents(co2_kg: float) -> dict[str, float]:
    return {
        "car_km": co2_kg / CAR_KG_PER_KM,
        "smartphone_charges": co2_kg / PHONE_CHARGE_KG,
    }


@dataclass
class TopJob:
    job_id: str
    cluster: str
    name: str | None
    partition: str | None
    state: str
    start: datetime | None
    elapsed_h: float
    gpus: int
    energy_kwh: float  # the whole job's, as `cocaq job` shows it
    co2_kg: float
    measured: bool
    share: float = 1.0  # of its run inside the window: what the window's totals count of it
    user: str | None = None  # (a lab's top jobs are its members')
    gpus_unknown: bool = False  # its GPU count is not in Slurm's accounting (jobs.gpus_unknown)


@dataclass
class Footprint:
    scope: str  # user, account
    key: str
    since: datetime
    until: datetime
    totals: Totals
    top_jobs: list[TopJob] = field(default_factory=list)
    members: list[dict[str, Any]] = field(default_factory=list)  # per user, for a lab
    plan: Plan | None = None
    sourced: dict[str, Any] | None = None  # source() as the API said it (from_dict)
    # cocaq.footprint.advice.Advice.as_dict() of what the window's jobs suggest (`add_advice`), largest saving
    # first; a lab's: each member's largest, with its "user"
    advice: list[dict[str, Any]] = field(default_factory=list)
    # cocaq.footprint.when_advice's suggestion (Advice.as_dict()), where a user's jobs that could wait
    # would have saved enough by starting at a cleaner hour; None otherwise (and for a lab)
    when_to_run: dict[str, Any] | None = None
    # only the jobs in these labs (a lab head's view of a member); None: all of the key's jobs
    within: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Footprint:
        """The footprint as_dict() wrote (the read API's answer), for the table and CSV output."""
        scope = "user" if "user" in d else "account"
        names = {f.name for f in fields(Totals)}
        top = [
            TopJob(**{**j, "start": datetime.fromisoformat(j["start"]) if j.get("start") else None})
            for j in d.get("top_jobs", [])
        ]
        return cls(
            scope=scope,
            key=str(d[scope]),
            since=datetime.fromisoformat(d["since"]),
            until=datetime.fromisoformat(d["until"]),
            totals=Totals(**{k: v for k, v in d.items() if k in names}),
            top_jobs=top,
            members=list(d.get("users", [])),
            sourced={k: d.get(k) for k in ("rollups_through", "rollup_days", "from_jobs")},
            advice=list(d.get("advice", [])),
            when_to_run=d.get("when_to_run"),
            within=tuple(str(a) for a in d["within_labs"]) if d.get("within_labs") is not None else None,
        )

    def source(self) -> dict[str, Any]:
        """Where the numbers came from, for scripts (JSON) and the table's footnote."""
        if self.sourced is not None:
            return dict(self.sourced)
        p = self.plan
        days = None
        if p is not None and p.rollup_since is not None and p.rollup_until is not None:
            days = {"since": p.rollup_since.isoformat(), "until": p.rollup_until.isoformat()}
        return {
            "rollups_through": p.rollups_through.isoformat() if p and p.rollups_through else None,
            "rollup_days": days,  # the whole days summed from daily_rollups; the rest came from jobs
            "from_jobs": bool(p and p.from_jobs),
        }

    def as_dict(self) -> dict[str, Any]:
        t = asdict(self.totals)
        d: dict[str, Any] = {
            self.scope: self.key,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            **t,
            "equivalents": equivalents(self.totals.co2_kg),
            **self.source(),
            "top_jobs": [
                {**asdict(j), "start": j.start.isoformat() if j.start else None} for j in self.top_jobs
            ],
        }
        d["advice"] = self.advice
        d["when_to_run"] = self.when_to_run
        if self.within is not None:
            d["within_labs"] = list(self.within)
        if self.scope == "account":
            d["lab"] = self.key
            d["users"] = self.members
        return d


# --- SQL ----------------------------------------------------------------------------------------------
# One text per statement, in cocaq.db.dbapi's psycopg style; the few spellings that differ by dialect here.


_KEYS = {  # group key -> (jobs column, rollups column)
    None: ("''", "''"),
    "user": ("j.user_name", "r.user_name"),
    "account": ("coalesce(j.account, '')", "r.account"),
    "partition": ("coalesce(j.partition, '')", "r.partition"),
}
_SCOPES = {"user": ("j.user_name", "r.user_name"), "account": ("j.account", "r.account")}
# The top-job columns of the statement's third part, with their types (for the other parts' NULLs).
_TOP = (
    ("id", "bigint"), ("job_id", "text"), ("cluster", "text"), ("name", "text"), ("partition", "text"),
    ("state", "text"), ("start_time", "timestamptz"), ("elapsed_s", "float8"), ("alloc_gpus", "bigint"),
    ("e", "float8"), ("f", "float8"), ("energy_measured_j", "float8"), ("energy_j", "float8"),
    ("co2_g", "float8"), ("user_name", "text"), ("gpus_unknown", "boolean"),
)  # fmt: skip
PART_JOBS, PART_ROLLUPS, PART_TOP = 0, 1, 2


def _filters(scope: str | None, cluster: str | None, which: int, within: int = 0) -> str:
    """`AND ...` conditions on jobs (which=0) or daily_rollups (which=1); values are bound parameters.
    `within`: the number of labs (`%(in0)s`...) the jobs must belong to (a lab head's view of a user)."""
    out = ""
    alias = "jr"[which]
    if scope is not None:
        out += f" AND {_SCOPES[scope][which]} = %(key)s"
    if cluster:
        out += f" AND {alias}.cluster_id = (SELECT id FROM clusters WHERE name = %(cluster)s)"
    if within:
        out += f" AND {alias}.account IN ({', '.join(f'%(in{i})s' for i in range(within))})"
    return out


def _est_range(alias: str, which: str) -> str:
    """A job's estimated part's low or high end: its stored range, else the estimate itself."""
    est = "coalesce(j.energy_j, 0.0) - coalesce(j.energy_measured_j, 0.0)"
    return f"coalesce(j.energy_est_{which}_j, {est}) AS est_{alias}"


def _nulls(types: Iterable[str]) -> str:
    """Typed NULLs (PostgreSQL types a UNION's columns pairwise; an untyped pair would become text)."""
    return ", ".join(f"CAST(NULL AS {t})" for t in types)


def footprint_sql(
    db: Db,
    group: str | None,
    scope: str | None,
    cluster: str | None,
    *,
    edges: int,
    rollups: bool,
    top: bool,
    within: int = 0,
    sessions: Sessions | None = None,
) -> str:
    """One statement, one pass over the scope's jobs in the window, returning rows of three parts:

    0 (PART_JOBS), per key: distinct jobs by state and energy x PUE over the whole window, and the
      rollups' quantities over the edge intervals (as cocaq.accounting.rollups._ROLLUP_JOBS computes them for
      a
      day: job_energy by component and job_metrics are read for the edge jobs only, by `IN`, which
      PostgreSQL plans as index lookups rather than a merge join along all of job_metrics);
    1 (PART_ROLLUPS), per key: the sums of daily_rollups over [r0, r1) (with `rollups`);
    2 (PART_TOP): the top jobs by energy in the window (with `top`).

    `y` holds each job once with f (its share of run time in the window) and fe (in the edges); the
    OFFSET 0 fences keep PostgreSQL from inlining t0 and el into every expression that uses them.
    """
    # each job's share of the window and of its edge intervals (cocaq.accounting.window)
    ov = overlap_sql("t0", "el", "%(since)s", "%(until)s", db.dialect)
    edge_windows = [(f"%(ea{i})s", f"%(eb{i})s") for i in range(edges)]
    ov_e = " + ".join(overlap_sql("t0", "el", a, b, db.dialect) for a, b in edge_windows)
    f = share_sql("t0", "el", "ov", [("%(since)s", "%(until)s")])
    fe = share_sql("t0", "el", "ov_e", edge_windows)
    el = greatest(db, "coalesce(j.elapsed_s, 0.0)", "0.0")
    job_cols = (*JOB_SUMS, *JOB_RANGES)
    n_sums = len(job_cols) + len(ROLLUP_SUMS)
    # the ledger's disjoint parts (cocaq.accounting.ledger), each job's idle energy from job_metrics
    idle = "coalesce(m.idle_gpu_energy_j, 0.0)"
    parts = ",\n           ".join(
        f"sum(({outcome_sql(o, 'e.st', 'e.energy', idle, db.dialect, interactive='(e.inter = 1)')})"
        f" * e.fe) AS {col}"
        for o, col in (*((o, f"energy_{o}_j") for o in OUTCOMES), ("idle", "idle_gpu_energy_j"))
    )
    counts = ",\n           ".join(
        f"sum(CASE WHEN f > 0 THEN {count_sql(o, 'st', interactive='(inter = 1)')} ELSE 0 END) AS jobs_{o}"
        for o in OUTCOMES
    )
    # an interactive session's time limit is how it ends: no energy possibly lost (cocaq.accounting.sessions)
    inter = (sessions or DEFAULT_SESSIONS).sql("j.name", "j.partition", "j.qos", "j.batch_step", db.dialect)
    top_types = [t for _, t in _TOP]
    fence = planner_fence(db.dialect, "\n            ")
    per_h = f"{S_PER_HOUR}.0"  # SQL's float literal: a division in floating point
    top_cte = """, t AS (
    SELECT id, energy * f AS top_e, f AS top_f FROM y WHERE f > 0 ORDER BY top_e DESC, id LIMIT %(top)s
)"""
    sql = f"""
WITH y AS (
    SELECT x.*, {f} AS f, {fe} AS fe
    FROM (
        SELECT w.*, {ov} AS ov, {ov_e or "0.0"} AS ov_e
        FROM (
            SELECT {_KEYS[group][0]} AS k, j.id, {first_word(db, "j.state")} AS st,
                   {epoch(db, "j.start_time")} AS t0, {el} AS el,
                   coalesce(j.alloc_cpus, 0) AS cpus, coalesce(j.alloc_gpus, 0) AS gpus,
                   coalesce(j.energy_j, 0.0) AS energy, coalesce(j.energy_measured_j, 0.0) AS measured,
                   coalesce(j.co2_g, 0.0) AS co2,
                   coalesce(j.energy_j, 0.0) * coalesce(j.pue, 1.0) AS facility,
                   CASE WHEN j.gpus_unknown THEN 1 ELSE 0 END AS gunk,
                   CASE WHEN j.slurm_gpu_util IS NOT NULL AND j.alloc_gpus > 0 THEN 1 ELSE 0 END AS gslurm,
                   coalesce(j.pue, 1.0) AS pue, CASE WHEN {inter} THEN 1 ELSE 0 END AS inter,
                   {_est_range("lo", "low")}, {_est_range("hi", "high")}
            FROM jobs j
            WHERE j.start_time < %(until_ts)s AND (j.end_time >= %(since_ts)s OR j.end_time IS NULL)
                  AND j.start_time IS NOT NULL{_filters(scope, cluster, 0, within)}{fence}
        ) w{fence}
    ) x
), e AS (
    SELECT id, k, st, el, ov_e, fe, cpus, gpus, energy, measured, co2, est_lo, est_hi, inter
    FROM y WHERE fe > 0
), c AS (
    SELECT q.job_pk,
           sum(CASE WHEN q.component = 'gpu' THEN coalesce(q.energy_j, 0.0) ELSE 0.0 END) AS gpu,
           sum(CASE WHEN q.component = 'cpu' THEN coalesce(q.energy_j, 0.0) ELSE 0.0 END) AS cpu,
           sum(CASE WHEN q.component = 'dram' THEN coalesce(q.energy_j, 0.0) ELSE 0.0 END) AS dram,
           sum(CASE WHEN q.component NOT IN ('gpu', 'cpu', 'dram') THEN coalesce(q.energy_j, 0.0)
                    ELSE 0.0 END) AS other
    FROM job_energy q WHERE q.job_pk IN (SELECT id FROM e) GROUP BY q.job_pk
), m AS (
    SELECT job_pk, co2_embodied_g, gpu_util_pct, idle_gpu_s, idle_gpu_energy_j, shift_state, shift_saved_g,
           shift_pause_saved_g
    FROM job_metrics WHERE job_pk IN (SELECT id FROM e)
), es AS (
    SELECT e.k,
           sum(e.cpus * e.ov_e / {per_h}) AS cpu_hours, sum(e.gpus * e.ov_e / {per_h}) AS gpu_hours,
           sum(coalesce(c.gpu, 0.0) * e.fe) AS energy_gpu_j, sum(coalesce(c.cpu, 0.0) * e.fe) AS energy_cpu_j,
           sum(coalesce(c.dram, 0.0) * e.fe) AS energy_dram_j,
           sum(coalesce(c.other, 0.0) * e.fe) AS energy_other_j,
           sum(e.measured * e.fe) AS energy_measured_j,
           sum((e.energy - e.measured) * e.fe) AS energy_estimated_j,
           sum(e.est_lo * e.fe) AS energy_est_low_j, sum(e.est_hi * e.fe) AS energy_est_high_j,
           {parts},
           sum(e.co2 * e.fe) AS co2_g, sum(coalesce(m.co2_embodied_g, 0.0) * e.fe) AS co2_embodied_g,
           sum(CASE WHEN m.gpu_util_pct IS NOT NULL THEN coalesce(c.gpu, 0.0) * e.fe ELSE 0.0 END)
               AS gpu_util_energy_j,
           sum(CASE WHEN m.gpu_util_pct IS NOT NULL THEN m.gpu_util_pct * (coalesce(c.gpu, 0.0) * e.fe)
                    ELSE 0.0 END) AS gpu_util_weighted,
           sum(coalesce(m.idle_gpu_s, 0.0) * e.fe / {per_h}) AS idle_gpu_hours,
           sum(CASE WHEN m.shift_state = 'ok' THEN e.co2 * e.fe ELSE 0.0 END) AS shift_co2_g,
           sum(coalesce(m.shift_saved_g, 0.0) * e.fe) AS shift_saved_g,
           sum(coalesce(m.shift_pause_saved_g, 0.0) * e.fe) AS shift_pause_saved_g
    FROM e LEFT JOIN c ON c.job_pk = e.id LEFT JOIN m ON m.job_pk = e.id
    GROUP BY e.k
), n AS (
    SELECT k, sum(CASE WHEN f > 0 THEN 1 ELSE 0 END) AS jobs,
           {counts},
           sum(facility * f) AS facility_j,
           sum(CASE WHEN f > 0 THEN gunk ELSE 0 END) AS jobs_gpus_unknown,
           sum(CASE WHEN f > 0 THEN gslurm ELSE 0 END) AS jobs_gpu_slurm,
           min(CASE WHEN f > 0 THEN pue END) AS pue_min, max(CASE WHEN f > 0 THEN pue END) AS pue_max
    FROM y GROUP BY k
){top_cte if top else ""}
SELECT {PART_JOBS}, n.k, {", ".join(f"n.{c}" for c in job_cols)}, {", ".join(f"es.{c}" for c in ROLLUP_SUMS)},
       {_nulls(top_types)}
FROM n LEFT JOIN es ON es.k = n.k"""
    if rollups:
        sql += f"""
UNION ALL
SELECT {PART_ROLLUPS}, {_KEYS[group][1]}, {_nulls(["float8"] * len(job_cols))},
       {", ".join(f"sum({_ROLLUP_READ.get(c, 'r.' + c)})" for c in ROLLUP_SUMS)}, {_nulls(top_types)}
FROM daily_rollups r
WHERE r.day >= %(r0)s AND r.day < %(r1)s{_filters(scope, cluster, 1, within)}
GROUP BY 2"""
    if top:
        sql += f"""
UNION ALL
SELECT {PART_TOP}, '', {_nulls(["float8"] * n_sums)},
       j.id, j.job_id, cl.name, j.name, j.partition, j.state, j.start_time, j.elapsed_s, j.alloc_gpus,
       t.top_e, t.top_f, j.energy_measured_j, j.energy_j, j.co2_g, j.user_name, j.gpus_unknown
FROM t JOIN jobs j ON j.id = t.id JOIN clusters cl ON cl.id = j.cluster_id"""
    return sql


def _params(
    w: Window, key: str | None, cluster: str | None, plan: Plan, top: int, within: tuple[str, ...] = ()
) -> dict[str, Any]:
    p: dict[str, Any] = {"since": w.since_s, "until": w.until_s, "since_ts": w.since, "until_ts": w.until}
    for i, lab in enumerate(within):
        p[f"in{i}"] = lab
    if key is not None:
        p["key"] = key
    if cluster:
        p["cluster"] = cluster
    for i, (a, b) in enumerate(plan.edges):
        p[f"ea{i}"], p[f"eb{i}"] = a, b
    if plan.rollup_since is not None:
        p["r0"], p["r1"] = plan.rollup_since, plan.rollup_until
    if top > 0:
        p["top"] = top
    return p


def read_watermark(db: Db) -> datetime | None:
    """The start of the aggregator's last completed run (None: it never ran)."""
    rows = db.rows("SELECT watermark FROM aggregator_state WHERE name = %(n)s", {"n": WATERMARK})
    return db.timestamp(rows[0][0]) if rows else None


@dataclass
class Result:
    """What `query` read: raw sums per group key (rollup units), the top jobs, and where they came from."""

    sums: dict[str, Sums]
    top_jobs: list[TopJob]
    plan: Plan


def query(
    db: Db,
    w: Window,
    group: str | None = None,
    *,
    scope: tuple[str, str] | None = None,
    cluster: str | None = None,
    top: int = 0,
    from_jobs: bool = False,
    within: tuple[str, ...] | None = None,
    sessions: Sessions | None = None,
) -> Result:
    """Sums per `group` key (user, account, partition; None: one row keyed '') of the jobs in `scope`
    (("user", name) or ("account", lab)), from rollups and jobs as `plan_window` splits the window,
    and the `top` jobs by energy in it."""
    plan = plan_window(w, None if from_jobs else read_watermark(db), from_jobs=from_jobs)
    skind, key = scope if scope else (None, None)
    rollups = plan.rollup_since is not None
    inside = labs_bound(within)
    sql = footprint_sql(
        db,
        group,
        skind,
        cluster,
        edges=len(plan.edges),
        rollups=rollups,
        top=top > 0,
        within=len(inside),
        sessions=sessions,
    )
    sums: dict[str, Sums] = {}
    tops = []
    names = (*JOB_SUMS, *JOB_RANGES, *ROLLUP_SUMS)
    for row in db.rows(sql, _params(w, key, cluster, plan, top, inside)):
        part, k, vals, t = row[0], row[1], row[2 : 2 + len(names)], row[2 + len(names) :]
        if part == PART_TOP:
            tops.append(t)
            continue
        # (rollups only: jobs deleted since)
        s = sums.setdefault(k, dict.fromkeys((*JOB_SUMS, *ROLLUP_SUMS), 0.0))
        for name, v in zip(names, vals, strict=True):
            if v is not None:
                _fold(s, name, float(v))
    tops.sort(key=lambda t: (-float(t[9]), t[0]))
    return Result(sums, [_top_job(db, t) for t in tops], plan)


def _top_job(db: Db, t: tuple[Any, ...]) -> TopJob:
    (
        _id,
        job_id,
        cluster,
        name,
        partition,
        state,
        start,
        elapsed,
        gpus,
        _e,
        f,
        measured,
        energy,
        co2,
        user,
        unk,
    ) = t
    return TopJob(
        job_id=job_id,
        cluster=cluster,
        name=name,
        partition=partition,
        state=state,
        start=db.timestamp(start),
        elapsed_h=float(elapsed or 0.0) / S_PER_HOUR,
        gpus=int(gpus or 0),
        energy_kwh=float(energy or 0.0) / J_PER_KWH,
        co2_kg=float(co2 or 0.0) / G_PER_KG,
        measured=bool(energy) and float(measured or 0.0) >= float(energy) * 0.999,
        share=min(max(float(f or 0.0), 0.0), 1.0),
        user=user,
        gpus_unknown=bool(unk),
    )


def _fold(s: Sums, name: str, v: float) -> None:
    """Add `v` into `s[name]`, or take the min/max of a JOB_RANGES figure (absent until a job has one)."""
    fold = JOB_RANGES.get(name)
    if fold is None:
        s[name] += v
    else:
        s[name] = fold(s[name], v) if name in s else v


def _add(rows: Iterable[Sums]) -> Sums:
    total: Sums = dict.fromkeys((*JOB_SUMS, *ROLLUP_SUMS), 0.0)
    for s in rows:
        for k, v in s.items():
            _fold(total, k, v)
    return total


def user_footprint(
    db: Db,
    user: str,
    w: Window,
    *,
    cluster: str | None = None,
    top: int = 5,
    from_jobs: bool = False,
    within: tuple[str, ...] | None = None,
    sessions: Sessions | None = None,
) -> Footprint:
    """A user's footprint; `within`: only their jobs in these labs (what a lab head may see of them);
    `sessions`: the site's interactive sessions ([advice]; None: the default configuration's)."""
    r = query(
        db,
        w,
        None,
        scope=("user", user),
        cluster=cluster,
        top=top,
        from_jobs=from_jobs,
        within=within,
        sessions=sessions,
    )
    totals = Totals.from_sums(_add(r.sums.values()))
    return Footprint("user", user, w.since, w.until, totals, r.top_jobs, plan=r.plan, within=within)


def lab_footprint(
    db: Db,
    account: str,
    w: Window,
    *,
    cluster: str | None = None,
    top: int = 5,
    from_jobs: bool = False,
    sessions: Sessions | None = None,
) -> Footprint:
    """A lab's totals are the sum of its users' rows (each job has one user)."""
    r = query(
        db,
        w,
        "user",
        scope=("account", account),
        cluster=cluster,
        top=top,
        from_jobs=from_jobs,
        sessions=sessions,
    )
    members = [{"user": u, **asdict(Totals.from_sums(s))} for u, s in r.sums.items()]
    members = [m for m in members if m["jobs"]]
    members.sort(key=lambda m: (-m["energy_kwh"], m["user"]))
    totals = Totals.from_sums(_add(r.sums.values()))
    return Footprint("account", account, w.since, w.until, totals, r.top_jobs, members, r.plan)


def group_totals(
    db: Db,
    w: Window,
    by: str,
    *,
    cluster: str | None = None,
    from_jobs: bool = False,
    sessions: Sessions | None = None,
) -> list[dict[str, Any]]:
    """Totals per user, account (lab) or partition, largest energy first."""
    r = query(db, w, by, cluster=cluster, from_jobs=from_jobs, sessions=sessions)
    rows = [{by: k, **asdict(Totals.from_sums(s))} for k, s in r.sums.items()]
    rows = [row for row in rows if row["jobs"]]
    rows.sort(key=lambda row: (-row["energy_kwh"], row[by]))
    return rows


def cluster_totals(
    db: Db,
    w: Window,
    *,
    cluster: str | None = None,
    from_jobs: bool = False,
    sessions: Sessions | None = None,
) -> Totals:
    r = query(db, w, None, cluster=cluster, from_jobs=from_jobs, sessions=sessions)
    return Totals.from_sums(_add(r.sums.values()))


def now_utc() -> datetime:
    return datetime.now(UTC)
