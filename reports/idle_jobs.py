"""Running jobs whose GPUs all idle: finding them in the collector's samples, and what an alert about one
says (`IdleAlert`). The alerts themselves (who gets one, binding it exactly once, sending it) are
`reports.alerts`; this module reads and decides nothing about mail, so the alert's rendering
(`reports.render`) and its sending both build on it.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    String,
    and_,
    case,
    cast,
    exists,
    func,
    or_,
    select,
)

from cocaq.accounting.sessions import Sessions
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import Cluster, Job, JobAlert, Sample
from cocaq.db.sqlfuncs import epoch_exact
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR, co2_grams_of_kwh

KIND = "idle-gpu"  # the alert's kind, in job_alerts and in the ledger of sent mail (reports.alerts)
HISTORY = timedelta(days=7)  # how far back a long streak is followed


def stale_after(cfg: Config) -> timedelta:
    """A job's samples are current when each GPU's latest is at most this old: 3 intervals, >= 15 min."""
    return max(timedelta(seconds=3 * cfg.collector.interval_s), timedelta(minutes=15))


def max_gap(cfg: Config) -> timedelta:
    """Samples further apart than this are a gap, which ends a streak: 3 intervals, >= 10 min."""
    return max(timedelta(seconds=3 * cfg.collector.interval_s), timedelta(minutes=10))


def lookback(cfg: Config) -> timedelta:
    """How much of the samples one pass reads: the idle time asked for, plus staleness and one gap."""
    return timedelta(minutes=cfg.alerts.idle_minutes) + stale_after(cfg) + max_gap(cfg)


def is_interactive(c: Candidate, cfg: Config) -> bool:
    """A notebook, shell or editor session, srun --pty or salloc (cocaq.accounting.sessions)."""
    return Sessions.of(cfg.advice).holds(c.name, c.partition, c.qos, c.batch_step)


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
    qos: str | None = None
    batch_step: bool | None = None  # jobs.batch_step: False for srun --pty and salloc sessions

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
            J.qos,
            J.batch_step,
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
                qos=r[18],
                batch_step=None if r[19] is None else bool(r[19]),
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
        return self.idle_s / S_PER_HOUR

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
            "co2_g": self.co2_kg * G_PER_KG if self.co2_kg is not None else None,
            "threshold_pct": self.threshold_pct,
            "interactive": self.interactive,
            "gpus": self.gpus,
        }

    def line(self) -> str:
        """One line for the CLI."""
        where = ", ".join(self.nodes) or "?"
        co2 = f", {self.co2_kg * G_PER_KG:.0f} g CO2e" if self.co2_kg is not None else ""
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
        co2_kg=co2_grams_of_kwh(kwh, c.pue, c.carbon_g_per_kwh) / G_PER_KG
        if c.carbon_g_per_kwh is not None
        else None,
        threshold_pct=float(cfg.aggregate.idle_gpu_util_pct),
        interactive=is_interactive(c, cfg),
        job_start=c.job_start,
        time_limit_h=c.time_limit_s / S_PER_HOUR if c.time_limit_s else None,
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
