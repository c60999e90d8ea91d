"""`cocaq study plan`: how large an effect the configured study can find (cocaq.study.plan), before it
starts: the detectable effect on the primary outcome, and how it changes with the hold-out and months.

Registered on the `study` group of cocaq.cli.study by importing this module (cocaq/cli/app.py does).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from cocaq.cli.study import _require, study
from cocaq.errors import UsageError

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx
    from cocaq.study.plan import Cell, Plan

MAX_WIDTH = 100  # the prose wraps at the terminal's width, at most this


def _cell(c: Cell, chosen: bool) -> str:
    text = "-" if c.mde is None else f"{c.mde:.0%}"
    return f"[{text}]" if chosen else text


def table_lines(plan: Plan) -> list[str]:
    """The detectable effect by hold-out share (rows) and months (columns), the chosen design in
    brackets: about 50 columns for the usual six months."""
    months = sorted({c.months for c in plan.table})
    shares = sorted({c.holdout_share for c in plan.table})
    cells = {(c.holdout_share, c.months): c for c in plan.table}
    label = {s: f"{s:.0%} ({cells[(s, months[0])].holdout_users})" for s in shares}
    lw = max(len("held out"), *(len(x) for x in label.values()))
    lines = [f"{'held out':<{lw}}" + "".join(f"{f'{m} mo':>7}" for m in months)]
    for s in shares:
        row = "".join(
            f"{_cell(cells[(s, m)], (s, m) == (plan.holdout_share, plan.months)):>7}" for m in months
        )
        lines.append(f"{label[s]:<{lw}}{row}")
    return lines


def footer(plan: Plan) -> str:
    from cocaq.study.plan import MAX_EFFECT

    span = f"{plan.history[0]} to {plan.history[-1]}" if len(plan.history) > 1 else plan.history[0]
    se = plan.chosen.se0 if plan.chosen is not None else None
    spread = (
        f"; with no effect, the chosen design's estimate varies by ±{se:.1%} (a standard deviation)"
        if se is not None
        else ""
    )
    dash = f" '-': not found even at {MAX_EFFECT:.0%}." if any(c.mde is None for c in plan.table) else ""
    return (
        f"How: {plan.simulations:,} simulated studies per design, each resampling the site's own "
        f"{plan.users:,} users and their months from {span} ({len(plan.history)} months){spread}.{dash} "
        "It assumes each user's months vary around a steady level: drift makes longer studies gain less "
        "than shown (docs/study.md, Planning)."
    )


def print_plan(plan: Plan, width: int) -> None:
    from cocaq.study.plan import effect_words, headline

    def para(text: str) -> None:
        click.echo(textwrap.fill(text, width=width, break_on_hyphens=False))

    para(headline(plan))
    click.echo()
    para(
        f"The {effect_words(plan)} found 4 times in 5, by users held out and months (in brackets: the "
        "chosen design):"
    )
    for line in table_lines(plan):
        click.echo(line)
    click.echo()
    para(footer(plan))


@study.command("plan")
@click.option("--holdout-share", type=float, default=None, help="the share held out [default: [study]]")
@click.option(
    "--months", type=int, default=None, help="the study's months [default: [study] start to end, or 3]"
)
@click.option(
    "--history", type=int, default=None,
    help="months before the study to learn from [default: max(baseline_months, 6), those with data]",
)  # fmt: skip
@click.option("--simulations", type=int, default=400, show_default=True, help="simulated studies per design")
@click.option(
    "-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_obj
def plan_cmd(
    obj: Ctx, holdout_share: float | None, months: int | None, history: int | None, simulations: int, fmt: str
) -> None:
    """How large an effect the study can find: the smallest cut (or rise) in the primary outcome found
    4 times in 5 (80% power) at the hold-out share and months, simulated on the site's own users and
    months before the study, and how it changes with a larger hold-out or more months (docs/study.md)."""
    from cocaq.study.plan import site_plan

    cfg = obj.cfg
    _require(cfg)
    if holdout_share is not None and not 0.05 <= holdout_share <= 0.5:
        raise UsageError(f"--holdout-share {holdout_share:g}: give a share from 0.05 to 0.5")
    if months is not None and not 1 <= months <= 36:
        raise UsageError(f"--months {months}: give 1 to 36 months")
    if history is not None and not 2 <= history <= 36:
        raise UsageError(f"--history {history}: give 2 to 36 months")
    if not 100 <= simulations <= 100_000:
        raise UsageError(f"--simulations {simulations}: give 100 to 100000")
    engine = obj.engine()
    with engine.connect() as conn:
        plan = site_plan(
            conn, cfg, datetime.now(UTC), holdout_share=holdout_share, months=months, history=history,
            simulations=simulations,
        )  # fmt: skip
    if plan.reason is not None:
        raise UsageError(f"study plan: {plan.reason}")
    if fmt == "json":
        click.echo(json.dumps(plan.as_dict(), indent=2))
        return
    print_plan(plan, min(shutil.get_terminal_size((80, 24)).columns, MAX_WIDTH))
