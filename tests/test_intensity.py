"""Carbon intensity over time: imports (real Electricity Maps exports, plain CSV) and the per-job index."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from cocaq.carbon.intensity import Choice, IntensityIndex, _resolve_overlaps, fallback_zone
from cocaq.carbon.series import zone_summaries
from cocaq.carbon.series_import import ImportResult, import_csv, parse_csv, write_rows
from cocaq.carbon.zones import zone_intensity
from cocaq.db.schema import CarbonIntensity
from cocaq.errors import InputError, UsageError

DATA = Path(__file__).resolve().parent / "data" / "carbon"
ES = DATA / "ES_2023_hourly_slice.csv"  # 2023-06-30 00:00 .. 2023-07-04 00:00 UTC, hourly
CISO = DATA / "US-CAL-CISO_2023_hourly_slice.csv"  # 2023-08-16 00:00 .. 2023-08-20 00:00 UTC, hourly
T0 = datetime(2026, 1, 1, tzinfo=UTC)
FRA = zone_intensity("FRA").g_per_kwh
ESP = zone_intensity("ESP").g_per_kwh
WORLD = zone_intensity("WORLD").g_per_kwh


def h(hours: float, base: datetime = T0) -> datetime:
    return base + timedelta(hours=hours)


def _import(engine: Engine, text: str, name: str = "series.csv", **kw: str) -> ImportResult:
    parsed = parse_csv(text.encode(), name, **kw)
    with engine.begin() as conn:
        return write_rows(conn, parsed)


def _import_file(engine: Engine, path: Path, **kw: str) -> ImportResult:
    with engine.begin() as conn:
        return import_csv(conn, path, **kw)


def _index(
    engine: Engine, zones: list[str], lo: datetime, hi: datetime, basis: str = "lca", tol: float = 1800
) -> IntensityIndex:
    with engine.connect() as conn:
        return IntensityIndex.load(conn, zones, lo, hi, basis, tol)


def _rows(engine: Engine) -> list[tuple[object, ...]]:
    t = CarbonIntensity.__table__
    with engine.connect() as c:
        return [
            tuple(r)
            for r in c.execute(
                select(
                    t.c.zone, t.c.kind, t.c.ts_start, t.c.ts_end, t.c.g_per_kwh, t.c.source, t.c.provenance
                ).order_by(t.c.zone, t.c.kind, t.c.ts_start)
            )
        ]


# FR, hourly: 00:00 100, 01:00 200, 02:00 400, 03:00 300 (the last row lasts the median step, one hour).
FOUR_HOURS = """zone,datetime,gco2_per_kwh
FR,2026-01-01T00:00:00Z,100
FR,2026-01-01T01:00:00Z,200
FR,2026-01-01T02:00:00Z,400
FR,2026-01-01T03:00:00Z,300
"""


def test_uniform_and_weighted_averages(engine: Engine) -> None:
    res = _import(engine, FOUR_HOURS)
    assert (res.imported, res.replaced, res.unchanged, res.n_skipped) == (4, 0, 0, 0)
    idx = _index(engine, ["FR"], h(-24), h(24))
    c = idx.for_interval("FR", h(0.5), h(2.5))  # half of 00h, all of 01h, half of 02h
    assert c.g_per_kwh == pytest.approx((0.5 * 100 + 200 + 0.5 * 400) / 2)  # 225
    assert c.flag is None and c.source == "CSV FR hourly (lca)"
    assert c.detail == {
        "series": 1.0,
        "nearest": 0.0,
        "annual": 0.0,
        "world": 0.0,
        "zone": "FR",
        "basis": "lca",
        "tolerance_s": 1800.0,
    }
    assert idx.for_interval("FR", h(1), h(2)).g_per_kwh == 200  # exactly one row
    assert idx.for_interval("FR", h(1.25), h(1.25)).g_per_kwh == 200  # an instant
    assert idx.for_interval("FR", h(3.5), h(4)).g_per_kwh == 300  # the last row lasts one step
    # Energy slices: 1 kJ in 00:30-01:00 (100), 3 kJ in 01:00-02:00 (200), none after.
    e = [(h(0.5).timestamp(), h(1).timestamp(), 1000.0), (h(1).timestamp(), h(2).timestamp(), 3000.0)]
    e.append((h(2).timestamp(), h(2.5).timestamp(), 0.0))
    c = idx.for_interval("FR", h(0.5), h(2.5), e)
    assert c.g_per_kwh == pytest.approx((1000 * 100 + 3000 * 200) / 4000)  # 175
    # A slice across two rows spreads its energy evenly over its time: 150 for 00:30-01:30.
    c = idx.for_interval("FR", h(0.5), h(1.5), [(h(0.5).timestamp(), h(1.5).timestamp(), 7.0)])
    assert c.g_per_kwh == pytest.approx(150)
    # Slices that carry no energy: uniform over the job.
    assert idx.for_interval(
        "FR", h(0.5), h(2.5), [(h(0.5).timestamp(), h(1).timestamp(), 0.0)]
    ).g_per_kwh == (pytest.approx(225))
    # Epoch seconds work as well as datetimes; a naive datetime is UTC.
    assert idx.for_interval("FR", h(0.5).timestamp(), h(2.5).timestamp()).g_per_kwh == pytest.approx(225)
    naive = h(0.5).replace(tzinfo=None), h(2.5).replace(tzinfo=None)
    assert idx.for_interval("FR", *naive).g_per_kwh == pytest.approx(225)


def _two_pieces(engine: Engine, zone: str = "FR") -> None:
    """00:00-02:00 (100, 200) and 06:00-08:00 (400, 300): a four-hour gap between two imports."""
    _import(
        engine, f"zone,datetime,gco2_per_kwh\n{zone},2026-01-01T00:00Z,100\n{zone},2026-01-01T01:00Z,200\n"
    )
    _import(
        engine, f"zone,datetime,gco2_per_kwh\n{zone},2026-01-01T06:00Z,400\n{zone},2026-01-01T07:00Z,300\n"
    )


def test_gaps_nearest_within_tolerance_then_annual(engine: Engine) -> None:
    _two_pieces(engine)
    idx = _index(engine, ["FR"], h(-48), h(48), tol=1800)
    # 01:00-07:00: series 01-02 (200) and 06-07 (400); nearest 02:00-02:30 (200) and 05:30-06:00 (400);
    # the annual figure (FR -> FRA) for 02:30-05:30.
    c = idx.for_interval("FR", h(1), h(7))
    assert c.g_per_kwh == pytest.approx((200 + 400 + 0.5 * 200 + 0.5 * 400 + 3 * FRA) / 6)
    assert c.flag == "annual-fallback"
    assert c.detail["series"] == pytest.approx(2 / 6, abs=1e-6)
    assert c.detail["nearest"] == pytest.approx(1 / 6, abs=1e-6)
    assert c.detail["annual"] == pytest.approx(3 / 6, abs=1e-6) and c.detail["world"] == 0.0
    assert c.detail["fallback_zone"] == "FRA" and c.detail["year"] == zone_intensity("FRA").year
    assert c.source.startswith("CSV FR hourly (lca) + codecarbon") and len(c.source) <= 128
    # Only nearest values: gap-filled.
    c = idx.for_interval("FR", h(2), h(2.5))
    assert (c.g_per_kwh, c.flag, c.detail["nearest"]) == (200, "gap-filled", 1.0)
    c = idx.for_interval("FR", h(1.5), h(2.5))
    assert (c.g_per_kwh, c.flag, c.detail["series"], c.detail["nearest"]) == (200, "gap-filled", 0.5, 0.5)
    # Entirely after (and before) the series, beyond the tolerance: the annual figure, and its source.
    for a, b in ((h(10), h(11)), (h(-5), h(-1))):
        c = idx.for_interval("FR", a, b)
        assert (c.g_per_kwh, c.flag) == (pytest.approx(FRA), "annual-fallback")
        assert c.source == zone_intensity("FRA").source and c.detail["annual"] == 1.0
    # Just before the first row, within the tolerance: its value.
    assert idx.for_interval("FR", h(-0.5), h(0)).g_per_kwh == 100
    # A gap of less than twice the tolerance: each side's value up to the middle.
    wide = _index(engine, ["FR"], h(-48), h(48), tol=3 * 3600)
    c = wide.for_interval("FR", h(2), h(6))
    assert (c.g_per_kwh, c.flag) == (pytest.approx(300), "gap-filled")
    # No tolerance: straight to the annual figure.
    c = _index(engine, ["FR"], h(-48), h(48), tol=0).for_interval("FR", h(2), h(2.5))
    assert (c.g_per_kwh, c.flag) == (pytest.approx(FRA), "annual-fallback")


def test_world_average_where_no_annual_figure(engine: Engine) -> None:
    _two_pieces(engine, "IT-NO")  # Italy North: no obvious codecarbon zone
    idx = _index(engine, ["IT-NO", "FRA", "XX", "FR"], h(-48), h(48))
    c = idx.for_interval("IT-NO", h(1), h(3))  # 01-02 series, 02:00-02:30 nearest, then the world
    assert c.g_per_kwh == pytest.approx((200 + 0.5 * 200 + 0.5 * WORLD) / 2)
    assert c.flag == "world-average"
    assert (c.detail["series"], c.detail["nearest"], c.detail["annual"], c.detail["world"]) == (
        0.5,
        0.25,
        0,
        0.25,
    )
    # Zones without any series: their annual figure as on the estimate path (not flagged), or the world's.
    c = idx.for_interval("FRA", h(1), h(3))
    assert (c.g_per_kwh, c.flag, c.source) == (FRA, None, zone_intensity("FRA").source)
    assert c.detail["has_series"] is False and c.detail["annual"] == 1.0
    c = idx.for_interval("XX", h(1), h(3))
    assert (c.g_per_kwh, c.flag, c.detail["world"]) == (WORLD, "world-average", 1.0)
    c = idx.for_interval("FR", h(1), h(3))  # FR has no series: its annual figure, FRA's
    assert (c.g_per_kwh, c.flag) == (FRA, None)


def test_series_elsewhere_in_time_still_flags_the_fallback(engine: Engine) -> None:
    _import(engine, FOUR_HOURS)
    later = T0 + timedelta(days=400)
    c = _index(engine, ["FR"], later, later + timedelta(days=1)).for_interval("FR", later, h(2, later))
    assert (c.g_per_kwh, c.flag) == (pytest.approx(FRA), "annual-fallback")


def test_real_export_boundaries_and_basis(engine: Engine) -> None:
    res = _import_file(engine, ES, basis="lca")
    assert (res.imported, res.n_skipped, res.fmt) == (96, 0, "electricitymaps")
    (span,) = res.spans
    assert (span.zone, span.rows, span.step_s, span.gaps) == ("ES", 96, 3600.0, 0)
    assert (span.first, span.last_end) == (
        datetime(2023, 6, 30, tzinfo=UTC),
        datetime(2023, 7, 4, tzinfo=UTC),
    )
    _import_file(engine, ES, basis="direct")
    day = datetime(2023, 7, 1, tzinfo=UTC)
    lo, hi = day - timedelta(days=3), day + timedelta(days=6)
    lca = _index(engine, ["ES"], lo, hi, "lca", 7200)
    direct = _index(engine, ["ES"], lo, hi, "direct", 7200)
    # A job from 05:30 to 07:15: half an hour at 05h, an hour at 06h, a quarter at 07h (from the file).
    c = lca.for_interval("ES", h(5.5, day), h(7.25, day))
    assert c.g_per_kwh == pytest.approx((0.5 * 153.09 + 123.76 + 0.25 * 100.25) / 1.75)
    assert (c.flag, c.source) == (None, "Electricity Maps ES hourly (lca)")
    c = direct.for_interval("ES", h(5.5, day), h(7.25, day))
    assert c.g_per_kwh == pytest.approx((0.5 * 110.58 + 86.01 + 0.25 * 66.12) / 1.75)
    assert c.source == "Electricity Maps ES hourly (direct)" and c.detail["basis"] == "direct"
    # Ending exactly where the series ends; starting an hour before it (within the 2 h tolerance).
    end = datetime(2023, 7, 4, tzinfo=UTC)
    assert lca.for_interval("ES", end - timedelta(hours=1), end).g_per_kwh == pytest.approx(239.03)
    first = datetime(2023, 6, 30, tzinfo=UTC)
    c = lca.for_interval("ES", first - timedelta(hours=1), first + timedelta(hours=1))
    assert c.g_per_kwh == pytest.approx(140.91) and c.flag == "gap-filled"
    # Running past the end: an hour of series, 2 h of nearest, an hour of ESP's annual figure.
    c = lca.for_interval("ES", end - timedelta(hours=1), end + timedelta(hours=3))
    assert c.g_per_kwh == pytest.approx((239.03 * 3 + ESP) / 4)
    assert c.flag == "annual-fallback" and c.detail["fallback_zone"] == "ESP"
    # Entirely before the series: the annual figure.
    c = lca.for_interval("ES", lo, lo + timedelta(hours=2))
    assert (c.g_per_kwh, c.flag, c.detail["series"]) == (pytest.approx(ESP), "annual-fallback", 0.0)


def test_point_explains_the_choice(engine: Engine) -> None:
    _two_pieces(engine)
    idx = _index(engine, ["FR"], h(-48), h(48), tol=1800)
    p = idx.point("FR", h(1.5))
    assert (p.method, p.g_per_kwh, p.row_start, p.row_end) == ("series", 200, h(1), h(2))
    p = idx.point("FR", h(5.75))
    assert (p.method, p.g_per_kwh, p.distance_s, p.row_start) == ("nearest", 400, 900.0, h(6))
    p = idx.point("FR", h(4))
    assert (p.method, p.fallback_zone, p.g_per_kwh) == ("annual", "FRA", FRA)


def test_reimport_changes_nothing(engine: Engine) -> None:
    _import_file(engine, ES)
    before = _rows(engine)
    res = _import_file(engine, ES)
    assert (res.imported, res.replaced, res.unchanged) == (0, 0, 96)
    assert _rows(engine) == before
    zone, kind, start, end, g, source, prov = before[29]  # line 31: 2023-07-01 05:00, estimated
    assert (zone, kind, start, end, g) == (
        "ES",
        "lifecycle",
        datetime(2023, 7, 1, 5, tzinfo=UTC),
        datetime(2023, 7, 1, 6, tzinfo=UTC),
        153.09,
    )
    assert source == "Electricity Maps (ES_2023_hourly_slice.csv)"
    assert json.loads(str(prov)) == {
        "data_source": "Electricity Maps Estimation",
        "estimated": True,
        "estimation_method": "ESTIMATED_TIME_SLICER_AVERAGE",
    }
    assert json.loads(str(before[0][6])) == {"data_source": "entsoe.eu", "estimated": False}


def test_overlapping_import_replaces_same_start(engine: Engine) -> None:
    _import_file(engine, ES)
    fix = "zone,datetime,gco2_per_kwh\nES,2023-07-03T22:00:00+00:00,10\nES,2023-07-03T23:00:00Z,20\nES,2023-07-04 00:00,30\n"
    res = _import(engine, fix, "fix.csv", basis="lca")
    assert (res.imported, res.replaced, res.unchanged) == (1, 2, 0)
    assert res.naive_times  # "2023-07-04 00:00" was read as UTC, and the summary says so
    assert "times without a UTC offset were read as UTC" in "\n".join(res.lines())
    rows = {r[2]: r for r in _rows(engine)}
    assert len(rows) == 97
    assert rows[datetime(2023, 7, 3, 22, tzinfo=UTC)][4:6] == (10.0, "CSV (fix.csv)")
    assert rows[datetime(2023, 7, 3, 21, tzinfo=UTC)][5] == "Electricity Maps (ES_2023_hourly_slice.csv)"
    day = datetime(2023, 7, 3, tzinfo=UTC)
    c = _index(engine, ["ES"], day, day + timedelta(days=2), tol=0).for_interval("ES", h(22, day), h(25, day))
    assert c.g_per_kwh == pytest.approx(20) and c.flag is None
    assert c.source == "CSV + Electricity Maps ES hourly (lca)"
    # The other basis is a separate series: untouched.
    assert all(r[1] == "lifecycle" for r in rows.values())


def test_different_resolutions_overlap_latest_start_wins() -> None:
    # A daily row, then hourly rows 06:00-08:00 inside it: the day resumes after them.
    day = 86400.0
    rows = [(0.0, day, 50.0, "a"), (6 * 3600.0, 7 * 3600.0, 10.0, "b"), (7 * 3600.0, 8 * 3600.0, 20.0, "b")]
    assert _resolve_overlaps(rows) == [
        (0.0, 6 * 3600.0, 50.0, 0),
        (6 * 3600.0, 7 * 3600.0, 10.0, 1),
        (7 * 3600.0, 8 * 3600.0, 20.0, 2),
        (8 * 3600.0, day, 50.0, 0),
    ]


MALFORMED = """zone,datetime,gco2_per_kwh
FR,2026-01-01T00:00Z,100
FR,2026-01-01T01:00Z,lots
FR,2026-01-01T02:00Z,-5
FR,yesterday,50
,2026-01-01T03:00Z,50
FR,2026-01-01T01:00Z,200
FR,2026-01-01T01:00Z,210
FR,2026-01-01T04:00Z,nan
FR,2026-01-01T05:00Z,

FR,2026-01-01T06:00Z,60
FR,2026-01-01T07:00Z,bad
"""


def test_malformed_rows_are_skipped_with_line_numbers(engine: Engine) -> None:
    res = _import(engine, MALFORMED, "bad.csv")
    assert res.imported == 3  # lines 2, 7 and 12
    assert dict(res.skipped) == {
        "bad number": 3,
        "negative value": 1,
        "bad time": 1,
        "missing zone": 1,
        "duplicate time": 1,
        "missing value": 1,
    }
    assert res.examples["bad number"] == [3, 9, 13]
    assert res.examples["negative value"] == [4]
    assert res.examples["bad time"] == [5]
    assert res.examples["missing zone"] == [6]
    assert res.examples["duplicate time"] == [8]
    assert res.examples["missing value"] == [10]
    text = "\n".join(res.lines())
    assert "skipped 3: bad number (lines 3, 9, 13)" in text and "skipped 1: duplicate time (line 8)" in text
    # Rows are valid until the next row: 01:00 (200) until 06:00.
    idx = _index(engine, ["FR"], h(-1), h(9))
    assert idx.for_interval("FR", h(1), h(6)).g_per_kwh == 200


def test_only_the_first_few_line_numbers_are_kept() -> None:
    body = "".join(f"FR,2026-01-01T{i:02d}:00Z,x\n" for i in range(20))
    parsed = parse_csv("zone,datetime,gco2_per_kwh\n" + body + "FR,2026-01-02T00:00Z,1\n", "many.csv")
    assert parsed.skipped["bad number"] == 20 and parsed.examples["bad number"] == [2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not a CSV file"),
        (b'{"zone": "FR", "data": []}\n', "no recognisable header"),
        (b"", "empty file"),
        (b"zone,datetime\nFR,2026-01-01T00:00Z\n", "no recognisable header"),
        (b"when,value\n2026-01-01,3\n", "no recognisable header"),
        (b"JobID|User|Account|Start|End\n1|alice|lab|2026-01-01|2026-01-02\n", "no recognisable header"),
    ],
)
def test_not_csv_or_no_header_is_one_error(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message) as exc:
        parse_csv(data, "x.csv")
    assert "\n" not in str(exc.value)


def test_bad_basis_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="basis"):
        parse_csv(FOUR_HOURS, "x.csv", basis="marginal")


def test_zone_from_file_or_override_and_other_layouts(engine: Engine) -> None:
    res = _import_file(engine, CISO, zone="us-ciso-test", basis="direct")
    assert [s.zone for s in res.spans] == ["US-CISO-TEST"]
    # A plain file without a zone column takes --zone; semicolons and any column order are fine;
    # offsets are converted to UTC.
    res = _import(
        engine, "gco2_per_kwh;datetime\n5;2026-01-01T01:00:00+01:00\n7;2026-01-01T02:00:00+01:00\n", zone="XY"
    )
    assert [(s.zone, s.first) for s in res.spans] == [("XY", T0)]
    # A newer Electricity Maps header ("Life cycle", lower case) is recognised too.
    newer = (
        "Datetime (UTC),Country,Zone name,Zone id,Carbon intensity gCO₂eq/kWh (direct),"
        "Carbon intensity gCO₂eq/kWh (Life cycle),Carbon-free energy percentage (CFE%),"
        "Renewable energy percentage (RE%),Data source,Data estimated,Data estimation method\n"
        "2026-01-01 00:00:00,France,France,FR,20.1,40.2,90,30,rte-france.com,false,\n"
        "2026-01-01 01:00:00,France,France,FR,21.1,41.2,90,30,rte-france.com,false,\n"
    )
    res = _import(engine, newer, "FR_2026_hourly.csv")
    assert (res.fmt, res.imported, res.source) == (
        "electricitymaps",
        2,
        "Electricity Maps (FR_2026_hourly.csv)",
    )
    assert _index(engine, ["FR"], T0, h(2)).for_interval("FR", T0, h(2)).g_per_kwh == pytest.approx(40.7)
    with engine.connect() as conn:
        zones = {(z.zone, z.basis): z for z in zone_summaries(conn)}
    assert set(zones) == {("US-CISO-TEST", "direct"), ("XY", "lca"), ("FR", "lca")}
    z = zones[("US-CISO-TEST", "direct")]
    assert (z.points, z.resolution_s, z.gaps) == (96, 3600.0, 0)
    assert z.sources == ("Electricity Maps (US-CAL-CISO_2023_hourly_slice.csv)",)


def test_a_missing_hour_in_an_export_is_a_gap(engine: Engine) -> None:
    lines = ES.read_text(encoding="utf-8").splitlines(keepends=True)
    del lines[29:31]  # 2023-07-01 04:00 and 05:00 (lines 30 and 31)
    res = _import(engine, "".join(lines), "ES_holes.csv")
    assert (res.imported, res.spans[0].gaps) == (94, 1)
    with engine.connect() as conn:
        (z,) = zone_summaries(conn)
    assert (z.gaps, z.gap_s, z.points) == (1, 7200.0, 94)
    day = datetime(2023, 7, 1, tzinfo=UTC)
    # 04:00-06:00 missing, tolerance 30 min: 03h's value, then ESP, then 06h's value.
    c = _index(engine, ["ES"], day, day + timedelta(days=1)).for_interval("ES", h(4, day), h(6, day))
    assert c.g_per_kwh == pytest.approx((0.5 * 181.99 + ESP + 0.5 * 123.76) / 2)
    assert (c.detail["nearest"], c.detail["annual"]) == (0.5, 0.5)


def test_fallback_zone_mapping() -> None:
    assert fallback_zone("FR") == "FRA"
    assert fallback_zone("es") == "ESP"
    assert fallback_zone("FRA") == "FRA"
    assert fallback_zone("SE-SE3") == "SE3"
    assert fallback_zone("NO-NO1") == "NO1"
    assert fallback_zone("CA-QC") == "CAN-QC"
    assert fallback_zone("US-CAL-CISO") == "USA-CA"
    assert fallback_zone("USA-CA") == "USA-CA"
    for z in ("IT-NO", "DK-DK1", "US-MIDA-PJM", "XX"):
        assert fallback_zone(z) is None


def test_misuse_is_loud(engine: Engine) -> None:
    _import(engine, FOUR_HOURS)
    idx = _index(engine, ["FR"], h(0), h(4))
    with pytest.raises(KeyError, match="not loaded"):
        idx.for_interval("ES", h(0), h(1))
    with pytest.raises(ValueError, match="outside the span"):
        idx.for_interval("FR", h(-1), h(1))
    with pytest.raises(ValueError, match="outside the span"):
        idx.for_interval("FR", h(0), h(1), [(h(3).timestamp(), h(5).timestamp(), 1.0)])
    assert idx.for_interval("fr", h(0), h(1)).g_per_kwh == 100  # zone ids in any case
    assert isinstance(idx.for_interval("FR", h(0), h(1)), Choice)


def test_micro_benchmark(engine: Engine) -> None:
    """A year of hourly data: import, load, and the per-job call (printed; run with -s to see)."""
    year = datetime(2025, 1, 1, tzinfo=UTC)
    body = "".join(
        f"BENCH,{(year + timedelta(hours=i)).isoformat()},{100 + (i * 37) % 300}\n" for i in range(8760)
    )
    data = ("zone,datetime,gco2_per_kwh\n" + body).encode()
    t = time.perf_counter()
    parsed = parse_csv(data, "bench.csv")
    t_parse = time.perf_counter() - t
    with engine.begin() as conn:
        res = write_rows(conn, parsed)
    t_import = time.perf_counter() - t
    assert res.imported == 8760
    t = time.perf_counter()
    with engine.begin() as conn:
        again = write_rows(conn, parse_csv(data, "bench.csv"))
    t_again = time.perf_counter() - t
    assert again.unchanged == 8760
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(CarbonIntensity)).scalar_one()
        assert n == 8760
        t = time.perf_counter()
        idx = IntensityIndex.load(conn, ["BENCH", "FRA"], year, year + timedelta(days=365), "lca", 7200)
        t_load = time.perf_counter() - t
    n_calls = 100_000
    starts = [year.timestamp() + (i * 7919.0) % (360 * 86400) for i in range(n_calls)]
    dts = [datetime.fromtimestamp(s, UTC) for s in starts]
    ends = [d + timedelta(hours=1 + i % 30) for i, d in enumerate(dts)]
    t = time.perf_counter()
    for a, b in zip(dts, ends, strict=True):
        idx.for_interval("BENCH", a, b)
    per_uniform = (time.perf_counter() - t) / n_calls * 1e6
    t = time.perf_counter()
    for a, b in zip(starts, ends, strict=True):
        idx.for_interval("FRA", a, b)
    per_no_series = (time.perf_counter() - t) / n_calls * 1e6
    weights = [
        [(s + 3600.0 * k, s + 3600.0 * (k + 1), 1e6 * (k + 1)) for k in range(24)] for s in starts[:20_000]
    ]
    t = time.perf_counter()
    for a, w in zip(dts, weights, strict=False):
        idx.for_interval("BENCH", a, a + timedelta(hours=24), w)
    per_weighted = (time.perf_counter() - t) / len(weights) * 1e6
    print(
        f"\n[{engine.dialect.name}] 8760 hourly rows: parse {t_parse * 1e3:.0f} ms, parse+import "
        f"{t_import * 1e3:.0f} ms, re-import (unchanged) {t_again * 1e3:.0f} ms, index load {t_load * 1e3:.0f} ms; "
        f"for_interval: uniform {per_uniform:.2f} us, zone without series {per_no_series:.2f} us, "
        f"24 hourly energy slices {per_weighted:.2f} us per call "
        f"(1M uniform calls ~ {per_uniform:.1f} s)"
    )
