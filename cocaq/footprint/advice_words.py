"""How the advice puts numbers into words: figures to about three digits, durations, shares, energy in kWh
or Wh, counts of jobs and GPUs, job lists, and the `--time` and `--mem` values it proposes.

The advice rules (cocaq.footprint.rules: the suggestions of a window and the notes on one job), when to
run (cocaq.footprint.when_advice) and the comparison with a user's own runs (cocaq.footprint.own_runs) all
write their sentences with these
helpers, so that a figure reads the same in each; kept apart from the rules so that reading a rule is
reading what it tests and sizes, not how it rounds. Standard library only (login nodes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from cocaq.footprint.jobfacts import JobFacts
from cocaq.timeparse import format_slurm_duration
from cocaq.units import G_PER_KG, KG_PER_TONNE, S_PER_HOUR, WH_PER_KWH

MB_PER_GB = 1024.0


def num(x: float | None) -> str:
    """About three significant digits, thousands separated, never scientific: 1,234 · 56.7 · 3.14 ·
    0.0123 · 0; "n/a" for nothing or not a number. The advice, the terminal and the e-mails all say
    numbers this way."""
    if x is None or not math.isfinite(x):
        return "n/a"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        s = f"{x:.1f}"
    elif a >= 1:
        s = f"{x:.2f}"
    elif a == 0:
        return "0"
    else:
        s = f"{x:.{max(2, 2 - math.floor(math.log10(a)))}f}"
    s = s.rstrip("0").rstrip(".") if "." in s else s
    return "0" if s in ("-0", "") else s


def hours(h: float) -> str:
    """A duration as people say it: `4 min`, `13.9 h`, `3 days`."""
    if h < 1:
        return f"{max(1, round(h * 60))} min"
    if h < 72:
        return f"{num(h)} h"
    return f"{num(h / 24)} days"


def duration_unit(h: float) -> tuple[float, str]:
    """A duration as a value and the unit `hours` would say it in (min, h, days), for an Evidence: "4 min",
    never "0.0733 h"."""
    if h < 1:
        return float(max(1, round(h * 60))), "min"
    if h < 72:
        return h, "h"
    return h / 24, "days"


def n_gpus(n: int) -> str:
    return "1 GPU" if n == 1 else f"{num(n)} GPUs"


def pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def job_list(jobs: Sequence[JobFacts], n: int = 4) -> str:
    shown = ", ".join(j.job_id + (f" ({shorten(j.name)})" if j.name else "") for j in jobs[:n])
    return shown + (f" and {len(jobs) - n} more" if len(jobs) > n else "")


def shorten(s: str | None, n: int = 24) -> str:
    text = " ".join((s or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def n_jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{num(n)} jobs"


def plural(n: float, word: str, words: str | None = None) -> str:
    """`3 jobs`, `1 job`, `1,397 cores`: a count with its thousands separator and the word it counts,
    singular for 1."""
    return f"{num(n)} {word if n == 1 else (words or word + 's')}"


def were(n: int) -> str:
    return "was" if n == 1 else "were"


def limit_hours(hours: float) -> float:
    """Hours rounded up as a proposed `--time` is: to the quarter hour below 2 h, else to the hour."""
    step = 0.25 if hours < 2 else 1.0
    return max(step, math.ceil(hours / step - 1e-9) * step)


def slurm_time(hours: float) -> str:
    """A `--time` value: `limit_hours` in Slurm's [D-]HH:MM:SS."""
    return format_slurm_duration(limit_hours(hours) * S_PER_HOUR)


def slurm_mem(mb: float) -> str:
    """A `--mem` value in whole GB (G), rounded up."""
    return f"{max(1, math.ceil(mb / MB_PER_GB - 1e-9))}G"


def energy(kwh: float) -> str:
    """kWh, or Wh below 1 kWh: figures people read without a calculator."""
    return f"{num(kwh)} kWh" if kwh >= 1 else f"{num(kwh * WH_PER_KWH)} Wh"


def co2_amount(kg: float | None) -> str:
    """A CO2e mass in the unit that reads best, without the word CO2e (for a cell under a "CO2e" heading,
    or a line labelled CO2e): `462 g`, `3.03 kg`, `1.2 t`. One rule for every surface, so that the same
    amount is the same figure and unit in a table, a sentence and the terminal (issue 32)."""
    if kg is None or not math.isfinite(kg):
        return "n/a"
    a = abs(kg)
    if a >= KG_PER_TONNE:
        return f"{num(kg / KG_PER_TONNE)} t"
    if a >= 1 or a == 0:
        return f"{num(kg)} kg"
    return f"{num(kg * G_PER_KG)} g"


def co2(kg: float | None) -> str:
    """A CO2e mass with its unit and the word: `462 g CO2e`, `3.03 kg CO2e`."""
    text = co2_amount(kg)
    return text if text == "n/a" else f"{text} CO2e"


INTENSITY_UNIT = "g CO2e/kWh"  # the carbon intensity's one spelling, on every surface


def intensity(g_per_kwh: float | None) -> str:
    """A carbon intensity: `150 g CO2e/kWh`."""
    return "intensity n/a" if g_per_kwh is None else f"{num(g_per_kwh)} {INTENSITY_UNIT}"


# Words that keep their capital inside a sentence: names, and the acronyms a label may start with.
_KEEP_CAPITAL = re.compile(r"[A-Z][A-Z0-9]|Slurm\b|PyTorch\b|Jupyter\b|McDonald\b")


def lower_first(label: str) -> str:
    """A label or title that starts a line ("Train mistral-7b in bf16", "Batch jobs lost at their time
    limit") as it reads spliced into a sentence ("the one change worth making: train mistral-7b ...");
    "GPUs near full power" and "Slurm ..." keep their capital."""
    if not label or not label[0].isupper() or _KEEP_CAPITAL.match(label):
        return label
    return label[0].lower() + label[1:]


_SECOND = {"your": "their", "you": "they", "yours": "theirs", "yourself": "themselves"}


def of_member(title: str) -> str:
    """A suggestion's title, written to the user who ran the jobs, as a lab head reads it about one of
    their lab's members ("dave could release GPUs their notebooks are not using"): spliced after "could",
    second person made third."""
    return re.sub(r"\b(?:your|you|yours|yourself)\b", lambda m: _SECOND[m.group(0)], lower_first(title))
