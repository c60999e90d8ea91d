"""Carbon intensity over time: which intensity applies to a job, from the series stored in
`carbon_intensity` (imported by `cocaq.carbon.series_import`), with the gaps filled and the reasons kept.

A zone is the one a series' file names (Electricity Maps' zone id: `FR`, `ES`, `US-CAL-CISO`) or
`--zone`: a cluster (or partition) whose `carbon_zone` names that zone uses it.

`IntensityIndex` loads the series of a few zones over a time span once, and then answers "what intensity
applies to this job" in microseconds: prefix sums of value x duration over a piecewise-constant function
that already has its gaps filled (nearest value within the tolerance, then the zone's annual figure from
codecarbon's data, then the world average), so one average is two bisections and a few subtractions.
"""

from __future__ import annotations

import json
import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

from sqlalchemy import Connection, select

from cocaq.carbon.series import SOURCE_MAX, basis_of, from_epoch, kind_of, resolution_name, to_epoch, zone_key
from cocaq.carbon.zones import Intensity, zone_intensity
from cocaq.db.schema import CarbonIntensity

# Electricity Maps' US balancing authorities that are one state, for the annual fallback (eGRID by state).
_EM_TO_CODECARBON = {"US-CAL-CISO": "USA-CA", "US-NY-NYIS": "USA-NY", "US-TEX-ERCO": "USA-TX"}


# --- fallbacks --------------------------------------------------------------------------------------


def fallback_zone(zone: str) -> str | None:
    """The codecarbon zone whose annual figure stands in where `zone`'s series has no value; None: world.

    codecarbon's own codes map to themselves (FRA, USA-CA, CAN-QC, SE3); Electricity Maps' country-level
    ids are ISO 3166 two-letter codes (FR -> FRA, ES -> ESP, via pycountry, which codecarbon installs);
    Canadian provinces (CA-QC -> CAN-QC) and Nordic bidding zones (SE-SE3 -> SE3, NO-NO1 -> NO1) map
    too, and the US balancing authorities that are one state (US-CAL-CISO -> USA-CA, US-NY-NYIS,
    US-TEX-ERCO). Any other zone (IT-NO, DK-DK1, US-MIDA-PJM, ...) gets the world average.
    """
    z = zone_key(zone)
    if z in _EM_TO_CODECARBON:
        return _EM_TO_CODECARBON[z]
    found = zone_intensity(z)
    if found.flag is None:
        return found.zone
    prefix, dash, rest = z.partition("-")
    if dash and rest.startswith(prefix):  # SE-SE3, NO-NO1
        sub = zone_intensity(rest)
        if sub.flag is None and sub.zone == rest:
            return rest
    return None


def fallback_intensity(zone: str) -> tuple[Intensity, str]:
    """The annual (or world) intensity for `zone` and which it is: "annual" or "world"."""
    fz = fallback_zone(zone)
    if fz is None or fz == "WORLD":
        return zone_intensity("WORLD"), "world"
    return zone_intensity(fz), "annual"


# --- the index --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """The intensity for a job and how it was chosen (for jobs.carbon_* and job_metrics.carbon_detail).

    flag: None where the series covered the whole run, "gap-filled" where nearest values filled gaps,
    "annual-fallback" / "world-average" where some of the run had neither. A zone with no series at all
    (for this basis, at any time) gets its annual figure unflagged, as on the estimate path, or the world
    average flagged "world-average". detail: the shares of the run (energy-weighted with weights) per
    method, {"series", "nearest", "annual", "world"}, with "zone", "basis", "tolerance_s"; where a fallback
    was used also "fallback_zone" (codecarbon's) and "year"; "has_series": False for a zone without any.
    """

    g_per_kwh: float
    source: str  # short, <= 128 characters
    flag: str | None
    detail: dict[str, Any]
    detail_json: str = ""  # `detail` as JSON text where the index made it (shared by equal choices)


@dataclass(frozen=True)
class Point:
    """The value at one instant and why (`cocaq carbon show`)."""

    zone: str
    basis: str
    at: datetime
    g_per_kwh: float
    method: str  # "series", "nearest", "annual", "world"
    source: str
    has_series: bool
    row_start: datetime | None = None  # the series row used (series, nearest)
    row_end: datetime | None = None
    distance_s: float = 0.0  # nearest: how far the row is
    fallback_zone: str | None = None  # annual, world: codecarbon's zone
    year: int | None = None


_SERIES, _NEAREST, _FALLBACK = 0, 1, 2


class _Zone:
    """One zone's gap-filled, piecewise-constant intensity with prefix sums.

    Pieces [b[k], b[k+1]) carry val[k] and a method (series, nearest, fallback); outside [b[0], b[-1]] the
    fallback value applies. cv[k], cs[k], cn[k] are the integrals from b[0] to b[k] of the value, and of
    the time covered by the series and by nearest values.
    """

    __slots__ = (
        "_choices",
        "b",
        "basis",
        "cn",
        "cs",
        "cv",
        "fb",
        "fb_intensity",
        "fb_key",
        "has_series",
        "label",
        "meth",
        "mixed_label",
        "row",
        "rows",
        "tol",
        "val",
        "zone",
    )

    def __init__(
        self,
        zone: str,
        basis: str,
        tol: float,
        rows: list[tuple[float, float, float, str]],
        has_series: bool,
    ) -> None:
        self.zone = zone
        self.basis = basis
        self.tol = tol
        self.has_series = has_series
        self.rows = rows
        fb, self.fb_key = fallback_intensity(zone)
        self.fb_intensity = fb
        self.fb = fb.g_per_kwh
        segs = _resolve_overlaps(rows)
        b: list[float] = []
        val: list[float] = []
        meth: list[int] = []
        row: list[int] = []

        def piece(s: float, e: float, v: float, m: int, r: int) -> None:
            if e <= s:
                return
            if b and b[-1] < s:  # a hole between pieces: the fallback
                val.append(self.fb)
                meth.append(_FALLBACK)
                row.append(-1)
                b.append(s)
            elif not b:
                b.append(s)
            val.append(v)
            meth.append(m)
            row.append(r)
            b.append(e)

        for i, (s, e, v, r) in enumerate(segs):
            if i == 0:
                piece(s - tol, s, v, _NEAREST, r)
            else:
                _, pe, pv, pr = segs[i - 1]
                if s > pe:  # a gap: nearest value from each side within tol, the fallback in between
                    mid = (pe + s) / 2
                    piece(pe, min(pe + tol, mid), pv, _NEAREST, pr)
                    piece(max(s - tol, mid), s, v, _NEAREST, r)
            piece(s, e, v, _SERIES, r)
            if i == len(segs) - 1:
                piece(e, e + tol, v, _NEAREST, r)
        self.b, self.val, self.meth, self.row = b, val, meth, row
        cv = [0.0]
        cs = [0.0]
        cn = [0.0]
        for k, v in enumerate(val):
            d = b[k + 1] - b[k]
            cv.append(cv[-1] + v * d)
            cs.append(cs[-1] + (d if meth[k] == _SERIES else 0.0))
            cn.append(cn[-1] + (d if meth[k] == _NEAREST else 0.0))
        self.cv, self.cs, self.cn = cv, cs, cn
        self.label = _series_label(zone, basis, rows) if rows else ""
        fb_src = fb.source
        self.mixed_label = f"{self.label} + {fb_src}"[:SOURCE_MAX] if rows else fb_src[:SOURCE_MAX]
        # How a run was covered -> (source, flag, detail, its JSON): most runs are covered alike (all by
        # the series), and building and serialising the same detail a million times is a full
        # recompute's largest cost after the database.
        self._choices: dict[tuple[float, float], tuple[str, str | None, dict[str, Any], str]] = {}

    def _integrals(self, x: float, k: int) -> tuple[float, float, float]:
        """From b[0] to x, x in piece k (-1: before b[0], len(b) - 1: after b[-1]): (value x time, series
        time, nearest time). Continuous at the breakpoints, so either piece of a breakpoint will do."""
        b = self.b
        if k < 0:
            return (x - b[0]) * self.fb, 0.0, 0.0
        if k == len(b) - 1:
            return self.cv[-1] + (x - b[-1]) * self.fb, self.cs[-1], self.cn[-1]
        d = x - b[k]
        m = self.meth[k]
        return (
            self.cv[k] + self.val[k] * d,
            self.cs[k] + (d if m == _SERIES else 0.0),
            self.cn[k] + (d if m == _NEAREST else 0.0),
        )

    def average(self, a: float, c: float) -> tuple[float, float, float]:
        """Mean over [a, c], a < c: (value, share of the time the series covers, share of nearest values)."""
        b = self.b
        if not b:
            return self.fb, 0.0, 0.0
        last = len(b) - 1
        ka = -1 if a < b[0] else last if a >= b[-1] else bisect_right(b, a) - 1
        kc = -1 if c <= b[0] else last if c > b[-1] else bisect_left(b, c) - 1
        if ka == kc:  # one piece: its value, exactly
            if ka < 0 or ka == last:
                return self.fb, 0.0, 0.0
            m = self.meth[ka]
            return self.val[ka], float(m == _SERIES), float(m == _NEAREST)
        v0, s0, n0 = self._integrals(a, ka)
        v1, s1, n1 = self._integrals(c, kc)
        d = c - a
        return (v1 - v0) / d, (s1 - s0) / d, (n1 - n0) / d

    def at(self, x: float) -> tuple[float, int, int]:
        """(value, method, row index or -1) at instant x."""
        b = self.b
        if not b or x < b[0] or x >= b[-1]:
            return self.fb, _FALLBACK, -1
        k = bisect_right(b, x) - 1
        return self.val[k], self.meth[k], self.row[k]

    def choice(self, g: float, s: float, n: float) -> Choice:
        hit = self._choices.get((s, n))
        if hit is None:
            c = self._choice(g, s, n)
            hit = (c.source, c.flag, c.detail, json.dumps(c.detail))
            if len(self._choices) < 10_000:
                self._choices[(s, n)] = hit
        return Choice(g, hit[0], hit[1], hit[2], hit[3])

    def _choice(self, g: float, s: float, n: float) -> Choice:
        f = max(0.0, 1.0 - s - n)
        world = self.fb_key == "world"
        detail: dict[str, Any] = {
            "series": round(s, 6),
            "nearest": round(n, 6),
            "annual": 0.0 if world else round(f, 6),
            "world": round(f, 6) if world else 0.0,
            "zone": self.zone,
            "basis": self.basis,
            "tolerance_s": self.tol,
        }
        if not self.has_series:
            # No series for this zone at all: its annual figure is the basis, as on the estimate path
            # (cocaq.carbon.zones), so it is not flagged; the world average for a zone codecarbon lacks is.
            detail["has_series"] = False
            detail["fallback_zone"] = self.fb_intensity.zone
            detail["year"] = self.fb_intensity.year
            flag = "world-average" if world and self.zone != "WORLD" else None
            return Choice(g, self.fb_intensity.source[:SOURCE_MAX], flag, detail)
        if f <= 1e-9:
            if n <= 1e-9:
                return Choice(g, self.label, None, detail)
            return Choice(g, self.label, "gap-filled", detail)
        detail["fallback_zone"] = self.fb_intensity.zone
        detail["year"] = self.fb_intensity.year
        src = self.fb_intensity.source[:SOURCE_MAX] if s + n <= 1e-9 else self.mixed_label
        return Choice(g, src, "world-average" if world else "annual-fallback", detail)


def _resolve_overlaps(rows: list[tuple[float, float, float, str]]) -> list[tuple[float, float, float, int]]:
    """Rows sorted by start -> disjoint segments (start, end, value, row index).

    Where rows overlap (imports of different resolutions), the row that started last applies, and an
    earlier, longer row applies again after it ends.
    """
    out: list[tuple[float, float, float, int]] = []
    stack: list[int] = []  # covering rows, latest start on top
    cur = -math.inf
    sentinel = len(rows)
    for i in range(len(rows) + 1):
        s = rows[i][0] if i < sentinel else math.inf
        while stack and cur < s:
            top = stack[-1]
            e = rows[top][1]
            if e <= cur:
                stack.pop()
                continue
            seg_end = min(e, s)
            if out and out[-1][1] == cur and out[-1][3] == top:
                out[-1] = (out[-1][0], seg_end, out[-1][2], top)
            else:
                out.append((cur, seg_end, rows[top][2], top))
            cur = seg_end
        if i < sentinel:
            stack.append(i)
            cur = s
    return out


def _series_label(zone: str, basis: str, rows: list[tuple[float, float, float, str]]) -> str:
    """The label, e.g. "Electricity Maps FR hourly (lca)": provider, zone, resolution (median step), basis."""
    providers = sorted(
        {"Electricity Maps" if src.startswith("Electricity Maps") else src.split(" (")[0] for *_, src in rows}
    )
    starts = [r[0] for r in rows]
    step = statistics.median(b - a for a, b in pairwise(starts)) if len(rows) > 1 else rows[0][1] - rows[0][0]
    return f"{' + '.join(providers)} {zone} {resolution_name(step)} ({basis})"[:SOURCE_MAX]


class IntensityIndex:
    """Carbon intensity of some zones over a time span, loaded once; `for_interval` per job.

    Outside the series, and in its gaps, a value is chosen per instant: the series' own value; else the
    nearest series value within `tolerance_s`; else the zone's annual figure (codecarbon's data, through
    `fallback_zone`); else the world average. An interval mixes them in proportion to the time (or
    energy) that falls in each.
    """

    def __init__(
        self, zones: dict[str, _Zone], start: float, end: float, basis: str, tolerance_s: float
    ) -> None:
        self._zones = zones
        self.start = start
        self.end = end
        self.basis = basis
        self.tolerance_s = tolerance_s

    @classmethod
    def load(
        cls,
        conn: Connection,
        zones: Iterable[str],
        start: datetime,
        end: datetime,
        basis: str,
        tolerance_s: float,
    ) -> IntensityIndex:
        """Read the series of `zones` (Electricity Maps ids or any zone a file was imported under) for
        [start, end] and `basis` ("lca" or "direct"), with what lies within `tolerance_s` of that span.

        Queries must then fall inside [start, end] (ValueError otherwise).
        """
        kind = kind_of(basis)
        b = basis_of(kind)
        tol = float(tolerance_s)
        if not math.isfinite(tol) or tol < 0:
            raise ValueError(f"tolerance_s must be a non-negative number, got {tolerance_s!r}")
        lo, hi = to_epoch(start), to_epoch(end)
        if hi < lo:
            raise ValueError(f"end ({end}) is before start ({start})")
        keys = sorted({zone_key(z) for z in zones})
        t = CarbonIntensity.__table__
        rows: dict[str, list[tuple[float, float, float, str]]] = {z: [] for z in keys}
        if keys:
            q = (
                select(t.c.zone, t.c.ts_start, t.c.ts_end, t.c.g_per_kwh, t.c.source)
                .where(
                    t.c.kind == kind,
                    t.c.zone.in_(keys),
                    t.c.ts_end >= from_epoch(lo - tol),
                    t.c.ts_start <= from_epoch(hi + tol),
                )
                .order_by(t.c.zone, t.c.ts_start)
            )
            for z, s, e, g, src in conn.execute(q):
                rows[z].append((to_epoch(s), to_epoch(e), float(g), src))
        present = {z for z in keys if rows[z]}
        absent = [z for z in keys if not rows[z]]
        if absent:
            anywhere = select(t.c.zone).where(t.c.kind == kind, t.c.zone.in_(absent)).group_by(t.c.zone)
            present.update(conn.execute(anywhere).scalars())
        built = {z: _Zone(z, b, tol, rows[z], z in present) for z in keys}
        return cls(built, lo, hi, b, tol)

    def zones(self) -> list[str]:
        return sorted(self._zones)

    def _zone(self, zone: str) -> _Zone:
        z = self._zones.get(zone)
        if z is None:
            z = self._zones.get(zone_key(zone))
            if z is None:
                raise KeyError(f"zone {zone!r} was not loaded into this IntensityIndex")
            self._zones[zone] = z
        return z

    def _check(self, a: float, c: float) -> None:
        if a < self.start or c > self.end:
            f = "%Y-%m-%d %H:%M:%S"
            raise ValueError(
                f"interval {from_epoch(a):{f}}..{from_epoch(c):{f}} UTC is outside the span this "
                f"IntensityIndex was loaded for ({from_epoch(self.start):{f}}..{from_epoch(self.end):{f}})"
            )

    def for_interval(
        self,
        zone: str,
        start: datetime | float,
        end: datetime | float,
        weights: Sequence[tuple[float, float, float]] | None = None,
    ) -> Choice:
        """The energy-weighted average intensity over a job's run [start, end].

        `weights`: (t0_epoch, t1_epoch, joules) energy slices; within a slice power is taken as constant.
        None (or slices with no energy) means uniform power over [start, end]. Times are aware datetimes
        (a naive one is UTC) or epoch seconds. A zero-length interval gets the value at that instant.
        """
        z = self._zone(zone)
        a = start.timestamp() if isinstance(start, datetime) and start.tzinfo is not None else to_epoch(start)
        c = end.timestamp() if isinstance(end, datetime) and end.tzinfo is not None else to_epoch(end)
        if c < a:
            a, c = c, a
        if weights:
            total = 0.0
            gsum = ssum = nsum = 0.0
            lo, hi = self.start, self.end
            for t0, t1, j in weights:
                if not j > 0:
                    continue
                if t1 < t0:
                    t0, t1 = t1, t0
                if t0 < lo or t1 > hi:
                    self._check(t0, t1)
                if t1 > t0:
                    g, sh, nh = z.average(t0, t1)
                    gsum += g * j
                    ssum += sh * j
                    nsum += nh * j
                else:
                    g, m, _ = z.at(t0)
                    gsum += g * j
                    if m == _SERIES:
                        ssum += j
                    elif m == _NEAREST:
                        nsum += j
                total += j
            if total > 0:
                return z.choice(gsum / total, ssum / total, nsum / total)
        if a < self.start or c > self.end:
            self._check(a, c)
        if c > a:
            return z.choice(*z.average(a, c))
        g, m, _ = z.at(a)
        return z.choice(g, 1.0 if m == _SERIES else 0.0, 1.0 if m == _NEAREST else 0.0)

    def has_series(self, zone: str) -> bool:
        """Whether the zone has an hourly series at all (of this basis, at any time)."""
        return self._zone(zone).has_series

    def hourly(self, zone: str, lo: float, hi: float) -> tuple[Any, Any]:
        """The zone's gap-filled intensity over [lo, hi] as an hourly `cocaq.carbon.shifting.Series` (each
        UTC hour's mean; the annual figure outside), which the when-to-run model works on, and beside it
        the share of each hour that the series (or its nearest value) covers, 0 outside, as a Series too."""
        from cocaq.carbon.shifting import HOUR, Series

        z = self._zone(zone)
        t0 = math.floor(lo / HOUR) * HOUR
        n = max(math.ceil((hi - t0) / HOUR), 1)
        hours = [z.average(t0 + i * HOUR, t0 + (i + 1) * HOUR) for i in range(n)]
        return Series(t0, [g for g, _, _ in hours], z.fb), Series(t0, [sh + nh for _, sh, nh in hours], 0.0)

    def series_end(self, zone: str) -> float:
        """The end of what was loaded of the zone's series with its nearest values (-inf without rows)."""
        z = self._zone(zone)
        return z.b[-1] if z.b else float("-inf")

    def point(self, zone: str, at: datetime | float) -> Point:
        """The value at one instant and why."""
        z = self._zone(zone)
        x = to_epoch(at)
        self._check(x, x)
        g, m, r = z.at(x)
        when = from_epoch(x)
        if m == _FALLBACK:
            fb = z.fb_intensity
            return Point(
                z.zone,
                z.basis,
                when,
                g,
                z.fb_key,
                fb.source,
                z.has_series,
                fallback_zone=fb.zone,
                year=fb.year,
            )
        s, e, _, src = z.rows[r]
        dist = 0.0 if m == _SERIES else (x - e if x >= e else s - x)
        return Point(
            z.zone,
            z.basis,
            when,
            g,
            "series" if m == _SERIES else "nearest",
            src,
            True,
            row_start=from_epoch(s),
            row_end=from_epoch(e),
            distance_s=dist,
        )


def explain(
    conn: Connection, zone: str, at: datetime, basis: str, tolerance_s: float
) -> tuple[Point, str | None]:
    """The value `zone` gets at `at` and why, with the provenance of the series row used (if any)."""
    index = IntensityIndex.load(conn, [zone], at, at, basis, tolerance_s)
    p = index.point(zone, at)
    prov = None
    if p.row_start is not None:
        t = CarbonIntensity.__table__
        prov = conn.execute(
            select(t.c.provenance).where(
                t.c.zone == p.zone, t.c.kind == kind_of(basis), t.c.ts_start == p.row_start
            )
        ).scalar_one_or_none()
    return p, prov
