"""`cocaq scheduler`: the aggregator daemon's command line (the work is in cocaq.scheduler)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import click

from cocaq.errors import CocaqError, UsageError

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx

# Kept here as well as in cocaq.scheduler.jobs so that `cocaq --help` does not import APScheduler or
# the ORM.
JOB_IDS = (
    "reconcile", "aggregate", "catchup", "reports-monthly", "reports-weekly", "reports-jobs", "alerts",
    "calibrate", "retention", "month-answers",
)  # fmt: skip


@click.command("scheduler")
@click.option("--status", is_flag=True, help="Print the jobs, their next run times and the last run of each.")
@click.option(
    "--once",
    "once",
    type=click.Choice(JOB_IDS),
    default=None,
    metavar="JOB",
    help=f"Run one job now, in this process, and exit ({', '.join(JOB_IDS)}).",
)
@click.option(
    "--reconcile-every",
    default="5m",
    show_default=True,
    help="How often to reconcile with sacct (a duration with a unit: 5m, 90s, 1h).",
)
@click.option("--sacct", "sacct_bin", default=None, help="Path of the sacct binary (default: on PATH).")
@click.option(
    "--retry",
    "retry_s",
    type=click.FloatRange(0.1, 3600),
    default=30.0,
    show_default=True,
    help="Seconds between a standby scheduler's tries to take over (and the active one's lock checks).",
)
@click.pass_obj
def scheduler(
    obj: Ctx, status: bool, once: str | None, reconcile_every: str, sacct_bin: str | None, retry_s: float
) -> None:
    """The aggregator daemon: reconcile with sacct, aggregate, catch up late data, trigger reports.

    Jobs are kept in the database; only one scheduler acts at a time (others wait as standby and take
    over when it stops). SIGTERM or SIGINT: the running job finishes, then it exits.
    """
    from cocaq.scheduler import daemon as sch
    from cocaq.scheduler import jobs
    from cocaq.timeparse import parse_duration

    if status and once:
        raise UsageError("--status and --once do not go together")
    text = reconcile_every.strip()
    if text.isdigit():
        raise UsageError(f"--reconcile-every {text}: give a unit (5m, 90s, 1h)")
    every = parse_duration(text)
    if every.total_seconds() < 1:
        raise UsageError(f"--reconcile-every {text}: at least one second")
    opts = jobs.Options(config_path=obj.config_path, reconcile_every=every, sacct=sacct_bin, retry_s=retry_s)
    if status:
        engine = obj.engine()
        try:
            for line in sch.status_lines(engine, obj.cfg):
                click.echo(line)
        finally:
            engine.dispose()
        return
    if once:
        jobs.require_runs_table(obj.engine())  # a missing schema fails here, in one line
        res = jobs.run_once(once, opts)
        if res.status == "error":
            raise CocaqError(f"{once}: {res.summary}")
        click.echo(f"{once}: {res.status}: {res.summary}", err=True)
        return
    if obj.verbose == 0:  # a daemon says what it does: standby, active, each run
        logging.getLogger("cocaq").setLevel(logging.INFO)
    sch.run_daemon(obj.cfg, opts)
