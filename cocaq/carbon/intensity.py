"""Carbon intensity over time: import series (Electricity Maps exports, plain CSV) and average them over jobs.

A series is stored in `carbon_intensity`, one row per zone, kind ("lifecycle" or "direct") and start time,
each valid over [ts_start, ts_end). The zone is the one the file names (Electricity Maps' zone id: `FR`,
`ES`, `US-CAL-CISO`) or `--zone`: a cluster (or partition) whose `carbon_zone` names that zone uses it.

`IntensityIndex` loads the series of a few zones over a time span once, and then answers "what intensity
applies to this job" in microseconds: prefix sums of value x duration over a piecewise-constant function
that already has its gaps filled (nearest value within the tolerance, then the zone's annual figure from
codecarbon's data, then the world average), so one average is two bisections and a few subtractions.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, select

from cocaq.carbon.zones import Intensity, zone_intensity
from cocaq.db.schema import CarbonIntensity
from cocaq.errors import InputError, UsageError

BASES = ("lca", "direct")
_KIND = {"lca": "lifecycle", "lifecycle": "lifecycle", "direct": "direct"}
_BASIS = {"lifecycle": "lca", "direct": "direct"}
_SOURCE_MAX = 128  # carbon_intensity.source and jobs.carbon_source are String(128)
_EXAMPLES = 5  # line numbers kept per reason a row was skipped
_DEFAULT_STEP_S = 3600.0  # the step of a file with a single row (nothing to take a median of)

# Electricity Maps' US balancing authorities that are one state, for the annual fallback (eGRID by state).
_EM_TO_CODECARBON = {"US-CAL-CISO": "USA-CA", "US-NY-NYIS": "USA-NY", "US-TEX-ERCO": "USA-TX"}


def kind_of(basis: str) -> str:
    """The `carbon_intensity.kind` of a basis: "lca" -> "lifecycle", "direct" -> "direct"."""
    try:
        return _KIND[basis.strip().lower()]
    except KeyError:
        raise UsageError(f"bad carbon basis {basis!r}: use 'lca' (life cycle) or 'direct'") from None


def basis_of(kind: str) -> str:
    return _BASIS.get(kind, kind)


def _zone_key(zone: str) -> str:
    return zone.strip().upper()


def _epoch(t: datetime | float) -> float:
    if isinstance(t, datetime):
        return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()
    return float(t)


def _dt(t: float) -> datetime:
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
    if step_s % 3600 == 0:
        return f"{step_s / 3600:g}-hourly"
    return f"{step_s:g} s step"


# --- fallbacks --------------------------------------------------------------------------------------


def fallback_zone(zone: str) -> str | None:
    """The codecarbon zone whose annual figure stands in where `zone`'s series has no value; None: world.

    codecarbon's own codes map to themselves (FRA, USA-CA, CAN-QC, SE3); Electricity Maps' country-level
    ids are ISO 3166 two-letter codes (FR -> FRA, ES -> ESP, via pycountry, which codecarbon installs);
    Canadian provinces (CA-QC -> CAN-QC) and Nordic bidding zones (SE-SE3 -> SE3, NO-NO1 -> NO1) map
    too, and the US balancing authorities that are one state (US-CAL-CISO -> USA-CA, US-NY-NYIS,
    US-TEX-ERCO). Any other zone (IT-NO, DK-DK1, US-MIDA-PJM, ...) gets the world average.
    """
    z = _zone_key(zone)
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


# --- import -----------------------------------------------------------------------------------------


# No grid emits more: lignite plants alone are 1,000-1,300 g/kWh (life cycle), whole grids under 1,000.
MAX_G_PER_KWH = 3000.0


@dataclass(frozen=True)
class Row:
    """One parsed row: a value valid over [start, end) (epoch seconds)."""

    zone: str
    start: float
    end: float
    g_per_kwh: float
    provenance: str | None
    line: int


@dataclass
class ZoneSpan:
    """What an import did for one zone."""

    zone: str
    kind: str
    first: datetime
    last_end: datetime
    rows: int
    step_s: float
    gaps: int  # missing rows inside the span (Electricity Maps exports)
    imported: int = 0
    replaced: int = 0
    unchanged: int = 0


@dataclass
class ParsedFile:
    name: str
    fmt: str  # "electricitymaps" or "plain"
    kind: str
    source: str
    rows: list[Row]
    skipped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[int]] = field(default_factory=dict)
    naive_times: bool = False  # some times had no offset and were read as UTC
    step_assumed: bool = False  # no two rows of a zone: a step of one hour was assumed

    def skip(self, reason: str, line: int) -> None:
        self.skipped[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < _EXAMPLES:
            ex.append(line)


@dataclass
class ImportResult:
    name: str
    fmt: str
    basis: str
    source: str
    spans: list[ZoneSpan]
    skipped: Counter[str]
    examples: dict[str, list[int]]
    naive_times: bool
    step_assumed: bool

    @property
    def imported(self) -> int:
        return sum(s.imported for s in self.spans)

    @property
    def replaced(self) -> int:
        return sum(s.replaced for s in self.spans)

    @property
    def unchanged(self) -> int:
        return sum(s.unchanged for s in self.spans)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def lines(self) -> list[str]:
        """The summary a person reads: one line per zone, then the skipped rows by reason."""
        fmt = "Electricity Maps export" if self.fmt == "electricitymaps" else "zone,datetime,gco2_per_kwh CSV"
        out = [
            f"{self.name} ({fmt}, basis {self.basis}): imported {self.imported:,}, "
            f"replaced {self.replaced:,}, unchanged {self.unchanged:,}, skipped {self.n_skipped:,}"
        ]
        for s in self.spans:
            gaps = f", {s.gaps} gap{'s' if s.gaps != 1 else ''}" if s.gaps else ""
            out.append(
                f"  {s.zone} ({basis_of(s.kind)}): {s.first:%Y-%m-%d %H:%M} to "
                f"{s.last_end:%Y-%m-%d %H:%M} UTC, "
                f"{s.rows:,} rows, {resolution_name(s.step_s)}{gaps}: imported {s.imported:,}, "
                f"replaced {s.replaced:,}, unchanged {s.unchanged:,}"
            )
        for reason, n in self.skipped.most_common():
            lines = ", ".join(str(x) for x in self.examples.get(reason, []))
            more = ", ..." if n > len(self.examples.get(reason, [])) else ""
            out.append(f"  skipped {n:,}: {reason} (line{'s' if n > 1 else ''} {lines}{more})")
        if self.naive_times:
            out.append("  times without a UTC offset were read as UTC")
        if self.step_assumed:
            out.append("  a zone has a single row: it was taken as valid for one hour")
        return out


def _norm(name: str) -> str:
    return " ".join(name.replace("\ufeff", "").replace("₂", "2").strip().lower().replace("_", " ").split())


def _find(cols: list[str], want: Iterable[str]) -> int | None:
    for w in want:
        if w in cols:
            return cols.index(w)
    return None


@dataclass(frozen=True)
class _Layout:
    fmt: str
    time: int
    zone: int | None
    value: int
    prov: tuple[int | None, int | None, int | None] = (None, None, None)  # source, estimated, method
    naive_is_utc_by_header: bool = False


def _layout(header: list[str], kind: str, zone_given: bool) -> _Layout | None:
    cols = [_norm(c) for c in header]
    direct = lca = None
    for i, c in enumerate(cols):
        if "carbon intensity" in c:
            if "direct" in c:
                direct = i
            elif "lca" in c or "life cycle" in c or "lifecycle" in c:
                lca = i
    t = _find(cols, ("datetime (utc)", "datetime"))
    if direct is not None and lca is not None and t is not None:
        return _Layout(
            fmt="electricitymaps",
            time=t,
            zone=_find(cols, ("zone id", "zoneid", "zone")),
            value=lca if kind == "lifecycle" else direct,
            prov=(
                _find(cols, ("data source",)),
                _find(cols, ("data estimated",)),
                _find(cols, ("data estimation method",)),
            ),
            naive_is_utc_by_header=cols[t].endswith("(utc)"),
        )
    t = _find(cols, ("datetime", "timestamp", "time"))
    v = _find(cols, ("gco2 per kwh", "g per kwh", "gco2eq per kwh"))
    z = _find(cols, ("zone",))
    if t is not None and v is not None and (z is not None or zone_given):
        return _Layout(fmt="plain", time=t, zone=z, value=v)
    return None


def _parse_time(text: str) -> tuple[float, bool] | None:
    """(epoch seconds, was naive) or None. ISO 8601 with offset or Z; a naive time is UTC."""
    try:
        d = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if d.tzinfo is None:
        return d.replace(tzinfo=UTC).timestamp(), True
    return d.timestamp(), False


def _provenance(
    row: list[str], prov: tuple[int | None, int | None, int | None], cache: dict[Any, Any]
) -> Any:
    si, ei, mi = prov
    key = tuple(row[i].strip() if i is not None and i < len(row) else "" for i in (si, ei, mi))
    if key in cache:
        return cache[key]
    src, est, method = key
    d: dict[str, Any] = {}
    if src:
        d["data_source"] = src
    if est:
        d["estimated"] = est.lower() == "true" if est.lower() in ("true", "false") else est
    if method:
        d["estimation_method"] = method
    cache[key] = json.dumps(d, ensure_ascii=False) if d else None
    return cache[key]


def parse_csv(
    data: bytes | str,
    name: str,
    *,
    zone: str | None = None,
    basis: str = "lca",
    source: str | None = None,
) -> ParsedFile:
    """Parse an Electricity Maps export or a `zone,datetime,gco2_per_kwh` CSV; bad rows are counted.

    Raises InputError (one line) for a file that is not CSV text or has no recognisable header.
    """
    kind = kind_of(basis)
    if isinstance(data, bytes):
        if b"\x00" in data[:65536]:
            raise InputError(f"{name}: not a CSV file (binary data)")
        text = data.decode("utf-8-sig", errors="replace")
    else:
        text = data.removeprefix("\ufeff")
    first = text.split("\n", 1)[0].strip()
    if not first:
        raise InputError(f"{name}: empty file, or a blank first line where the CSV header should be")
    delim = max(",;\t", key=first.count)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delim)
    try:
        header = next(reader)
    except csv.Error as exc:
        raise InputError(f"{name}: not a CSV file ({exc})") from None
    layout = _layout(header, kind, zone is not None)
    if layout is None:
        raise InputError(
            f"{name}: not a carbon-intensity CSV: no recognisable header (expected an Electricity Maps "
            "export with 'Datetime (UTC)', 'Zone Id' and both 'Carbon Intensity ... (direct)' and '(LCA)', "
            f"or 'zone,datetime,gco2_per_kwh'); first line: {first[:80]!r}"
        )
    base = os.path.basename(name)
    if source is None:
        source = f"Electricity Maps ({base})" if layout.fmt == "electricitymaps" else f"CSV ({base})"
    out = ParsedFile(base, layout.fmt, kind, source[:_SOURCE_MAX], [])
    zone_over = _zone_key(zone) if zone is not None else None
    per_zone: dict[str, dict[float, tuple[float, Any, int]]] = {}
    cache: dict[Any, Any] = {}
    ti, zi, vi = layout.time, layout.zone, layout.value
    try:
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            n = len(row)
            parsed = _parse_time(row[ti]) if ti < n else None
            if parsed is None:
                out.skip("bad time", line)
                continue
            t, naive = parsed
            if naive and not layout.naive_is_utc_by_header:
                out.naive_times = True
            z = zone_over or (_zone_key(row[zi]) if zi is not None and zi < n else "")
            if not z:
                out.skip("missing zone", line)
                continue
            raw = row[vi].strip() if vi < n else ""
            if not raw:
                out.skip("missing value", line)
                continue
            try:
                g = float(raw)
            except ValueError:
                out.skip("bad number", line)
                continue
            if not math.isfinite(g):
                out.skip("bad number", line)
                continue
            if g < 0:
                out.skip("negative value", line)
                continue
            if g > MAX_G_PER_KWH:
                out.skip(f"over {MAX_G_PER_KWH:g} g/kWh (no grid emits that much)", line)
                continue
            series = per_zone.setdefault(z, {})
            if t in series:
                out.skip("duplicate time", line)
                continue
            series[t] = (
                g,
                _provenance(row, layout.prov, cache) if layout.fmt == "electricitymaps" else None,
                line,
            )
    except csv.Error as exc:
        raise InputError(f"{name}: not a CSV file (line {reader.line_num}: {exc})") from None
    steps: dict[str, float] = {}
    for z, series in per_zone.items():
        starts = sorted(series)
        if len(starts) > 1:
            steps[z] = statistics.median(b - a for a, b in pairwise(starts))
    any_step = statistics.median(steps.values()) if steps else None
    for z, series in per_zone.items():
        starts = sorted(series)
        step = steps.get(z, any_step)
        if step is None:
            step, out.step_assumed = _DEFAULT_STEP_S, True
        for i, t in enumerate(starts):
            g, prov, line = series[t]
            if i + 1 < len(starts):
                nxt = starts[i + 1]
                # An Electricity Maps export has a fixed step: a row is missing where the next is more than
                # 1.5 steps away, and that stays a gap. A plain CSV's row is valid until the next one.
                end = nxt if layout.fmt == "plain" or nxt - t <= 1.5 * step else t + step
            else:
                end = t + step
            out.rows.append(Row(z, t, end, g, prov, line))
    return out


def read_file(path: str | os.PathLike[str]) -> bytes:
    try:
        return Path(path).read_bytes()
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a CSV file") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def import_csv(
    conn: Connection,
    path: str | os.PathLike[str],
    *,
    zone: str | None = None,
    basis: str = "lca",
    source: str | None = None,
) -> ImportResult:
    """Import a carbon-intensity CSV file in the caller's transaction (see `parse_csv`, `write_rows`)."""
    parsed = parse_csv(read_file(path), str(path), zone=zone, basis=basis, source=source)
    return write_rows(conn, parsed)


def write_rows(conn: Connection, parsed: ParsedFile) -> ImportResult:
    """Upsert the parsed rows by (zone, kind, ts_start); rows already stored as they are are not written."""
    t = CarbonIntensity.__table__
    by_zone: dict[str, list[Row]] = {}
    for r in parsed.rows:
        by_zone.setdefault(r.zone, []).append(r)
    spans: list[ZoneSpan] = []
    writes: list[dict[str, Any]] = []
    for z in sorted(by_zone):
        rows = sorted(by_zone[z], key=lambda r: r.start)
        starts = [r.start for r in rows]
        step = (
            statistics.median(b - a for a, b in pairwise(starts))
            if len(rows) > 1
            else (rows[0].end - rows[0].start)
        )
        gaps = sum(1 for a, b in pairwise(rows) if b.start > a.end)
        span = ZoneSpan(z, parsed.kind, _dt(rows[0].start), _dt(rows[-1].end), len(rows), step, gaps)
        existing = {
            _epoch(s): (_epoch(e), g, src, prov)
            for s, e, g, src, prov in conn.execute(
                select(t.c.ts_start, t.c.ts_end, t.c.g_per_kwh, t.c.source, t.c.provenance).where(
                    t.c.zone == z,
                    t.c.kind == parsed.kind,
                    t.c.ts_start >= _dt(rows[0].start),
                    t.c.ts_start <= _dt(rows[-1].start),
                )
            )
        }
        for r in rows:
            start, end = _dt(r.start), _dt(r.end)  # microseconds, as the database keeps them
            old = existing.get(_epoch(start))
            if old is not None and old == (_epoch(end), r.g_per_kwh, parsed.source, r.provenance):
                span.unchanged += 1
                continue
            if old is None:
                span.imported += 1
            else:
                span.replaced += 1
            writes.append(
                {
                    "zone": z,
                    "ts_start": start,
                    "ts_end": end,
                    "g_per_kwh": r.g_per_kwh,
                    "kind": parsed.kind,
                    "source": parsed.source,
                    "provenance": r.provenance,
                }
            )
        spans.append(span)
    if writes:
        if conn.dialect.name == "postgresql":
            _upsert_pg(conn, writes)
        else:
            _upsert_generic(conn, writes)
    return ImportResult(
        parsed.name,
        parsed.fmt,
        basis_of(parsed.kind),
        parsed.source,
        spans,
        parsed.skipped,
        parsed.examples,
        parsed.naive_times,
        parsed.step_assumed,
    )


_COLS = ("zone", "ts_start", "ts_end", "g_per_kwh", "kind", "source", "provenance")
_PG_TEMP = "cocaq_carbon_load"


def _upsert_generic(conn: Connection, writes: list[dict[str, Any]]) -> None:
    """SQLite (and any other): INSERT ... ON CONFLICT DO UPDATE, executemany."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    stmt = sqlite_insert(CarbonIntensity)
    stmt = stmt.on_conflict_do_update(
        index_elements=["zone", "kind", "ts_start"],
        set_={c: stmt.excluded[c] for c in ("ts_end", "g_per_kwh", "source", "provenance")},
    )
    for i in range(0, len(writes), 10_000):
        conn.execute(stmt, writes[i : i + 10_000])


def _upsert_pg(conn: Connection, writes: list[dict[str, Any]]) -> None:
    """PostgreSQL: COPY into a temporary table, then one INSERT ... SELECT ... ON CONFLICT DO UPDATE."""
    raw = conn.connection.driver_connection
    assert raw is not None
    cols = ", ".join(_COLS)
    with raw.cursor() as cur:
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {_PG_TEMP} ON COMMIT DELETE ROWS AS "
            f"SELECT {cols} FROM carbon_intensity WITH NO DATA"
        )
        cur.execute(f"TRUNCATE {_PG_TEMP}")
        with cur.copy(f"COPY {_PG_TEMP} ({cols}) FROM STDIN") as cp:
            for w in writes:
                cp.write_row([w[c] for c in _COLS])
        cur.execute(
            f"INSERT INTO carbon_intensity ({cols}) SELECT {cols} FROM {_PG_TEMP} "
            "ON CONFLICT (zone, kind, ts_start) DO UPDATE SET ts_end = EXCLUDED.ts_end, "
            "g_per_kwh = EXCLUDED.g_per_kwh, source = EXCLUDED.source, provenance = EXCLUDED.provenance"
        )


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
        self.mixed_label = f"{self.label} + {fb_src}"[:_SOURCE_MAX] if rows else fb_src[:_SOURCE_MAX]
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
            return Choice(g, self.fb_intensity.source[:_SOURCE_MAX], flag, detail)
        if f <= 1e-9:
            if n <= 1e-9:
                return Choice(g, self.label, None, detail)
            return Choice(g, self.label, "gap-filled", detail)
        detail["fallback_zone"] = self.fb_intensity.zone
        detail["year"] = self.fb_intensity.year
        src = self.fb_intensity.source[:_SOURCE_MAX] if s + n <= 1e-9 else self.mixed_label
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
    return f"{' + '.join(providers)} {zone} {resolution_name(step)} ({basis})"[:_SOURCE_MAX]


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
        lo, hi = _epoch(start), _epoch(end)
        if hi < lo:
            raise ValueError(f"end ({end}) is before start ({start})")
        keys = sorted({_zone_key(z) for z in zones})
        t = CarbonIntensity.__table__
        rows: dict[str, list[tuple[float, float, float, str]]] = {z: [] for z in keys}
        if keys:
            q = (
                select(t.c.zone, t.c.ts_start, t.c.ts_end, t.c.g_per_kwh, t.c.source)
                .where(
                    t.c.kind == kind,
                    t.c.zone.in_(keys),
                    t.c.ts_end >= _dt(lo - tol),
                    t.c.ts_start <= _dt(hi + tol),
                )
                .order_by(t.c.zone, t.c.ts_start)
            )
            for z, s, e, g, src in conn.execute(q):
                rows[z].append((_epoch(s), _epoch(e), float(g), src))
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
            z = self._zones.get(_zone_key(zone))
            if z is None:
                raise KeyError(f"zone {zone!r} was not loaded into this IntensityIndex")
            self._zones[zone] = z
        return z

    def _check(self, a: float, c: float) -> None:
        if a < self.start or c > self.end:
            f = "%Y-%m-%d %H:%M:%S"
            raise ValueError(
                f"interval {_dt(a):{f}}..{_dt(c):{f}} UTC is outside the span this IntensityIndex was "
                f"loaded for ({_dt(self.start):{f}}..{_dt(self.end):{f}})"
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
        a = start.timestamp() if isinstance(start, datetime) and start.tzinfo is not None else _epoch(start)
        c = end.timestamp() if isinstance(end, datetime) and end.tzinfo is not None else _epoch(end)
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

    def point(self, zone: str, at: datetime | float) -> Point:
        """The value at one instant and why."""
        z = self._zone(zone)
        x = _epoch(at)
        self._check(x, x)
        g, m, r = z.at(x)
        when = _dt(x)
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
            row_start=_dt(s),
            row_end=_dt(e),
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
            "gap_hours": round(self.gap_s / 3600, 3),
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
                _dt(starts[0]),
                _dt(max(ends)),
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
        starts.append(_epoch(s))
        ends.append(_epoch(e))
        sources[src] = None
    flush()
    return out
