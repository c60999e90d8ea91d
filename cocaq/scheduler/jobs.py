"""The scheduler's job table: what `cocaq scheduler` runs, when, and the record of every run.

    reconcile        every 5 minutes (--reconcile-every): sacct states + linking node records, over the
                     last 2 days or since the last successful reconcile, whichever is longer
    aggregate        hourly: per-job metrics and daily rollups of what changed (cocaq.accounting.aggregate)
    catchup          daily at 03:10: late data, a week back (reconcile, then aggregate)
    reports-monthly  on the 1st at 06:00: last month's user, lab and admin e-mails (cocaq.reports.trigger)
    reports-weekly   Mondays at 06:00: no weekly report; in a month's first two weeks, last month's batch
                     again (sends only what did not go)
    reports-jobs     every 5 minutes: job e-mails of jobs whose energy became final (digests per user)
    alerts           every 5 minutes: alerts to users whose running jobs hold GPUs that all sit idle
                     (cocaq.reports.alerts)
    calibrate        Sundays at 04:20: the GPU power of the measured jobs learnt again, and applied to the
                     estimates of the jobs of the last 35 days (cocaq.accounting.calibrate)
    retention        daily at 03:40 (after catchup's aggregate): raw samples older than [retention]
                     samples_days that the aggregator has summarised go, and the coming months'
                     partitions are made (cocaq.accounting.retention)
    month-answers    hourly at :40: every user's answer for the last [reports] keep_months settled
                     months, built again only where a month's data or the settings changed, for the web
                     app's month pages (cocaq.reports.month_store)

Times are in the cluster's timezone (config `cluster.timezone`, else this machine's).

Job functions are module-level (APScheduler's job store keeps a reference to them by name, not code; the
names of earlier versions, cocaq.scheduler and cocaq.cli.scheduler_jobs, still lead here: see
cocaq.scheduler.daemon.EARLIER_JOB_MODULES) and take only plain keyword arguments: each run reads the
configuration and connects on its own. Every run is recorded in `scheduler_runs`
(cocaq.db.schema.SchedulerRun), which `--status` reads.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from sqlalchemy import Engine, insert, inspect, select, update
from sqlalchemy.exc import SQLAlchemyError

from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.errors import CocaqError, DatabaseError
from cocaq.units import S_PER_HOUR

log = logging.getLogger("cocaq.scheduler")

JOBSTORE_TABLE = "apscheduler_jobs"
RECONCILE_WINDOW = timedelta(days=2)
CATCHUP_WINDOW = timedelta(days=7)
DEFAULT_RECONCILE_EVERY = timedelta(minutes=5)
JOB_MAIL_EVERY = timedelta(minutes=5)
ALERTS_EVERY = timedelta(minutes=5)
# The weekly calibrate job applies the new table to the jobs that ended this long ago or later: the month a
# report covers and the days since (older jobs keep the estimate they were reported with).
CALIBRATE_APPLY_WINDOW = timedelta(days=35)
# The advisory lock's key (a bigint; advisory locks are per database): "cocaqsch" in ASCII.
HOST = socket.gethostname()


def now_utc() -> datetime:
    return datetime.now(UTC)


def zone(cfg: Config) -> tzinfo:
    """The timezone of the schedule: the cluster's, else this machine's (an IANA zone, so DST is right)."""
    if cfg.cluster.timezone:
        from zoneinfo import ZoneInfo

        return ZoneInfo(cfg.cluster.timezone)
    from tzlocal import get_localzone

    tz: tzinfo = get_localzone()
    return tz


def _one_line(s: str, limit: int = 500) -> str:
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, CocaqError):
        return str(exc)
    orig = getattr(exc, "orig", None)  # SQLAlchemy's DBAPI errors: the driver's first line says it
    msg = str(orig if orig is not None else exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"


# --- the run log ------------------------------------------------------------------------------------


@dataclass
class RunResult:
    job_id: str
    status: str  # ok, skipped, error
    summary: str
    run_id: int | None = None


def require_runs_table(engine: Engine) -> None:
    from cocaq.db.engine import mask_url, require_schema

    require_schema(engine)
    if not inspect(engine).has_table("scheduler_runs"):
        raise DatabaseError(
            f"database {mask_url(str(engine.url))} has no scheduler_runs table: run `cocaq db upgrade`"
        )


def _start_run(engine: Engine, job_id: str, started: datetime, via: str) -> int:
    from cocaq.db.schema import SchedulerRun

    with engine.begin() as conn:
        res = conn.execute(
            insert(SchedulerRun).values(
                job_id=job_id,
                started_at=started,
                status="running",
                summary="",
                via=via,
                host=HOST[:255],
                pid=os.getpid(),
            )
        )
        pk = res.inserted_primary_key
        assert pk is not None
        return int(pk[0])


def _finish_run(engine: Engine, run_id: int, status: str, summary: str) -> None:
    from cocaq.db.schema import SchedulerRun

    with engine.begin() as conn:
        conn.execute(
            update(SchedulerRun)
            .where(SchedulerRun.id == run_id)
            .values(finished_at=now_utc(), status=status, summary=summary)
        )


Work = Callable[[Engine, Config, datetime], tuple[str, str]]


def _recorded(job_id: str, config_path: str | None, via: str, work: Work) -> RunResult:
    """Run `work` with a fresh config and engine, record it in scheduler_runs, never raise."""
    started = now_utc()
    try:
        cfg = load_config(config_path)
        from cocaq.db.engine import make_engine

        engine = make_engine(cfg.database_url)
    except Exception as exc:
        log.error("%s: error: %s", job_id, _error_text(exc))
        return RunResult(job_id, "error", _error_text(exc))
    run_id: int | None = None
    try:
        run_id = _start_run(engine, job_id, started, via)
        try:
            status, summary = work(engine, cfg, started)
        except Exception as exc:
            log.debug("%s failed", job_id, exc_info=True)
            status, summary = "error", _error_text(exc)
        summary = _one_line(summary)
        _finish_run(engine, run_id, status, summary)
    except SQLAlchemyError as exc:  # the database went away: the run cannot even be recorded
        status, summary = "error", f"cannot record the run: {_error_text(exc)}"
    finally:
        engine.dispose()
    (log.error if status == "error" else log.info)("%s: %s: %s", job_id, status, summary)
    return RunResult(job_id, status, summary, run_id)


# --- what the jobs do --------------------------------------------------------------------------------
# Each job imports what it runs when it runs: `--status` and the daemon's start load neither the reports
# (Jinja2, Plotly, Pillow) nor the aggregator, and a module that fails to import is that run's error.


def _describe(result: Any) -> str:
    """A summary object's own words: its `line()`, or its `lines()` joined, or str()."""
    line = getattr(result, "line", None)
    if callable(line):
        return str(line())
    lines = getattr(result, "lines", None)
    if callable(lines):
        return "; ".join(str(x) for x in lines())
    return str(result)


def _pyslurm_usable(cfg: Config) -> bool:
    """With no sacct here, "auto" (and "pyslurm") read Slurm through pyslurm if it loads."""
    if cfg.slurm.backend == "cli":
        return False
    from cocaq.errors import InputError
    from cocaq.slurm.slurmdb import probe_pyslurm

    try:
        probe_pyslurm()
    except InputError:
        return False
    return True


def reconcile_since(engine: Engine, now: datetime) -> datetime:
    """The last 2 days, or since the start of the last successful reconcile if that is longer ago."""
    from cocaq.db.schema import SchedulerRun

    since = now - RECONCILE_WINDOW
    with engine.connect() as conn:
        last = conn.execute(
            select(SchedulerRun.started_at)
            .where(SchedulerRun.job_id == "reconcile", SchedulerRun.status == "ok")
            .order_by(SchedulerRun.started_at.desc())
            .limit(1)
        ).scalar()
    return min(since, last) if last is not None else since


def _reconcile(
    engine: Engine, cfg: Config, since: datetime, until: datetime, sacct: str | None
) -> tuple[str, str]:
    from cocaq.accounting.reconcile import reconcile
    from cocaq.slurm.run import find_sacct

    exe = find_sacct(sacct or cfg.slurm.sacct)
    span = f"{since:%Y-%m-%d %H:%M} UTC to now"
    backend = None  # the config's
    if exe is None:
        if cfg.slurm.backend != "pyslurm" and not _pyslurm_usable(cfg):
            res = reconcile(engine, cfg, since, until, use_sacct=False)
            return "skipped", (
                f"sacct is not installed on this host ({sacct or cfg.slurm.sacct or 'sacct'} not found):"
                " sacct skipped; " + "; ".join(res.lines())
            )
        # no sacct to run (nor to compare versions with): slurmdbd through pyslurm; where the config asks
        # for pyslurm and it does not load, reconcile says why in one line (the run's error)
        backend = "pyslurm"
    res = reconcile(engine, cfg, since, until, sacct=exe or sacct or cfg.slurm.sacct, backend=backend)
    return "ok", f"{span}: " + "; ".join(res.lines())


def _aggregate(engine: Engine, cfg: Config, since: datetime | None) -> tuple[str, str]:
    from cocaq.accounting.aggregate import run_aggregate

    result = run_aggregate(engine, cfg, since=since)
    where = f"since {since:%Y-%m-%d %H:%M} UTC" if since else "since the watermark"
    return "ok", f"aggregate ({where}): {_describe(result)}"


def previous_month_start(now: datetime, tz: tzinfo) -> datetime:
    local = now.astimezone(tz)
    first = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first - timedelta(days=1)).replace(day=1)


def previous_week_start(now: datetime, tz: tzinfo) -> datetime:
    local = now.astimezone(tz)
    monday = (local - timedelta(days=local.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    return monday - timedelta(days=7)


def _reports(engine: Engine, cfg: Config, kind: str, period_start: datetime, what: str) -> tuple[str, str]:
    from cocaq.reports import trigger

    result = trigger(kind, period_start, engine, cfg)
    # The result's own status where it has one: "skipped" when there was nothing to do, "error" when the
    # mail server stopped the batch.
    status = getattr(result, "status", "ok")
    if status not in ("ok", "skipped", "error"):
        status = "ok"
    return status, f"reports: {what}: " + (_describe(result) if result is not None else "triggered")


# --- the job functions (module-level: the job store refers to them by name) ---------------------------


def job_reconcile(
    config_path: str | None = None, sacct: str | None = None, via: str = "scheduler"
) -> RunResult:
    def work(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
        return _reconcile(engine, cfg, reconcile_since(engine, now), now, sacct)

    return _recorded("reconcile", config_path, via, work)


def job_aggregate(config_path: str | None = None, via: str = "scheduler") -> RunResult:
    return _recorded("aggregate", config_path, via, lambda engine, cfg, now: _aggregate(engine, cfg, None))


def job_catchup(
    config_path: str | None = None, sacct: str | None = None, via: str = "scheduler"
) -> RunResult:
    def work(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
        since = now - CATCHUP_WINDOW
        statuses, parts = [], []
        for step in (
            lambda: _reconcile(engine, cfg, since, now, sacct),
            lambda: _aggregate(engine, cfg, since),
        ):
            try:  # late data still gets aggregated when sacct fails
                st, summary = step()
            except Exception as exc:
                st, summary = "error", _error_text(exc)
            statuses.append(st)
            parts.append(summary)
        overall = "error" if "error" in statuses else "ok" if "ok" in statuses else "skipped"
        return overall, "a week back: " + " | ".join(parts)

    return _recorded("catchup", config_path, via, work)


def job_reports_monthly(config_path: str | None = None, via: str = "scheduler") -> RunResult:
    def work(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
        start = previous_month_start(now, zone(cfg))
        return _reports(engine, cfg, "monthly", start, f"monthly user reports for {start:%Y-%m}")

    return _recorded("reports-monthly", config_path, via, work)


def job_reports_weekly(config_path: str | None = None, via: str = "scheduler") -> RunResult:
    def work(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
        start = previous_week_start(now, zone(cfg))
        return _reports(engine, cfg, "weekly", start, f"weekly reports for the week of {start:%Y-%m-%d}")

    return _recorded("reports-weekly", config_path, via, work)


def job_reports_jobs(config_path: str | None = None, via: str = "scheduler") -> RunResult:
    def work(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
        return _reports(engine, cfg, "jobs", now, "ended jobs")

    return _recorded("reports-jobs", config_path, via, work)


def _alerts(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
    from cocaq.reports.alerts import send_idle_alerts

    result = send_idle_alerts(engine, cfg, now=now)
    # "skipped" when [alerts] idle_gpu is off, "error" when the mail server stopped the batch.
    status = getattr(result, "status", "ok")
    if status not in ("ok", "skipped", "error"):
        status = "ok"
    return status, "alerts: " + _describe(result)


def job_alerts(config_path: str | None = None, via: str = "scheduler") -> RunResult:
    return _recorded("alerts", config_path, via, _alerts)


def _calibrate(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
    """Learn the GPU power of the measured jobs again and apply it to the recent jobs' estimates."""
    if not cfg.estimate.calibrate:
        return "skipped", "calibrate: off ([estimate] calibrate = false); estimates use TDP x utilisation"
    from cocaq.accounting import calibrate
    from cocaq.accounting.recompute import recompute_jobs

    res = calibrate.refresh(engine, cfg, now)
    line = res.line(cfg.estimate.calibrate_min_jobs)
    if not res.cells:
        return "skipped", line
    since = now - CALIBRATE_APPLY_WINDOW
    n, changed = recompute_jobs(engine, cfg, since=since)
    return "ok", f"{line}; applied to jobs since {since:%Y-%m-%d}: {n:,} looked at, {changed:,} changed"


def job_calibrate(config_path: str | None = None, via: str = "scheduler") -> RunResult:
    return _recorded("calibrate", config_path, via, _calibrate)


def _retention(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
    """The samples' lifecycle; "skipped" where samples are kept for ever and no partition was due."""
    from cocaq.accounting.retention import run_retention

    res = run_retention(engine, cfg)
    status = "skipped" if res.cutoff is None and not res.created else "ok"
    return status, "retention: " + _describe(res)


def job_retention(config_path: str | None = None, via: str = "scheduler") -> RunResult:
    return _recorded("retention", config_path, via, _retention)


def _month_answers(engine: Engine, cfg: Config, now: datetime) -> tuple[str, str]:
    """The web app's kept month answers; "skipped" where none are kept ([reports] keep_months = 0)."""
    from cocaq.reports.month_answer import keep_recent

    done = keep_recent(engine, cfg, now)
    if not done:
        return "skipped", "month answers: none kept ([reports] keep_months = 0)"
    return "ok", "; ".join(k.line() for k in done)


def job_month_answers(config_path: str | None = None, via: str = "scheduler") -> RunResult:
    return _recorded("month-answers", config_path, via, _month_answers)


JOB_FUNCS: dict[str, Callable[..., RunResult]] = {
    "reconcile": job_reconcile,
    "aggregate": job_aggregate,
    "catchup": job_catchup,
    "reports-monthly": job_reports_monthly,
    "reports-weekly": job_reports_weekly,
    "reports-jobs": job_reports_jobs,
    "alerts": job_alerts,
    "calibrate": job_calibrate,
    "retention": job_retention,
    "month-answers": job_month_answers,
}
JOB_IDS = tuple(JOB_FUNCS)
_TAKES_SACCT = {"reconcile", "catchup"}


@dataclass(frozen=True)
class Options:
    config_path: str | None = None
    reconcile_every: timedelta = DEFAULT_RECONCILE_EVERY
    sacct: str | None = None
    retry_s: float = 30.0  # standby: how often to try the lock; active: how often to check it is still held


def run_once(job_id: str, opts: Options) -> RunResult:
    """`cocaq scheduler --once JOB`: run one job now, in this process, recorded like a scheduled run."""
    kwargs: dict[str, Any] = {"config_path": opts.config_path, "via": "once"}
    if job_id in _TAKES_SACCT:
        kwargs["sacct"] = opts.sacct
    return JOB_FUNCS[job_id](**kwargs)


@dataclass(frozen=True)
class JobSpec:
    id: str
    trigger: Any
    grace_s: int  # a run this late still runs; with coalescing, the one catch-up run is never later than this
    kwargs: dict[str, Any] = field(default_factory=dict)


def job_specs(opts: Options, tz: tzinfo) -> list[JobSpec]:
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    every = opts.reconcile_every.total_seconds()
    base: dict[str, Any] = {"config_path": opts.config_path}
    with_sacct = dict(base, sacct=opts.sacct)
    day = 86400
    return [
        JobSpec(
            "reconcile", IntervalTrigger(seconds=every, timezone=tz), max(3600, int(2 * every)), with_sacct
        ),
        JobSpec("aggregate", IntervalTrigger(hours=1, timezone=tz), 2 * S_PER_HOUR, base),
        JobSpec("catchup", CronTrigger(hour=3, minute=10, timezone=tz), day, with_sacct),
        JobSpec("reports-monthly", CronTrigger(day=1, hour=6, minute=0, timezone=tz), 31 * day, base),
        JobSpec(
            "reports-weekly", CronTrigger(day_of_week="mon", hour=6, minute=0, timezone=tz), 7 * day, base
        ),
        JobSpec(
            "reports-jobs",
            IntervalTrigger(seconds=JOB_MAIL_EVERY.total_seconds(), timezone=tz),
            int(2 * JOB_MAIL_EVERY.total_seconds()),
            base,
        ),
        JobSpec(
            "alerts",
            IntervalTrigger(seconds=ALERTS_EVERY.total_seconds(), timezone=tz),
            int(2 * ALERTS_EVERY.total_seconds()),
            base,
        ),
        JobSpec("calibrate", CronTrigger(day_of_week="sun", hour=4, minute=20, timezone=tz), 7 * day, base),
        JobSpec("retention", CronTrigger(hour=3, minute=40, timezone=tz), day, base),
        JobSpec("month-answers", CronTrigger(minute=40, timezone=tz), 2 * S_PER_HOUR, base),
    ]


def install_jobs(sched: Any, specs: list[JobSpec]) -> None:
    """Put the jobs in the (started, paused) scheduler's store: stable ids, replaced, missed runs kept.

    A plain add_job(replace_existing=True) would compute a fresh next run time and so silently drop a run
    that was due while no scheduler ran. The earlier of the stored and the fresh next run time is kept
    instead: a run missed during downtime is still due, and coalescing runs it once.
    """
    now = datetime.now(sched.timezone)
    stored = {job.id: job for job in sched.get_jobs()}
    wanted = {s.id for s in specs}
    for job_id in stored.keys() - wanted:
        sched.remove_job(job_id)
        log.info("scheduler: removed job %r, which this version does not have", job_id)
    for spec in specs:
        fresh = spec.trigger.get_next_fire_time(None, now)
        old = stored.get(spec.id)
        next_run = fresh
        if old is not None and old.next_run_time is not None and fresh is not None:
            next_run = min(old.next_run_time, fresh)
        sched.add_job(
            JOB_FUNCS[spec.id],
            trigger=spec.trigger,
            id=spec.id,
            name=spec.id,
            kwargs=spec.kwargs,
            replace_existing=True,
            coalesce=True,
            max_instances=1,
            misfire_grace_time=spec.grace_s,
            next_run_time=next_run,
        )
