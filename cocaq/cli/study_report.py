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


def _rel(e: Estimate, unit: str = "") -> str:
    """The arms' difference: relative where it is read so, else in the unit (a share's in points)."""
    if e.relative:
        return f"{e.rel:+.0%} ({e.rel_lo:+.0%} to {e.rel_hi:+.0%})"
    if e.diff is None:
        return "-"
    if e.diff_lo is None or e.diff_hi is None:
        return _change(e.diff, unit)
    return f"{_change(e.diff, unit)} ({_change(e.diff_lo, unit)} to {_change(e.diff_hi, unit)})"


def summary_lines(rep: StudyReport) -> list[str]:
    """The study's findings in words: the primary outcome's headline, then the secondary outcomes with
    what their number means; the same words as the admin report's section."""
    out: list[str] = []
    head = rep.headline
    if head is None:
        return out
    d = head.did
    p = f"Re-randomisation p = {d.p:.2g}; " if d.p is not None else ""
    out.append(f"Primary outcome ({rep.declared}):")
    out.append(
        f"  {head.sentence} {p}{d.n_emailed} e-mailed and {d.n_holdout} held-out users with a baseline."
    )
    n = len(rep.secondary)
    out.append(f"Secondary outcomes ({n}): {rep.caveat}")
    out += [f"  - {r.sentence}" for r in rep.secondary]
    return out


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
    console.print(f"How the study months are counted: {rep.counting}.")
    for note in rep.notes:
        console.print(f"[yellow]{note}[/]")
    if not rep.outcomes:
        return
    months = ", ".join(rep.months)
    import textwrap

    for line in summary_lines(rep):
        body = line.lstrip(" ")
        lead = line[: len(line) - len(body)]
        if body.startswith("- "):
            lead, body = lead + "- ", body[2:]
        for part in textwrap.wrap(body, width=max(console.width, 40), initial_indent=lead,
                                  subsequent_indent=" " * len(lead)):  # fmt: skip
            console.print(part, markup=False, highlight=False, soft_wrap=True)
    console.print(
        f"Month by month (months with data: {months}). 95% intervals: the change from baseline over the "
        f"study months by {rep.resamples:,} re-draws of the arms within their strata and blocks (a "
        f"randomisation test); the rest from {rep.resamples:,} bootstrap resamples of users."
    )
    for r in rep.outcomes:
        o = r.outcome
        role = "primary" if r.primary else "secondary"
        t = Table(
            title=f"{o.label} ({o.unit}; {role})", title_justify="left", show_edge=False, pad_edge=False
        )
        for col in ("", "e-mailed", "hold-out", "n", "e-mailed vs hold-out"):
            t.add_column(col, justify="left" if not col else "right", overflow="fold")
        for m, e in r.by_month:
            n = f"{e.n_emailed}/{e.n_holdout}"
            t.add_row(m, _num(e.emailed, o.unit), _num(e.holdout, o.unit), n, _rel(e, o.unit))
        p = r.pooled
        t.add_row("study months", _num(p.emailed, o.unit), _num(p.holdout, o.unit),
                  f"{p.n_emailed}/{p.n_holdout}", _rel(p, o.unit))  # fmt: skip
        for m, d in r.did_by_month:
            t.add_row(f"{m} vs baseline", _change(d.emailed, o.unit), _change(d.holdout, o.unit),
                      f"{d.n_emailed}/{d.n_holdout}", _rel(d, o.unit))  # fmt: skip
        d = r.did
        t.add_row("change from baseline", _change(d.emailed, o.unit), _change(d.holdout, o.unit),
                  f"{d.n_emailed}/{d.n_holdout}", _rel(d, o.unit))  # fmt: skip
        console.print(t)


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
