"""Alerts while a job runs: a user whose running job holds GPUs that do nothing hears it while it runs.

Which jobs (`find_idle`): running ones (`jobs.is_open`) holding at least `[alerts] min_gpus` GPUs, no
idle alert yet, whose GPUs have *all* been idle, each under `[aggregate] idle_gpu_util_pct` (5%)
utilisation in every one of its samples, for at least `[alerts] idle_minutes` up to the latest sample.
From the collector's samples (`samples`: source nvml, metrics util_pct and power_w, job_id the job's raw
id as text, one series per node and device; a job's samples are those of its cluster and raw id from
its start on):

* A GPU's *idle streak* starts at its first sample after the later of (a) its last sample at or above
  the threshold (or with no utilisation) and (b) its last gap: two consecutive samples further apart than
  `max_gap` (3 collector intervals, at least 10 minutes), since what the GPU did in a gap is not known.
  Without either, it starts at its first sample. A GPU whose latest sample is busy has no streak.
* The *job's* streak runs from the latest of its GPUs' streak starts to its latest sample: the time
  during which every one of its GPUs was idle, covered by samples without a gap. A utilisation equal to
  the threshold is not idle (idle is strictly under it, as the aggregator counts it).
* The job is alerted on when that streak is at least `idle_minutes` long, every GPU has a streak, the
  job has samples of at least as many GPUs as it was allocated, and every GPU's latest sample is recent
  (within `stale_after`: 3 collector intervals, at least 15 minutes, of now), so that a job whose
  collector stopped is not alerted on old data.
* The energy its GPUs drew while idle: each GPU's samples over the streak, power x the time to its next
  sample (the last sample of each GPU counts for nothing: the streak ends there). CO2 = that x the
  job's PUE x its carbon intensity, where the job has one.

Bounded work: one statement reads the last `idle_minutes` + `stale_after` + `max_gap` of samples of the
running GPU jobs not alerted on yet, and groups them in the database (per GPU, then per job); only the
jobs it finds come back. A job about to be alerted on whose streak reaches back to the start of that
window (it waited behind the throttle, or the scheduler was down) is read again from its start (at most
`HISTORY` back; past that the alert says "at least"), alone, so that the alert says how long it really
idled and what that cost.

Who gets what: at most one idle alert per job, ever (`job_alerts`, primary key (job, kind)); at most
one alert per user in `[alerts] throttle_hours` (the user's job with the most idle GPU time goes first,
the others wait; they go when the throttle allows, if they still idle); never to opted-out users
(`users.opted_out`, `[mail] opt_out_file`); none at all with `[alerts] idle_gpu = false`.

Exactly once, in two committed steps, as job e-mails (reports/jobmail.py):

1. Bind: the alert is written to `job_alerts` with its key `alerted_at` (the run's time) and what it says
   (`detail`), in one transaction that also checks the throttle (on PostgreSQL under a per-user advisory
   lock, on SQLite under the database's write lock, taken by the insert). A run that races another for
   the same job fails on the primary key and leaves the alert to the other; one that races it for
   another job of the same user finds the other's alert within the throttle and rolls back.
2. Send: through `deliver` as kind "idle-gpu" with period_start = `alerted_at`: the ledger
   (`sent_reports`) makes it go once. An alert not sent yet (crash, server down, daily throttle) is
   sent again by the next runs while its job still runs, for `RETRY_FOR`; the runs of the first
   `LEAVE_TO_BINDER` after its binding leave it to the run that bound it, which may be sending it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Engine,
    String,
    and_,
    case,
    cast,
    exists,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError

from cocaq.accounting.ledger import J_PER_KWH
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import Cluster, Job, JobAlert, Sample, SentReport
from cocaq.db.sqlfuncs import epoch_exact
from cocaq.errors import UsageError

if TYPE_CHECKING:
    from cocaq.reports.deliver import DeliverySummary, Outgoing
    from cocaq.reports.transport import Transport

log = logging.getLogger("cocaq.reports")

KIND = "idle-gpu"
RETRY_FOR = timedelta(hours=12)  # an unsent alert is tried again this long, while its job runs
# An unsent alert younger than this is left to the run that bound it (which may be sending it now): one
# taken up meanwhile would look in doubt and be sent twice ([mail] in_doubt = "resend").
LEAVE_TO_BINDER = timedelta(minutes=4)
HISTORY = timedelta(days=7)  # how far back a long streak is followed
_RACED, _THROTTLED = "raced", "throttled"


def stale_after(cfg: Config) -> timedelta:
    """A job's samples are current when each GPU's latest is at most this old: 3 intervals, >= 15 min."""
    return max(timedelta(seconds=3 * cfg.collector.interval_s), timedelta(minutes=15))


def max_gap(cfg: Config) -> timedelta:
    """Samples further apart than this are a gap, which ends a streak: 3 intervals, >= 10 min."""
    return max(timedelta(seconds=3 * cfg.collector.interval_s), timedelta(minutes=10))


def lookback(cfg: Config) -> timedelta:
    """How much of the samples one pass reads: the idle time asked for, plus staleness and one gap."""
    return timedelta(minutes=cfg.alerts.idle_minutes) + stale_after(cfg) + max_gap(cfg)


def is_interactive(name: str | None, partition: str | None, cfg: Config) -> bool:
    """A notebook, shell or editor session: its name in `[advice] interactive_names`, or a partition whose
    name holds "interactive"."""
    if name and name.strip().lower() in cfg.advice.interactive_names:
        return True
    return bool(partition and "interactive" in partition.lower())


# --- finding idle jobs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A running job whose GPUs have all idled long enough, as the streak query found it."""

    pk: int
    cluster_id: int
    cluster: str
    job_id: str
    job_id_raw: int
    user: str
    name: str | None
    partition: str | None
    account: str | None
    alloc_gpus: int
    job_start: datetime
    time_limit_s: float | None
    pue: float
    carbon_g_per_kwh: float | None
    gpus_seen: int
    start: datetime  # the streak's first sample
    last: datetime  # the job's latest sample
    energy_j: float  # what its GPUs drew over the streak
    since: datetime  # the start of the samples read

    @property
    def idle_s(self) -> float:
        return (self.last - self.start).total_seconds()

    @property
    def gpu_idle_s(self) -> float:
        return self.idle_s * max(self.alloc_gpus, 1)


def _streak_query(
    cfg: Config,
    now: datetime,
    since: datetime,
    *,
    cluster_id: int | None = None,
    pks: Sequence[int] | None = None,
) -> Any:
    """The jobs whose GPUs all idle (see the module doc), from the samples in [since, now], with the
    figures of their streak; one statement, grouped in the database.

    `pks` None: every running GPU job without an idle alert (of `cluster_id`, if given); else these jobs.
    """
    threshold = float(cfg.aggregate.idle_gpu_util_pct)
    gap = max_gap(cfg).total_seconds()
    J, S = Job, Sample
    jobs = [
        J.is_open.is_(True),
        J.alloc_gpus > 0,
        J.alloc_gpus >= cfg.alerts.min_gpus,
        J.job_id_raw.is_not(None),
        J.start_time.is_not(None),
    ]
    if pks is not None:
        jobs.append(J.id.in_(list(pks)))
    else:
        jobs.append(~exists().where(JobAlert.job_pk == J.id, JobAlert.kind == KIND))
    if cluster_id is not None:
        jobs.append(J.cluster_id == cluster_id)
    # One row per GPU and time: its power and utilisation side by side.
    p = (
        select(
            J.id.label("pk"),
            S.node.label("node"),
            S.device.label("device"),
            S.ts.label("ts"),
            func.max(case((S.metric == "power_w", S.value))).label("power"),
            func.max(case((S.metric == "util_pct", S.value))).label("util"),
        )
        .select_from(J)
        .join(S, and_(S.cluster_id == J.cluster_id, S.job_id == cast(J.job_id_raw, String)))
        .where(
            *jobs,
            S.source == "nvml",
            S.metric.in_(("power_w", "util_pct")),
            S.ts >= since,
            S.ts <= now,
            S.ts >= J.start_time,
        )
        .group_by(J.id, S.node, S.device, S.ts)
        .cte("p")
    )
    gpu = (p.c.pk, p.c.node, p.c.device)
    t = epoch_exact(p.c.ts)
    d = select(
        p.c.pk,
        p.c.node,
        p.c.device,
        t.label("t"),
        p.c.power,
        p.c.util,
        func.lag(t).over(partition_by=gpu, order_by=p.c.ts).label("prev"),
        func.lead(t).over(partition_by=gpu, order_by=p.c.ts).label("nxt"),
    ).cte("d")
    busy = or_(d.c.util.is_(None), d.c.util >= threshold)
    gapped = and_(d.c.prev.is_not(None), d.c.t - d.c.prev > gap)
    dgpu = (d.c.pk, d.c.node, d.c.device)
    # Each sample with its GPU's last busy sample and last sample after a gap.
    e = select(
        d.c.pk,
        d.c.node,
        d.c.device,
        d.c.t,
        d.c.power,
        d.c.nxt,
        func.max(case((busy, d.c.t))).over(partition_by=dgpu).label("busy_t"),
        func.max(case((gapped, d.c.t))).over(partition_by=dgpu).label("gap_t"),
    ).cte("e")
    in_streak = and_(e.c.t > func.coalesce(e.c.busy_t, -1.0), e.c.t >= func.coalesce(e.c.gap_t, -1.0))
    per_gpu = (
        select(
            e.c.pk,
            func.max(e.c.t).label("last"),
            func.min(case((in_streak, e.c.t))).label("start"),
        )
        .group_by(e.c.pk, e.c.node, e.c.device)
        .cte("per_gpu")
    )
    jb = (
        select(
            per_gpu.c.pk,
            func.count().label("n_gpu"),
            func.count(per_gpu.c.start).label("n_idle"),
            func.min(per_gpu.c.last).label("min_last"),
            func.max(per_gpu.c.last).label("last"),
            func.max(per_gpu.c.start).label("start"),
        )
        .group_by(per_gpu.c.pk)
        .cte("jb")
    )
    energy = (
        select(
            e.c.pk,
            func.sum(func.coalesce(e.c.power, 0.0) * func.coalesce(e.c.nxt - e.c.t, 0.0)).label("j"),
        )
        .join(jb, jb.c.pk == e.c.pk)
        .where(e.c.t >= jb.c.start)
        .group_by(e.c.pk)
        .cte("energy")
    )
    idle_s = float(cfg.alerts.idle_minutes) * 60.0
    return (
        select(
            J.id,
            J.cluster_id,
            Cluster.name,
            J.job_id,
            J.job_id_raw,
            J.user_name,
            J.name,
            J.partition,
            J.account,
            J.alloc_gpus,
            J.start_time,
            J.time_limit_s,
            J.pue,
            J.carbon_g_per_kwh,
            jb.c.n_gpu,
            jb.c.start,
            jb.c.last,
            func.coalesce(energy.c.j, 0.0),
        )
        .select_from(jb)
        .join(J, J.id == jb.c.pk)
        .join(Cluster, Cluster.id == J.cluster_id)
        .outerjoin(energy, energy.c.pk == jb.c.pk)
        .where(
            jb.c.n_idle == jb.c.n_gpu,
            jb.c.n_gpu >= J.alloc_gpus,
            jb.c.min_last >= now.timestamp() - stale_after(cfg).total_seconds(),
            jb.c.last - jb.c.start >= idle_s - 1e-6,
        )
        .order_by(J.user_name, J.id)
    )


def _epoch_dt(x: Any) -> datetime:
    return datetime.fromtimestamp(float(x), UTC)


def find_idle(
    conn: Connection,
    cfg: Config,
    now: datetime,
    *,
    cluster_id: int | None = None,
    pks: Sequence[int] | None = None,
    since: datetime | None = None,
) -> list[Candidate]:
    """The running jobs whose GPUs have all idled for `[alerts] idle_minutes` (see the module doc)."""
    since = since if since is not None else now - lookback(cfg)
    out = []
    for r in conn.execute(_streak_query(cfg, now, since, cluster_id=cluster_id, pks=pks)):
        out.append(
            Candidate(
                pk=int(r[0]),
                cluster_id=int(r[1]),
                cluster=str(r[2]),
                job_id=str(r[3]),
                job_id_raw=int(r[4]),
                user=str(r[5]),
                name=r[6],
                partition=r[7],
                account=r[8],
                alloc_gpus=int(r[9] or 0),
                job_start=as_utc(r[10]),
                time_limit_s=float(r[11]) if r[11] else None,
                pue=float(r[12] or 1.0),
                carbon_g_per_kwh=float(r[13]) if r[13] is not None else None,
                gpus_seen=int(r[14]),
                start=_epoch_dt(r[15]),
                last=_epoch_dt(r[16]),
                energy_j=float(r[17] or 0.0),
                since=since,
            )
        )
    return out


def _reaches_back(c: Candidate, cfg: Config) -> bool:
    """Whether the streak may have started before the samples read (it starts at their beginning)."""
    return c.since > c.job_start and c.start <= c.since + max_gap(cfg)


def _devices(conn: Connection, c: Candidate, now: datetime, since: datetime) -> list[tuple[str, str]]:
    """(node, device) of the job's GPUs that have recent samples."""
    S = Sample
    q = (
        select(S.node, S.device)
        .where(
            S.cluster_id == c.cluster_id,
            S.job_id == str(c.job_id_raw),
            S.source == "nvml",
            S.metric == "util_pct",
            S.ts >= max(since, c.job_start),
            S.ts <= now,
        )
        .group_by(S.node, S.device)
        .order_by(S.node, S.device)
    )
    return [(str(n), str(d)) for n, d in conn.execute(q)]


# --- what an alert says ------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdleAlert:
    """What an idle-GPU alert tells (the templates' `a`); kept in job_alerts.detail when it is bound."""

    pk: int
    job_id: str
    name: str | None
    user: str
    cluster: str
    partition: str | None
    account: str | None
    gpus: int  # allocated
    devices: tuple[tuple[str, str], ...]  # (node, GPU) seen idle
    start: datetime  # the streak's first sample
    last: datetime  # the latest sample
    at_least: bool  # the streak began before what was read (HISTORY): it is at least this long
    from_job_start: bool  # idle since the job's first sample
    energy_kwh: float  # drawn by its GPUs over the streak
    co2_kg: float | None  # at the job's PUE and intensity; None where the job has no intensity yet
    threshold_pct: float
    interactive: bool
    job_start: datetime
    time_limit_h: float | None
    alerted_at: datetime | None = None

    @property
    def idle_s(self) -> float:
        return max((self.last - self.start).total_seconds(), 0.0)

    @property
    def idle_h(self) -> float:
        return self.idle_s / 3600

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for n, _ in self.devices))

    @property
    def ends_by(self) -> datetime | None:
        """When its time limit ends it, if known."""
        if self.time_limit_h is None:
            return None
        return self.job_start + timedelta(hours=self.time_limit_h)

    def detail(self) -> dict[str, Any]:
        return {
            "start": self.start.isoformat(),
            "last": self.last.isoformat(),
            "at_least": self.at_least,
            "from_job_start": self.from_job_start,
            "devices": [list(d) for d in self.devices],
            "energy_j": self.energy_kwh * J_PER_KWH,
            "co2_g": self.co2_kg * 1000 if self.co2_kg is not None else None,
            "threshold_pct": self.threshold_pct,
            "interactive": self.interactive,
            "gpus": self.gpus,
        }

    def line(self) -> str:
        """One line for the CLI."""
        where = ", ".join(self.nodes) or "?"
        co2 = f", {self.co2_kg * 1000:.0f} g CO2e" if self.co2_kg is not None else ""
        return (
            f"{self.user}: job {self.job_id}{f' ({self.name})' if self.name else ''}: "
            f"{self.gpus} GPU{'' if self.gpus == 1 else 's'} "
            f"on {where} idle for {self.idle_h:.1f} h{'+' if self.at_least else ''}, "
            f"{self.energy_kwh:.3g} kWh{co2}"
        )


def _alert_of(c: Candidate, devices: Sequence[tuple[str, str]], cfg: Config, at_least: bool) -> IdleAlert:
    kwh = c.energy_j / J_PER_KWH
    return IdleAlert(
        pk=c.pk,
        job_id=c.job_id,
        name=c.name,
        user=c.user,
        cluster=c.cluster,
        partition=c.partition,
        account=c.account,
        gpus=c.alloc_gpus,
        devices=tuple(devices),
        start=c.start,
        last=c.last,
        at_least=at_least,
        from_job_start=c.start <= c.job_start + max_gap(cfg),
        energy_kwh=kwh,
        co2_kg=kwh * c.pue * c.carbon_g_per_kwh / 1000 if c.carbon_g_per_kwh is not None else None,
        threshold_pct=float(cfg.aggregate.idle_gpu_util_pct),
        interactive=is_interactive(c.name, c.partition, cfg),
        job_start=c.job_start,
        time_limit_h=c.time_limit_s / 3600 if c.time_limit_s else None,
    )


def describe(engine: Engine, cfg: Config, c: Candidate, now: datetime) -> IdleAlert:
    """The alert for a candidate: its whole streak (read again from further back where it reaches the
    start of the pass's window), its GPUs and what they drew."""
    at_least = False
    with engine.connect() as conn:
        if _reaches_back(c, cfg):
            since = max(now - HISTORY, c.job_start)
            again = find_idle(conn, cfg, now, pks=[c.pk], since=since)
            if again:
                c = again[0]
                at_least = _reaches_back(c, cfg)
            else:
                at_least = True  # (cannot happen: a longer window holds the shorter one's streak)
        devices = _devices(conn, c, now, c.last - stale_after(cfg) - max_gap(cfg))
    return _alert_of(c, devices, cfg, at_least)


def _alert_from_row(row: Any, detail: dict[str, Any], cfg: Config) -> IdleAlert:
    """An alert as bound: its job's row and the detail stored with it."""
    return IdleAlert(
        pk=int(row.id),
        job_id=str(row.job_id),
        name=row.name,
        user=str(row.user_name),
        cluster=str(row.cluster),
        partition=row.partition,
        account=row.account,
        gpus=int(detail.get("gpus") or row.alloc_gpus or 0),
        devices=tuple((str(n), str(d)) for n, d in detail.get("devices", [])),
        start=as_utc(datetime.fromisoformat(detail["start"])),
        last=as_utc(datetime.fromisoformat(detail["last"])),
        at_least=bool(detail.get("at_least")),
        from_job_start=bool(detail.get("from_job_start")),
        energy_kwh=float(detail.get("energy_j") or 0.0) / J_PER_KWH,
        co2_kg=float(detail["co2_g"]) / 1000 if detail.get("co2_g") is not None else None,
        threshold_pct=float(detail.get("threshold_pct", cfg.aggregate.idle_gpu_util_pct)),
        interactive=bool(detail.get("interactive")),
        job_start=as_utc(row.start_time),
        time_limit_h=float(row.time_limit_s) / 3600 if row.time_limit_s else None,
        alerted_at=as_utc(row.alerted_at),
    )


def bound_alert(engine: Engine, cfg: Config, job_pk: int) -> IdleAlert | None:
    """The idle alert bound to a job, as it will be (or was) sent; None if there is none."""
    A, J = JobAlert, Job
    q = (
        select(
            J.id,
            J.job_id,
            J.name,
            J.user_name,
            Cluster.name.label("cluster"),
            J.partition,
            J.account,
            J.alloc_gpus,
            J.start_time,
            J.time_limit_s,
            A.alerted_at,
            A.detail,
        )
        .join(J, J.id == A.job_pk)
        .join(Cluster, Cluster.id == J.cluster_id)
        .where(A.job_pk == job_pk, A.kind == KIND)
    )
    with engine.connect() as conn:
        row = conn.execute(q).first()
    if row is None or not row.detail:
        return None
    return _alert_from_row(row, dict(row.detail), cfg)


# --- the run -------------------------------------------------------------------------------------------


@dataclass
class AlertSummary:
    """What one pass did; `line()` for the scheduler's run log and the CLI."""

    enabled: bool = True
    dry_run: bool = False
    cluster: str | None = None
    idle_jobs: int = 0  # running jobs found idle long enough, not alerted on yet
    new: int = 0  # alerts bound this run (dry run: that would be)
    open: int = 0  # alerts handed to deliver (new ones and earlier unsent ones)
    throttled: int = 0  # idle jobs waiting: their user had an alert within throttle_hours
    opted_out: int = 0  # idle jobs of opted-out users
    no_address: int = 0  # idle jobs of users without an address
    raced: int = 0  # left to a concurrent run that bound them (or another alert of their user) first
    alerts: list[IdleAlert] = field(default_factory=list)  # the new ones
    delivery: DeliverySummary | None = None

    @property
    def status(self) -> str:
        if not self.enabled:
            return "skipped"
        return "error" if self.delivery is not None and self.delivery.stopped else "ok"

    def line(self) -> str:
        where = f" -M {self.cluster}" if self.cluster else ""
        if not self.enabled:
            return "idle-GPU alerts are off ([alerts] idle_gpu = false)"
        if self.dry_run:
            head = (
                f"idle-GPU alerts{where} (dry run): {self.new} new alert(s) and "
                f"{self.open} earlier unsent alert(s) would go"
            )
        else:
            head = f"idle-GPU alerts{where}: {self.new} new, {self.open} to send"
        parts = [head, f"{self.idle_jobs} idle job(s) found"]
        left = []
        if self.throttled:
            left.append(f"{self.throttled} throttled (one alert per user per throttle_hours)")
        if self.opted_out:
            left.append(f"{self.opted_out} of opted-out users")
        if self.no_address:
            left.append(f"{self.no_address} of users without an address")
        if self.raced:
            left.append(f"{self.raced} left to a concurrent run")
        if left:
            parts.append("not alerted: " + ", ".join(left))
        if self.delivery is not None:
            parts.append(self.delivery.line())
        return "; ".join(parts)

    def lines(self) -> list[str]:
        """Each new alert (what it says), then the summary line."""
        verb = "would alert" if self.dry_run else "alert"
        return [f"{verb} {a.line()}" for a in self.alerts] + [self.line()]


def _cluster_id(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        cid = conn.execute(select(Cluster.id).where(Cluster.name == name)).scalar()
    if cid is None:
        raise UsageError(f"no cluster named {name!r} in the database")
    return int(cid)


def _open_alerts(engine: Engine, now: datetime, cluster_id: int | None) -> list[tuple[int, str, datetime]]:
    """(job, user, alerted_at) of the alerts bound within RETRY_FOR (and not in the last
    LEAVE_TO_BINDER), not sent, whose job still runs."""
    A, J, S = JobAlert, Job, SentReport
    sent = exists().where(
        S.kind == KIND, S.user_name == A.user_name, S.period_start == A.alerted_at, S.status == "sent"
    )
    q = (
        select(A.job_pk, A.user_name, A.alerted_at)
        .join(J, J.id == A.job_pk)
        .where(
            A.kind == KIND,
            A.alerted_at >= now - RETRY_FOR,
            A.alerted_at <= now - LEAVE_TO_BINDER,
            J.is_open.is_(True),
            ~sent,
        )
        .order_by(A.alerted_at, A.job_pk)
    )
    if cluster_id is not None:
        q = q.where(J.cluster_id == cluster_id)
    with engine.connect() as conn:
        return [(int(pk), str(u), as_utc(at)) for pk, u, at in conn.execute(q)]


def _recently_alerted(engine: Engine, users: Sequence[str], after: datetime) -> set[str]:
    """The users with an alert (of any kind) bound after `after`."""
    out: set[str] = set()
    names = sorted(set(users))
    with engine.connect() as conn:
        for i in range(0, len(names), 500):
            q = (
                select(JobAlert.user_name)
                .where(JobAlert.user_name.in_(names[i : i + 500]), JobAlert.alerted_at > after)
                .distinct()
            )
            out.update(str(u) for u in conn.execute(q).scalars())
    return out


def _user_lock_key(user: str) -> int:
    """A signed 64-bit advisory lock key for a user's alerts (PostgreSQL)."""
    digest = hashlib.blake2b(f"cocaq-alerts:{user}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _Throttled(Exception):
    pass


def _bind(engine: Engine, alert: IdleAlert, now: datetime, throttle: timedelta) -> datetime | str:
    """Write the alert to job_alerts in one transaction; its key, or _RACED / _THROTTLED (rolled back).

    The insert comes first: on SQLite it takes the write lock, so what the checks read after it is
    current; on PostgreSQL a per-user advisory lock, held to the commit, orders the runs.
    """
    A = JobAlert
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _user_lock_key(alert.user)})
            at = now
            conn.execute(
                insert(A).values(
                    job_pk=alert.pk, kind=KIND, user_name=alert.user, alerted_at=at, detail=alert.detail()
                )
            )
            # Never the key of another alert of this user: the ledger would take the two for one message.
            while conn.execute(
                select(func.count()).where(
                    A.user_name == alert.user, A.kind == KIND, A.alerted_at == at, A.job_pk != alert.pk
                )
            ).scalar_one():
                at += timedelta(microseconds=1)
                conn.execute(update(A).where(A.job_pk == alert.pk, A.kind == KIND).values(alerted_at=at))
            if throttle > timedelta(0):
                others = conn.execute(
                    select(func.count()).where(
                        A.user_name == alert.user, A.job_pk != alert.pk, A.alerted_at > at - throttle
                    )
                ).scalar_one()
                if others:
                    raise _Throttled
            return at
    except IntegrityError:
        return _RACED
    except _Throttled:
        return _THROTTLED


def send_idle_alerts(
    engine: Engine,
    cfg: Config,
    *,
    now: datetime | None = None,
    cluster: str | None = None,
    transport: Transport | None = None,
    dry_run: bool = False,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> AlertSummary:
    """One pass: find running jobs whose GPUs all idle, bind an alert for each (within the throttle and
    opt-outs), then send every unsent alert (see the module doc).

    `now` is the time the pass judges by (default: the clock); `cluster` limits it to one cluster's jobs;
    `dry_run` binds and sends nothing and says what would go.
    """
    from cocaq.reports.recipients import AddressBook

    now = as_utc(now) if now is not None else clock()
    s = AlertSummary(dry_run=dry_run, cluster=cluster)
    if not cfg.alerts.idle_gpu:
        s.enabled = False
        return s
    cid = _cluster_id(engine, cluster) if cluster is not None else None
    opened = _open_alerts(engine, now, cid)
    with engine.connect() as conn:
        found = find_idle(conn, cfg, now, cluster_id=cid)
    s.idle_jobs = len(found)
    by_user: dict[str, list[Candidate]] = defaultdict(list)
    for c in found:
        by_user[c.user].append(c)
    throttle = timedelta(hours=cfg.alerts.throttle_hours)
    recent = _recently_alerted(engine, list(by_user), now - throttle) if throttle > timedelta(0) else set()
    book = AddressBook.load(engine, cfg.mail, by_user)
    chosen: list[Candidate] = []
    for user, cands in sorted(by_user.items()):
        rcpt = book.for_user(user)
        if rcpt.address is None:
            s.no_address += len(cands)
            log.warning("mail: idle-GPU alert for %s not made: %s", user, rcpt.problem)
            continue
        if rcpt.opted_out:
            s.opted_out += len(cands)
            continue
        if throttle > timedelta(0):
            if user in recent:
                s.throttled += len(cands)
                continue
            cands = sorted(cands, key=lambda c: (-c.gpu_idle_s, c.pk))
            s.throttled += len(cands) - 1
            cands = cands[:1]
        chosen.extend(cands)
    made: list[tuple[int, str, datetime]] = []
    for c in chosen:
        alert = describe(engine, cfg, c, now)
        if dry_run:
            s.new += 1
            s.alerts.append(alert)
            continue
        at = _bind(engine, alert, now, throttle)
        if at == _RACED:
            s.raced += 1
            continue
        if at == _THROTTLED:
            s.raced += 1  # another run alerted this user meanwhile
            continue
        assert isinstance(at, datetime)
        s.new += 1
        s.alerts.append(_with_key(alert, at))
        made.append((c.pk, c.user, at))
    s.open = len(opened) if dry_run else len(opened) + len(made)
    if dry_run or not (opened or made):
        log.info("%s", s.line())
        return s

    todo = opened + made

    def build() -> Iterator[Outgoing]:
        from cocaq.reports.deliver import Outgoing
        from cocaq.reports.render import render_idle_alert

        for pk, user, at in todo:
            a = bound_alert(engine, cfg, pk)
            if a is None:
                continue  # its job was deleted
            yield Outgoing.of(KIND, at, at, render_idle_alert(a, cfg), user=user)

    from cocaq.reports.deliver import deliver

    s.delivery = deliver(engine, cfg, build(), transport=transport)
    log.info("%s", s.line())
    return s


def _with_key(a: IdleAlert, at: datetime) -> IdleAlert:
    return replace(a, alerted_at=at)
