"""`cocaq calibrate`: the GPU power learnt from the site's measured jobs (cocaq.accounting.calibrate).

Shows the stored table (W per GPU by model, partition and utilisation bucket, the jobs and GPU-hours
behind each cell, when it was computed) and how each basis of the estimate did on the site's own measured
jobs held out by run (median error, how often its range held the truth, on how many jobs);
`--refresh` learns it again now. `cocaq recompute` applies it
to the jobs' estimates; the scheduler's weekly `calibrate` job does both.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from cocaq.accounting.power_bases import CHOSEN, BasisStats
from cocaq.cli import terminal as render

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from cocaq.cli.app import Ctx

NOTHING = (
    "no GPU power learnt yet: no measured GPU jobs (nodes with the cocaq hooks and collector, or Slurm "
    "energy accounting split by GPU samples); estimates stay TDP x [estimate] gpu_utilisation"
)


@click.command()
@click.option("--refresh", is_flag=True, help="Learn the table again from the measured jobs now.")
@click.option(
    "-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_obj
def calibrate(obj: Ctx, refresh: bool, fmt: str) -> None:
    """What each GPU model drew in the site's measured jobs: the power estimates use for the rest."""
    from cocaq.accounting import calibrate as cal

    cfg = obj.cfg
    engine = obj.engine()
    est = cfg.estimate
    if refresh:
        res = cal.refresh(engine, cfg)
        click.echo(res.line(est.calibrate_min_jobs), err=True)
        if res.cells:
            click.echo("run `cocaq recompute` to apply it to the jobs' estimates", err=True)
    cells = cal.stored(engine)
    bases, user_cells = cal.stored_bases(engine)
    if fmt == "json":
        doc = {
            "calibrate": est.calibrate,
            "min_jobs": est.calibrate_min_jobs,
            "buckets": list(est.calibrate_buckets),
            "cells": [
                dict(c.as_dict(), used=est.calibrate and c.jobs >= est.calibrate_min_jobs) for c in cells
            ],
            "user_cells": user_cells,
            "held_out": [_basis_doc(b) for b in bases],
        }
        if not cells:
            doc["note"] = NOTHING
        click.echo(json.dumps(doc, indent=2))
        return
    if not cells:
        click.echo(NOTHING)
        return
    from cocaq.cli.app import _console

    when = sorted({f"{c.computed_at:%Y-%m-%d %H:%M}" for c in cells})
    title = f"GPU power learnt from measured jobs (W per GPU; computed {', '.join(when)} UTC)"
    # what matters first (priority 0 never dropped): model, partition, utilisation, median W; then the
    # range and whether it is used; the counts last
    cols = [
        ("GPU model", 0), ("partition", 0), ("util %", 0), ("median W", 0), ("10-90% W", 1),
        ("used", 2), ("jobs", 3), ("GPU-h", 4),
    ]  # fmt: skip
    rows = []
    for c in cells:
        used = c.jobs >= est.calibrate_min_jobs
        rows.append(
            [
                render.term(c.gpu_model),
                render.term(c.partition) if c.partition else "(all)",
                "any" if c.bucket == "any" else c.bucket,
                f"{c.w_median:,.0f}",
                f"{c.w_p10:,.0f}-{c.w_p90:,.0f}",
                "yes" if used else f"no (<{est.calibrate_min_jobs} jobs)",
                f"{c.jobs:,}",
                f"{c.gpu_hours:,.0f}",
            ]
        )
    console = _console()
    console.print(
        render.fit_table(
            console,
            title,
            cols,
            rows,
            left=("GPU model", "partition", "util %", "used"),
            complete="--format json",
        )
    )
    if bases:
        console.print(_bases_table(console, bases, est.gpu_utilisation))
        chosen = next((b for b in bases if b.basis == CHOSEN), None)
        rated = next((b for b in bases if b.basis == "rated-util"), None)
        if chosen is not None and chosen.median_err is not None:
            line = (
                f"The estimate as made (each job on the first basis used that has a cell for it): a median "
                f"error of {chosen.median_err:.0%} on {chosen.jobs:,} held-out jobs"
            )
            if rated is not None and rated.median_err:
                line += f", against {rated.median_err:.0%} for rated power x the job's utilisation"
            if chosen.coverage is not None:
                line += f"; its 10-90% range held {chosen.coverage:.0%} of them"
            console.print(line + ".")
    if not est.calibrate:
        console.print("calibration is off ([estimate] calibrate = false): estimates use TDP x utilisation")


def _basis_doc(b: BasisStats) -> dict[str, object]:
    lo, hi = b.factors()
    return {
        "basis": b.basis,
        "used": b.used,
        "jobs": b.jobs,
        "runs": b.runs,
        "median_error": _r(b.median_err),
        "p90_error": _r(b.p90_err),
        "median_error_instead": _r(b.err_instead),
        "coverage": _r(b.coverage),
        "range_factors": [round(lo, 4), round(hi, 4)],
        "widened": b.widened,
        "computed_at": b.computed_at.isoformat(),
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _bases_table(console: Console, bases: list[BasisStats], utilisation: float) -> Table:
    """How each basis did on held-out runs, in the order the estimate tries them."""
    words = {
        "series": "user's jobs, same name",
        "user": "user's jobs",
        "meta": "declared model",
        "gpumem": "GPU memory (gpumem)",
        "shape": "GPUs, CPUs per GPU",
        "table": "GPU model",
        "table-util": "GPU model + utilisation",
        CHOSEN: "the estimate as made",
        "rated-util": "rated x utilisation",
        "rated-config": f"rated x {utilisation:g}",
    }
    title = "How good the estimate is: measured jobs held out by run, estimated as if nothing measured them"
    cols = [
        ("basis", 0), ("used", 0), ("median error", 0), ("range held", 0), ("range", 1), ("p90 error", 2),
        ("jobs", 0), ("runs", 2), ("instead", 3),
    ]  # fmt: skip
    rows = []
    for b in bases:
        lo, hi = b.factors()
        used = "ref." if b.basis.startswith("rated") else ("yes" if b.used else "no")
        if b.basis == CHOSEN:
            used = ""
        elif not b.jobs:
            used = "no data"  # no measured job has the fact, or none a cell to estimate from
        rows.append(
            [
                render.term(words.get(b.basis, b.basis)),
                used,
                _pct(b.median_err),
                _pct(b.coverage),
                (f"x{lo:.2f}-{hi:.2f}" + (" (wide)" if b.widened else "")) if b.jobs else "-",
                _pct(b.p90_err),
                f"{b.jobs:,}",
                f"{b.runs:,}",
                _pct(b.err_instead),
            ]
        )
    return render.fit_table(console, title, cols, rows, left=("basis", "used"), complete="--format json")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"
