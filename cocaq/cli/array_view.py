"""`cocaq job 123` for a job array: what its tasks add up to, then one line per task.

The data is cocaq.footprint.array_job's (from the database or the read API, the same dict); the tables
fit the terminal as `cocaq user`'s do (cocaq.cli.terminal.fit_table), and `-o json` has every field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cocaq.cli.terminal import _kg, _kwh, estimate_text, fit_table, term
from cocaq.timeparse import format_slurm_duration

if TYPE_CHECKING:
    from rich.console import Console


def states_text(states: dict[str, int]) -> str:
    """`3 COMPLETED, 1 FAILED`: how many tasks ended in each state, most first."""
    return ", ".join(f"{n} {s}" for s, n in states.items())


def how_text(measured_kwh: float, energy_kwh: float) -> str:
    """How a task's energy is known: `measured` (all of it, as `cocaq user`'s top jobs say), `estimated`
    (none), or the share measured (a node measured, another estimated)."""
    if energy_kwh > 0 and measured_kwh >= energy_kwh * 0.999:
        return "measured"
    if measured_kwh <= 0 or energy_kwh <= 0:
        return "estimated"
    return f"{measured_kwh / energy_kwh:.0%} measured"


def _measured_text(a: dict[str, Any]) -> str:
    """The array's energy split: "(all estimated)", or "(40% measured: 1.20 kWh; 1.80 kWh, 1.5-2.1
    estimated)"."""
    share = a.get("measured_share")
    est = estimate_text(
        a["energy_estimated_kwh"], a["energy_estimated_low_kwh"], a["energy_estimated_high_kwh"]
    )
    if share is None:
        return ""
    if a["energy_measured_kwh"] <= 0:
        return " (all estimated)" if est.endswith(" estimated") and "-" not in est else f" ({est})"
    if share >= 0.999:
        return " (all measured)"
    return f" ({share:.0%} measured: {_kwh(a['energy_measured_kwh'])}; {est})"


def _pue_text(lo: float, hi: float) -> str:
    return f"PUE {lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"PUE {lo:.2f}-{hi:.2f}"


def column(values: list[float], big: str, small: str) -> tuple[str, list[str]]:
    """A column of figures in one unit and one precision, chosen from its largest value: kWh or kg,
    or Wh or g where all are under one (a short task's energy is not a row of 0.000), three significant
    digits of the largest, never written as 1e-05."""
    import math

    top = max((abs(v) for v in values), default=0.0)
    unit, scale = (big, 1.0) if top >= 1 else (small, 1000.0)
    top *= scale
    places = 0 if top == 0 else min(max(0, 2 - math.floor(math.log10(top))), 6)
    return unit, [f"{v * scale:,.{places}f}" for v in values]


def print_array(a: dict[str, Any], console: Console) -> None:
    """A job array's summary (tasks by state, span, GPU-hours, energy, CO2e) and its tasks' table."""
    from rich.table import Table

    n = a["n_tasks"]
    console.print(
        f"Job array [bold]{term(a['job_id'])}[/] on cluster {term(a['cluster'])}: {term(a['name'] or '')}"
    )
    tab = Table.grid(padding=(0, 2))
    tab.add_column(style="dim", no_wrap=True)
    tab.add_column(overflow="fold")
    tasks = f"{n} {'task' if n == 1 else 'tasks'}"
    if a["asked"] != a["job_id"]:
        tasks += f" of {a['asked']}"
    span = None
    if a["span_s"] is not None:
        span = f"{format_slurm_duration(a['span_s'])} from the first start to the last end"
    elif a["running"]:
        span = f"{a['running']} {'task' if a['running'] == 1 else 'tasks'} still running"
    facts = [
        ("user", a["user_name"]),
        ("lab (account)", a["account"]),
        ("tasks", f"{tasks}: {states_text(a['states'])}"),
        ("submitted", a["submit_time"]),
        ("first start", a["start_time"]),
        ("last end", a["end_time"]),
        ("span", span),
        ("task run time", f"{format_slurm_duration(a['run_time_s'])} in all"),
        ("GPU-hours", f"{a['gpu_hours']:,.2f}"),
        ("energy", _kwh(a["energy_kwh"]) + _measured_text(a)),
        ("with cooling", f"{_kwh(a['energy_kwh_with_pue'])} ({_pue_text(a['pue_min'], a['pue_max'])})"),
        ("CO2e", _kg(a["co2_kg"])),
    ]
    for k, v in facts:
        if v not in (None, ""):
            tab.add_row(k, term(v))
    console.print(tab)
    energy_unit, energy = column([t["energy_kwh"] for t in a["tasks"]], "kWh", "Wh")
    co2_unit, co2 = column([t["co2_kg"] for t in a["tasks"]], "kg CO2e", "g CO2e")
    rows = [
        [
            term(t["job_id"]),
            term(t["state"]),
            format_slurm_duration(t["elapsed_s"]),
            str(t["alloc_gpus"]),
            e,
            c,
            how_text(t["energy_measured_kwh"], t["energy_kwh"]),
        ]
        for t, e, c in zip(a["tasks"], energy, co2, strict=True)
    ]
    cols = [("task", 0), ("state", 1), ("run time", 2), ("GPUs", 3), (energy_unit, 0), (co2_unit, 0),
            ("how", 4)]  # fmt: skip
    console.print(
        fit_table(
            console,
            f"Tasks ({energy_unit} drawn by the hardware)",
            cols,
            rows,
            left=("task", "state", "how"),
            complete="--format json",
        )
    )
    console.print(f"[dim]`cocaq job {term(a['tasks'][0]['job_id'])}` shows one task in full.[/]")
