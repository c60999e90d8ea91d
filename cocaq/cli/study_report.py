"""`cocaq study report`: the e-mail study's estimates (cocaq.study.analysis) as a table or JSON.

Registered on the `study` group of cocaq.cli.study by importing this module (cocaq/cli/app.py does).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from cocaq.cli.study import study

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx
    from cocaq.study.analysis import Estimate, StudyReport


def _num(x: float | None, unit: str, *, signed: bool = False) -> str:
    """A value in its unit; `signed`: a change, a share's in percentage points (not a relative %)."""
    if x is None:
        return "-"
    sign = "+" if signed else ""
    if unit == "%":
        return f"{x:+.1f} pt" if signed else f"{x:.1f}%"
    return f"{x:{sign},.3g}" if abs(x) < 100 else f"{x:{sign},.0f}"


def _change(x: float | None, unit: str) -> str:
    """An arm's change from its baseline."""
    return _num(x, unit, signed=True)


def _rel(e: Estimate) -> str:
    if e.rel is None:
        return "-"
    if e.rel_lo is None or e.rel_hi is None:
        return f"{e.rel:+.0%}"
    return f"{e.rel:+.0%} ({e.rel_lo:+.0%} to {e.rel_hi:+.0%})"


def print_report(rep: StudyReport, console: Any) -> None:
    from rich.table import Table

    arms = ", ".join(f"{a} {n}" for a, n in rep.arms.items())
    console.print(
        f"Study [bold]{rep.study}[/]: from {rep.start}{f' to {rep.end}' if rep.end else ''}; "
        f"baseline {rep.baseline[0]} to {rep.baseline[-1]}; users drawn: {arms}"
    )
    console.print(
        "Joined after the draw (no baseline): "
        + ", ".join(f"{a} {n}" for a, n in rep.joined.items())
        + "; with jobs in the study months: "
        + ", ".join(f"{a} {n}" for a, n in rep.active.items())
        + "; opted out of e-mails (kept in their arm): "
        + ", ".join(f"{a} {n}" for a, n in rep.opted_out.items())
    )
    for note in rep.notes:
        console.print(f"[yellow]{note}[/]")
    if not rep.outcomes:
        return
    months = ", ".join(rep.months)
    console.print(f"Months with data: {months}; 95% intervals from {rep.resamples:,} resamples")
    for r in rep.outcomes:
        o = r.outcome
        t = Table(title=f"{o.label} ({o.unit})", title_justify="left", show_edge=False, pad_edge=False)
        for col in ("", "e-mailed", "hold-out", "n", "e-mailed vs hold-out"):
            t.add_column(col, justify="left" if not col else "right", overflow="fold")
        for m, e in r.by_month:
            n = f"{e.n_emailed}/{e.n_holdout}"
            t.add_row(m, _num(e.emailed, o.unit), _num(e.holdout, o.unit), n, _rel(e))
        p = r.pooled
        t.add_row("study months", _num(p.emailed, o.unit), _num(p.holdout, o.unit),
                  f"{p.n_emailed}/{p.n_holdout}", _rel(p))  # fmt: skip
        for m, d in r.did_by_month:
            t.add_row(f"{m} vs baseline", _change(d.emailed, o.unit), _change(d.holdout, o.unit),
                      f"{d.n_emailed}/{d.n_holdout}", _rel(d))  # fmt: skip
        d = r.did
        t.add_row("change from baseline", _change(d.emailed, o.unit), _change(d.holdout, o.unit),
                  f"{d.n_emailed}/{d.n_holdout}", _rel(d))  # fmt: skip
        console.print(t)
        console.print(f"  {r.sentence}", soft_wrap=False)


@study.command("report")
@click.option(
    "-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_obj
def report(obj: Ctx, fmt: str) -> None:
    """The study's estimates: per month and arm, the arms compared, and the change from each user's
    baseline (difference-in-differences), with 95% bootstrap intervals (docs/study.md)."""
    from cocaq.db.engine import make_engine
    from cocaq.study.analysis import study_report

    engine = make_engine(obj.cfg.database_url)
    with engine.connect() as conn:
        rep = study_report(conn, obj.cfg, datetime.now(UTC))
    if fmt == "json":
        click.echo(json.dumps(rep.as_dict(), indent=1, default=str))
        return
    from rich.console import Console

    print_report(rep, Console(highlight=False))
