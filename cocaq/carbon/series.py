"""Carbon intensity series as stored (`carbon_intensity`: one row per zone, kind and start time, each
valid over [ts_start, ts_end)): the two bases and the kinds they are stored as, how zones are keyed, epoch
seconds and UTC times, the names of resolutions, and a summary of what is stored per zone
(`cocaq carbon list`).

Both the import of series from files (`cocaq.carbon.series_import`) and their lookup over time
(`cocaq.carbon.intensity`) speak this vocabulary; it is kept here so that neither depends on the other.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

from sqlalchemy import Connection, select

from cocaq.db.schema import CarbonIntensity
from cocaq.errors import UsageError
from cocaq.units import S_PER_HOUR

BASES = ("lca", "direct")
_KIND = {"lca": "lifecycle", "lifecycle": "lifecycle", "direct": "direct"}
_BASIS = {"lifecycle": "lca", "direct": "direct"}
SOURCE_MAX = 128  # carbon_intensity.source and jobs.carbon_source are String(128)


def kind_of(basis: str) -> str:
    """The `carbon_intensity.kind` of a basis: "lca" -> "lifecycle", "direct" -> "direct"."""
    try:
        return _KIND[basis.strip().lower()]
    except KeyError:
        raise UsageError(f"bad carbon basis {basis!r}: use 'lca' (life cycle) or 'direct'") from None


def basis_of(kind: str) -> str:
    return _BASIS.get(kind, kind)


def zone_key(zone: str) -> str:
    return zone.strip().upper()


def to_epoch(t: datetime | float) -> float:
    if isinstance(t, datetime):
        return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()
    return float(t)


def from_epoch(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def resolution_name(step_s: float) -> str:
    """`hourly`, `15-min`, `daily`, `monthly`, ... for a median step in seconds."""
    named = {300: "5-min", 900: "15-min", 1800: "30-min", 3600: "hourly", 86400: "daily", 7 * 86400: "weekly"}
    if round(step_s) in named:
        return named[round(step_s)]
    if 28 * 86400 <= step_s <= 31 * 86400:
        return "monthly"
    if 365 * 86400 <= step_s <= 366 * 86400:
        return "yearly"
    if step_s % S_PER_HOUR == 0:
        return f"{step_s / S_PER_HOUR:g}-hourly"
    return f"{step_s:g} s step"


# --- what is stored ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZoneSummary:
    zone: str
    basis: str
    first: datetime
    last: datetime  # the end of the last row
    points: int
    resolution_s: float  # the median step between starts
    gaps: int  # places where a row ends before the next starts
    gap_s: float  # their total length
    sources: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "zone": self.zone,
            "basis": self.basis,
            "first": self.first.isoformat(),
            "last": self.last.isoformat(),
            "points": self.points,
            "resolution_s": self.resolution_s,
            "resolution": resolution_name(self.resolution_s),
            "gaps": self.gaps,
            "gap_hours": round(self.gap_s / S_PER_HOUR, 3),
            "sources": list(self.sources),
        }


def zone_summaries(conn: Connection) -> list[ZoneSummary]:
    """Each stored zone and basis: span, points, resolution, gaps and sources."""
    t = CarbonIntensity.__table__
    out: list[ZoneSummary] = []
    q = select(t.c.zone, t.c.kind, t.c.ts_start, t.c.ts_end, t.c.source).order_by(
        t.c.zone, t.c.kind, t.c.ts_start
    )
    key: tuple[str, str] | None = None
    starts: list[float] = []
    ends: list[float] = []
    sources: dict[str, None] = {}

    def flush() -> None:
        if key is None:
            return
        steps = [b - a for a, b in pairwise(starts)]
        gaps = [(s - e) for e, s in zip(ends, starts[1:], strict=False) if s > e]
        out.append(
            ZoneSummary(
                key[0],
                basis_of(key[1]),
                from_epoch(starts[0]),
                from_epoch(max(ends)),
                len(starts),
                statistics.median(steps) if steps else ends[0] - starts[0],
                len(gaps),
                sum(gaps),
                tuple(sources),
            )
        )

    for z, k, s, e, src in conn.execute(q):
        if (z, k) != key:
            flush()
            key, starts, ends, sources = (z, k), [], [], {}
        starts.append(to_epoch(s))
        ends.append(to_epoch(e))
        sources[src] = None
    flush()
    return out
