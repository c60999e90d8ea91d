"""How the advice puts numbers into words: figures to about three digits, durations, shares, energy in kWh
or Wh, counts of jobs and GPUs, job lists, and the `--time` and `--mem` values it proposes.

The suggestions of a window (cocaq.footprint.advice), the notes on one job (cocaq.footprint.job_advice) and
the comparison with a user's own runs (cocaq.footprint.own_runs) all write their sentences with these
helpers, so that a figure reads the same in each; kept apart from the rules so that reading a rule is
reading what it tests and sizes, not how it rounds. Standard library only (login nodes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cocaq.footprint.jobfacts import JobFacts
from cocaq.timeparse import format_slurm_duration

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


def n_gpus(n: int) -> str:
    return "1 GPU" if n == 1 else f"{n} GPUs"


def pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def job_list(jobs: Sequence[JobFacts], n: int = 4) -> str:
    shown = ", ".join(j.job_id + (f" ({shorten(j.name)})" if j.name else "") for j in jobs[:n])
    return shown + (f" and {len(jobs) - n} more" if len(jobs) > n else "")


def shorten(s: str | None, n: int = 24) -> str:
    text = " ".join((s or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def n_jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def were(n: int) -> str:
    return "was" if n == 1 else "were"


def slurm_time(hours: float) -> str:
    """A `--time` value, rounded up to the quarter hour below 2 h, else to the hour."""
    step = 0.25 if hours < 2 else 1.0
    h = max(step, math.ceil(hours / step - 1e-9) * step)
    return format_slurm_duration(h * 3600)


def slurm_mem(mb: float) -> str:
    """A `--mem` value in whole GB (G), rounded up."""
    return f"{max(1, math.ceil(mb / MB_PER_GB - 1e-9))}G"


def energy(kwh: float) -> str:
    """kWh, or Wh below 1 kWh: figures people read without a calculator."""
    return f"{num(kwh)} kWh" if kwh >= 1 else f"{num(kwh * 1000)} Wh"
