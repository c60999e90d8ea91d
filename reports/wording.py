"""Numbers and sentences as the reports write them: kWh, CO2, percentages, dates, ranks, trends, the
parts of the energy that did no work, savings, and what every figure rests on (the "Basis" lines).

These are plain functions of plain values, shared by every report kind: the Jinja2 templates get them as
filters and globals (reports.render), the interactive admin page (reports.admin_html) and the tests call
them directly. They hold no template, database or mail logic, so that each kind's rendering, and the
page that draws charts, can use them without importing one another.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from cocaq.accounting.ledger import POSSIBLY_LOST
from cocaq.config import Config
from cocaq.footprint.advice_words import co2, intensity, num, plural
from cocaq.footprint.words import cooling_words, pue_words
from cocaq.units import WH_PER_KWH

if TYPE_CHECKING:
    from cocaq.footprint.by_model import Comparison
    from cocaq.reports.data import Basis, Change, HourWindow, MonthTotals, ZoneWeek
    from cocaq.reports.suggest import Suggestion

# --- numbers as the reports write them ---------------------------------------------------------------


def kwh(x: float | None) -> str:
    """kWh, or Wh below 1 kWh (0.00144 kWh reads as 1.44 Wh)."""
    if x is not None and math.isfinite(x) and 0 < abs(x) < 1:
        return f"{num(x * WH_PER_KWH)} Wh"
    return f"{num(x)} kWh"


def estimate(
    est: float | None, low: float | None = None, high: float | None = None, unit: bool = True
) -> str:
    """The estimated part of an energy with its range: "310 kWh, 240-390 estimated"
    (cocaq.accounting.calibrate's
    10th-90th percentile); "310 kWh estimated" where it has none (rated power). Without `unit`, plain
    kWh numbers ("310, 240-390 estimated"), for a column of kWh."""
    if est is None or not math.isfinite(est):
        return "n/a estimated"
    lo, hi = (est if low is None else low), (est if high is None else high)
    scale = 1000.0 if unit and 0 < abs(est) < 1 else 1.0  # kwh() says Wh below 1 kWh
    text = kwh(est) if unit else num(est)
    a, b = num(lo * scale), num(hi * scale)
    if a == b == num(est * scale):
        return f"{text} estimated"
    return f"{text}, {a}-{b} estimated"


def pct(x: float | None) -> str:
    """A percentage given in percent (0-100)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if 0 < abs(x) < 1:
        return f"{x:.1f}%"
    return f"{x:.0f}%"


def share(x: float | None) -> str:
    """A fraction (0-1) as a percentage ("<0.1%" for a sliver, never a "0.0%" that is not nothing)."""
    if x is not None and 0 < x < 0.001:
        return "<0.1%"
    return pct(None if x is None else x * 100)


def hours(x: float | None) -> str:
    return f"{num(x)} h"


def day(d: date | datetime | None) -> str:
    """3 Mar (dates in the reports are UTC, as the months are)."""
    if d is None:
        return "n/a"
    return f"{d.day} {d:%b}"


def when(t: datetime | None) -> str:
    """3 Mar 2025 14:05 UTC."""
    if t is None:
        return "n/a"
    return f"{t.day} {t:%b %Y %H:%M} UTC"


CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
SPACES = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def short(s: object, n: int = 40) -> str:
    """One line of at most n characters (names and comments come from users: any length, any bytes)."""
    text = SPACES.sub(" ", "" if s is None else str(s)).strip()
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


@dataclass(frozen=True)
class TrendText:
    text: str  # "up 12% on February", "" when there is nothing to compare
    tone: str  # good, bad, neutral (theme styles of the same names)


# Changes smaller than these are "about the same": a 1-point move of a 12% utilisation, or 3% more
# energy per day, is noise in a month of jobs, and colouring it good or bad would mislead.
SAME_POINTS = 2.0  # utilisation, percentage points
SAME_PCT = 5.0  # energy, CO2, GPU-hours: relative change in percent


def trend(c: Change, kind: str, previous: str, unit: str = "") -> TrendText:
    """A change against the previous month, per day of data (reports.data.Trend), in words. kind:
    "less-is-better" (energy, CO2), "more-is-better" (utilisation, in percentage points) or "neutral"
    (GPU-hours). The tone says whether the change is good (green), bad (red) or neither."""
    if c.current is None or c.previous is None:
        return TrendText("", "neutral")
    if kind == "more-is-better":  # a utilisation: the change in points
        if c.delta is None or abs(c.delta) < SAME_POINTS:
            return TrendText(f"about the same as {previous}", "neutral")
        word = "up" if c.delta > 0 else "down"
        return TrendText(f"{word} {abs(c.delta):.0f} points on {previous}", "good" if c.delta > 0 else "bad")
    if c.previous == 0:
        return TrendText(f"none in {previous}" if c.current else "", "neutral")
    if c.pct is None or abs(c.pct) < SAME_PCT:
        return TrendText(f"about the same per day as {previous}", "neutral")
    word = "up" if c.pct > 0 else "down"
    tone = "neutral" if kind == "neutral" else ("bad" if c.pct > 0 else "good")
    return TrendText(f"{word} {pct(abs(c.pct))} per day on {previous}", tone)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def rank_text(rank: int | None, of: int, most: str, least: str) -> str:
    """How people say a rank among `of`: "the most energy of the 10", "the 3rd most energy of the 10",
    "the least energy of the 10". `most` starts "the most" or "the highest"; "" when there is no rank."""
    if rank is None or of < 2:
        return ""
    if rank == 1:
        return f"{most} of the {of}"
    if rank == of:
        return f"{least} of the {of}"
    head, _, rest = most.partition(" ")  # "the", "most energy"
    return f"{head} {ordinal(rank)} {rest} of the {of}"


@dataclass(frozen=True)
class WastePart:
    """One of the ledger's disjoint parts of energy that did no work (cocaq.accounting.ledger), as a report
    says it."""

    key: str  # idle, failed, oom, timeout, cancelled
    label: str
    kwh: float
    co2_kg: float
    share: float | None  # of all the energy
    jobs: int | None  # jobs that ended so (None for idle GPUs)
    detail: str  # what it is, in a few words


def possibly_lost(t: Any) -> WastePart | None:
    """The time-limit part of a month's energy (MonthTotals, WasteBreakdown): possibly lost, never in the
    energy that did no work (a job may have saved checkpoints; interactive sessions count none)."""
    kwh, jobs = float(t.timeout_kwh), int(t.jobs_timeout)
    if kwh <= 0 and jobs <= 0:
        return None
    e = float(t.energy_kwh)
    label, _, note = POSSIBLY_LOST.partition(" (")
    co2 = float(getattr(t, "timeout_co2_kg", 0.0))
    return WastePart("timeout", label.capitalize(), kwh, co2, kwh / e if e > 0 else None, jobs, "(" + note)


def waste_parts(t: MonthTotals) -> list[WastePart]:
    """The parts of a month's energy that did no work, largest first; they never add up to more than the
    energy (each job's idle GPU energy counts once, the rest of a job that ended badly under its outcome).
    The time-limit part is apart (`possibly_lost`)."""
    e = t.energy_kwh
    rows = [
        WastePart("idle", "Idle GPUs", t.idle_gpu_kwh, t.idle_co2_kg, None, None,
                  f"{num(t.idle_gpu_hours)} GPU-hours allocated but unused"),
        WastePart("failed", "Failed jobs", t.failed_kwh, t.failed_co2_kg, None, t.jobs_failed,
                  "that ended with an error"),
        WastePart("oom", "Out of memory", t.oom_kwh, t.oom_co2_kg, None, t.jobs_oom,
                  "killed for running out of memory"),
        WastePart("cancelled", "Cancelled", t.cancelled_kwh, t.cancelled_co2_kg, None, t.jobs_cancelled,
                  "cancelled before the end"),
    ]  # fmt: skip
    out = [
        WastePart(r.key, r.label, r.kwh, r.co2_kg, r.kwh / e if e > 0 else None, r.jobs, r.detail)
        for r in rows
        if r.kwh > 0 or (r.jobs or 0) > 0
    ]
    out.sort(key=lambda r: -r.kwh)
    return out


def peer_text(p: Any, whose: str = "You") -> str:
    """Where a user stands among the month's users, as people say it (reports.data.PeerStanding)."""
    if p.users < 2 or p.energy_rank is None:
        return ""
    where = ", ".join(p.clusters)
    energy = rank_text(p.energy_rank, p.users, "the most energy", "the least energy")
    out = f"{whose} used {energy} people who ran jobs on {where} this month."
    if p.gpu_util_rank is not None and p.gpu_users >= 2:
        util = rank_text(
            p.gpu_util_rank, p.gpu_users, "the highest GPU utilisation", "the lowest GPU utilisation"
        )
        out += f" {'Your' if whose == 'You' else whose + chr(39) + 's'} GPU jobs had {util} GPU users."
    return out


def opt_out_text(cfg: Config) -> str:
    """The sentence every report ends with: how to get no more of them (the List-Unsubscribe header says the
    same to mail clients)."""
    from cocaq.reports.message import opt_out_address

    to = opt_out_address(cfg.mail, cfg.reports.contact)
    return f'Don\'t want these e-mails? Reply with "unsubscribe" (or write to {to}) and you will get no more.'


def job_waste(f: Any, interactive: bool = False) -> Any:
    """A job's disjoint parts that did no work (cocaq.accounting.ledger.waste of a
    cocaq.footprint.jobfacts.JobFacts), in kWh; `interactive`: it is an interactive session
    (reports.data.JobReport.interactive), whose time limit is no loss."""
    from cocaq.accounting.ledger import waste

    return waste(f.state, f.energy_kwh, f.idle_kwh, interactive)


def saving_word(a: Any) -> str:
    """ "Up to" for an upper bound, else "About" (a suggestion's or a site lever's saving)."""
    return "Up to" if a.upper_bound else "About"


def saving_text(a: Suggestion, brief: bool = False) -> str:
    """`about 75 kWh (39 kg CO2e)` or `up to 35 kWh (18 kg CO2e)`, "" without a saving; `brief` leaves the
    CO2 out, for text already in parentheses."""
    if a.saving_kwh is None:
        return ""
    kg = f" ({co2(a.saving_kg)})" if a.saving_kg and not brief else ""
    return f"{'up to' if a.upper_bound else 'about'} {kwh(a.saving_kwh)}{kg}"


def car_km(co2_kg: float) -> float:
    """Kilometres in an average petrol car with the same CO2 (US EPA, as cocaq.footprint.totals)."""
    from cocaq.footprint.totals import equivalents

    return equivalents(co2_kg)["car_km"]


def evidence(value: float, unit: str) -> str:
    if unit == "%":
        return pct(value)
    if unit in ("jobs", "job"):
        return plural(value, "job")
    if unit == "kWh":  # as the suggestion's sentence says it: 110 Wh, not 0.11 kWh
        return kwh(value)
    return f"{num(value)} {unit}".strip()


def model_tip(comparisons: Sequence[Comparison]) -> str | None:
    """The user e-mail's one sentence about precision or batch size (`Your llama-3-8b runs in bf16 used
    0.42 kWh per epoch, 38% less than in fp32.`): the comparison with the largest possible saving that
    has something to say (cocaq.footprint.by_model.Comparison.sentence), None when none has. A plain string:
    the
    HTML template escapes the model name in it."""
    for c in comparisons:
        line = c.sentence("Your", kwh=kwh, name=lambda s: short(s, 40))
        if line:
            return line
    return None


# --- what the figures rest on ------------------------------------------------------------------------


def _pue(b: Basis) -> str:
    return pue_words(b.pue_min, b.pue_max)


def cooling(b: Basis, capital: bool = False) -> str:
    """The label of the energy with PUE, the jobs' PUE in it: `with cooling (PUE 1.20-1.50)`."""
    return cooling_words(b.pue_min, b.pue_max, capital=capital)


def zone_name(zone: str | None) -> str:
    return zone or "unknown zone"


def intensity_lines(b: Basis) -> list[str]:
    """Each carbon basis: `DEU 381 g CO2e/kWh (codecarbon ...; annual-fallback): 62% of the energy`."""
    out = []
    for c in b.carbon:
        g = intensity(c.g_per_kwh)
        src = c.source or "source not recorded"
        if c.flag:
            src += f"; {c.flag}"
        out.append(f"{zone_name(c.zone)} {g} ({src}): {share(c.energy_share)} of the energy")
    return out


def basis_short(b: Basis) -> str:
    """One line under the headline figures: measured share, zone(s) and intensity, PUE."""
    parts = []
    if b.measured_share is not None:
        parts.append(f"{share(b.measured_share)} measured, {share(1 - b.measured_share)} estimated")
    zones = [c for c in b.carbon if c.energy_share >= 0.05] or list(b.carbon[:1])
    seen: dict[str, list[float]] = {}
    for c in zones:
        acc = seen.setdefault(zone_name(c.zone), [0.0, 0.0])
        if c.g_per_kwh is not None:
            acc[0] += c.g_per_kwh * c.energy_kwh
            acc[1] += c.energy_kwh
    for z, (gx, e) in seen.items():
        parts.append(f"{z} {intensity(gx / e)}" if e > 0 else z)
    parts.append(_pue(b))
    if not b.complete:
        parts.append("month not complete yet")
    return "Basis: " + " · ".join(parts)


def basis_lines(b: Basis, t: MonthTotals | None = None) -> list[str]:
    """What every figure of a report rests on, in sentences (the `How these figures were made` block)."""
    out = []
    if b.measured_share is not None:
        meas = t.measured_kwh if t is not None else None
        est = t.estimated_kwh if t is not None else None
        extra = (
            f" ({kwh(meas)} measured, {estimate(est, t.estimated_low_kwh, t.estimated_high_kwh)})"
            if t is not None and meas is not None and est is not None
            else ""
        )
        how = " (GPU energy counters and power samples, CPU/DRAM RAPL, Slurm node energy)"
        ranged = t is not None and t.estimated_high_kwh - t.estimated_low_kwh > 1e-9
        basis = (
            "the time allocated and what the site's measured jobs drew on the same GPU model (the rest from "
            "the hardware's rated power, TDP)"
            if ranged
            else "the hardware's rated power (TDP) and the time allocated"
        )
        # the figure with PUE, and which peer tool's "energy used" it compares with (issue 31)
        with_pue = (
            f"; {cooling(b)} it was {kwh(t.energy_kwh_with_pue)}, the figure to compare with Green "
            "Algorithms (and with codecarbon where its pue is set: at its default, 1.0, codecarbon's energy "
            "is what the hardware drew)"
            if t is not None
            else ""
        )
        out.append(
            f"Energy: {share(b.measured_share)} measured{how if b.measured_share > 0 else ''}, "
            f"{share(1 - b.measured_share)} estimated from {basis}{extra}. Energy is IT energy, before PUE: "
            f"what the hardware drew{with_pue}."
        )
    else:
        out.append("Energy: none recorded in this period.")
    lines = intensity_lines(b)
    if lines:
        out.append("Carbon intensity used (energy-weighted over each job's run): " + "; ".join(lines) + ".")
    out.append(
        f"CO2 = energy x PUE x carbon intensity; {_pue(b)} (data centre overhead). Operational CO2 only: "
        "embodied (manufacturing) emissions are shown apart."
    )
    out.append(
        f"A GPU counts as idle while allocated under {pct(b.idle_threshold_pct)} utilisation (from its "
        "samples; for a job cocaq's collector did not sample, from Slurm's gres/gpuutil, its mean over the "
        "run, where the site records it); jobs with neither have no utilisation figure."
    )
    if b.rollups_through is not None:
        out.append(
            f"Data through {when(b.rollups_through)}"
            + ("." if b.complete else ": the month is not complete yet, figures will still grow.")
        )
    else:
        out.append("The aggregator has not run yet: run `cocaq aggregate` before rendering reports.")
    out.append("Days and months are UTC. Everyday equivalents: US EPA Greenhouse Gas Equivalencies.")
    return out


def hour_window(w: HourWindow) -> str:
    """`11:00-15:00 UTC`."""
    return f"{w.start:02d}:00-{w.end:02d}:00 UTC"


def week_text(z: ZoneWeek) -> str:
    """A zone's month by hour in one sentence: `cheapest 11:00-15:00 UTC, 180 g CO2e/kWh; dearest
    19:00-23:00 UTC, 320 g CO2e/kWh; mean 250 g CO2e/kWh; weekends 8% below weekdays (series over 720 of
    744 hours)`."""
    parts = []
    if (
        z.cheapest is not None
        and z.dearest is not None
        and z.dearest.g_per_kwh <= z.cheapest.g_per_kwh * (1 + SAME_PCT / 100)
    ):
        parts.append(f"no hours of the day much cleaner than others (within {SAME_PCT:.0f}%)")
    elif z.cheapest is not None and z.dearest is not None:
        parts.append(f"cheapest {hour_window(z.cheapest)}, {intensity(z.cheapest.g_per_kwh)}")
        parts.append(f"dearest {hour_window(z.dearest)}, {intensity(z.dearest.g_per_kwh)}")
    else:
        parts.append("too few hours of series to name the cheapest and dearest hours of the day")
    parts.append(f"mean {intensity(z.g_per_kwh)}")
    wd, we = z.weekdays_g_per_kwh, z.weekends_g_per_kwh
    if wd and we is not None:
        d = (we / wd - 1) * 100
        if abs(d) < SAME_PCT:
            parts.append("weekends about the same as weekdays")
        else:
            parts.append(f"weekends {abs(d):.0f}% {'below' if d < 0 else 'above'} weekdays")
    return "; ".join(parts) + f" (series over {z.hours} of {z.month_hours} hours)"


# --- comparisons and lengths of time --------------------------------------------------------------------


def before_after_tone(before: float, after: float, better: str) -> str:
    """good, bad or neutral for a before/after pair in percent: `better` "less" (idle share) or "more"
    (utilisation); changes under SAME_POINTS points are neutral."""
    d = after - before
    if abs(d) < SAME_POINTS:
        return "neutral"
    return "good" if (d < 0) == (better == "less") else "bad"


def duration(seconds: float | None) -> str:
    """`45 min`, `3 h`, `2.5 h`, `3 days`: a length of time as the alerts say it."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    m = seconds / 60
    if m < 100:
        return f"{m:.0f} min"
    h = m / 60
    if h < 48:
        return f"{h:.0f} h" if h >= 10 or abs(h - round(h)) < 0.05 else f"{h:.1f} h"
    return f"{num(h / 24)} days"
