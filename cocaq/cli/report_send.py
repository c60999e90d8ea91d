"""`cocaq report send`: a month's report e-mails, exactly once (the work is in cocaq.reports.batch), and
`cocaq report alerts`: one pass of the idle-GPU alerts to users of running jobs (cocaq.reports.alerts).

Registered on the `report` group of cocaq.cli.report by importing this module (cocaq/cli/app.py does).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from cocaq.cli.report import parse_month, report

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx


@report.command("send")
@click.option("--month", required=True, metavar="YYYY-MM", help="The month to report on (UTC months).")
@click.option("-M", "--cluster", default=None, help="Only this cluster (default: all in the database).")
@click.option("--force", is_flag=True, help="Send again what was sent already (never to opted-out users).")
@click.option("--dry-run", is_flag=True, help="Say what would be sent; render, write and send nothing.")
@click.option(
    "--only",
    type=click.Choice(["users", "labs", "admin"]),
    multiple=True,
    help="Only these parts (repeatable; default: all three).",
)
@click.pass_obj
def report_send(
    obj: Ctx, month: str, cluster: str | None, force: bool, dry_run: bool, only: tuple[str, ...]
) -> None:
    """Send the month's user, lab and admin e-mails, each once.

    Users with jobs in the month get theirs unless they opted out or turned the monthly e-mail off
    (users.monthly_email); lab heads and admins come from [reports]. Running it again sends only what
    is missing (after a crash, a server that was down, a throttle); --force sends everything again.
    Prints one line; exit code 5 when the mail server stopped the batch.
    """
    from cocaq.reports.batch import send_month

    first = parse_month(month)
    summary = send_month(
        obj.engine(), obj.cfg, first, cluster=cluster, force=force, dry_run=dry_run, only=only or None
    )
    for line in summary.lines():
        click.echo(line, err=True)
    if summary.stopped:
        sys.exit(5)


@report.command("alerts")
@click.option("-M", "--cluster", default=None, help="Only this cluster's jobs (default: all).")
@click.option("--dry-run", is_flag=True, help="Say which alerts would go; record and send nothing.")
@click.pass_obj
def report_alerts(obj: Ctx, cluster: str | None, dry_run: bool) -> None:
    """Alert the users whose running jobs hold GPUs that all sat idle ([alerts] in the config).

    One pass of what the scheduler's `alerts` job runs every 5 minutes: at most one alert per job, one
    per user per [alerts] throttle_hours, none to opted-out users; alerts not sent yet go again. Prints
    each new alert on stdout ("alert ..." or, with --dry-run, "would alert ..."), then one summary line
    on stderr; exit code 5 when the mail server stopped the batch.
    """
    from cocaq.reports.alerts import send_idle_alerts

    summary = send_idle_alerts(obj.engine(), obj.cfg, cluster=cluster, dry_run=dry_run)
    *alerts, line = summary.lines()
    for a in alerts:
        click.echo(a)
    click.echo(line, err=True)
    if summary.delivery is not None:
        for extra in summary.delivery.lines()[1:]:
            click.echo(extra, err=True)
    if summary.status == "error":
        sys.exit(5)


@report.command("keep")
@click.option("--month", default=None, metavar="YYYY-MM", help="Only this month (default: the latest "
              "[reports] keep_months before this one, forgetting older ones).")  # fmt: skip
@click.option("-M", "--cluster", default=None, help="Answers for this cluster only (default: all clusters).")
@click.pass_obj
def report_keep(obj: Ctx, month: str | None, cluster: str | None) -> None:
    """Keep every user's month answer for the web app's month pages (what the scheduler's month-answers
    job runs hourly).

    A settled month's e-mail is computed once for all its users and kept with a stamp of the data and
    settings it came from; the read API serves it while the stamp holds and computes it otherwise. A
    month with running jobs, or jobs the aggregator has not derived yet, is not kept (the line says
    why). Prints one line per month on stderr.
    """
    from datetime import UTC, datetime

    from cocaq.reports.month_answer import keep, keep_recent

    engine, cfg = obj.engine(), obj.cfg
    if month is None:
        done = keep_recent(engine, cfg, datetime.now(UTC), cluster)
        if not done:
            click.echo("month answers: none kept ([reports] keep_months = 0)", err=True)
    else:
        done = [keep(engine, cfg, parse_month(month), cluster)]
    for k in done:
        click.echo(k.line(), err=True)
