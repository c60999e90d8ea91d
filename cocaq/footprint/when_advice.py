"""When to run: the one suggestion about timing, from the shifting figures of the user's own jobs that
could have waited (cocaq.accounting.shifting: finished batch jobs in a zone with an hourly series).

It saves CO2, not energy (the same job at a cleaner hour), so it is not one of the advice rules
(cocaq.footprint.rules), which are ranked and filtered by the energy they save: it has its own test, a
share of the user's CO2 in the window and a floor in kg (`[shifting] min_share`, `min_kg`), on what
starting each job at its best hour within its slack would have saved (what `sbatch --begin` can do).
Pausing (the cheapest hours, for jobs that checkpoint) is evidence beside it, never the claim.

Pure functions over JobFacts, no database: `cocaq user`, the read API and the monthly e-mail call the same.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import tzinfo
from typing import TYPE_CHECKING

from cocaq.carbon.begin import touched_hours, zone_name
from cocaq.footprint.advice_words import co2 as co2_words
from cocaq.footprint.advice_words import hours, n_jobs, num, pct, shorten
from cocaq.footprint.rules.base import Advice, Evidence
from cocaq.units import S_PER_HOUR

if TYPE_CHECKING:
    from cocaq.config import Config
    from cocaq.footprint.jobfacts import JobFacts

ID = "when-to-run"


@dataclass(frozen=True)
class Settings:
    slack_h: float
    min_share: float
    min_kg: float
    tz: tzinfo | None = None  # the hours people read: the site's zone


def settings(cfg: Config) -> Settings:
    from cocaq.carbon.begin import site_zone

    s = cfg.shifting
    return Settings(s.slack_s / S_PER_HOUR, s.min_share, s.min_kg, site_zone(cfg.cluster.timezone, cfg.tz()))


def _weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value below which half the weight lies (the plain median where the weights are all 0)."""
    total = sum(weights)
    if total <= 0:
        return statistics.median(values)
    acc = 0.0
    for v, w in sorted(zip(values, weights, strict=True)):
        acc += w
        if acc >= total / 2:
            return v
    return max(values)


def when_to_run(
    jobs: Sequence[JobFacts],
    s: Settings,
    period: str = "in this window",
    total_kg: float | None = None,
) -> Advice | None:
    """The suggestion, or None where the user's jobs that could wait would not have saved enough.
    `total_kg`: the CO2 of all the user's jobs in the window, where `jobs` are not all of them (only those
    with shifting figures need be: cocaq.footprint.advice_jobs)."""
    flex = [j for j in jobs if j.shift_state == "ok" and j.share > 0 and j.start is not None]
    if not flex or s.slack_h <= 0:
        return None
    if total_kg is None:
        total_kg = sum(j.co2_kg * j.share for j in jobs)
    co2 = sum(j.co2_kg * j.share for j in flex)
    saved = sum(j.shift_saved_kg * j.share for j in flex)
    paused = sum(j.shift_pause_saved_kg * j.share for j in flex)
    if saved <= 0 or saved < max(s.min_share * total_kg, s.min_kg):
        return None
    movers = sorted(
        (j for j in flex if j.shift_saved_kg > 0 and j.shift_best_start is not None),
        key=lambda j: (-j.shift_saved_kg * j.share, j.job_id),
    )
    weights = [j.shift_saved_kg * j.share for j in movers]
    delays = [(j.shift_best_start - j.start).total_seconds() / S_PER_HOUR for j in movers]  # type: ignore[operator]
    # what is typical of the jobs that carry the saving, not of the many small ones
    wait = _weighted_median(delays, weights)
    run_h = _weighted_median([j.elapsed_h for j in movers], weights)
    # the hour of the day the best starts fall in most (weighted by what they save), in the site's zone
    by_hour: Counter[int] = Counter()  # (Counter's counts are any numbers: kg here)
    for j in movers:
        hour = j.shift_best_start.astimezone(s.tz).hour  # type: ignore[union-attr]
        by_hour[hour] += j.shift_saved_kg * j.share  # type: ignore[assignment]
    best_hour = by_hour.most_common(1)[0][0]
    e = movers[0]
    e_start, e_best = e.start.astimezone(s.tz), e.shift_best_start.astimezone(s.tz)  # type: ignore[union-attr]
    e_share = e.shift_saved_kg / e.co2_kg if e.co2_kg > 0 else 0.0
    zone = e_start.strftime("%Z")
    best_zone = "" if e_best.strftime("%Z") == zone else f" {e_best:%Z}"
    later_h = max((e_best - e_start).total_seconds() / S_PER_HOUR, 0.0)
    slack = hours(s.slack_h)
    # `--begin=HH:00` is the next HH:00 in local time: on the nights clocks change that hour may be
    # skipped or come twice (cocaq.carbon.begin), and Slurm may then take it an hour off
    touched = touched_hours(s.tz, e_best) if s.tz is not None else {}
    caution = (
        f" On the nights clocks change, {best_hour:02d}:00 {touched[best_hour]} in {zone_name(s.tz)}"  # type: ignore[arg-type]
        ": those nights, take the line `cocaq carbon when` prints."
        if best_hour in touched
        else ""
    )
    body = (
        f"{n_jobs(len(flex))} {period} could have waited (batch jobs, up to {slack} or their time limit, "
        f"whichever is shorter). Started at the hour with the cleanest electricity within that, they would "
        f"have emitted {co2_words(saved)} less: {pct(saved / co2)} of their {co2_words(co2)}, for the same "
        f"work and energy. For example job {e.job_id}"
        + (f" ({shorten(e.name)})" if e.name else "")
        + f", started {e_start:%a %d %b %H:%M} {zone}, would have emitted {pct(e_share)} less starting at "
        f"{e_best:%H:%M}{best_zone}{'' if e_best.date() == e_start.date() else f' on {e_best:%a}'} "
        f"({hours(later_h)} later). Most of the saving was in "
        f"starts around {best_hour:02d}:00 {zone} (sbatch --begin={best_hour:02d}:00 holds a job until the "
        f"next one).{caution} Before you submit a job that can wait, `cocaq carbon when --hours N` gives the "
        "best start in the coming hours and the sbatch line."
    )
    within = _weighted_median([j.shift_slack_h or s.slack_h for j in movers], weights)
    change = [f"cocaq carbon when --hours {max(1, math.ceil(run_h))} --within {max(1, round(within))}h"]
    change.append(f"sbatch --begin={best_hour:02d}:00 job.sh")  # Slurm: the next such time, today or tomorrow
    evidence = [
        Evidence("CO2 of your jobs that could wait", co2, "kg"),
        Evidence("saved at each one's best start", saved, "kg"),
        Evidence("saved if they could pause and resume (checkpoints)", paused, "kg"),
    ]
    evidence.append(Evidence("typical wait to the best start (by CO2 saved)", wait, "h"))
    return Advice(
        id=ID,
        title="Start jobs that can wait when the electricity is cleaner",
        body=body,
        change=tuple(change),
        evidence=tuple(evidence),
        job_ids=tuple(j.job_id for j in movers),
        saving_kwh=None,
        saving_kg=saved,
        upper_bound=False,
        basis=(
            "the zone's hourly carbon intensity over each job's window: the same energy at its best start "
            f"within {slack} (never beyond its time limit), its power taken as flat over its run"
        ),
        test=f"saved >= {pct(s.min_share)} of your CO2 and >= {num(s.min_kg)} kg",
    )
