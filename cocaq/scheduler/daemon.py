"""`cocaq scheduler`: the head node's daemon that keeps the database current.

APScheduler 3 runs the job table of cocaq.scheduler.jobs, with the jobs stored in the database
(APScheduler's own table `apscheduler_jobs`), so their next run times survive restarts. Only one
scheduler acts at a time (cocaq.scheduler.lock); others wait as standby and take over when the lock
comes free. Missed runs after downtime are coalesced: each job runs once on start-up, not once per missed
time, then follows its schedule. A signal lets the running job finish, then the daemon exits.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
import time
from datetime import UTC, datetime, tzinfo
from typing import Any

from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.exc import SQLAlchemyError

from cocaq.config import Config
from cocaq.scheduler.jobs import (
    JOB_IDS,
    JOBSTORE_TABLE,
    Options,
    _error_text,
    install_jobs,
    job_specs,
    require_runs_table,
    zone,
)
from cocaq.scheduler.lock import Lock, lock_for

log = logging.getLogger("cocaq.scheduler")

# --- the daemon ------------------------------------------------------------------------------------------


SIGNAL_SLICE_S = 0.5


def wait_for(stop: threading.Event, seconds: float) -> bool:
    """`stop.wait(seconds)` in slices: a signal's Python handler runs only in the main thread and only
    when it runs bytecode, and a signal the kernel hands to another thread (one running sacct, say) does
    not wake the main thread's wait, so one long wait would hold SIGTERM back for its whole length (seen:
    SIGTERM handled only after the 30 s lock check)."""
    end = time.monotonic() + seconds
    while not stop.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return False
        stop.wait(min(left, SIGNAL_SLICE_S))
    return True


def run_daemon(cfg: Config, opts: Options, stop: threading.Event | None = None) -> None:
    """Wait for the lock (standby), then run the jobs until SIGTERM/SIGINT or until the lock is lost."""
    from cocaq.db.engine import make_engine

    stop = stop or threading.Event()
    engine = make_engine(cfg.database_url)
    require_runs_table(engine)
    lock = lock_for(cfg.database_url)
    handlers: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        if not stop.is_set():
            log.info("scheduler: %s: finishing the running job, then exiting", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            handlers[sig] = signal.signal(sig, on_signal)
    try:
        waiting = False
        while not stop.is_set():
            try:
                got = lock.try_acquire()
            except (SQLAlchemyError, OSError) as exc:
                log.warning(
                    "scheduler: cannot take the lock (%s); retrying in %g s", _error_text(exc), opts.retry_s
                )
                got = False
            if not got:
                if not waiting:
                    try:
                        who = lock.holder()
                    except (SQLAlchemyError, OSError):
                        who = None
                    log.info(
                        "standby: another scheduler is active (%s); retrying every %g s",
                        who or "holder unknown",
                        opts.retry_s,
                    )
                    waiting = True
                wait_for(stop, opts.retry_s)
                continue
            log.info(
                "active: %s the jobs (%s, pid %d)",
                "took over" if waiting else "this scheduler runs",
                lock.describe(),
                os.getpid(),
            )
            waiting = False
            try:
                _run_active(engine, cfg, opts, lock, stop)
            finally:
                lock.release()
    finally:
        lock.close()
        engine.dispose()
        for sig, old in handlers.items():
            signal.signal(sig, old)
    log.info("scheduler: stopped")


# Where earlier versions kept the job functions: APScheduler's job store names each job's function by
# module and attribute, and drops (with a traceback) every job whose name no longer imports, losing its
# next run time, so a run missed during an upgrade would never happen. These names lead to the job table;
# install_jobs then stores the current names. (The oldest, cocaq.scheduler, is this package's own name:
# its __getattr__ leads `cocaq.scheduler:job_*` there.)
EARLIER_JOB_MODULES = ("cocaq.cli.scheduler_jobs",)


def _earlier_job_names() -> None:
    import sys

    from cocaq.scheduler import jobs

    for name in EARLIER_JOB_MODULES:
        sys.modules.setdefault(name, jobs)


def new_scheduler(engine: Engine, tz: tzinfo) -> Any:
    """An APScheduler 3 BackgroundScheduler on the database's job store, running one job at a time."""
    _earlier_job_names()
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.schedulers.base import STATE_RUNNING

    class Scheduler(BackgroundScheduler):
        def _process_jobs(self) -> Any:
            # APScheduler 3's loop makes one more pass after shutdown() (and one can wake while shutdown()
            # waits for the running job): it would submit due jobs to the stopped executor, fail, and still
            # move their next run time on, so a run due at shutdown would be lost. Only a running scheduler
            # processes jobs; holding the job stores' lock (an RLock) closes the race with shutdown(), which
            # stops the executor under the same lock.
            with self._jobstores_lock:
                if self.state != STATE_RUNNING:
                    return None
                return super()._process_jobs()

    return Scheduler(
        jobstores={"default": SQLAlchemyJobStore(engine=engine, tablename=JOBSTORE_TABLE)},
        # One job at a time: reconcile, aggregation and reports work on the same rows, and SQLite has one
        # writer. A job due while another runs waits its turn (within its misfire grace time).
        executors={"default": ThreadPoolExecutor(max_workers=1)},
        job_defaults={"coalesce": True, "max_instances": 1},
        timezone=tz,
    )


def _run_active(engine: Engine, cfg: Config, opts: Options, lock: Lock, stop: threading.Event) -> None:
    tz = zone(cfg)
    sched = new_scheduler(engine, tz)
    sched.start(paused=True)
    try:
        install_jobs(sched, job_specs(opts, tz))
        for job in sched.get_jobs():
            log.info("job %s: %s, next run %s", job.id, job.trigger, _fmt_time(job.next_run_time, tz))
        sched.resume()
        while not wait_for(stop, opts.retry_s):
            if not lock.healthy():
                log.error(
                    "scheduler: lost the lock (database connection gone); stopping jobs, back to standby"
                )
                return
    finally:
        sched.shutdown(wait=True)  # lets the running job finish


# --- --status ----------------------------------------------------------------------------------------------


def _fmt_time(t: datetime | None, tz: tzinfo) -> str:
    return t.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z") if t else "-"


def stored_jobs(engine: Engine, tz: tzinfo) -> list[tuple[str, str, datetime | None]]:
    """(id, trigger, next run) of the jobs in APScheduler's table, read without changing it."""
    if not inspect(engine).has_table(JOBSTORE_TABLE):
        return []
    out = []
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT id, next_run_time, job_state FROM {JOBSTORE_TABLE}")).all()
    for row in rows:
        try:
            # Written by APScheduler, which reads it the same way.
            trigger = str(pickle.loads(row.job_state).get("trigger"))
        except Exception:
            trigger = "?"
        nxt = datetime.fromtimestamp(row.next_run_time, UTC) if row.next_run_time is not None else None
        out.append((row.id, trigger, nxt))
    order = {j: i for i, j in enumerate(JOB_IDS)}
    return sorted(out, key=lambda r: (order.get(r[0], len(order)), r[0]))


def status_lines(engine: Engine, cfg: Config) -> list[str]:
    from cocaq.db.schema import SchedulerRun

    require_runs_table(engine)
    tz = zone(cfg)
    lock = lock_for(cfg.database_url)
    try:
        holder = lock.holder()
    finally:
        lock.close()
    lines = [f"scheduler: active: {holder}" if holder else "scheduler: none running (the lock is free)"]
    jobs = stored_jobs(engine, tz)
    if not jobs:
        lines.append("no jobs stored yet: they are added when `cocaq scheduler` first becomes active")
    last: dict[str, Any] = {}
    with engine.connect() as conn:
        for job_id in {j[0] for j in jobs} | set(JOB_IDS):
            row = conn.execute(
                select(
                    SchedulerRun.started_at,
                    SchedulerRun.finished_at,
                    SchedulerRun.status,
                    SchedulerRun.summary,
                    SchedulerRun.via,
                    SchedulerRun.host,
                    SchedulerRun.pid,
                )
                .where(SchedulerRun.job_id == job_id)
                .order_by(SchedulerRun.started_at.desc(), SchedulerRun.id.desc())
                .limit(1)
            ).first()
            if row is not None:
                last[job_id] = row
    ids = [j[0] for j in jobs] + [j for j in JOB_IDS if j not in {x[0] for x in jobs} and j in last]
    info = {j[0]: j for j in jobs}
    lines.append(f"{'JOB':<16} {'SCHEDULE':<46} {'NEXT RUN':<24} LAST RUN")
    for job_id in ids:
        _, trig, nxt = info.get(job_id, (job_id, "(not scheduled)", None))
        r = last.get(job_id)
        if r is None:
            last_txt = "never"
        else:
            took = f", {(r.finished_at - r.started_at).total_seconds():.1f} s" if r.finished_at else ""
            last_txt = (
                f"{_fmt_time(r.started_at, tz)} {r.status}{took} ({r.via}, {r.host}:{r.pid}): {r.summary}"
            )
        lines.append(f"{job_id:<16} {trig:<46} {_fmt_time(nxt, tz):<24} {last_txt}")
    return lines
