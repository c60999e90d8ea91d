"""`cocaq report`: one month's report of a user, a lab or the site, written to files or e-mailed.

The group is open: another module adds its commands to it (`from cocaq.cli.report import report`, then
`@report.command("send")`), and cocaq/cli/app.py registers the group once. Errors are one line.

Why both --out and --send: --out shows a report before anyone gets it (a browser opens the .html, a mail
client the .eml); --send goes through `reports.deliver`, so a report is sent once per recipient and month
unless --force.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cocaq.errors import UsageError
from cocaq.reports.files import file_stem, user_address, write_email, write_private
from cocaq.timeparse import parse_month as month_start

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx
    from cocaq.reports.data import Month
    from cocaq.reports.deliver import Outgoing
    from cocaq.reports.render import Rendered


def parse_month(text: str | None, now: datetime | None = None) -> datetime:
    """The first instant (UTC) of `YYYY-MM`; without one, of last month (the month reports are about)."""
    if text is None:
        first = (
            (now or datetime.now(UTC))
            .astimezone(UTC)
            .replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        )
        last = first - timedelta(days=1)
        return datetime(last.year, last.month, 1, tzinfo=UTC)
    return month_start(text)


def _kind(what: str, cluster: str | None, lab: str | None = None) -> str:
    """The ledger kind `cocaq report send` uses for the same report (reports/batch.py)."""
    from cocaq.reports import batch

    base = {"user": batch.USER_KIND, "lab": batch.LAB_KIND, "admin": batch.ADMIN_KIND}[what]
    return batch.kind_for(base, cluster, lab=lab)


def _send(obj: Ctx, items: Sequence[Outgoing], force: bool) -> None:
    from cocaq.reports.deliver import deliver

    summary = deliver(obj.engine(), obj.cfg, items, force=force)
    for line in summary.lines():
        click.echo(line, err=True)
    if summary.failed or summary.stopped or summary.no_address:
        sys.exit(5)


def _outgoing(kind: str, month: Month, r: Rendered, **who: Any) -> Outgoing:
    from cocaq.reports.deliver import Outgoing

    return Outgoing.of(kind, month.start, month.end, r, **who)


def _check_target(out_dir: str | None, send: bool) -> None:
    if not out_dir and not send:
        raise UsageError("say where the report goes: --out DIR (files) and/or --send (e-mail)")


def _echo_paths(paths: Iterable[Path]) -> None:
    for p in paths:
        click.echo(str(p))


month_opt = click.option("--month", default=None, help="The UTC month, YYYY-MM (default: last month).")
cluster_opt = click.option("-M", "--cluster", default=None, help="Only this cluster (default: all).")
out_opt = click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write the report here: .html to open in a browser and .eml as it would be sent.",
)
send_opt = click.option("--send", is_flag=True, help="E-mail it (exactly once per recipient and month).")
force_opt = click.option("--force", is_flag=True, help="With --send: send again what was already sent.")


@click.group("report")
def report() -> None:
    """Monthly reports of a user, a lab or the site: to files (--out) or by e-mail (--send)."""


@report.command("user")
@click.argument("user")
@month_opt
@cluster_opt
@out_opt
@send_opt
@force_opt
@click.pass_obj
def report_user(
    obj: Ctx, user: str, month: str | None, cluster: str | None, out_dir: str | None, send: bool, force: bool
) -> None:
    """A user's monthly report: energy, CO2, idle GPUs, failed jobs, suggestions."""
    from cocaq.db.dbapi import wrap
    from cocaq.footprint.lookup import check_names
    from cocaq.reports.data import Month
    from cocaq.reports.render import render_user_month
    from cocaq.reports.suggest import suggest_for_user
    from cocaq.reports.user_report import user_month

    _check_target(out_dir, send)
    start = parse_month(month)
    engine = obj.engine()
    with engine.connect() as conn:
        check_names(wrap(conn), user=user, cluster=cluster)  # a typo: exit 2, not an empty report
        um = user_month(conn, obj.cfg, user, start, cluster=cluster)
    r = render_user_month(um, suggest_for_user(um, obj.cfg), obj.cfg)
    if out_dir:
        to = user_address(engine, obj.cfg, user)
        _echo_paths(
            write_email(Path(out_dir), file_stem("user", user, um.month.label), r, obj.cfg, to, user=user)
        )
    if send:
        from cocaq.study.assign import hold_out

        # the study's hold-out gets no e-mail, sent by hand or not (judged as `cocaq report send` does)
        now = datetime.now(UTC)
        hold = hold_out(engine, obj.cfg, now, [user], judged_at=max(now, um.month.end))
        if hold is not None and user in hold:
            raise UsageError(
                f"{user} is in the hold-out of the e-mail study {hold.key}: not sent (--out writes the files)"
            )
        kind = _kind("user", cluster)  # as `cocaq report send` records it: the same report goes once
        _send(obj, [_outgoing(kind, Month.of(start), r, user=user)], force)


@report.command("lab")
@click.argument("account")
@month_opt
@cluster_opt
@out_opt
@send_opt
@force_opt
@click.pass_obj
def report_lab(
    obj: Ctx,
    account: str,
    month: str | None,
    cluster: str | None,
    out_dir: str | None,
    send: bool,
    force: bool,
) -> None:
    """A lab's (Slurm account's) monthly report, for its heads ([reports] lab_heads)."""
    from cocaq.db.dbapi import wrap
    from cocaq.footprint.lookup import check_names
    from cocaq.reports.lab_report import lab_month
    from cocaq.reports.render import render_lab_month

    _check_target(out_dir, send)
    heads = obj.cfg.reports.lab_heads.get(account, ())
    if send and not heads:
        raise UsageError(
            f'no address for the heads of {account!r}: set [reports] lab_heads = {{ "{account}" = '
            '["head@example.org"] }'
        )
    start = parse_month(month)
    engine = obj.engine()
    with engine.connect() as conn:
        check_names(wrap(conn), account=account, cluster=cluster)  # a typo: exit 2, not an empty report
        lm = lab_month(conn, obj.cfg, account, start, cluster=cluster)
    r = render_lab_month(lm, obj.cfg)
    if out_dir:
        to = heads[0] if heads else f"{file_stem(account)}@example.invalid"
        _echo_paths(write_email(Path(out_dir), file_stem("lab", account, lm.month.label), r, obj.cfg, to))
    if send:
        kind = _kind("lab", cluster, lab=account)
        _send(obj, [_outgoing(kind, lm.month, r, address=a) for a in heads], force)


@report.command("admin")
@month_opt
@cluster_opt
@out_opt
@send_opt
@force_opt
@click.pass_obj
def report_admin(
    obj: Ctx, month: str | None, cluster: str | None, out_dir: str | None, send: bool, force: bool
) -> None:
    """The site's monthly report for its admins ([reports] admins); --out also writes the interactive page."""
    from cocaq.reports.batch import build_admin_month
    from cocaq.reports.render import render_admin_email, render_admin_html

    _check_target(out_dir, send)
    admins = obj.cfg.reports.admins
    if send and not admins:
        raise UsageError('no admin addresses: set [reports] admins = ["hpc-admins@example.org"]')
    start = parse_month(month)
    engine = obj.engine()
    am = build_admin_month(engine, obj.cfg, start, cluster)
    r = render_admin_email(am, obj.cfg)
    if out_dir:
        out = Path(out_dir)
        parts = ["admin", am.month.label] + ([cluster] if cluster else [])
        page = out / f"{file_stem(*parts)}.html"
        paths = write_email(
            out, file_stem(*parts, "email"), r, obj.cfg, admins[0] if admins else "admins@example.invalid"
        )
        write_private(page, render_admin_html(am, obj.cfg))
        _echo_paths([page, *paths])
    if send:
        kind = _kind("admin", cluster)
        _send(obj, [_outgoing(kind, am.month, r, address=a) for a in admins], force)
