"""`cocaq job 123` for a job array or a het job: what its parts add up to, then one line per part.

The data is cocaq.footprint.job_parts's (from the database or the read API, the same dict); the tables
fit the terminal as `cocaq user`'s do (cocaq.cli.terminal.fit_table), and `-o json` has every field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cocaq.cli.terminal import _kg, _kwh, estimate_text, fit_table, term
from cocaq.footprint.job_parts import KINDS
from cocaq.timeparse import format_slurm_duration

if TYPE_CHECKING:
    from rich.console import Console


def states_text(states: dict[str, int]) -> str:
    """`3 COMPLETED, 1 FAILED`: how many parts ended in each state, most first."""
    return ", ".join(f"{n} {s}" for s, n in states.items())


def how_text(measured_kwh: float, energy_kwh: float) -> str:
    """How a part's energy is known: `measured` (all of it, as `cocaq user`'s top jobs say), `estimated`
    (none), or the share measured (a node measured, another estimated)."""
    if energy_kwh > 0 and measured_kwh >= energy_kwh * 0.999:
        return "measured"
    if measured_kwh <= 0 or energy_kwh <= 0:
        return "estimated"
    return f"{measured_kwh / energy_kwh:.0%} measured"


def _measured_text(a: dict[str, Any]) -> str:
    """The whole's energy split: "(all estimated)", or "(40% measured: 1.20 kWh; 1.80 kWh, 1.5-2.1
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


# Per kind: the title, and the parts' table: (column, priority: cocaq.cli.terminal.fit_table) and how a
# part fills it. A het job's components differ in partition and CPUs (that is why they are parts) more
# than in run time (they start together), so a narrow terminal keeps those longer.
_TITLE = {"array": "Job array", "het": "Heterogeneous job"}
_COLUMNS: dict[str, list[tuple[str, int]]] = {
    "array": [("task", 0), ("state", 1), ("run time", 2), ("GPUs", 3), ("energy", 0), ("co2", 0), ("how", 4)],
    "het": [("component", 0), ("partition", 1), ("state", 2), ("run time", 4), ("CPUs", 3), ("GPUs", 3),
            ("energy", 0), ("co2", 0), ("how", 5)],
}  # fmt: skip


def _cell(column: str, p: dict[str, Any], energy: str, co2: str) -> str:
    """One part's cell: every kind's table is filled by this one function, so arrays and het jobs agree."""
    if column in ("task", "component"):
        return term(p["job_id"])
    if column == "partition":
        return term(p["partition"] or "")
    if column == "state":
        return term(p["state"])
    if column == "run time":
        return format_slurm_duration(p["elapsed_s"])
    if column in ("CPUs", "GPUs"):
        return str(p[f"alloc_{column[:3].lower()}s"])
    if column == "energy":
        return energy
    if column == "co2":
        return co2
    return how_text(p["energy_measured_kwh"], p["energy_kwh"])


def print_parts(w: dict[str, Any], console: Console) -> None:
    """A job array's or het job's summary (parts by state, span, GPU-hours, energy, CO2e) and its parts'
    table, one line per task or component."""
    from rich.table import Table

    noun = KINDS[w["kind"]][2]
    parts = w[f"{noun}s"]
    n = len(parts)
    console.print(
        f"{_TITLE[w['kind']]} [bold]{term(w['job_id'])}[/] on cluster {term(w['cluster'])}: "
        f"{term(w['name'] or '')}"
    )
    tab = Table.grid(padding=(0, 2))
    tab.add_column(style="dim", no_wrap=True)
    tab.add_column(overflow="fold")
    count = f"{n} {noun if n == 1 else noun + 's'}"
    if w["asked"] != w["job_id"]:
        count += f" of {w['asked']}"
    span = None
    if w["span_s"] is not None:
        span = f"{format_slurm_duration(w['span_s'])} from the first start to the last end"
    elif w["running"]:
        span = f"{w['running']} {noun if w['running'] == 1 else noun + 's'} still running"
    facts = [
        ("user", w["user_name"]),
        ("lab (account)", w["account"]),
        (f"{noun}s", f"{count}: {states_text(w['states'])}"),
        ("submitted", w["submit_time"]),
        ("first start", w["start_time"]),
        ("last end", w["end_time"]),
        ("span", span),
        (f"{noun} run time", f"{format_slurm_duration(w['run_time_s'])} in all"),
        ("GPU-hours", f"{w['gpu_hours']:,.2f}"),
        ("energy", _kwh(w["energy_kwh"]) + _measured_text(w)),
        ("with cooling", f"{_kwh(w['energy_kwh_with_pue'])} ({_pue_text(w['pue_min'], w['pue_max'])})"),
        ("CO2e", _kg(w["co2_kg"])),
    ]
    for k, v in facts:
        if v not in (None, ""):
            tab.add_row(k, term(v))
    console.print(tab)
    energy_unit, energy = column([p["energy_kwh"] for p in parts], "kWh", "Wh")
    co2_unit, co2 = column([p["co2_kg"] for p in parts], "kg CO2e", "g CO2e")
    names = {"energy": energy_unit, "co2": co2_unit}
    cols = [(names.get(c, c), prio) for c, prio in _COLUMNS[w["kind"]]]
    rows = [
        [_cell(c, p, e, g) for c, _ in _COLUMNS[w["kind"]]]
        for p, e, g in zip(parts, energy, co2, strict=True)
    ]
    console.print(
        fit_table(
            console,
            f"{noun.capitalize()}s ({energy_unit} drawn by the hardware)",
            cols,
            rows,
            left=(noun, "partition", "state", "how"),
            complete="--format json",
        )
    )
    console.print(f"[dim]`cocaq job {term(parts[0]['job_id'])}` shows one {noun} in full.[/]")
