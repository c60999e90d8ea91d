"""A footprint's totals as labelled rows of text: what `cocaq user` and `cocaq lab` print as their
table, and what the web app shows, from one function, so the two surfaces cannot word or round a figure
differently. Plain text (no markup): each surface styles it its own way.
"""

from __future__ import annotations

from cocaq.accounting.ledger import POSSIBLY_LOST
from cocaq.footprint.advice_words import co2_amount, num
from cocaq.footprint.totals import Totals, equivalents
from cocaq.footprint.words import DRAWN_WORDS, cooling_words
from cocaq.units import WH_PER_KWH

Row = tuple[str, str]  # (label, value); a label indented by two spaces is a part of the row above

OUTCOME_WORDS = (
    ("jobs_failed", "failed"),
    ("jobs_oom", "out of memory"),
    ("jobs_timeout", "timed out"),
    ("jobs_cancelled", "cancelled"),
)
# The ledger's disjoint parts of energy that did no work (cocaq.accounting.ledger), as the CLI names them;
# the time-limit part is apart (possibly lost: POSSIBLY_LOST_LABEL), never in "did no work".
WASTE_ROWS = (
    ("idle_gpu_energy_kwh", "idle GPUs"),
    ("failed_energy_kwh", "failed jobs"),
    ("oom_energy_kwh", "out of memory"),
    ("cancelled_energy_kwh", "cancelled"),
)
# "possibly lost (hit its time limit: lost unless it saved a checkpoint)", as label and its note
POSSIBLY_LOST_LABEL, _, _rest = POSSIBLY_LOST.partition(" (")
POSSIBLY_LOST_NOTE = "(" + _rest


def kwh_text(v: float) -> str:
    """kWh as people read them, as the e-mails write them: 1,044 kWh, 85.7 kWh, 3.94 kWh, 512 Wh (never a
    cut, a 1e-5 or a 0.00)."""
    a = abs(v)
    return f"{kwh_number(v, v)} {'kWh' if a >= 1 or a == 0 else 'Wh'}"


def kwh_number(v: float, like: float) -> str:
    """v in the unit kwh_text(like) uses, without the unit, through num (about three significant digits)."""
    a = abs(like)
    return num(v) if a >= 1 or a == 0 else num(v * WH_PER_KWH)


def estimate_text(kwh: float, low: float | None, high: float | None) -> str:
    """The estimated part of an energy with its range: "310 kWh, 240-390 estimated" (the 10th-90th
    percentile of what the site's measured jobs drew, cocaq.accounting.calibrate); "310 kWh estimated" where
    the estimate has no range (rated power, or nothing estimated)."""
    lo = kwh if low is None else low
    hi = kwh if high is None else high
    a, b = kwh_number(lo, kwh), kwh_number(hi, kwh)
    if a == b == kwh_number(kwh, kwh):
        return f"{kwh_text(kwh)} estimated"
    return f"{kwh_text(kwh)}, {a}-{b} estimated"


def co2_text(v: float) -> str:
    """CO2e as every surface writes it (cocaq.footprint.advice_words.co2_amount): 462 g, 29.4 kg."""
    return co2_amount(v)


def share_text(part: float, whole: float) -> str:
    return f" ({part / whole:.0%})" if whole > 0 else ""


def _jobs(n: int) -> str:
    return "job" if n == 1 else "jobs"


def totals_rows(t: Totals) -> list[Row]:
    """The window's totals, one labelled row each (a row only where it has something to say)."""
    rows: list[Row] = []
    outcomes = [f"{getattr(t, k):,} {what}" for k, what in OUTCOME_WORDS if getattr(t, k)]
    rows.append(("jobs", f"{t.jobs:,}" + (f" ({', '.join(outcomes)})" if outcomes else "")))
    rows.append(("GPU-hours", num(t.gpu_hours)))
    rows.append(("CPU-hours", num(t.cpu_hours)))
    rows += energy_rows(t)
    rows += waste_rows(t)
    if t.gpu_util_pct is not None:
        slurm = (
            f"; {t.jobs_gpu_slurm:,} {_jobs(t.jobs_gpu_slurm)}' by Slurm gres/gpuutil"
            if t.jobs_gpu_slurm
            else ""
        )
        rows.append(("GPU utilisation", f"{t.gpu_util_pct:.0f}% (energy-weighted{slurm})"))
    if t.jobs_gpus_unknown:
        rows.append(
            (
                "GPUs unknown",
                f"{t.jobs_gpus_unknown:,} {_jobs(t.jobs_gpus_unknown)} on GPU partitions with no GPU in "
                "Slurm's accounting: their GPUs are in none of these figures (`cocaq job` says why)",
            )
        )
    return rows + carbon_rows(t)


def energy_rows(t: Totals) -> list[Row]:
    """The energy drawn, by component and by method, with cooling, and its CO2e."""
    measured = "" if t.measured_energy_fraction is None else f" ({t.measured_energy_fraction:.0%} measured)"
    rows = [(f"energy {DRAWN_WORDS}", kwh_text(t.energy_kwh) + measured)]
    for name, v in (
        ("GPUs", t.energy_gpu_kwh),
        ("CPUs", t.energy_cpu_kwh),
        ("memory", t.energy_dram_kwh),
        ("rest of node", t.energy_other_kwh),
    ):
        if v:
            rows.append((f"  {name}", kwh_text(v) + share_text(v, t.energy_kwh)))
    estimated = estimate_text(t.energy_estimated_kwh, t.energy_estimated_low_kwh, t.energy_estimated_high_kwh)
    rows.append(("  measured / estimated", f"{kwh_text(t.energy_measured_kwh)} measured / {estimated}"))
    rows.append((cooling_words(t.pue_min, t.pue_max), kwh_text(t.energy_kwh_with_pue)))
    rows.append(("CO2e", co2_text(t.co2_kg)))
    return rows


def waste_rows(t: Totals) -> list[Row]:
    """The energy that did no work, in the ledger's disjoint parts, and apart from it what the jobs
    that hit their time limit possibly lost."""
    rows: list[Row] = []
    if t.wasted_energy_kwh > 0:
        rows.append(
            ("did no work", kwh_text(t.wasted_energy_kwh) + share_text(t.wasted_energy_kwh, t.energy_kwh))
        )
        for k, name in WASTE_ROWS:
            v = getattr(t, k)
            if v:
                extra = f", {num(t.idle_gpu_hours)} GPU-hours" if k == "idle_gpu_energy_kwh" else ""
                rows.append((f"  {name}", kwh_text(v) + extra))
    if t.timeout_energy_kwh > 0:
        rows.append((POSSIBLY_LOST_LABEL, f"{kwh_text(t.timeout_energy_kwh)} {POSSIBLY_LOST_NOTE}"))
    return rows


def carbon_rows(t: Totals) -> list[Row]:
    """The CO2e in kilometres by car, the hardware's embodied CO2e, and what waiting would have saved."""
    eq = equivalents(t.co2_kg)
    rows = [("like driving", f"{eq['car_km']:,.0f} km by car")]
    if t.co2_embodied_kg:
        rows.append(
            ("embodied CO2e", f"{co2_text(t.co2_embodied_kg)} (making the hardware; not in CO2e above)")
        )
    if t.shift_co2_kg > 0:  # when to run (cocaq.accounting.shifting)
        rows.append(
            (
                "could wait",
                f"{co2_text(t.shift_co2_kg)} of the CO2e, from jobs that could have waited: "
                f"{co2_text(t.shift_saved_kg)} less{share_text(t.shift_saved_kg, t.shift_co2_kg)} at each "
                f"one's best start, {co2_text(t.shift_pause_saved_kg)} "
                f"less{share_text(t.shift_pause_saved_kg, t.shift_co2_kg)} pausing",
            )
        )
    return rows
