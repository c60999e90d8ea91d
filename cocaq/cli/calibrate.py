"""`cocaq calibrate`: the GPU power learnt from the site's measured jobs (cocaq.accounting.calibrate).

Shows the stored table (W per GPU by model, partition and utilisation bucket, the jobs and GPU-hours
behind each cell, when it was computed); `--refresh` learns it again now. `cocaq recompute` applies it
to the jobs' estimates; the scheduler's weekly `calibrate` job does both.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from cocaq.cli import terminal as render

if TYPE_CHECKING:
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
    if fmt == "json":
        doc = {
            "calibrate": est.calibrate,
            "min_jobs": est.calibrate_min_jobs,
            "buckets": list(est.calibrate_buckets),
            "cells": [
                dict(c.as_dict(), used=est.calibrate and c.jobs >= est.calibrate_min_jobs) for c in cells
            ],
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
    if not est.calibrate:
        console.print("calibration is off ([estimate] calibrate = false): estimates use TDP x utilisation")
