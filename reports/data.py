"""What the monthly and job reports hold: the typed dataclasses each report kind is made of.

A month (`Month`, a UTC calendar month, and `DataDays`, the days of it the data covers), its figures
(`MonthTotals`, `Trend`, `Basis`, the daily and weekly series, tables per lab, partition, state and zone),
the four reports built of them (`UserMonth`, `LabMonth`, `AdminMonth`, `JobReport`) and the sizes of their
lists (`ReportOptions`). They live apart from the queries that fill them (`reports.queries` and one
builder module per kind: `user_report`, `lab_report`, `admin_report`, `job_report`) so that the renderers,
the sender and the tests read a report's shape without loading or reading its SQL. The per-row classes
(JobLine, DayPoint, ...) are plain slotted dataclasses: a month of the whole site holds tens of thousands
of them, and frozen ones cost several times more to build.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from cocaq.accounting.ledger import CERTAIN
from cocaq.db.coltypes import as_utc
from cocaq.footprint.advice import Advice
from cocaq.footprint.by_model import Comparison
from cocaq.footprint.jobfacts import JobFacts

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

    energy_kwh: float = 0.0  # drawn by the hardware (IT energy)
    # x each job's PUE (the data centre's cooling and power losses): what Green Algorithms and codecarbon
    # call the energy used; from jobs, as the CLI's (no rollup holds it)
    energy_kwh_with_pue: float = 0.0
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
    # possibly lost (hit the time limit, not an interactive session): never in wasted_kwh
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
    # When to run (cocaq.accounting.shifting): the CO2 of the jobs that could have waited and have figures,
    # and what their best start within the slack, or pausing, would have saved (parts of that CO2)
    shift_co2_kg: float = 0.0
    shift_saved_kg: float = 0.0
    shift_pause_saved_kg: float = 0.0

    @property
    def measured_share(self) -> float | None:
        return self.measured_kwh / self.energy_kwh if self.energy_kwh > 0 else None

    @property
    def wasted_kwh(self) -> float:
        """The disjoint parts that did no work, certainly (idle GPUs, failed, out of memory, cancelled),
        added up: never the time-limit part (`timeout_kwh`, possibly lost), never more than energy_kwh."""
        return self.idle_gpu_kwh + sum(getattr(self, f"{o}_kwh") for o in CERTAIN)

    @property
    def wasted_co2_kg(self) -> float:
        return self.idle_co2_kg + sum(getattr(self, f"{o}_co2_kg") for o in CERTAIN)

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
    gpu_util_source: str | None = None  # "samples" (the collector), "slurm" (Slurm's gres/gpuutil)
    gpus_unknown: bool = False  # no GPU in its TRES on a GPU partition whose accounting records none


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
        """Did no work, certainly; the time-limit part (`timeout_kwh`, possibly lost) is apart."""
        return self.idle_kwh + self.failed_kwh + self.oom_kwh + self.cancelled_kwh

    @property
    def timeout_share(self) -> float | None:
        return self.timeout_kwh / self.energy_kwh if self.energy_kwh > 0 else None

    @property
    def wasted_share(self) -> float | None:
        return self.wasted_kwh / self.energy_kwh if self.energy_kwh > 0 else None


@dataclass(frozen=True)
class MonthShift:
    """When to run, for one month of the site (MonthTotals' shift_* figures, from the rollups): the
    operational CO2 of the jobs that have when-to-run figures, as they ran, and what starting each at its
    best hour within its slack, or running it in the cheapest hours of that window (pausing), would have
    saved (cocaq.accounting.shifting)."""

    month: Month
    data_days: int  # days of it the data covers
    co2_kg: float
    saved_kg: float
    pause_saved_kg: float

    @property
    def best_start_kg(self) -> float:
        return self.co2_kg - self.saved_kg

    @property
    def paused_kg(self) -> float:
        return self.co2_kg - self.pause_saved_kg

    @property
    def saved_share(self) -> float | None:
        return self.saved_kg / self.co2_kg if self.co2_kg > 0 else None

    @property
    def pause_saved_share(self) -> float | None:
        return self.pause_saved_kg / self.co2_kg if self.co2_kg > 0 else None


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
    gaps: AccountingGaps | None = None  # what Slurm's accounting did not record of the lab's jobs


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
        """Did no work, certainly; the time-limit part (`timeout_kwh`, possibly lost) is apart."""
        return self.idle_kwh + self.failed_kwh + self.oom_kwh + self.cancelled_kwh

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


@dataclass(frozen=True)
class AccountingGaps:
    """What the cluster's Slurm accounting did not record this month, for the admins: jobs on GPU
    partitions with no GPU in their TRES (jobs.gpus_unknown: `AccountingStorageTRES` lacks gres/gpu),
    finished jobs whose TotalCPU Slurm did not gather, and GPU jobs whose use came from Slurm's gres/gpuutil
    (no collector samples)."""

    gpus_unknown_jobs: int = 0
    gpus_unknown_partitions: tuple[str, ...] = ()
    cpu_unrecorded_jobs: int = 0
    gpu_jobs: int = 0
    gpu_slurm_jobs: int = 0

    @property
    def any(self) -> bool:
        return bool(self.gpus_unknown_jobs or self.cpu_unrecorded_jobs or self.gpu_slurm_jobs)


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


@dataclass(slots=True)
class WeekCell:
    """One weekday and UTC hour of a zone's series over the month: the mean of the hours it covers."""

    weekday: int  # 0 = Monday
    hour: int  # 0..23, UTC
    g_per_kwh: float  # plain mean of those hours' values (each hour time-weighted over its rows)
    hours: int  # the month's hours in this cell with a value


@dataclass(frozen=True)
class HourWindow:
    """`hours` consecutive hours of the day from `start` (UTC; it may run past midnight), over every day of
    the month, and their mean intensity."""

    start: int
    hours: int
    g_per_kwh: float

    @property
    def end(self) -> int:
        return (self.start + self.hours) % 24


WEEK_WINDOW_H = 4  # the cheapest and dearest hours of a zone's day (`ZoneWeek`): windows this long


@dataclass(frozen=True)
class ZoneWeek:
    """A zone's imported series over the month by weekday and UTC hour: when its electricity was cleaner.

    A reading of the series itself (not of when the jobs ran), for the zones the month's jobs used, in the
    configured basis. `cheapest` and `dearest` are the WEEK_WINDOW_H-hour windows of the day (over every
    day) with the lowest and highest mean, among those the series covers at every hour.
    """

    zone: str
    basis: str  # lca or direct
    cells: tuple[WeekCell, ...]  # the cells with a value, Monday 00:00 first
    hours: int  # hours of the month with a value
    month_hours: int
    g_per_kwh: float  # the mean over those hours
    cheapest: HourWindow | None
    dearest: HourWindow | None
    weekdays_g_per_kwh: float | None  # Monday to Friday
    weekends_g_per_kwh: float | None
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
    # the series of the zones the jobs used, by weekday and hour (those with none in the month: `_missing`)
    carbon_week: tuple[ZoneWeek, ...] = ()
    carbon_week_missing: tuple[str, ...] = ()
    # when to run: this month and the ones before it whose jobs have figures, oldest first
    shift_trend: tuple[MonthShift, ...] = ()
    # the e-mail study's estimates through this month (cocaq.study.analysis.StudyReport), where `[study]`
    # runs and has begun; None otherwise
    study: Any = None
    gaps: AccountingGaps | None = None  # what Slurm's accounting did not record (None: not looked at)


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
    interactive: bool = False  # an interactive session (cocaq.accounting.sessions): its time limit is no loss
    notes: tuple[
        Advice, ...
    ] = ()  # what to change next time (cocaq.footprint.advice.job_notes), largest first
    gpu_estimate: str | None = None  # what an estimate of its GPUs rests on (footprint.words)


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
