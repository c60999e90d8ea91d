"""`cocaq carbon when`: the best start for a job of L hours in the coming hours, from the imported series.

Each coming hour's intensity is the imported series' own value where it has one (a forecast imported
with `cocaq carbon import`, or measured values when planning a past day with --at), else a typical
day: the mean of the same UTC hour on the days before it, over the last `weeks` weeks of the series
(an hour with none at all gets the zone's annual figure). So a window that runs past the end of the
series keeps the hours the series covers and takes only the rest from the typical day, and the plan
says which hours came from which (`Plan.spans`). Then cocaq.carbon.shifting's exact model: the best
contiguous start within the window, the next best starts at least an hour from it, and what pausing
would reach. The answer names the basis it used, so a user can tell a forecast from a habit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cocaq.carbon.series import from_epoch, kind_of, to_epoch, zone_key
from cocaq.carbon.shifting import HOUR, Series, Shift
from cocaq.errors import InputError

if TYPE_CHECKING:
    from sqlalchemy import Connection


SERIES = "series"  # the imported series' own value for the hour
TYPICAL = "typical"  # the typical day's
ANNUAL = "annual"  # neither: the zone's annual figure


@dataclass(frozen=True)
class Start:
    start: float  # epoch seconds
    g_per_kwh: float  # the run's average
    saving: float  # against starting at once, 0..1


@dataclass
class Plan:
    zone: str
    basis: str  # lca or direct
    source: str  # "forecast" (every hour from the series), "typical" (none), or "mixed"
    source_text: str
    at: float
    length_s: float
    within_s: float
    shift: Shift
    best: Start
    others: list[Start] = field(default_factory=list)
    filled_hours: int = 0  # coming hours no value reached: the zone's annual figure
    t0: float = 0.0  # the first coming hour's start (epoch seconds)
    origins: list[str] = field(default_factory=list)  # each coming hour's: SERIES, TYPICAL or ANNUAL

    def spans(self) -> list[tuple[float, float, str]]:
        """(start, end, origin) of each run of coming hours from one origin, in order."""
        out: list[tuple[float, float, str]] = []
        for i, o in enumerate(self.origins):
            t = self.t0 + i * HOUR
            if out and out[-1][2] == o:
                out[-1] = (out[-1][0], t + HOUR, o)
            else:
                out.append((t, t + HOUR, o))
        return out

    def hours_from(self, a: float, b: float) -> dict[str, float]:
        """How many of the hours of [a, b] came from each origin (fractions of an hour at the ends)."""
        got: dict[str, float] = {}
        for s, e, o in self.spans():
            part = min(b, e) - max(a, s)
            if part > 0:
                got[o] = got.get(o, 0.0) + part / HOUR
        return got

    def as_dict(self) -> dict[str, Any]:
        def start(s: Start) -> dict[str, Any]:
            return {
                "start": from_epoch(s.start).isoformat(),
                "g_per_kwh": s.g_per_kwh,
                "saving": s.saving,
                "hours_from": self.hours_from(s.start, s.start + self.length_s),
            }

        return {
            "zone": self.zone,
            "basis": self.basis,
            "source": self.source,
            "source_text": self.source_text,
            "at": from_epoch(self.at).isoformat(),
            "hours": self.length_s / HOUR,
            "within_hours": self.within_s / HOUR,
            "now_g_per_kwh": self.shift.now_g,
            "best": start(self.best),
            "others": [start(s) for s in self.others],
            "interruptible_g_per_kwh": self.shift.interruptible_g,
            "interruptible_saving": self.shift.saving("interruptible"),
            "filled_hours": self.filled_hours,
            "spans": [
                {"start": from_epoch(a).isoformat(), "end": from_epoch(b).isoformat(), "source": o}
                for a, b, o in self.spans()
            ],
        }


def hourly(conn: Connection, zone: str, basis: str, start: float, end: float) -> dict[int, float]:
    """The zone's series in [start, end) as hour number (epoch // 3600) -> g/kWh, finer rows averaged
    over the hour by the time they cover."""
    from sqlalchemy import select

    from cocaq.db.schema import CarbonIntensity

    t = CarbonIntensity.__table__
    q = select(t.c.ts_start, t.c.ts_end, t.c.g_per_kwh).where(
        t.c.zone == zone_key(zone),
        t.c.kind == kind_of(basis),
        t.c.ts_end > from_epoch(start),
        t.c.ts_start < from_epoch(end),
    )
    acc: dict[int, list[float]] = {}
    for s, e, g in conn.execute(q):
        a, b = max(to_epoch(s), start), min(to_epoch(e), end)
        if not (b > a and math.isfinite(g) and g >= 0):
            continue
        h = int(a // HOUR)
        while h * HOUR < b:
            part = min(b, (h + 1) * HOUR) - max(a, h * HOUR)
            if part > 0:
                w = acc.setdefault(h, [0.0, 0.0])
                w[0] += g * part
                w[1] += part
            h += 1
    return {h: w[0] / w[1] for h, w in acc.items() if w[1] > 0}


def plan(
    conn: Connection,
    zone: str,
    basis: str,
    length_s: float,
    within_s: float,
    at: float,
    weeks: int = 4,
    others: int = 3,
) -> Plan:
    """The best start for a run of `length_s` starting within [at, at + within_s] in `zone`."""
    from cocaq.carbon.intensity import fallback_intensity

    if not length_s > 0:
        raise InputError("--hours: a job runs for some time (more than 0 h)")
    h0, h1 = int(at // HOUR), math.ceil((at + within_s + length_s) / HOUR)
    past = weeks * 7 * 24
    got = hourly(conn, zone, basis, (h0 - past) * HOUR, h1 * HOUR)
    coming = list(range(h0, h1))
    if not got:
        raise InputError(
            f"no {basis} series for zone {zone} in the {weeks} weeks before "
            f"{from_epoch(at):%Y-%m-%d %H:%M} UTC or after it: import one with `cocaq carbon import FILE` "
            "(`cocaq carbon zones` lists what is there)"
        )
    annual = fallback_intensity(zone)[0].g_per_kwh
    values: list[float] = []
    origins: list[str] = []
    days: set[int] = set()  # the days the typical hours were averaged over
    for h in coming:
        if h in got:
            values.append(got[h])
            origins.append(SERIES)
            continue
        same = [h - 24 * k for k in range(1, weeks * 7 + 1) if h - 24 * k in got]
        if same:
            values.append(sum(got[x] for x in same) / len(same))
            origins.append(TYPICAL)
            days.update(x // 24 for x in same)
        else:
            values.append(annual)
            origins.append(ANNUAL)
    filled = origins.count(ANNUAL)
    typical_text = (
        f"a typical day: each hour the mean of the same UTC hour over the last {weeks} weeks "
        f"({len(days)} days with values)"
    )
    if all(o == SERIES for o in origins):
        source, text = "forecast", f"the imported {basis} series for these hours"
    elif SERIES not in origins:
        source, text = "typical", typical_text
    else:
        n = origins.count(SERIES)
        source = "mixed"
        text = (
            f"the imported {basis} series for {n} of the {len(origins)} hours, and for the "
            f"{len(origins) - n} it has no value for, {typical_text}"
        )
    series = Series(h0 * HOUR, values, annual)
    shift = series.shift(at, length_s, within_s)
    now = shift.now_g

    def start(t: float, g: float) -> Start:
        return Start(t, g, 0.0 if now <= 0 else max(1.0 - g / now, 0.0))

    best = start(shift.contiguous_start, shift.contiguous_g)
    cands = [at] + [float(h * HOUR) for h in range(h0 + 1, h1) if at < h * HOUR <= at + within_s]
    ranked = sorted((series.average(t, t + length_s), t) for t in cands)
    alt: list[Start] = []
    for g, t in ranked:
        if len(alt) >= others:
            break
        if all(abs(t - s.start) >= HOUR for s in (best, *alt)):
            alt.append(start(t, g))
    return Plan(
        zone, basis, source, text, at, length_s, within_s, shift, best, alt, filled, h0 * HOUR, origins
    )
