"""`cocaq models`: which models cost what, per model, framework and run, and what precision or batch size
did to the energy per epoch (`cocaq.footprint.by_model` has the definitions).

Output: a rich table per section for people; JSON of `ModelStats.as_dict()` for scripts (every section);
CSV is one table, the runs by default, another with `--section` (`models`, `frameworks`, `comparison`:
one row per group compared). Model names and every other metadata string come from users: the table
goes through `cocaq.cli.terminal.term`, the CSV through `cocaq.cli.terminal.csv_cell` (see
cocaq/cli/terminal.py).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from cocaq import outfile
from cocaq.cli import terminal as render
from cocaq.cli.app import FORMAT, Ctx, _console, _window, cluster_opt, since_opt, until_opt
from cocaq.cli.footprint import _api_or_db
from cocaq.errors import UsageError
from cocaq.footprint.words import NAME_MODEL_TIP, UNNAMED, UNNAMED_WORDS
from cocaq.units import G_PER_KG, WH_PER_KWH

if TYPE_CHECKING:
    from rich.console import Console

    from cocaq.footprint.by_model import Comparison, GroupTotal, ModelStats, Run

SECTIONS = ("runs", "models", "frameworks", "comparison")
JSON_KEYS = ("runs", "by_model", "by_framework", "comparisons")  # the sections' keys in the JSON
TABLE_RUNS = 25  # the table shows the runs with the most energy; JSON and CSV have them all

RUN_COLUMNS = (
    "job_id", "cluster", "user", "account", "state", "end", "model", "framework", "task", "precision",
    "batch_size", "epochs", "tokens", "gpus", "gpu_hours", "energy_kwh", "kwh_per_epoch", "wh_per_1m_tokens",
    "co2_kg", "co2_kg_per_epoch", "co2_g_per_1m_tokens", "co2_embodied_kg",
)  # fmt: skip
TOTAL_COLUMNS = ("jobs", "users", "gpu_hours", "energy_kwh", "co2_kg", "co2_embodied_kg")
GROUP_COLUMNS = (
    "user", "model", "unit", "precision", "batch_size", "runs", "units", "energy_kwh", "co2_kg",
    "kwh_per_unit", "ratio_to_best",
)  # fmt: skip


@click.command()
@since_opt
@until_opt
@click.option("-u", "--user", default=None, help="Only this user's jobs.")
@click.option("-A", "--account", default=None, help="Only this lab's (Slurm account's) jobs.")
@cluster_opt
@click.option("-o", "--format", "fmt", type=FORMAT, default="table", show_default=True)
@click.option(
    "--section",
    type=click.Choice(SECTIONS),
    default=None,
    help="Only this section (CSV holds one table: runs unless this says otherwise).",
)
@click.pass_obj
def models(
    obj: Ctx,
    since: str,
    until: str | None,
    user: str | None,
    account: str | None,
    cluster: str | None,
    fmt: str,
    section: str | None,
) -> None:
    """Energy and CO2 per ML model, framework and run (jobs that ended in the window), and the energy per
    1M tokens or per epoch by precision and batch size for the same model and user."""
    from cocaq.footprint.by_model import ModelStats, model_stats

    if user is not None and account is not None:
        raise UsageError("-u/--user and -A/--account exclude each other")
    w = _window(since, until)

    def from_db() -> dict[str, Any]:
        from cocaq.db.dbapi import wrap
        from cocaq.footprint.lookup import check_names

        with obj.engine().connect() as conn:
            # a name nowhere in the database is a typo (exit 2), as `cocaq user` says, not "no models"
            check_names(wrap(conn), user=user, account=account, cluster=cluster)
            return model_stats(conn, w.since, w.until, user=user, account=account, cluster=cluster).as_dict()

    params = {"since": w.since.isoformat(), "until": w.until.isoformat(), "user": user, "account": account}
    d = _api_or_db(obj, ("models",), {**params, "cluster": cluster}, from_db)
    stats = ModelStats.from_dict(d)
    if fmt == "json":
        if section is not None:  # the other sections' lists left out
            keep = JSON_KEYS[SECTIONS.index(section)]
            d = {k: v for k, v in d.items() if k == keep or k not in JSON_KEYS}
        outfile.stdout(render.to_json(d) + "\n")
    elif fmt == "csv":
        outfile.stdout(models_csv(stats, section or "runs"))
    else:
        print_models(stats, _console(), section)


# --- CSV ---------------------------------------------------------------------------------------------------


def models_csv(stats: ModelStats, section: str = "runs") -> str:
    """One section as one CSV table, every text cell defused (cocaq.cli.terminal.csv_cell)."""
    rows: list[list[Any]] = []
    if section == "runs":
        rows.append(list(RUN_COLUMNS))
        for r in stats.runs:
            d = r.as_dict()
            rows.append([d[c] for c in RUN_COLUMNS])
    elif section in ("models", "frameworks"):
        key = "model" if section == "models" else "framework"
        rows.append([key, *TOTAL_COLUMNS])
        for g in stats.by_model if section == "models" else stats.by_framework:
            d = g.as_dict()
            rows.append([g.key, *(d[c] for c in TOTAL_COLUMNS)])
    else:
        rows.append(list(GROUP_COLUMNS))
        for c in stats.comparisons:
            for group in c.groups:
                d = {"user": c.user, "model": c.model, "unit": c.unit, **group.as_dict()}
                rows.append([d[k] for k in GROUP_COLUMNS])
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    for row in rows:
        out.writerow([render.csv_cell(v) for v in row])
    return buf.getvalue()


# --- the table ---------------------------------------------------------------------------------------------


def num(x: float | None) -> str:
    """About three significant digits, never scientific (per-token figures are small): `-` for unknown."""
    if x is None or not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    return f"{x:,.{max(0, 2 - math.floor(math.log10(a)))}f}"


# Each table fits the terminal as `cocaq user`'s do (cocaq.cli.terminal.fit_table): columns are dropped,
# the least important first (the highest priority; 0 never), and the caption names them; a number is never
# cut or folded. Text columns (names from users) are left-aligned and end in `…` where they must.
TEXT = ("model", "framework", "job", "user", "precision", "batch size")


def _fit(
    console: Console, title: str, cols: list[tuple[str, int]], rows: list[list[str]], section: str
) -> Any:
    more = "--format csv" + ("" if section == "runs" else f" --section {section}")
    return render.fit_table(console, title, cols, rows, left=TEXT, complete=more)


def _totals_table(console: Console, title: str, key: str, groups: Sequence[GroupTotal]) -> Any:
    cols = [(key, 0), ("jobs", 3), ("users", 4), ("GPU-h", 2), ("kWh", 0), ("kg CO2e", 1), ("embodied kg", 5)]
    rows = [
        [
            render.term(g.key),
            f"{g.jobs:,}",
            f"{g.users:,}",
            num(g.gpu_hours),
            num(g.energy_kwh),
            num(g.co2_kg),
            num(g.co2_embodied_kg) if g.co2_embodied_kg else "-",
        ]
        for g in groups
    ]
    return _fit(console, title, cols, rows, "models" if key == "model" else "frameworks")


def _runs_table(console: Console, runs: Sequence[Run]) -> Any:
    cols = [("job", 0), ("user", 3), ("model", 1), ("precision", 5), ("batch", 6), ("epochs", 7),
            ("tokens", 10), ("kWh", 0), ("kWh/epoch", 4), ("Wh/1M tok", 4), ("kg CO2e", 2),
            ("g CO2e/epoch", 8)]  # fmt: skip
    rows = [
        [
            render.term(r.job_id),
            render.term(r.user),
            render.term(r.model),
            render.term(r.precision or "-"),
            "-" if r.batch_size is None else f"{r.batch_size:,}",
            num(r.epochs),
            "-" if r.tokens is None else f"{r.tokens:,}",
            num(r.energy_kwh),
            num(r.kwh_per_epoch),
            num(r.wh_per_1m_tokens),
            num(r.co2_kg),
            num(None if r.co2_kg_per_epoch is None else r.co2_kg_per_epoch * G_PER_KG),
        ]
        for r in runs[:TABLE_RUNS]
    ]
    title = f"Runs, most energy first{f' (top {TABLE_RUNS})' if len(runs) > TABLE_RUNS else ''}"
    return _fit(console, title, cols, rows, "runs")


def _comparison_table(console: Console, c: Comparison) -> Any:
    tokens = c.unit == "1M tokens"
    per = "Wh/1M tok" if tokens else "kWh/epoch"
    cols = [("precision", 0), ("batch size", 0), ("runs", 3), ("M tokens" if tokens else "epochs", 4),
            ("kWh", 2), (per, 0), ("x best", 1)]  # fmt: skip
    title = f"{render.term(c.user)}: {render.term(c.model)}, energy per {c.unit} by precision and batch size"
    rows = [
        [
            render.term(g.precision or "-"),
            "-" if g.batch_size is None else f"{g.batch_size:,}",
            f"{g.runs:,}",
            num(g.units),
            num(g.energy_kwh),
            num(g.kwh_per_unit * WH_PER_KWH if tokens else g.kwh_per_unit),
            "-" if g.ratio_to_best is None else f"{g.ratio_to_best:.2f}",
        ]
        for g in c.groups
    ]
    return _fit(console, title, cols, rows, "comparison")


def print_models(stats: ModelStats, console: Console, section: str | None = None) -> None:
    """The sections as rich tables: by model, by framework, runs, comparisons."""
    scope = []
    if stats.user:
        scope.append(f"user [bold]{render.term(stats.user)}[/]")
    if stats.account:
        scope.append(f"lab [bold]{render.term(stats.account)}[/]")
    if stats.cluster:
        scope.append(f"cluster {render.term(stats.cluster)}")
    console.print(
        f"ML models{' of ' + ', '.join(scope) if scope else ''}: jobs that ended from "
        f"{stats.since:%Y-%m-%d %H:%M} to {stats.until:%Y-%m-%d %H:%M} (UTC)"
    )
    if not stats.runs:
        console.print("No job with model metadata ended in this window.")
        return

    def show(name: str) -> bool:
        return section is None or section == name

    if show("models"):
        console.print(_totals_table(console, "By model", "model", stats.by_model))
        if any(g.key == UNNAMED for g in stats.by_model):  # say what the group is, and how to name them
            console.print(f"[dim]{UNNAMED}: {UNNAMED_WORDS}, by framework. {render.term(NAME_MODEL_TIP)}[/]")
    if show("frameworks"):
        console.print(_totals_table(console, "By framework", "framework", stats.by_framework))
    if show("runs"):
        console.print(_runs_table(console, stats.runs))
        if len(stats.runs) > TABLE_RUNS:
            console.print(
                f"[dim]{len(stats.runs) - TABLE_RUNS:,} more runs: -o csv or -o json lists them all.[/]"
            )
    if show("comparison"):
        if not stats.comparisons:
            console.print(
                "[dim]No comparison: no user ran one model with two precisions or batch sizes that both "
                "recorded epochs or tokens.[/]"
            )
        for c in stats.comparisons:
            console.print(_comparison_table(console, c))
            line = c.sentence(f"{c.user}'s")
            if line:
                console.print(render.term(line))
        if stats.comparisons:
            console.print(
                "[dim]Energy per 1M tokens or per epoch of a group: the energy-weighted mean of its runs'"
                " (runs that count them, per user and model). A setting that needs more epochs or tokens to"
                " converge saves less.[/]"
            )
    console.print(
        "[dim]Energy is IT energy before PUE; CO2e is operational (with PUE), embodied apart. Each run "
        "counts whole in the window it ended in.[/]"
    )
