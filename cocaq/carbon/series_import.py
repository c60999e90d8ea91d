"""Importing carbon intensity series from files: Electricity Maps exports (their CSV, hourly to yearly,
life-cycle and direct columns) and plain CSV (`zone,datetime,g_per_kwh` or with `--zone` given), parsed
into rows, checked (plausible values, one step, duplicates and overlaps, skipped rows with line numbers)
and written to `carbon_intensity` with their provenance (`cocaq carbon import`).

The file's layout is recognised from its header (`_layout`), so one parser reads both formats; what the
series mean once stored, and how a job's intensity is looked up in them, is `cocaq.carbon.intensity`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select

from cocaq.carbon.series import SOURCE_MAX, basis_of, from_epoch, kind_of, resolution_name, to_epoch, zone_key
from cocaq.carbon.zones import ZONE_RULE, valid_zone
from cocaq.db.schema import CarbonIntensity
from cocaq.errors import InputError, UsageError

if TYPE_CHECKING:
    import _csv

_EXAMPLES = 5  # line numbers kept per reason a row was skipped
_DEFAULT_STEP_S = 3600.0  # the step of a file with a single row (nothing to take a median of)


# The years a row may start in: no Slurm job ran before 1990 (nor do Electricity Maps' series start
# earlier), and a forecast past 2100 is a typo. The bounds keep every time and every row's end (its start
# plus the file's step, at most the span) inside what datetime holds: one row in 9999 cannot stop a file.
FIRST_YEAR, LAST_YEAR = 1990, 2100
_T_MIN = datetime(FIRST_YEAR, 1, 1, tzinfo=UTC).timestamp()
_T_MAX = datetime(LAST_YEAR + 1, 1, 1, tzinfo=UTC).timestamp()
BAD_YEAR = f"year outside {FIRST_YEAR}..{LAST_YEAR}"
BAD_ZONE = "bad zone id"

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
    """(epoch seconds, was naive) or None. ISO 8601 with offset or Z; a naive time is UTC. The time may be
    outside FIRST_YEAR..LAST_YEAR (the caller skips it, saying so), never outside what a float holds."""
    try:
        d = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if d.tzinfo is None:
        return d.replace(tzinfo=UTC).timestamp(), True
    try:
        return d.timestamp(), False
    except (OverflowError, ValueError):  # (0001-01-01T00:00+14:00 is before datetime's first instant)
        return -math.inf, False


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


def _shown(name: str) -> str:
    """A file name as text a database and a terminal take: bytes that are not UTF-8 (a name from argv
    holds them as lone surrogates, which PostgreSQL and SQLite refuse) and controls as replacements."""
    from cocaq.textsafe import plain

    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = name.encode("utf-8", "replace")
    return plain(raw.decode("utf-8", "replace"))


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
    first, reader = _csv_reader(data, name)
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
    base = _shown(os.path.basename(name))
    if source is None:
        source = f"Electricity Maps ({base})" if layout.fmt == "electricitymaps" else f"CSV ({base})"
    out = ParsedFile(base, layout.fmt, kind, source[:SOURCE_MAX], [])
    zone_over = zone_key(zone) if zone is not None else None
    if zone_over is not None and not valid_zone(zone_over):
        raise UsageError(f"--zone: {zone_over!r} is not a zone id: {ZONE_RULE}")
    per_zone = _read_series(reader, name, layout, zone_over, out)
    _add_rows(out, per_zone, layout.fmt)
    return out


def _csv_reader(data: bytes | str, name: str) -> tuple[str, _csv.Reader]:
    """(the first line, a reader of the whole text, its delimiter the one the first line has most of)."""
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
    return first, csv.reader(io.StringIO(text, newline=""), delimiter=delim)


# One zone's rows: start (epoch seconds) -> (g/kWh, provenance JSON, line number)
_Series = dict[float, tuple[float, Any, int]]


def _read_series(
    reader: _csv.Reader, name: str, layout: _Layout, zone_over: str | None, out: ParsedFile
) -> dict[str, _Series]:
    """The rows after the header, by zone; a bad row is counted in `out` and a second row at the same
    time of a zone skipped as a duplicate."""
    per_zone: dict[str, _Series] = {}
    cache: dict[Any, Any] = {}
    try:
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            value = _row_value(row, line, layout, zone_over, out)
            if value is None:
                continue
            z, t, g = value
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
    return per_zone


def _row_value(
    row: list[str], line: int, layout: _Layout, zone_over: str | None, out: ParsedFile
) -> tuple[str, float, float] | None:
    """(zone, start in epoch seconds, g/kWh) of a row, or None where it is skipped (counted in `out`)."""
    ti, zi, vi = layout.time, layout.zone, layout.value
    n = len(row)
    parsed = _parse_time(row[ti]) if ti < n else None
    if parsed is None:
        out.skip("bad time", line)
        return None
    t, naive = parsed
    if not _T_MIN <= t < _T_MAX:
        out.skip(BAD_YEAR, line)
        return None
    if naive and not layout.naive_is_utc_by_header:
        out.naive_times = True
    z = zone_over or (zone_key(row[zi]) if zi is not None and zi < n else "")
    if not z:
        out.skip("missing zone", line)
        return None
    if not valid_zone(z):
        out.skip(BAD_ZONE, line)
        return None
    raw = row[vi].strip() if vi < n else ""
    if not raw:
        out.skip("missing value", line)
        return None
    try:
        g = float(raw)
    except ValueError:
        out.skip("bad number", line)
        return None
    if not math.isfinite(g):
        out.skip("bad number", line)
        return None
    if g < 0:
        out.skip("negative value", line)
        return None
    if g > MAX_G_PER_KWH:
        out.skip(f"over {MAX_G_PER_KWH:g} g/kWh (no grid emits that much)", line)
        return None
    return z, t, g


def _add_rows(out: ParsedFile, per_zone: dict[str, _Series], fmt: str) -> None:
    """Each zone's rows in time order with their ends: the next row, or one step (the zone's median step,
    else the file's, else an hour) where the file has a fixed step or it is the last row."""
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
                end = nxt if fmt == "plain" or nxt - t <= 1.5 * step else t + step
            else:
                end = t + step
            out.rows.append(Row(z, t, end, g, prov, line))


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
        span = ZoneSpan(
            z, parsed.kind, from_epoch(rows[0].start), from_epoch(rows[-1].end), len(rows), step, gaps
        )
        existing = {
            to_epoch(s): (to_epoch(e), g, src, prov)
            for s, e, g, src, prov in conn.execute(
                select(t.c.ts_start, t.c.ts_end, t.c.g_per_kwh, t.c.source, t.c.provenance).where(
                    t.c.zone == z,
                    t.c.kind == parsed.kind,
                    t.c.ts_start >= from_epoch(rows[0].start),
                    t.c.ts_start <= from_epoch(rows[-1].start),
                )
            )
        }
        for r in rows:
            start, end = from_epoch(r.start), from_epoch(r.end)  # microseconds, as the database keeps them
            old = existing.get(to_epoch(start))
            if old is not None and old == (to_epoch(end), r.g_per_kwh, parsed.source, r.provenance):
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
