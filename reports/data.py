"""What the monthly reports say, as typed dataclasses computed in SQL: per user, per lab, for admins, per job.

Where each figure comes from, and why:

* Totals, trends, daily and weekly series, per-user/lab/partition tables and rankings come from
  `daily_rollups`. A rollup row holds a UTC day's share of every job that ran in it (pro rata to its
  hours), so a UTC month is exactly the sum of its days and two months compare like for like; a month is
  a few thousand rows to read whatever the number of jobs.
* What a rollup cannot hold comes from `jobs` (+ `job_metrics`), each job weighted by the share of its
  run inside the month, the rollups' own formula (`cocaq.accounting.aggregate`): distinct jobs and their
  states (a
  rollup counts a job once in every day it ran), the CO2 of idle-GPU and failed-job energy (a rollup
  keeps their energy, not the intensity and PUE it was emitted at), the zones, sources and PUE used, the
  GPU-utilisation histogram, and per-job lists (top jobs, idle jobs, GPU jobs for `reports.suggest`).
* Per-GPU use of a multi-GPU job comes from `samples`: `job_gpu_hours` and `job_metrics` add a job's GPUs
  together, so they cannot tell one idle GPU out of four from four GPUs each idle a quarter of the time.
  Samples are read only for the few jobs whose job-level figures leave that possible.

Months are UTC months because the rollups' days are UTC days. The rollups are as fresh as the
aggregator's last run: `Basis.complete` says whether it ran after the month ended (run `cocaq aggregate`
before building reports). Energy is IT energy (before PUE); CO2 is operational (energy x PUE x intensity)
and embodied CO2 is always reported apart, never added in.

The per-row classes (JobFacts, JobLine, DayPoint, ...) are plain slotted dataclasses: a month of the
whole site holds tens of thousands of them, and frozen ones cost several times more to build.
"""

from __future__ import annotations

import bisect
import heapq
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Float,
    Table,
    and_,
    case,
    func,
    literal,
    or_,
    select,
    union_all,
)

from cocaq.accounting.ledger import OUTCOME, OUTCOMES, outcome_of
from cocaq.accounting.window import overlap_expr, share_expr
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import (
    AggregatorState,
    Cluster,
    DailyRollup,
    Job,
    JobEnergy,
    JobGpuHour,
    JobMetrics,
    ModelMetadata,
    NodeEnergy,
    Sample,
)
from cocaq.db.sqlfuncs import epoch_exact as _epoch_s
from cocaq.db.sqlfuncs import first_word as _first_word
from cocaq.db.sqlfuncs import floor_ as _floor
from cocaq.db.sqlfuncs import greatest, least
from cocaq.errors import UsageError
from cocaq.footprint.advice import Advice, Context, advise
from cocaq.footprint.by_model import UNNAMED, Comparison
from cocaq.footprint.by_model import Scope as ModelScope
from cocaq.footprint.by_model import comparisons as model_comparisons
from cocaq.footprint.jobfacts import DeviceUse, JobFacts
from cocaq.footprint.totals import equivalents
from cocaq.slurm.record import FINAL_STATES
from cocaq.units import J_PER_KWH

J = cast(Table, Job.__table__).c
M = cast(Table, JobMetrics.__table__).c
R = cast(Table, DailyRollup.__table__).c
E = cast(Table, JobEnergy.__table__).c
GH = cast(Table, JobGpuHour.__table__).c
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
# What a daily_rollups row sums (cocaq.accounting.aggregate._FIELDS without the per-day job counts).
SUMS = (
    "cpu_hours", "gpu_hours", "energy_gpu_j", "energy_cpu_j", "energy_dram_j", "energy_other_j",
    "energy_measured_j", "energy_estimated_j", "energy_failed_j", "energy_oom_j", "energy_timeout_j",
    "energy_cancelled_j", "co2_g", "co2_embodied_g", "gpu_util_energy_j", "gpu_util_weighted",
    "idle_gpu_hours", "idle_gpu_energy_j", "energy_est_low_j", "energy_est_high_j",
)  # fmt: skip
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


def _f(x: float) -> Any:
    return literal(x, Float)


# --- the month -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Month:
    """A UTC calendar month [start, end)."""

    start: datetime
    end: datetime

    @classmethod
    def of(cls, when: datetime | date) -> Month:
        """The UTC month holding `when` (a naive datetime is taken as UTC)."""
        if isinstance(when, datetime):
            when = as_utc(when).astimezone(UTC)
        start = datetime(when.year, when.month, 1, tzinfo=UTC)
        end = datetime(when.year + (when.month == 12), when.month % 12 + 1, 1, tzinfo=UTC)
        return cls(start, end)

    def previous(self) -> Month:
        return Month.of(self.start - timedelta(days=1))

    @property
    def label(self) -> str:
        return f"{self.start:%Y-%m}"

    def days(self) -> list[date]:
        n = (self.end - self.start).days
        return [(self.start + timedelta(days=i)).date() for i in range(n)]


# --- what the reports hold ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MonthTotals:
    """A scope's month: energy before PUE, CO2 operational with PUE; embodied apart, never added in."""

    energy_kwh: float = 0.0
    co2_kg: float = 0.0
    co2_embodied_kg: float = 0.0
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0
    jobs: int = 0  # distinct jobs that ran in the month (from jobs: rollups count a job in each day)
    jobs_failed: int = 0  # FAILED, NODE_FAIL, BOOT_FAIL
    jobs_cancelled: int = 0
    jobs_timeout: int = 0  # TIMEOUT, DEADLINE
    jobs_oom: int = 0
    gpu_util_pct: float | None = None  # energy-weighted, over the GPU energy that samples cover
    idle_gpu_hours: float = 0.0  # allocated GPU-hours under the idle threshold
    # What did no work, in disjoint parts of energy_kwh (cocaq.accounting.ledger), each with its CO2 (at each
    # job's
    # own intensity x PUE, see `_job_groups`): idle GPUs, then the rest of the energy of the jobs that
    # failed, ran out of memory, timed out, were cancelled.
    idle_gpu_kwh: float = 0.0  # what idle allocated GPUs drew (their samples), at most the GPU energy
    idle_co2_kg: float = 0.0
    failed_kwh: float = 0.0
    failed_co2_kg: float = 0.0
    oom_kwh: float = 0.0
    oom_co2_kg: float = 0.0
    timeout_kwh: float = 0.0
    timeout_co2_kg: float = 0.0
    cancelled_kwh: float = 0.0
    cancelled_co2_kg: float = 0.0
    measured_kwh: float = 0.0
    estimated_kwh: float = 0.0
    estimated_low_kwh: float = 0.0  # the estimate's range (calibrated GPU estimates; the estimate where none)
    estimated_high_kwh: float = 0.0
    gpu_kwh: float = 0.0
    cpu_kwh: float = 0.0
    dram_kwh: float = 0.0
    other_kwh: float = 0.0  # node-level measurements (Slurm's ConsumedEnergy)

    @property
    def measured_share(self) -> float | None:
        return self.measured_kwh / self.energy_kwh if self.energy_kwh > 0 else None

    @property
    def wasted_kwh(self) -> float:
        """The disjoint parts that did no work, added up: never more than energy_kwh."""
        return self.idle_gpu_kwh + sum(getattr(self, f"{o}_kwh") for o in OUTCOMES)

    @property
    def wasted_co2_kg(self) -> float:
        return self.idle_co2_kg + sum(getattr(self, f"{o}_co2_kg") for o in OUTCOMES)

    def jobs_of(self, outcome: str) -> int:
        return int(getattr(self, f"jobs_{outcome}"))


@dataclass(frozen=True)
class Equivalents:
    """Everyday equivalents of the operational CO2 (cocaq.footprint.totals's US EPA factors)."""

    car_km: float
    smartphone_charges: float


@dataclass(frozen=True)
class Change:
    """One figure this month against the previous: `delta` in its unit (percentage points for a
    utilisation), `pct` relative (None when the previous month had none)."""

    current: float | None
    previous: float | None
    delta: float | None
    pct: float | None

    @classmethod
    def of(cls, current: float | None, previous: float | None) -> Change:
        if current is None or previous is None:
            return cls(current, previous, None, None)
        return cls(
            current, previous, current - previous, (current / previous - 1) * 100 if previous else None
        )


@dataclass(frozen=True)
class Trend:
    """This month against the previous one, as rates per day of data.

    A month is compared by what it holds per day over the days the data covers (from the first day the
    database has jobs to the aggregator's last complete day), so a month whose data starts on the 25th,
    or the month still running, compares fairly with a whole one. With fewer than `min_days` days of data
    on either side there is no comparison at all (`comparable` False, `note` says why): seven days
    against thirty would say more about the data than about the user. Utilisation is a ratio already.
    """

    previous_month: Month
    energy_kwh: Change  # kWh per day of data
    co2_kg: Change  # kg per day of data
    gpu_hours: Change  # GPU-hours per day of data
    gpu_util_pct: Change  # delta in percentage points
    days: int = 0  # days of this month with data
    previous_days: int = 0
    comparable: bool = True
    note: str = ""  # how it compares, or why it does not

    @property
    def per_day(self) -> bool:
        return True


@dataclass(frozen=True)
class PeerStanding:
    """Where a user stands among the users with jobs in the month on the same cluster(s).

    Percentiles say the share of the *other* peers below the user (ties count half): 100 is the most
    energy of all, 0 the least; None with no other peer. Utilisation ranks only users whose GPU
    utilisation is known (GPU jobs with samples).
    """

    clusters: tuple[str, ...]
    users: int  # peers with jobs in the month, the user included
    energy_rank: int | None  # 1 = the most energy
    energy_percentile: float | None
    gpu_users: int  # peers with a known GPU utilisation, the user included if theirs is
    gpu_util_rank: int | None  # 1 = the highest utilisation
    gpu_util_percentile: float | None


@dataclass(slots=True)
class JobLine:
    """A job in a top-N list, ranked by the month's share of its energy; its energy, CO2 and GPU-hours are
    the whole job's (as `cocaq job` shows them), `share_in_month` what the month counts of it."""

    pk: int
    job_id: str
    cluster: str
    name: str | None
    partition: str | None
    state: str
    start: datetime | None
    end: datetime | None
    gpus: int
    elapsed_h: float
    share_in_month: float
    energy_kwh: float
    co2_kg: float
    gpu_hours: float
    measured_share: float | None
    gpu_util_pct: float | None


@dataclass(frozen=True)
class TimeLimitUse:
    """How much of their time limit the user's COMPLETED jobs that ended in the month used.

    Only jobs with a known limit (jobs.time_limit_s, from sacct's Timelimit) count.
    """

    finished: int = 0  # finished in the month with a known limit, any state
    completed: int = 0  # of which COMPLETED: the ones whose use of the limit says anything
    timeouts: int = 0
    median_use: float | None = None  # median of elapsed / limit over the completed ones
    median_limit_h: float | None = None
    median_elapsed_h: float | None = None
    p95_elapsed_h: float | None = None
    max_elapsed_h: float | None = None
    requested_h: float = 0.0  # sum of limits (wall time)
    used_h: float = 0.0  # sum of elapsed
    examples: tuple[str, ...] = ()  # completed jobs that left the most of their limit unused


@dataclass(slots=True)
class DayPoint:
    day: date
    energy_kwh: float
    co2_kg: float
    gpu_hours: float
    gpu_util_pct: float | None
    has_data: bool = True  # False: before the data starts or after the aggregator's last day (not a 0)


@dataclass(slots=True)
class WeekPoint:
    """An ISO week, clipped to the month (`first`..`last`, `days` of it in the month)."""

    iso_year: int
    iso_week: int
    first: date
    last: date
    days: int
    energy_kwh: float
    co2_kg: float
    gpu_hours: float
    gpu_util_pct: float | None
    data_days: int = 7  # of its days in the month, those the data covers

    @property
    def partial(self) -> bool:
        """Fewer than 7 days of data: the week is cut by the month, the data's start or its end."""
        return self.data_days < 7


@dataclass(frozen=True)
class CarbonBasis:
    """Intensity used for a part of the energy: zone, source (and fallback flag), energy share."""

    zone: str | None
    source: str | None
    flag: str | None
    energy_kwh: float
    energy_share: float
    co2_kg: float
    g_per_kwh: float | None  # energy-weighted mean intensity (before PUE)


@dataclass(frozen=True)
class Basis:
    """What the figures rest on: how much was measured, which intensities and PUE, how fresh."""

    measured_share: float | None
    carbon: tuple[CarbonBasis, ...]
    pue_min: float | None
    pue_max: float | None
    idle_threshold_pct: float
    rollups_through: datetime | None  # the aggregator's last completed run started then
    complete: bool  # it ran after the month ended: every day of the month is in the rollups


@dataclass(frozen=True)
class UserMonth:
    user: str
    month: Month
    cluster: str | None  # the cluster asked for (None: all)
    clusters: tuple[str, ...]  # where the user ran this month
    accounts: tuple[str, ...]
    totals: MonthTotals
    equivalents: Equivalents
    trend: Trend
    peers: PeerStanding
    top_jobs: tuple[JobLine, ...]
    idle_jobs: tuple[JobFacts, ...]  # jobs that held GPUs nearly idle, most idle energy first
    jobs: tuple[
        JobFacts, ...
    ]  # every job of the month (cocaq.footprint.jobfacts), most energy first: the advice's
    time_limits: TimeLimitUse
    basis: Basis
    daily: tuple[DayPoint, ...]  # every day of the month
    models: tuple[ModelUse, ...] = ()  # the month's share of the user's jobs with model metadata
    # the user's runs of one model side by side by precision and batch size (cocaq.footprint.by_model): runs
    # that
    # ended in the month, whole; the largest possible saving first
    model_comparisons: tuple[Comparison, ...] = ()
    data_days: DataDays | None = None  # the days of the month the data covers


@dataclass(frozen=True)
class IdleWaste:
    """Allocated GPU time under the idle threshold of a user or lab; share = idle / all GPU-hours."""

    key: str
    gpu_hours: float
    idle_gpu_hours: float
    idle_share: float | None
    idle_kwh: float
    idle_co2_kg: float


@dataclass(frozen=True)
class LabUser:
    user: str
    jobs: int
    energy_kwh: float
    co2_kg: float
    gpu_hours: float
    gpu_util_pct: float | None
    idle_gpu_hours: float
    idle_kwh: float
    failed_kwh: float
    waste: WasteBreakdown | None = None  # the ledger's disjoint parts of their energy that did no work


@dataclass(frozen=True)
class ModelUse:
    """The energy, CO2 and GPU-hours of the runs that ended in the month whose model_metadata names this
    model and framework, whole (as `cocaq models` counts them; one row of metadata per job)."""

    model_name: str  # "(unnamed)" for metadata that names no model (a framework only, say)
    framework: str | None
    jobs: int
    energy_kwh: float
    co2_kg: float
    gpu_hours: float
    users: int = 0


@dataclass(frozen=True)
class MonthWaste:
    """One month of the site's energy that did no work (the ledger's parts), for the trend over months."""

    month: Month
    data_days: int  # days of it the data covers
    energy_kwh: float
    idle_kwh: float
    failed_kwh: float
    oom_kwh: float
    timeout_kwh: float
    cancelled_kwh: float

    @property
    def wasted_kwh(self) -> float:
        return self.idle_kwh + self.failed_kwh + self.oom_kwh + self.timeout_kwh + self.cancelled_kwh

    @property
    def wasted_share(self) -> float | None:
        return self.wasted_kwh / self.energy_kwh if self.energy_kwh > 0 else None


@dataclass(frozen=True)
class MemberAdvice:
    """A lab member's largest suggestion of the month (cocaq.footprint.advice), for the lab head."""

    user: str
    advice: Advice


@dataclass(frozen=True)
class SiteLever:
    """One kind of suggestion added up over the site's users, and what admins can do about it."""

    id: str  # an Advice id, or "power-cap" (admins only)
    label: str  # what it is: "GPUs held idle by notebooks"
    users: tuple[str, ...]  # most saving first
    saving_kwh: float
    saving_kg: float
    upper_bound: bool
    action: str  # what the admins can do


@dataclass(frozen=True)
class LabMonth:
    account: str
    month: Month
    cluster: str | None
    totals: MonthTotals
    equivalents: Equivalents
    trend: Trend
    users: tuple[LabUser, ...]  # most energy first
    idle_by_user: tuple[IdleWaste, ...]  # most idle energy first
    models: tuple[ModelUse, ...]  # empty when no model_metadata
    weekly: tuple[WeekPoint, ...]
    basis: Basis
    data_days: DataDays | None = None
    advice: tuple[MemberAdvice, ...] = ()  # each member's largest suggestion, largest first


@dataclass(frozen=True)
class GroupEnergy:
    key: str
    jobs: int
    energy_kwh: float
    co2_kg: float
    gpu_hours: float
    cpu_hours: float
    gpu_util_pct: float | None
    measured_share: float | None
    energy_share: float | None  # of the month's total


@dataclass(frozen=True)
class UtilBin:
    lo: float  # [lo, hi) percent; the last bin holds 100
    hi: float
    jobs: int
    gpu_hours: float


@dataclass(frozen=True)
class UtilHistogram:
    """GPU jobs by their energy-weighted utilisation, weighted by their GPU-hours in the month."""

    bins: tuple[UtilBin, ...]
    unsampled_jobs: int  # GPU jobs without samples: utilisation unknown
    unsampled_gpu_hours: float


@dataclass(frozen=True)
class WasteBreakdown:
    """A lab's (or user's) energy that did no work, in the ledger's disjoint parts
    (cocaq.accounting.ledger)."""

    key: str
    energy_kwh: float  # all of its energy: the parts never add up to more
    idle_kwh: float
    failed_kwh: float
    oom_kwh: float
    timeout_kwh: float
    cancelled_kwh: float
    jobs_failed: int
    jobs_oom: int
    jobs_timeout: int
    jobs_cancelled: int
    wasted_co2_kg: float

    @property
    def wasted_kwh(self) -> float:
        return self.idle_kwh + self.failed_kwh + self.oom_kwh + self.timeout_kwh + self.cancelled_kwh

    @classmethod
    def of(cls, key: str, t: MonthTotals) -> WasteBreakdown:
        return cls(
            key, t.energy_kwh, t.idle_gpu_kwh, t.failed_kwh, t.oom_kwh, t.timeout_kwh, t.cancelled_kwh,
            t.jobs_failed, t.jobs_oom, t.jobs_timeout, t.jobs_cancelled, t.wasted_co2_kg,
        )  # fmt: skip


@dataclass(frozen=True)
class StateEnergy:
    state: str
    jobs: int
    energy_kwh: float
    co2_kg: float
    outcome: (
        str | None
    )  # where the ledger counts its energy beyond idle GPUs (cocaq.accounting.ledger), if anywhere


@dataclass(frozen=True)
class Coverage:
    partition: str
    energy_kwh: float
    measured_kwh: float
    estimated_kwh: float
    measured_share: float | None
    estimated_low_kwh: float | None = None  # the estimate's range (calibrated GPU estimates)
    estimated_high_kwh: float | None = None


@dataclass(slots=True)
class DayIntensity:
    day: date
    g_per_kwh: float
    energy_kwh: float


@dataclass(frozen=True)
class ZoneIntensity:
    """The intensity a zone's jobs were given over the month (from jobs.carbon_g_per_kwh).

    `g_per_kwh` weights every job by its energy in the month; `daily_mean_g_per_kwh` is the plain mean of
    the days' energy-weighted values (`daily`), a reading of the series itself rather than of when the
    jobs ran.
    """

    zone: str
    energy_kwh: float
    g_per_kwh: float | None
    daily_mean_g_per_kwh: float | None
    daily: tuple[DayIntensity, ...]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class WindowUse:
    start: datetime
    end: datetime
    gpu_hours: float
    idle_gpu_hours: float
    idle_share: float | None
    gpu_util_pct: float | None


@dataclass(frozen=True)
class BeforeAfterUser:
    user: str
    first_report: datetime
    before: WindowUse
    after: WindowUse
    idle_share_change: float | None  # after - before
    gpu_util_change: float | None  # percentage points


@dataclass(frozen=True)
class BeforeAfter:
    """Idle-GPU share and GPU utilisation before and after each user's first report.

    An observational before/after comparison, not a controlled effect: there is no control group, and
    anything else that changed around the report (projects, deadlines, the software, the season, which
    users keep running GPU jobs at all) is mixed into the difference. Read it as a description.

    Each user's windows are the `window_days` whole UTC days before the day of the first report and the
    `window_days` whole days after it (the day of the report itself, when it was not at midnight, is in
    neither). A user counts only with GPU-hours and GPU samples on both sides (without samples an idle
    share of 0 would mean "unknown"), and only once the after-window is over by the month's end and in
    the rollups (`pending` otherwise). The aggregate figures are GPU-hour-weighted: the idle share is
    idle GPU-hours over GPU-hours of the included users on each side; the utilisation is each user's
    energy-weighted utilisation weighted by their GPU-hours on that side.
    """

    window_days: int
    users: tuple[BeforeAfterUser, ...]
    gpu_hours_before: float
    gpu_hours_after: float
    idle_share_before: float | None
    idle_share_after: float | None
    idle_share_change: float | None
    gpu_util_before: float | None
    gpu_util_after: float | None
    gpu_util_change: float | None
    excluded: tuple[str, ...]  # no GPU-hours or no samples on one side
    pending: tuple[str, ...]  # the after-window is not over (or not aggregated) by the month's end


@dataclass(frozen=True)
class AdminMonth:
    month: Month
    cluster: str | None
    totals: MonthTotals
    equivalents: Equivalents
    trend: Trend
    by_lab: tuple[GroupEnergy, ...]
    by_partition: tuple[GroupEnergy, ...]
    by_week: tuple[WeekPoint, ...]
    util_histogram: UtilHistogram
    idle_by_user: tuple[IdleWaste, ...]
    idle_by_lab: tuple[IdleWaste, ...]
    waste_by_lab: tuple[WasteBreakdown, ...]  # most wasted energy first
    energy_by_state: tuple[StateEnergy, ...]
    coverage: tuple[Coverage, ...]
    intensity: tuple[ZoneIntensity, ...]
    top_users: tuple[GroupEnergy, ...]
    before_after: BeforeAfter | None
    basis: Basis
    models: tuple[ModelUse, ...] = ()  # the site's, most energy first
    data_days: DataDays | None = None
    advice: tuple[SiteLever, ...] = ()  # the users' suggestions added up by kind, and power caps
    waste_trend: tuple[MonthWaste, ...] = ()  # this month and the ones before it with data, oldest first


@dataclass(frozen=True)
class EnergyPart:
    node: str
    component: str
    method: str
    source: str
    energy_kwh: float


@dataclass(frozen=True)
class JobReport:
    """One job's footprint and what it rests on."""

    pk: int
    job_id: str
    cluster: str
    user: str
    account: str | None
    partition: str | None
    name: str | None
    state: str
    state_detail: str | None
    is_open: bool
    submit: datetime
    start: datetime | None
    end: datetime | None
    elapsed_h: float
    time_limit_h: float | None
    cpus: int
    gpus: int
    gpu_type: str | None
    node_list: str | None
    energy_kwh: float
    measured_kwh: float
    estimated_kwh: float
    estimated_low_kwh: float  # the estimate's range (calibrated GPU estimates; the estimate where none)
    estimated_high_kwh: float
    by_component: dict[str, float]  # kWh
    by_method: dict[str, float]  # kWh: measured, estimated
    parts: tuple[EnergyPart, ...]
    pue: float
    carbon_zone: str | None
    carbon_g_per_kwh: float | None
    carbon_source: str | None
    carbon_year: int | None
    carbon_flag: str | None
    carbon_detail: dict[str, Any] | None
    co2_kg: float
    co2_embodied_kg: float | None  # None until the aggregator has run for the job
    gpu_util_pct: float | None
    sampled_gpu_hours: float
    idle_gpu_hours: float
    idle_kwh: float
    idle_co2_kg: float
    cpu_usage: float | None
    hw_profile: str | None
    final: bool  # the energy will not change: see `job_footprint`
    final_reasons: tuple[str, ...]  # why not, when not
    metrics_current: bool  # job_metrics derived after the job's last change
    models: tuple[str, ...]
    facts: JobFacts | None = None  # the ledger's view of it (cocaq.footprint.jobfacts): waste parts, memory
    notes: tuple[
        Advice, ...
    ] = ()  # what to change next time (cocaq.footprint.advice.job_notes), largest first


@dataclass(frozen=True)
class ReportOptions:
    """Sizes of the lists and what counts as a job holding GPUs nearly idle."""

    top_jobs: int = 5
    idle_jobs: int = 5
    # A job holds its GPUs nearly idle when at least this share of its sampled GPU time was under the
    # idle threshold ([aggregate] idle_gpu_util_pct), for at least `min_idle_gpu_hours` in the month.
    nearly_idle_share: float = 0.5
    min_idle_gpu_hours: float = 0.5
    # Multi-GPU jobs whose GPUs are looked at one by one in `samples` (most idle GPU-hours first), per user
    # and in all: reading a job's samples costs rows x GPUs x its hours, the costly part of a month (a
    # per-GPU summary kept by the aggregator would remove it). Candidates: see `_examine_devices`.
    device_jobs: int = 3
    device_jobs_total: int = 300
    top_users: int = 10
    # Month-over-month comparisons need this many days of data in both months (see Trend).
    trend_min_days: int = 14
    trend_months: int = 6  # the admin report's waste trend: this month and up to 5 before it


# --- building blocks -----------------------------------------------------------------------------------


@dataclass
class _Scope:
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


def _tune(conn: Connection) -> None:
    """PostgreSQL, for this transaction: no JIT (these scans of a month are costed high enough to be
    compiled, and compiling them takes longer than running them), and work_mem for grouping a month's
    jobs in memory rather than sorting them on disk. (In autocommit mode: a warning, no effect.)"""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL jit = off; SET LOCAL work_mem = '{WORK_MEM}'")


def _cluster_id(conn: Connection, name: str | None) -> int | None:
    if name is None:
        return None
    cid = conn.execute(select(CL.id).where(CL.name == name)).scalar()
    if cid is None:
        raise UsageError(f"no cluster named {name!r} in the database")
    return int(cid)


def _cluster_names(conn: Connection) -> dict[int, str]:
    return {int(i): str(n) for i, n in conn.execute(select(CL.id, CL.name))}


def _watermark(conn: Connection) -> datetime | None:
    return as_utc(conn.execute(select(AS.watermark).where(AS.name == "jobs")).scalar())


def _rollups(
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


def _add(into: Sums, s: Mapping[str, float]) -> Sums:
    for k, v in s.items():
        into[k] = into.get(k, 0.0) + v
    return into


def _total(rows: Iterable[Mapping[str, float]]) -> Sums:
    out: Sums = dict.fromkeys(SUMS, 0.0)
    for s in rows:
        _add(out, s)
    return out


def _util(s: Mapping[str, float]) -> float | None:
    e = s.get("gpu_util_energy_j", 0.0)
    return s.get("gpu_util_weighted", 0.0) / e if e > 0 else None


def _kwh(s: Mapping[str, float]) -> float:
    return (s.get("energy_measured_j", 0.0) + s.get("energy_estimated_j", 0.0)) / J_PER_KWH


def _month_jobs(lo: datetime, hi: datetime, where: list[Any]) -> Any:
    """The jobs that ran in [lo, hi) with job_metrics, and `f`: the share of each inside it.

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
            func.coalesce(M.gpu_samples_s, 0.0).label("samples_s"),
            func.coalesce(M.idle_gpu_s, 0.0).label("idle_s"),
            # the ledger's idle GPU energy: at most the job's energy (cocaq.accounting.ledger.waste)
            greatest(
                _f(0.0),
                least(
                    func.coalesce(M.idle_gpu_energy_j, 0.0), greatest(func.coalesce(J.energy_j, 0.0), _f(0.0))
                ),
            ).label("idle_j"),
            func.coalesce(M.co2_embodied_g, 0.0).label("embodied"),
            _epoch_s(J.start_time).label("t0"),
            greatest(func.coalesce(J.elapsed_s, 0.0), _f(0.0)).label("el"),
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
class _JobStats:
    """Distinct jobs by how they ended, and the CO2 of the ledger's parts (cocaq.accounting.ledger), per
    key."""

    jobs: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # outcome -> jobs
    co2_g: dict[str, float] = field(default_factory=dict)  # part (idle or an outcome) -> CO2
    pue_min: float | None = None
    pue_max: float | None = None

    def add(self, o: _JobStats) -> None:
        self.jobs += o.jobs
        for k, n in o.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        for k, c in o.co2_g.items():
            self.co2_g[k] = self.co2_g.get(k, 0.0) + c
        self.pue_min = _opt(min, self.pue_min, o.pue_min)
        self.pue_max = _opt(max, self.pue_max, o.pue_max)

    def count(self, outcome: str) -> int:
        return self.counts.get(outcome, 0)


def _opt(fn: Any, a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else float(fn(a, b))


@dataclass
class _Group:
    """The month's jobs of one key, state and carbon basis: one row of `_job_groups`."""

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
    bin: int | None = None  # with `bins`: the utilisation bin (UTIL_BINS: no samples; -1: no GPU)
    gpu_hours: float = 0.0  # with `bins`


UTIL_BINS = 10  # 10% wide; index UTIL_BINS counts GPU jobs without samples


def _job_groups(conn: Connection, y: Any, keys: Sequence[Any], *, bins: bool = False) -> list[_Group]:
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
        src = select(y, bin_.label("bin"), (y.c.gpus * y.c.ov / 3600.0).label("gh")).subquery("yb")
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
        func.sum(case((c.g.is_not(None), e), else_=_f(0.0))),
        func.sum(c.idle_j * c.f),
        func.sum(case((c.energy > 0, c.idle_j * c.f * c.co2 / c.energy), else_=_f(0.0))),
        func.min(c.pue),
        func.max(c.pue),
    ]
    if bins:
        cols.append(func.sum(c.gh))
    q = select(*cols).where(c.f > 0).group_by(*kcols, c.st, c.zone, c.source, c.flag)
    n = len(keys)
    m = len(kcols)
    out = []
    for r in conn.execute(q).all():
        out.append(
            _Group(
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
                _num(r[m + 11]),
                _num(r[m + 12]),
                int(r[n]) if bins else None,
                float(r[m + 13] or 0.0) if bins else 0.0,
            )
        )
    return out


def _same(key: tuple[Any, ...]) -> Any:
    return key


def _stats(groups: Iterable[_Group], fold: Callable[[tuple[Any, ...]], Any] = _same) -> dict[Any, _JobStats]:
    """Per key (or per fold(key)): distinct jobs by how they ended, the CO2 of the ledger's parts (idle
    GPUs; the rest of a job that ended badly under its outcome), PUE."""
    out: dict[Any, _JobStats] = defaultdict(_JobStats)
    for g in groups:
        o = OUTCOME.get(g.st)
        co2 = {"idle": g.idle_co2_g}
        if o is not None:
            co2[o] = g.co2_g - g.idle_co2_g
        out[fold(g.key)].add(
            _JobStats(g.jobs, {o: g.jobs} if o is not None else {}, co2, g.pue_min, g.pue_max)
        )
    return out


def _carbon(
    groups: Iterable[_Group], fold: Callable[[tuple[Any, ...]], Any] = _same
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


def _whole(key: tuple[Any, ...]) -> Any:
    return ()


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def _basis(
    cfg: Config,
    s: Mapping[str, float],
    carbon: Sequence[tuple[Any, ...]],
    js: _JobStats | None,
    watermark: datetime | None,
    month: Month,
) -> Basis:
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
                co2 / 1000,
                float(eg) / float(e_known) if e_known else None,
            )
        )
    parts.sort(key=lambda p: (-p.energy_kwh, p.zone or "", p.source or "", p.flag or ""))
    e = _kwh(s)
    return Basis(
        measured_share=(s.get("energy_measured_j", 0.0) / J_PER_KWH / e) if e > 0 else None,
        carbon=tuple(parts),
        pue_min=js.pue_min if js else None,
        pue_max=js.pue_max if js else None,
        idle_threshold_pct=cfg.aggregate.idle_gpu_util_pct,
        rollups_through=watermark,
        complete=watermark is not None and watermark >= month.end,
    )


def _totals(s: Mapping[str, float], js: _JobStats | None) -> MonthTotals:
    js = js or _JobStats()
    g = {k: float(s.get(k, 0.0)) for k in SUMS}
    return MonthTotals(
        energy_kwh=_kwh(g),
        co2_kg=g["co2_g"] / 1000,
        co2_embodied_kg=g["co2_embodied_g"] / 1000,
        gpu_hours=g["gpu_hours"],
        cpu_hours=g["cpu_hours"],
        jobs=js.jobs,
        jobs_failed=js.count("failed"),
        jobs_cancelled=js.count("cancelled"),
        jobs_timeout=js.count("timeout"),
        jobs_oom=js.count("oom"),
        gpu_util_pct=_util(g),
        idle_gpu_hours=g["idle_gpu_hours"],
        idle_gpu_kwh=g["idle_gpu_energy_j"] / J_PER_KWH,
        idle_co2_kg=js.co2_g.get("idle", 0.0) / 1000,
        failed_kwh=g["energy_failed_j"] / J_PER_KWH,
        failed_co2_kg=js.co2_g.get("failed", 0.0) / 1000,
        oom_kwh=g["energy_oom_j"] / J_PER_KWH,
        oom_co2_kg=js.co2_g.get("oom", 0.0) / 1000,
        timeout_kwh=g["energy_timeout_j"] / J_PER_KWH,
        timeout_co2_kg=js.co2_g.get("timeout", 0.0) / 1000,
        cancelled_kwh=g["energy_cancelled_j"] / J_PER_KWH,
        cancelled_co2_kg=js.co2_g.get("cancelled", 0.0) / 1000,
        measured_kwh=g["energy_measured_j"] / J_PER_KWH,
        estimated_kwh=g["energy_estimated_j"] / J_PER_KWH,
        estimated_low_kwh=g["energy_est_low_j"] / J_PER_KWH,
        estimated_high_kwh=g["energy_est_high_j"] / J_PER_KWH,
        gpu_kwh=g["energy_gpu_j"] / J_PER_KWH,
        cpu_kwh=g["energy_cpu_j"] / J_PER_KWH,
        dram_kwh=g["energy_dram_j"] / J_PER_KWH,
        other_kwh=g["energy_other_j"] / J_PER_KWH,
    )


def _equivalents(t: MonthTotals) -> Equivalents:
    eq = equivalents(t.co2_kg)
    return Equivalents(car_km=float(eq["car_km"]), smartphone_charges=float(eq["smartphone_charges"]))


@dataclass(frozen=True)
class DataDays:
    """The days a month's data covers: from the first day the database has jobs (on the scope's
    cluster) to the end of the aggregator's last complete day, within the month."""

    first: date | None  # the first day with data, None: none
    end: date | None  # the day after the last day with data
    days: int
    month_days: int

    @property
    def partial(self) -> bool:
        return self.days < self.month_days

    def holds(self, d: date) -> bool:
        return self.first is not None and self.end is not None and self.first <= d < self.end


def _data_start(conn: Connection, cluster_id: int | None) -> datetime | None:
    """The first day the rollups hold anything (on the cluster): where the data starts."""
    q = select(func.min(R.day))
    if cluster_id is not None:
        q = q.where(R.cluster_id == cluster_id)
    return as_utc(conn.execute(q).scalar())


def _data_days(month: Month, start: datetime | None, watermark: datetime | None) -> DataDays:
    n = len(month.days())
    if start is None or watermark is None:
        return DataDays(None, None, 0, n)
    lo = max(_midnight(start), month.start)
    hi = min(_midnight(watermark), month.end)
    if hi <= lo:
        return DataDays(None, None, 0, n)
    return DataDays(lo.date(), hi.date(), (hi - lo).days, n)


def _day_label(d: date) -> str:
    return f"{d.day} {d:%b}"


def _trend(
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
        energy_kwh=Change.of(rate(_kwh(cur), days), rate(_kwh(old), prev_days)),
        co2_kg=Change.of(
            rate(cur.get("co2_g", 0.0) / 1000, days), rate(old.get("co2_g", 0.0) / 1000, prev_days)
        ),
        gpu_hours=Change.of(
            rate(cur.get("gpu_hours", 0.0), days), rate(old.get("gpu_hours", 0.0), prev_days)
        ),
        gpu_util_pct=Change.of(_util(cur), _util(old)),
        days=days.days,
        previous_days=prev_days.days,
        comparable=True,
        note=note,
    )


def _daily(
    conn: Connection, month: Month, keys: Sequence[Any], where: list[Any]
) -> dict[Any, dict[date, Sums]]:
    """Per key, per day of the month: the rollups' sums that the series show (DAY_SUMS)."""
    rows = _rollups(conn, month.start, month.end, [*keys, R.day], where, DAY_SUMS)
    out: dict[Any, dict[date, Sums]] = defaultdict(dict)
    for k, s in rows.items():
        _add(out[k[:-1]].setdefault(as_utc(k[-1]).date(), {}), s)
    return out


def _day_points(month: Month, days: Mapping[date, Sums], span: DataDays) -> tuple[DayPoint, ...]:
    out = []
    for d in month.days():
        s = days.get(d, {})
        out.append(
            DayPoint(d, _kwh(s), s.get("co2_g", 0.0) / 1000, s.get("gpu_hours", 0.0), _util(s), span.holds(d))
        )
    return tuple(out)


def _weeks(month: Month, days: Mapping[date, Sums], span: DataDays) -> tuple[WeekPoint, ...]:
    """ISO weeks (Monday to Sunday), clipped to the month; each says how many of its days have data."""
    acc: dict[tuple[int, int], tuple[list[date], Sums]] = {}
    for d in month.days():
        iso = d.isocalendar()
        ds, s = acc.setdefault((iso[0], iso[1]), ([], dict.fromkeys(DAY_SUMS, 0.0)))
        ds.append(d)
        _add(s, days.get(d, {}))
    return tuple(
        WeekPoint(
            y,
            w,
            ds[0],
            ds[-1],
            len(ds),
            _kwh(s),
            s["co2_g"] / 1000,
            s["gpu_hours"],
            _util(s),
            sum(1 for d in ds if span.holds(d)),
        )
        for (y, w), (ds, s) in sorted(acc.items())
    )


def _standing(mine: float, ordered: Sequence[float]) -> tuple[int, float | None]:
    """(rank from the top, percentile of the others below, ties half) of `mine` in sorted `ordered`."""
    n = len(ordered)
    below = bisect.bisect_left(ordered, mine)
    at_or_below = bisect.bisect_right(ordered, mine)
    rank = n - at_or_below + 1
    if n < 2:
        return rank, None
    ties = at_or_below - below - 1  # the others with the same value
    return rank, 100.0 * (below + 0.5 * ties) / (n - 1)


# --- per user ---------------------------------------------------------------------------------------


def user_month(
    conn: Connection,
    cfg: Config,
    user: str,
    month_start: datetime | date,
    *,
    cluster: str | None = None,
    options: ReportOptions | None = None,
) -> UserMonth:
    """One user's month (an empty one, all zeros, if they ran nothing); see `users_month`."""
    return users_month(conn, cfg, month_start, cluster=cluster, users=[user], options=options)[user]


def users_month(
    conn: Connection,
    cfg: Config,
    month_start: datetime | date,
    *,
    cluster: str | None = None,
    users: Sequence[str] | None = None,
    options: ReportOptions | None = None,
) -> dict[str, UserMonth]:
    """The month of every user with jobs in it (or of `users`, each present, empty if idle), in one pass.

    For the sender: a dozen statements for all users together, instead of a dozen per user. Peers are
    always every user of the month on the user's cluster(s), whoever is asked for.
    """
    _tune(conn)
    opts = options or ReportOptions()
    month = Month.of(month_start)
    prev = month.previous()
    cid = _cluster_id(conn, cluster)
    names = _cluster_names(conn)
    scope = _Scope(users=list(users) if users is not None else None, cluster_id=cid)
    everyone = _Scope(cluster_id=cid)
    watermark = _watermark(conn)
    start = _data_start(conn, cid)
    span, prev_span = _data_days(month, start, watermark), _data_days(prev, start, watermark)

    # Rollups: the asked users' month (per cluster and lab), previous month and days; every user's
    # energy and utilisation per cluster, for the peers.
    keys = [R.user_name, R.cluster_id, R.account]
    per_user: dict[str, dict[int, Sums]] = defaultdict(dict)
    accounts: dict[str, set[str]] = defaultdict(set)
    for (u, c, a), s in _rollups(conn, month.start, month.end, keys, scope.rollups()).items():
        _add(per_user[u].setdefault(c, {}), s)
        accounts[u].add(a)
    old = _rollups(conn, prev.start, prev.end, [R.user_name], scope.rollups())
    daily = _daily(conn, month, [R.user_name], scope.rollups())
    everyone_by_cluster: dict[str, dict[int, Sums]] = defaultdict(dict)
    lean = _rollups(conn, month.start, month.end, keys[:2], everyone.rollups(), PEER_SUMS)
    for (u, c), s in lean.items():
        everyone_by_cluster[u][c] = s
    peers = _peers(everyone_by_cluster, names, set(per_user) if users is not None else None)

    y = _month_jobs(month.start, month.end, scope.jobs())
    groups = _job_groups(conn, y, [y.c.user_name])
    stats, carbon = _stats(groups), _carbon(groups)
    top = _top_jobs(conn, y, names, opts.top_jobs)
    facts = _job_facts(conn, cfg, month, cluster, users)
    limits = _time_limits(conn, month, scope)
    models = _model_uses(conn, y, month, by_user=True)
    comps: dict[str, list[Comparison]] = defaultdict(list)
    model_scope = ModelScope(users=tuple(users) if users is not None else None, cluster_id=cid)
    for c in model_comparisons(conn, month.start, month.end, model_scope):
        comps[c.user].append(c)

    wanted = (
        list(dict.fromkeys(users)) if users is not None else sorted(set(per_user) | {k[0] for k in stats})
    )
    _examine_devices(conn, cfg, facts, opts, wanted)
    out: dict[str, UserMonth] = {}
    for u in wanted:
        s = _total(per_user.get(u, {}).values())
        js = stats.get((u,))
        totals = _totals(s, js)
        jobs = facts.get(u, [])
        idle = [
            g
            for g in jobs
            if g.idle_share is not None
            and g.idle_share >= opts.nearly_idle_share
            and g.idle_gpu_hours * g.share >= opts.min_idle_gpu_hours
        ]
        idle.sort(key=lambda g: (-g.idle_kwh * g.share, -g.idle_gpu_hours, g.pk))
        out[u] = UserMonth(
            user=u,
            month=month,
            cluster=cluster,
            clusters=tuple(sorted(names.get(c, str(c)) for c in per_user.get(u, {}))),
            accounts=tuple(sorted(accounts.get(u, set()))),
            totals=totals,
            equivalents=_equivalents(totals),
            trend=_trend(prev, s, old.get((u,), {}), span, prev_span, opts.trend_min_days),
            peers=peers.get(u) or PeerStanding((), 0, None, None, 0, None, None),
            top_jobs=tuple(top.get(u, [])),
            idle_jobs=tuple(idle[: opts.idle_jobs]),
            jobs=tuple(jobs),
            time_limits=limits.get(u, TimeLimitUse()),
            basis=_basis(cfg, s, carbon.get((u,), []), js, watermark, month),
            daily=_day_points(month, daily.get((u,), {}), span),
            data_days=span,
            models=models.get(u, ()),
            model_comparisons=tuple(comps.get(u, ())),
        )
    return out


def _peers(
    per_user: Mapping[str, Mapping[int, Sums]], names: Mapping[int, str], only: set[str] | None = None
) -> dict[str, PeerStanding]:
    """Each user's (or each of `only`'s) standing among the users of the month on the same cluster(s),
    compared on those clusters."""
    by_set: dict[frozenset[int], list[str]] = defaultdict(list)
    for u, cs in per_user.items():
        if only is None or u in only:
            by_set[frozenset(cs)].append(u)
    out: dict[str, PeerStanding] = {}
    for cset, members in by_set.items():
        peers = [u for u, cs in per_user.items() if cset & set(cs)]
        sums = {u: _total(s for c, s in per_user[u].items() if c in cset) for u in peers}
        kwh = sorted(_kwh(s) for s in sums.values())
        utils = {u: _util(s) for u, s in sums.items()}
        known = sorted(v for v in utils.values() if v is not None)
        for u in members:
            rank, pct = _standing(_kwh(sums[u]), kwh)
            mine = utils[u]
            urank, upct = _standing(mine, known) if mine is not None else (None, None)
            out[u] = PeerStanding(
                clusters=tuple(sorted(names.get(c, str(c)) for c in cset)),
                users=len(peers),
                energy_rank=rank,
                energy_percentile=pct,
                gpu_users=len(known),
                gpu_util_rank=urank,
                gpu_util_percentile=upct,
            )
    return out


def _top_jobs(conn: Connection, y: Any, names: Mapping[int, str], n: int) -> dict[str, list[JobLine]]:
    """Each user's n jobs with the most energy in the month (window function: one statement for all)."""
    if n <= 0:
        return {}
    e = y.c.energy * y.c.f
    rn = func.row_number().over(partition_by=y.c.user_name, order_by=(e.desc(), y.c.id))
    t = (
        select(
            y.c.id,
            y.c.cluster_id,
            y.c.job_id,
            y.c.name,
            y.c.partition,
            y.c.state,
            y.c.start_time,
            y.c.end_time,
            y.c.gpus,
            y.c.el,
            y.c.f,
            e.label("e"),
            y.c.co2.label("c"),
            (y.c.gpus * y.c.el / 3600.0).label("gh"),
            y.c.measured,
            y.c.energy,
            y.c.util,
            y.c.user_name,
            rn.label("rn"),
        )
        .where(y.c.f > 0)
        .subquery("t")
    )
    out: dict[str, list[JobLine]] = defaultdict(list)
    q = select(t).where(t.c.rn <= n).order_by(t.c.user_name, t.c.rn)
    for (
        pk,
        cid,
        jid,
        name,
        part,
        state,
        start,
        end,
        gpus,
        el,
        f,
        _e_j,
        co2,
        gh,
        measured,
        energy,
        util,
        user,
        _rn,
    ) in conn.execute(q).all():
        out[user].append(
            JobLine(
                pk=pk,
                job_id=jid,
                cluster=names.get(cid, ""),
                name=name,
                partition=part or None,
                state=state,
                start=as_utc(start),
                end=as_utc(end),
                gpus=gpus,
                elapsed_h=el / 3600,
                share_in_month=f,
                energy_kwh=energy / J_PER_KWH,  # the whole job (ranked by the month's share)
                co2_kg=co2 / 1000,
                gpu_hours=gh or 0.0,
                measured_share=measured / energy if energy else None,
                gpu_util_pct=util,
            )
        )
    return out


def _job_facts(
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


def _waste_trend(
    conn: Connection,
    month: Month,
    scope: _Scope,
    start: datetime | None,
    watermark: datetime | None,
    n: int,
) -> tuple[MonthWaste, ...]:
    """The ledger's parts per month, from the rollups, for `n` months up to this one (those with data)."""
    months = [month]
    while len(months) < n:
        months.insert(0, months[0].previous())
    keys = [R.day]
    rows = _rollups(conn, months[0].start, month.end, keys, scope.rollups())
    acc: dict[datetime, Sums] = {}
    for (d,), v in rows.items():
        m = Month.of(as_utc(d))
        _add(acc.setdefault(m.start, {}), v)
    out = []
    for m in months:
        v = acc.get(m.start, {})
        days = _data_days(m, start, watermark).days
        if days == 0:
            continue
        parts = [v.get(f"energy_{o}_j", 0.0) / J_PER_KWH for o in OUTCOMES]
        out.append(MonthWaste(m, days, _kwh(v), v.get("idle_gpu_energy_j", 0.0) / J_PER_KWH, *parts))
    return tuple(out)


def advice_context(month: Month, cfg: Config) -> Context:
    """What cocaq.footprint.advice needs to know of a month and the site."""
    return Context(
        since=month.start,
        until=month.end,
        idle_threshold_pct=cfg.aggregate.idle_gpu_util_pct,
        interactive_names=cfg.advice.interactive_names,
        period=f"in {month.start:%B}",
    )


def _members_advice(
    facts: Mapping[str, list[JobFacts]], totals: Mapping[str, float], month: Month, cfg: Config
) -> tuple[MemberAdvice, ...]:
    """Each lab member's largest suggestion worth their attention (as their own e-mail opens with)."""
    ctx = advice_context(month, cfg)
    out = []
    for u, jobs in facts.items():
        found = advise(
            jobs,
            ctx,
            total_kwh=totals.get(u, 0.0),
            min_share=cfg.advice.min_share,
            min_kwh=cfg.advice.min_kwh,
        )
        if found:
            out.append(MemberAdvice(u, found[0]))
    out.sort(key=lambda a: (-(a.advice.saving_kwh or 0.0), a.user))
    return tuple(out)


# What each kind of suggestion is, site-wide, and what the admins can do about it.
LEVERS = {
    "precision": (
        "Training in full precision",
        "point users to mixed precision (their e-mails show their own figures); a bf16 example job script",
    ),
    "timeouts": (
        "Batch jobs lost at their time limit",
        "document checkpointing with --signal and --requeue; a warning signal before the limit by default",
    ),
    "failures": ("Failed jobs", "a short debug partition or QOS, so that a test run starts at once"),
    "out-of-memory": ("Jobs killed for memory", "a sensible default memory per CPU or GPU on the partitions"),
    "notebooks": (
        "GPUs held idle by interactive sessions",
        "a short MaxTime on interactive partitions, idle culling in the notebook server, and cocaq's alerts "
        "while jobs run ([alerts])",
    ),
    "fewer-gpus": (
        "Idle GPUs in batch jobs",
        "cocaq's alerts while jobs run ([alerts]); help with launching on several GPUs",
    ),
    "dataloader": ("GPUs waiting for data", "more CPU cores per GPU by default on the GPU partitions"),
    "memory": ("Memory asked for and not used", "a lower default memory request"),
    "power-cap": (
        "GPUs near full power at moderate utilisation",
        "a GPU power cap (nvidia-smi -pl) on a partition or per job from a prolog: McDonald et al. (NAACL "
        "2022) measured ~15% less energy for transformer training for a marginal increase in run time",
    ),
}
POWER_CAP_SAVING = 0.10  # counted, below the ~15% measured
POWER_CAP_UTIL = (30.0, 70.0)  # the utilisation at which a cap costs little
POWER_CAP_MIN_SHARE = 0.6  # mean sampled power / TDP: a cap must have something to cut


def _site_levers(
    facts: Mapping[str, list[JobFacts]], totals: Mapping[str, float], month: Month, cfg: Config
) -> tuple[SiteLever, ...]:
    """The users' suggestions added up by kind (each user's as their own e-mail gives them), and the one
    lever only admins hold: GPU power caps, for jobs whose GPUs drew most of their rated power at moderate
    utilisation (POWER_CAP_SAVING of those jobs' GPU energy)."""
    ctx = advice_context(month, cfg)
    acc: dict[str, list[tuple[str, float, float, bool]]] = defaultdict(list)
    for u, jobs in facts.items():
        for a in advise(
            jobs,
            ctx,
            total_kwh=totals.get(u, 0.0),
            min_share=cfg.advice.min_share,
            min_kwh=cfg.advice.min_kwh,
        ):
            acc[a.id].append((u, a.saving_kwh or 0.0, a.saving_kg or 0.0, a.upper_bound))
        capped = [
            j
            for j in jobs
            if j.gpus > 0
            and j.gpu_util_pct is not None
            and POWER_CAP_UTIL[0] <= j.gpu_util_pct <= POWER_CAP_UTIL[1]
            and j.mean_gpu_power_w is not None
            and j.gpu_tdp_w > 0
            and j.mean_gpu_power_w >= POWER_CAP_MIN_SHARE * j.gpu_tdp_w
        ]
        if capped:
            e = sum(j.gpu_kwh * j.share * POWER_CAP_SAVING for j in capped)
            c = sum(j.gpu_kwh * j.share * POWER_CAP_SAVING * j.kg_per_kwh for j in capped)
            acc["power-cap"].append((u, e, c, False))
    out = []
    for kind, rows in acc.items():
        rows.sort(key=lambda r: (-r[1], r[0]))
        label, action = LEVERS.get(kind, (kind, ""))
        users = tuple(r[0] for r in rows)
        saving = sum(r[1] for r in rows)
        kg = sum(r[2] for r in rows)
        out.append(SiteLever(kind, label, users, saving, kg, any(r[3] for r in rows), action))
    out.sort(key=lambda x: (-x.saving_kwh, x.id))
    return tuple(x for x in out if x.saving_kwh > 0)


def _examine_devices(
    conn: Connection,
    cfg: Config,
    facts: dict[str, list[JobFacts]],
    opts: ReportOptions,
    users: Iterable[str],
) -> None:
    """Per-GPU use, from `samples`, of multi-GPU jobs where one GPU may have idled while another worked.

    Job-level figures bound what per-GPU ones can be (the job's GPUs sampled alike): one GPU idle over
    half its time puts at least 0.5 / GPUs of the job's sampled GPU time under the threshold, and one
    GPU busy over half its time at most 1 - 0.5 / GPUs. Jobs outside those bounds, with samples over
    less than half their GPU time or less than `min_idle_gpu_hours` idle, are not read.
    """
    if opts.device_jobs <= 0 or opts.device_jobs_total <= 0:
        return
    chosen: list[tuple[str, int, JobFacts]] = []
    for u in users:
        jobs = facts.get(u) or []
        cands = [
            (i, g)
            for i, g in enumerate(jobs)
            if g.gpus >= 2
            and g.idle_share is not None
            and 0.5 / g.gpus <= g.idle_share <= 1 - 0.5 / g.gpus
            and g.sampled_share >= 0.5
            and g.idle_gpu_hours * g.share >= opts.min_idle_gpu_hours
            and g.start is not None
            and g.job_id_raw is not None
        ]
        cands.sort(key=lambda t: (-t[1].idle_gpu_hours * t[1].share, t[1].pk))
        chosen += [(u, i, g) for i, g in cands[: opts.device_jobs]]
    chosen.sort(key=lambda t: (-t[2].idle_gpu_hours * t[2].share, t[2].pk))
    chosen = chosen[: opts.device_jobs_total]
    found = _devices(conn, [g for _u, _i, g in chosen], cfg)
    for u, i, g in chosen:
        if found.get(g.pk):
            facts[u][i] = g.with_devices(found[g.pk])


def _devices(
    conn: Connection, jobs: Sequence[JobFacts], cfg: Config, chunk: int = 200
) -> dict[int, tuple[DeviceUse, ...]]:
    """Per job: each GPU's share of idle samples, mean utilisation and power, the time its samples cover.

    One statement per `chunk` jobs, each job's samples by its (cluster, raw id) and run (the index's
    range); a raw id twice in a chunk (Slurm reused it) would mix two runs, so it goes to another chunk.
    """
    threshold = cfg.aggregate.idle_gpu_util_pct
    step = cfg.collector.interval_s
    chunks: list[dict[tuple[int, int], JobFacts]] = []
    for g in jobs:
        assert g.job_id_raw is not None
        key = (g.cluster_id, g.job_id_raw)
        for ch in chunks:
            if key not in ch and len(ch) < chunk:
                ch[key] = g
                break
        else:
            chunks.append({key: g})
    util = S.metric == "util_pct"
    power = S.metric == "power_w"
    zero = _f(0.0)
    out: dict[int, list[DeviceUse]] = defaultdict(list)
    for ch in chunks:
        runs = []
        for (cid, raw), g in ch.items():
            assert g.start is not None
            hi = (g.end or g.start + timedelta(hours=g.elapsed_h)) + timedelta(minutes=1)
            runs.append(
                and_(
                    S.cluster_id == cid,
                    S.job_id == str(raw),
                    S.ts >= g.start - timedelta(minutes=1),
                    S.ts <= hi,
                )
            )
        q = (
            select(
                S.cluster_id,
                S.job_id,
                S.node,
                S.device,
                func.sum(case((util, _f(1.0)), else_=zero)),
                func.sum(case((and_(util, S.value < threshold), _f(1.0)), else_=zero)),
                func.sum(case((util, S.value), else_=zero)),
                func.sum(case((power, _f(1.0)), else_=zero)),
                func.sum(case((power, S.value), else_=zero)),
                func.min(S.ts),
                func.max(S.ts),
            )
            .where(or_(*runs), S.source == "nvml", S.metric.in_(("util_pct", "power_w")))
            .group_by(S.cluster_id, S.job_id, S.node, S.device)
            .order_by(S.cluster_id, S.job_id, S.node, S.device)
        )
        for cid, raw, node, device, n, n_idle, u_sum, n_p, p_sum, t_first, t_last in conn.execute(q):
            job = ch.get((int(cid), int(raw)))
            if job is None or not n:
                continue
            # regular samples: each stands for one spacing, (last - first) / (n - 1); one alone, the interval
            span = (as_utc(t_last) - as_utc(t_first)).total_seconds()
            covered = span * n / (n - 1) if n > 1 else step
            mean_p = float(p_sum) / float(n_p) if n_p else None
            out[job.pk].append(
                DeviceUse(
                    node,
                    device,
                    int(n),
                    covered / 3600,
                    float(n_idle) / float(n),
                    float(u_sum) / float(n),
                    mean_p,
                    mean_p * covered / J_PER_KWH if mean_p is not None else None,
                )
            )
    return {pk: tuple(v) for pk, v in out.items()}


def _time_limits(conn: Connection, month: Month, scope: _Scope) -> dict[str, TimeLimitUse]:
    """Per user: the use of their time limits by the jobs that ended in the month with a known limit."""
    ended = (J.end_time >= month.start, J.end_time < month.end, J.is_open.is_(False), J.time_limit_s > 0)
    counts = select(J.user_name, func.count(), func.sum(case((J.state == "TIMEOUT", 1), else_=0))).where(
        *ended, *scope.jobs()
    )
    out: dict[str, TimeLimitUse] = {
        u: TimeLimitUse(finished=int(n), timeouts=int(t or 0))
        for u, n, t in conn.execute(counts.group_by(J.user_name)).all()
    }
    done: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    q = select(J.user_name, J.elapsed_s, J.time_limit_s, J.job_id).where(
        *ended, J.state == "COMPLETED", *scope.jobs()
    )
    for u, el, limit, jid in conn.execute(q).all():
        done[u].append((float(el or 0.0), float(limit), jid))
    for u, jobs in done.items():
        els = sorted(j[0] for j in jobs)
        k95 = max(0, min(len(els) - 1, -(-95 * len(els) // 100) - 1))  # nearest rank
        unused = heapq.nsmallest(3, jobs, key=lambda j: (j[0] - j[1], j[2]))
        out[u] = replace(
            out[u],
            completed=len(jobs),
            median_use=statistics.median([j[0] / j[1] for j in jobs]),
            median_limit_h=statistics.median([j[1] for j in jobs]) / 3600,
            median_elapsed_h=statistics.median(els) / 3600,
            p95_elapsed_h=els[k95] / 3600,
            max_elapsed_h=els[-1] / 3600,
            requested_h=sum(j[1] for j in jobs) / 3600,
            used_h=sum(els) / 3600,
            examples=tuple(j[2] for j in unused),
        )
    return out


# --- per lab ------------------------------------------------------------------------------------------


def lab_month(
    conn: Connection,
    cfg: Config,
    account: str,
    month_start: datetime | date,
    *,
    cluster: str | None = None,
) -> LabMonth:
    """A lab's (Slurm account's) month: totals and trend, its users, idle waste, models, weeks."""
    _tune(conn)
    month = Month.of(month_start)
    prev = month.previous()
    cid = _cluster_id(conn, cluster)
    scope = _Scope(account=account, cluster_id=cid)
    watermark = _watermark(conn)
    start = _data_start(conn, cid)
    span, prev_span = _data_days(month, start, watermark), _data_days(prev, start, watermark)
    by_user = _rollups(conn, month.start, month.end, [R.user_name], scope.rollups())
    s = _total(by_user.values())
    old = _total(_rollups(conn, prev.start, prev.end, [], scope.rollups()).values())
    days = _daily(conn, month, [], scope.rollups()).get((), {})
    y = _month_jobs(month.start, month.end, scope.jobs())
    groups = _job_groups(conn, y, [y.c.user_name])
    stats = _stats(groups)
    js = _JobStats()
    for v in stats.values():
        js.add(v)
    totals = _totals(s, js)
    users = []
    idle = []
    for (u,), us in by_user.items():
        t = _totals(us, stats.get((u,)))
        users.append(
            LabUser(
                u,
                t.jobs,
                t.energy_kwh,
                t.co2_kg,
                t.gpu_hours,
                t.gpu_util_pct,
                t.idle_gpu_hours,
                t.idle_gpu_kwh,
                t.failed_kwh,
                WasteBreakdown.of(u, t),
            )
        )
        if t.idle_gpu_hours > 0:
            idle.append(_idle(u, t))
    users.sort(key=lambda x: (-x.energy_kwh, x.user))
    idle.sort(key=lambda x: (-x.idle_kwh, -x.idle_gpu_hours, x.key))
    return LabMonth(
        account=account,
        month=month,
        cluster=cluster,
        totals=totals,
        equivalents=_equivalents(totals),
        trend=_trend(prev, s, old, span, prev_span, ReportOptions().trend_min_days),
        users=tuple(users),
        idle_by_user=tuple(idle),
        models=_model_uses(conn, y, month).get("", ()),
        weekly=_weeks(month, days, span),
        data_days=span,
        advice=_members_advice(
            _job_facts(conn, cfg, month, cluster, None, account=account),
            {u.user: u.energy_kwh for u in users},
            month,
            cfg,
        ),
        basis=_basis(cfg, s, _carbon(groups, _whole).get((), []), js, watermark, month),
    )


def _idle(key: str, t: MonthTotals) -> IdleWaste:
    share = t.idle_gpu_hours / t.gpu_hours if t.gpu_hours > 0 else None
    return IdleWaste(key, t.gpu_hours, t.idle_gpu_hours, share, t.idle_gpu_kwh, t.idle_co2_kg)


def _model_uses(
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
            func.sum(y.c.gpus * y.c.el / 3600.0),
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
                float(c or 0.0) / 1000,
                float(gh or 0.0),
                int(users),
            )
        )
    return {
        k: tuple(sorted(v, key=lambda x: (-x.energy_kwh, x.model_name, x.framework or "")))
        for k, v in out.items()
    }


# --- for admins --------------------------------------------------------------------------------------


def admin_month(
    conn: Connection,
    cfg: Config,
    month_start: datetime | date,
    cluster: str | None = None,
    *,
    first_report: Mapping[str, datetime] | None = None,
    window_days: int = 30,
    options: ReportOptions | None = None,
) -> AdminMonth:
    """The site's month: totals, by lab/partition/week, utilisation, idle waste, failures, coverage,
    intensity, top users, and (with `first_report`, user -> first report sent) the before/after
    comparison described in `BeforeAfter`."""
    _tune(conn)
    opts = options or ReportOptions()
    month = Month.of(month_start)
    prev = month.previous()
    cid = _cluster_id(conn, cluster)
    scope = _Scope(cluster_id=cid)
    watermark = _watermark(conn)
    start = _data_start(conn, cid)
    span, prev_span = _data_days(month, start, watermark), _data_days(prev, start, watermark)
    rolled = _rollups(conn, month.start, month.end, [R.user_name, R.account, R.partition], scope.rollups())
    old = _total(_rollups(conn, prev.start, prev.end, [], scope.rollups()).values())
    days = _daily(conn, month, [], scope.rollups()).get((), {})
    y = _month_jobs(month.start, month.end, scope.jobs())
    groups = _job_groups(conn, y, [y.c.user_name, y.c.account, y.c.partition], bins=True)
    stats = _stats(groups)

    def fold(index: int) -> tuple[dict[str, Sums], dict[str, _JobStats]]:
        sums: dict[str, Sums] = defaultdict(lambda: dict.fromkeys(SUMS, 0.0))
        js: dict[str, _JobStats] = defaultdict(_JobStats)
        for k, v in rolled.items():
            _add(sums[k[index]], v)
        for k, st in stats.items():
            js[k[index]].add(st)
        return sums, js

    s = _total(rolled.values())
    js_all = _JobStats()
    for st in stats.values():
        js_all.add(st)
    totals = _totals(s, js_all)
    labs, labs_js = fold(1)
    parts, parts_js = fold(2)
    people, people_js = fold(0)

    def table(sums: Mapping[str, Sums], js: Mapping[str, _JobStats]) -> list[GroupEnergy]:
        out = []
        for k, v in sums.items():
            t = _totals(v, js.get(k))
            out.append(
                GroupEnergy(
                    k,
                    t.jobs,
                    t.energy_kwh,
                    t.co2_kg,
                    t.gpu_hours,
                    t.cpu_hours,
                    t.gpu_util_pct,
                    t.measured_share,
                    t.energy_kwh / totals.energy_kwh if totals.energy_kwh > 0 else None,
                )
            )
        out.sort(key=lambda g: (-g.energy_kwh, g.key))
        return out

    def idle(sums: Mapping[str, Sums], js: Mapping[str, _JobStats]) -> tuple[IdleWaste, ...]:
        out = [_idle(k, _totals(v, js.get(k))) for k, v in sums.items() if v["idle_gpu_hours"] > 0]
        out.sort(key=lambda x: (-x.idle_kwh, -x.idle_gpu_hours, x.key))
        return tuple(out)

    failed = [WasteBreakdown.of(k, _totals(v, labs_js.get(k))) for k, v in labs.items()]
    failed = [w for w in failed if w.wasted_kwh > 0]
    failed.sort(key=lambda x: (-x.wasted_kwh, x.key))
    coverage = [
        Coverage(
            k,
            _kwh(v),
            v["energy_measured_j"] / J_PER_KWH,
            v["energy_estimated_j"] / J_PER_KWH,
            v["energy_measured_j"] / J_PER_KWH / _kwh(v) if _kwh(v) > 0 else None,
            v["energy_est_low_j"] / J_PER_KWH,
            v["energy_est_high_j"] / J_PER_KWH,
        )
        for k, v in parts.items()
    ]
    coverage.sort(key=lambda c: (-c.energy_kwh, c.partition))
    carbon = _carbon(groups, _whole).get((), [])
    return AdminMonth(
        month=month,
        cluster=cluster,
        totals=totals,
        equivalents=_equivalents(totals),
        trend=_trend(prev, s, old, span, prev_span, opts.trend_min_days),
        by_lab=tuple(table(labs, labs_js)),
        by_partition=tuple(table(parts, parts_js)),
        by_week=_weeks(month, days, span),
        data_days=span,
        util_histogram=_histogram(groups),
        idle_by_user=idle(people, people_js),
        idle_by_lab=idle(labs, labs_js),
        waste_by_lab=tuple(failed),
        energy_by_state=_states(groups),
        coverage=tuple(coverage),
        intensity=_intensity(conn, y, month, carbon),
        top_users=tuple(table(people, people_js)[: opts.top_users]),
        before_after=None
        if first_report is None
        else before_after(
            conn, first_report, month, window_days=window_days, cluster_id=cid, watermark=watermark
        ),
        basis=_basis(cfg, s, carbon, js_all, watermark, month),
        models=_model_uses(conn, y, month).get("", ()),
        advice=_site_levers(
            _job_facts(conn, cfg, month, cluster, None),
            {k: _kwh(v) for k, v in people.items()},
            month,
            cfg,
        ),
        waste_trend=_waste_trend(conn, month, scope, start, watermark, opts.trend_months),
    )


def _histogram(groups: Iterable[_Group]) -> UtilHistogram:
    """GPU jobs by energy-weighted utilisation in 10% bins, weighted by their GPU-hours in the month."""
    acc = [[0, 0.0] for _ in range(UTIL_BINS + 1)]
    for g in groups:
        if g.bin is not None and g.bin >= 0:
            acc[g.bin][0] += g.jobs
            acc[g.bin][1] += g.gpu_hours
    bins = tuple(UtilBin(10.0 * i, 10.0 * (i + 1), int(acc[i][0]), acc[i][1]) for i in range(UTIL_BINS))
    return UtilHistogram(bins, int(acc[UTIL_BINS][0]), acc[UTIL_BINS][1])


def _states(groups: Iterable[_Group]) -> tuple[StateEnergy, ...]:
    acc: dict[str, list[float]] = {}
    for g in groups:
        a = acc.setdefault(g.st, [0, 0.0, 0.0])
        a[0] += g.jobs
        a[1] += g.energy_j
        a[2] += g.co2_g
    out = [StateEnergy(st, int(n), e / J_PER_KWH, c / 1000, outcome_of(st)) for st, (n, e, c) in acc.items()]
    out.sort(key=lambda x: (-x.energy_kwh, x.state))
    return tuple(out)


def _intensity(
    conn: Connection, y: Any, month: Month, carbon: Sequence[tuple[Any, ...]]
) -> tuple[ZoneIntensity, ...]:
    """Per zone and day: the jobs' intensity weighted by their energy in the day (pro rata of hours)."""
    d0 = month.start.timestamp()
    n = len(month.days())
    used = (y.c.f > 0, y.c.el > 0, y.c.g.is_not(None), y.c.energy > 0)
    first, last = _floor(y.c.t0 / DAY_S), _floor((y.c.t0 + y.c.el) / DAY_S)
    # most jobs run within one day: all their energy is that day's
    e1 = y.c.energy * y.c.f
    one_day = select(y.c.zone, (first * DAY_S).label("d"), (e1 * y.c.g).label("eg"), e1.label("e")).where(
        *used, first == last
    )
    # the others: split by the hours in each day of the month
    days = union_all(*(select(_f(d0 + i * DAY_S).label("d")) for i in range(n))).subquery("days")
    ov = greatest(_f(0.0), least(y.c.t0 + y.c.el, days.c.d + DAY_S) - greatest(y.c.t0, days.c.d))
    e = y.c.energy * ov / y.c.el
    more = (
        select(y.c.zone, days.c.d, (e * y.c.g).label("eg"), e.label("e"))
        .select_from(y.join(days, and_(y.c.t0 < days.c.d + DAY_S, y.c.t0 + y.c.el > days.c.d)))
        .where(*used, first != last)
    )
    u = union_all(one_day, more).subquery("u")
    q = select(u.c.zone, u.c.d, func.sum(u.c.eg), func.sum(u.c.e)).group_by(u.c.zone, u.c.d)
    per: dict[str, list[DayIntensity]] = defaultdict(list)
    for zone, d, eg, ej in conn.execute(q):
        if ej and float(ej) > 0:
            day = datetime.fromtimestamp(float(d), UTC).date()
            per[zone or ""].append(DayIntensity(day, float(eg) / float(ej), float(ej) / J_PER_KWH))
    sources: dict[str, set[str]] = defaultdict(set)
    for zone, source, flag, *_rest in carbon:
        sources[zone or ""].add(f"{source} ({flag})" if flag else str(source))
    out = []
    for zone, ds in per.items():
        ds.sort(key=lambda x: x.day)
        e = sum(d.energy_kwh for d in ds)
        out.append(
            ZoneIntensity(
                zone,
                e,
                sum(d.g_per_kwh * d.energy_kwh for d in ds) / e if e > 0 else None,
                statistics.fmean(d.g_per_kwh for d in ds) if ds else None,
                tuple(ds),
                tuple(sorted(sources.get(zone, set()))),
            )
        )
    out.sort(key=lambda z: (-z.energy_kwh, z.zone))
    return tuple(out)


def _midnight(t: datetime) -> datetime:
    return as_utc(t).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def before_after(
    conn: Connection,
    first_report: Mapping[str, datetime],
    month: Month,
    *,
    window_days: int = 30,
    cluster_id: int | None = None,
    watermark: datetime | None = None,
) -> BeforeAfter:
    """Idle-GPU share and GPU utilisation in the windows around each user's first report (`BeforeAfter`:
    observational, not a controlled effect), from the users' daily rollups."""
    span = timedelta(days=window_days)
    windows: dict[str, tuple[datetime, datetime, datetime, datetime]] = {}
    pending = []
    limit = month.end
    if watermark is not None:
        limit = min(limit, _midnight(watermark))
    for u, t in sorted(first_report.items()):
        b1 = _midnight(t)
        a0 = b1 if b1 == as_utc(t) else b1 + timedelta(days=1)
        if a0 + span > limit:
            pending.append(u)
            continue
        windows[u] = (b1 - span, b1, a0, a0 + span)
    rows: dict[str, dict[datetime, Sums]] = defaultdict(dict)
    if windows:
        lo = min(w[0] for w in windows.values())
        hi = max(w[3] for w in windows.values())
        names = sorted(windows)
        where: list[Any] = [R.user_name.in_(names)] if len(names) <= 5000 else []
        if cluster_id is not None:
            where.append(R.cluster_id == cluster_id)
        for (u, d), s in _rollups(conn, lo, hi, [R.user_name, R.day], where).items():
            if u in windows:
                rows[u][as_utc(d)] = s

    def side(u: str, a: datetime, b: datetime) -> tuple[WindowUse, Sums]:
        s = _total(v for d, v in rows.get(u, {}).items() if a <= d < b)
        gh = s["gpu_hours"]
        return WindowUse(
            a, b, gh, s["idle_gpu_hours"], s["idle_gpu_hours"] / gh if gh > 0 else None, _util(s)
        ), s

    users, excluded = [], []
    for u, (b0, b1, a0, a1) in windows.items():
        before, _ = side(u, b0, b1)
        after, _ = side(u, a0, a1)
        if (
            before.gpu_hours <= 0
            or after.gpu_hours <= 0
            or before.gpu_util_pct is None
            or after.gpu_util_pct is None
        ):
            excluded.append(u)
            continue
        assert before.idle_share is not None and after.idle_share is not None
        users.append(
            BeforeAfterUser(
                u,
                as_utc(first_report[u]),
                before,
                after,
                after.idle_share - before.idle_share,
                after.gpu_util_pct - before.gpu_util_pct,
            )
        )
    hb = sum(x.before.gpu_hours for x in users)
    ha = sum(x.after.gpu_hours for x in users)
    ib = sum(x.before.idle_gpu_hours for x in users) / hb if hb > 0 else None
    ia = sum(x.after.idle_gpu_hours for x in users) / ha if ha > 0 else None
    ub = sum(x.before.gpu_hours * (x.before.gpu_util_pct or 0.0) for x in users) / hb if hb > 0 else None
    ua = sum(x.after.gpu_hours * (x.after.gpu_util_pct or 0.0) for x in users) / ha if ha > 0 else None
    return BeforeAfter(
        window_days=window_days,
        users=tuple(users),
        gpu_hours_before=hb,
        gpu_hours_after=ha,
        idle_share_before=ib,
        idle_share_after=ia,
        idle_share_change=ia - ib if ia is not None and ib is not None else None,
        gpu_util_before=ub,
        gpu_util_after=ua,
        gpu_util_change=ua - ub if ua is not None and ub is not None else None,
        excluded=tuple(sorted(excluded)),
        pending=tuple(pending),
    )


# --- one job ----------------------------------------------------------------------------------------------


def job_footprint(conn: Connection, cfg: Config, job_pk: int) -> JobReport:
    """One job's energy by component and method, CO2 and its basis, embodied apart, GPU use and idling,
    and whether the energy is final.

    Final means it will not change any more: the job is not open, its state is a final Slurm state (the
    import or `cocaq reconcile` has seen it end), and every measured node record of it (node_energy) is
    the epilog's final one. `metrics_current` says whether the aggregator has derived its metrics (carbon
    over the run, utilisation, idle, embodied) since the job last changed.
    """
    j = conn.execute(
        select(Job.__table__, CL.name.label("cluster"))
        .join_from(cast(Table, Job.__table__), cast(Table, Cluster.__table__), CL.id == J.cluster_id)
        .where(J.id == job_pk)
    ).one_or_none()
    if j is None:
        raise UsageError(f"no job with id {job_pk}")
    m = conn.execute(select(JobMetrics.__table__).where(M.job_pk == job_pk)).one_or_none()
    parts = tuple(
        EnergyPart(r.node, r.component, r.method, r.source, float(r.energy_j) / J_PER_KWH)
        for r in conn.execute(
            select(E.node, E.component, E.method, E.source, E.energy_j)
            .where(E.job_pk == job_pk)
            .order_by(E.component, E.node, E.source)
        )
    )
    by_component: dict[str, float] = defaultdict(float)
    by_method: dict[str, float] = defaultdict(float)
    for p in parts:
        by_component[p.component] += p.energy_kwh
        by_method[p.method] += p.energy_kwh
    reasons = []
    state = (j.state or "").split(" ")[0]
    if j.is_open:
        reasons.append(f"the job is still {state or 'open'}")
    elif state not in FINAL_STATES:
        reasons.append(f"state {state or '?'} is not a final Slurm state")
    if j.job_id_raw is not None and j.start_time is not None:
        start = as_utc(j.start_time)
        end = as_utc(j.end_time) or datetime.now(UTC)
        open_nodes = conn.execute(
            select(func.count()).where(
                NE.cluster_id == j.cluster_id,
                NE.job_id == str(j.job_id_raw),
                NE.final.is_(False),
                NE.job_start >= start - timedelta(minutes=10),
                NE.job_start <= end + timedelta(minutes=10),
            )
        ).scalar()
        if open_nodes:
            reasons.append(f"{open_nodes} measured node record(s) not final yet (no epilog record)")
    metrics_current = bool(m is not None and as_utc(m.computed_at) >= as_utc(j.updated_at))
    from cocaq.db.dbapi import wrap
    from cocaq.footprint import jobfacts
    from cocaq.footprint.one_job import job_notes

    db = wrap(conn)
    facts = jobfacts.one(db, cfg, job_pk)
    notes = job_notes(db, cfg, facts) if facts is not None else []
    idle_j = float(m.idle_gpu_energy_j or 0.0) if m is not None else 0.0
    est_j = float(j.energy_j or 0.0) - float(j.energy_measured_j or 0.0)
    el = max(float(j.elapsed_s or 0.0), 0.0)
    models = tuple(
        r[0]
        for r in conn.execute(select(MM.model_name).where(MM.job_pk == job_pk).order_by(MM.id))
        if r[0] is not None
    )
    return JobReport(
        pk=int(j.id),
        job_id=j.job_id,
        cluster=j.cluster,
        user=j.user_name,
        account=j.account,
        partition=j.partition,
        name=j.name,
        state=j.state,
        state_detail=j.state_detail,
        is_open=bool(j.is_open),
        submit=as_utc(j.submit_time),
        start=as_utc(j.start_time),
        end=as_utc(j.end_time),
        elapsed_h=el / 3600,
        time_limit_h=float(j.time_limit_s) / 3600 if j.time_limit_s else None,
        cpus=int(j.alloc_cpus or 0),
        gpus=int(j.alloc_gpus or 0),
        gpu_type=j.gpu_type,
        node_list=j.node_list,
        energy_kwh=float(j.energy_j or 0.0) / J_PER_KWH,
        measured_kwh=float(j.energy_measured_j or 0.0) / J_PER_KWH,
        estimated_kwh=est_j / J_PER_KWH,
        estimated_low_kwh=(est_j if j.energy_est_low_j is None else float(j.energy_est_low_j)) / J_PER_KWH,
        estimated_high_kwh=(est_j if j.energy_est_high_j is None else float(j.energy_est_high_j)) / J_PER_KWH,
        by_component=dict(by_component),
        by_method=dict(by_method),
        parts=parts,
        pue=float(j.pue or 1.0),
        carbon_zone=j.carbon_zone,
        carbon_g_per_kwh=_num(j.carbon_g_per_kwh),
        carbon_source=j.carbon_source,
        carbon_year=j.carbon_year,
        carbon_flag=j.carbon_flag,
        carbon_detail=m.carbon_detail if m is not None else None,
        co2_kg=float(j.co2_g or 0.0) / 1000,
        co2_embodied_kg=float(m.co2_embodied_g or 0.0) / 1000 if m is not None else None,
        gpu_util_pct=_num(m.gpu_util_pct) if m is not None else None,
        sampled_gpu_hours=float(m.gpu_samples_s or 0.0) / 3600 if m is not None else 0.0,
        idle_gpu_hours=float(m.idle_gpu_s or 0.0) / 3600 if m is not None else 0.0,
        idle_kwh=idle_j / J_PER_KWH,
        idle_co2_kg=idle_j / J_PER_KWH * float(j.pue or 1.0) * float(j.carbon_g_per_kwh or 0.0) / 1000,
        cpu_usage=float(j.total_cpu_s) / (int(j.alloc_cpus) * el)
        if j.total_cpu_s is not None and j.alloc_cpus and el > 0
        else None,
        hw_profile=j.hw_profile,
        final=not reasons,
        final_reasons=tuple(reasons),
        metrics_current=metrics_current,
        models=models,
        facts=facts,
        notes=tuple(notes),
    )
