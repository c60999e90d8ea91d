"""Fuzzing (Hypothesis, bounded for CI) of issue 33's carbon import and export inputs: carbon CSVs with
hostile dates (any year 1..9999, any offset), zones and values, parsed and written to both databases;
zone ids; the CSV cell rule; export paths, written by cocaq.outfile and through the real CLI.

The invariants: no exception but the documented one-line errors; the good row next to the bad ones is
imported; every stored row has a valid zone id and starts in 1990..2100; an output is written whole or
not at all, and nothing is left behind in its directory.
"""

from __future__ import annotations

import os
import string
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, select

from cocaq.carbon.series_import import FIRST_YEAR, LAST_YEAR, parse_csv, write_rows
from cocaq.carbon.zones import ZONE_MAX, known_zones, valid_zone
from cocaq.db.schema import CarbonIntensity
from cocaq.errors import CocaqError, OutputError
from cocaq.outfile import write_atomic, write_text
from cocaq.textsafe import FORMULA_START, UNSAFE, csv_text, csv_value
from tests.conftest import run_cocaq

BUDGET = settings(
    max_examples=int(os.environ.get("COCAQ_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
DB_BUDGET = settings(BUDGET, max_examples=max(10, BUDGET.max_examples // 5))  # (each one writes)

# Electricity Maps' zone ids (their zones list), codecarbon's, and a site's own: all must pass.
REAL_ZONES = [
    "DE", "FR", "ES", "SE3", "DK-DK1", "DK-BHM", "US-CAL-CISO", "US-MIDA-PJM", "US-NY-NYIS", "US-TEX-ERCO",
    "IN-NO", "JP-TK", "AUS-NSW", "ES-IB-MA", "GB-NIR", "CA-QC", "BR-CS", "USA-CA", "CAN-QC", "WORLD", "HAL-DC",
    "hal_dc", "fr",
]  # fmt: skip
HOSTILE_ZONES = [
    "../X", 'E"S', "a/b", "..", ".", "X" * (ZONE_MAX + 1), "E\x1bS", "E\x00S", "ES;DROP", "É", "E S", "-ES",
    "ES-", "E--S", "=HYPERLINK(1)", "\ud800", "", " ", "\u202eES", "ＥＳ",
]  # fmt: skip


def test_every_real_zone_id_is_valid_and_no_hostile_one() -> None:
    for z in [*known_zones(), *REAL_ZONES]:
        assert valid_zone(z), z
    for z in HOSTILE_ZONES:
        assert not valid_zone(z), repr(z)


@BUDGET
@given(st.text(max_size=40))
def test_a_valid_zone_is_letters_and_digits_joined_by_dash_or_underscore(z: str) -> None:
    ok = set(string.ascii_letters + string.digits + "-_")
    if valid_zone(z):
        s = z.strip()
        assert 0 < len(s) <= ZONE_MAX and set(s) <= ok and s[0] not in "-_" and s[-1] not in "-_", repr(z)


# --- carbon CSVs: hostile dates, zones and values --------------------------------------------------------

OFFSETS = st.sampled_from([None, UTC, timezone(timedelta(hours=14)), timezone(timedelta(hours=-14))])
DATES = st.one_of(
    st.builds(lambda d, tz: d.replace(tzinfo=tz).isoformat(), st.datetimes(), OFFSETS),
    st.sampled_from(
        [
            "9999-12-31T23:00Z", "0001-01-01T00:00+14:00", "0001-01-01T00:00-14:00", "9999-12-31T23:59-14:00",
            "1989-12-31T23:59:59Z", "1990-01-01T00:00Z", "2100-12-31T23:00Z", "2101-01-01T00:00Z", "20261101",
            "2026-02-30T00:00Z", "2026-01-01T24:00Z", "", "now", "1e400", "-1",
        ]
    ),
)  # fmt: skip
ZONES = st.one_of(st.sampled_from(REAL_ZONES + HOSTILE_ZONES), st.text(max_size=40))
VALUES = st.one_of(
    st.sampled_from(["10", "-1", "nan", "inf", "1e400", "", "x", "3000", "3000.01", "0"]),
    st.floats(allow_nan=True).map(str),
)
GOOD = "FR,2026-11-10T10:00:00Z,55"


def _csv(rows: list[tuple[str, str, str]]) -> bytes:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["zone", "datetime", "gco2_per_kwh"])
    w.writerows(rows)
    return (buf.getvalue() + GOOD + "\n").encode("utf-8", "surrogatepass")


@DB_BUDGET
@given(st.lists(st.tuples(ZONES, DATES, VALUES), max_size=8))
@example([("ES", "9999-12-31T23:00Z", "200"), ("ES", "2026-01-01T00:00Z", "10")])
@example([("ES", "0001-01-01T00:00+14:00", "200"), ("../X", "2026-01-01T00:00Z", "1")])
@example(
    [('E"S', "2026-01-01T00:00Z", "1"), ("ES", "2100-12-31T23:00Z", "1"), ("ES", "1990-01-01T00:00Z", "1")]
)
def test_carbon_csv_is_written_whole_minus_its_bad_rows(
    engine: Engine, rows: list[tuple[str, str, str]]
) -> None:
    try:
        parsed = parse_csv(_csv(rows), "fuzz.csv")
    except CocaqError as exc:
        assert "\n" not in str(exc)
        return
    assert any(r.zone == "FR" and r.g_per_kwh == 55.0 for r in parsed.rows), "the good row is kept"
    lo, hi = datetime(FIRST_YEAR, 1, 1, tzinfo=UTC), datetime(LAST_YEAR + 1, 1, 1, tzinfo=UTC)
    with engine.begin() as c:
        c.execute(delete(CarbonIntensity))
        res = write_rows(c, parsed)
        stored = c.execute(select(CarbonIntensity.zone, CarbonIntensity.ts_start)).all()
    assert res.imported == len(stored) == len(parsed.rows)
    assert all("\n" not in line for line in res.lines())
    for zone, start in stored:
        start = start if start.tzinfo else start.replace(tzinfo=UTC)
        assert valid_zone(zone) and lo <= start < hi, (zone, start)


@pytest.mark.parametrize("name", ["bad\udcff.csv", "e\x1b[31m.csv", "\u202eevil.csv", "x" * 200 + ".csv"])
def test_a_hostile_file_name_is_stored_as_text(engine: Engine, name: str) -> None:
    """The source is named after the file: a name from argv with bytes that are not UTF-8 (lone
    surrogates) once failed the whole import on both databases."""
    parsed = parse_csv(b"zone,datetime,gco2_per_kwh\nES,2026-01-01T00:00Z,10\n", name)
    with engine.begin() as c:
        assert write_rows(c, parsed).imported == 1
        (source,) = c.execute(select(CarbonIntensity.source)).scalars()
    assert source.startswith("CSV (") and not UNSAFE.search(source) and source.encode("utf-8")


# --- CSV cells ---------------------------------------------------------------------------------------------


@BUDGET
@given(
    st.one_of(st.text(), st.sampled_from(['=HYPERLINK("http://x")', "+1", "-1", "@SUM(A1)", "\t=1", "\r=1"]))
)
def test_a_text_cell_never_starts_a_formula(s: str) -> None:
    out = csv_text(s)
    assert not out.startswith(FORMULA_START) and not UNSAFE.search(out)
    assert out == ("'" if s.startswith(FORMULA_START) else "") + UNSAFE.sub("?", s)


@BUDGET
@given(st.one_of(st.integers(), st.floats(), st.none(), st.datetimes()))
def test_numbers_stay_numbers(v: object) -> None:
    assert csv_value(v) is v


# --- export paths ------------------------------------------------------------------------------------------


@BUDGET
@given(st.text(min_size=1, max_size=300).filter(lambda s: "\x00" not in s), st.booleans())
@example("a/b/c.csv", False)
@example("x" * 300, False)
@example(".", False)
@example("..", False)
def test_write_atomic_writes_whole_or_nothing(
    tmp_path_factory: pytest.TempPathFactory, name: str, fail: bool
) -> None:
    d = tmp_path_factory.mktemp("out")
    try:
        target = os.path.join(d, name)
    except (TypeError, ValueError):
        return

    def write(p: str) -> None:
        with open(p, "w", encoding="utf-8") as f:
            f.write("half")
            if fail:
                raise OSError(28, "No space left on device")
            f.write(" and whole")

    try:
        write_atomic(target, write)
    except OutputError as exc:
        assert str(exc).startswith("cannot write ") and "\n" not in str(exc)
        assert not [p for p in d.rglob("*") if p.is_file()], "nothing left behind"
        return
    except (UnicodeEncodeError, ValueError):
        return  # (a lone surrogate in a path: the file system's call refuses it before anything is written)
    assert not fail
    assert Path(target).read_text() == "half and whole"
    assert not [p for p in d.rglob("*.tmp")]


def test_a_device_is_written_in_place_and_a_symlink_through(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"^cannot write /dev/full: No space left on device$"):
        write_text("/dev/full", "x" * 10)
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")
    real = tmp_path / "real.csv"
    real.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    write_text(str(link), "new")
    assert link.is_symlink() and real.read_text() == "new"
    write_text("/dev/null", "gone")


@pytest.mark.parametrize(
    "target",
    [
        "/nonexistent/dir/x.csv", "/dev/full", "/etc/passwd/x.csv", "/proc/self/x.csv", "x" * 300 + ".csv",
        "dir/", "new/", ".", "/", "\n.csv", "\udcff.csv", "a\x1b[2J.csv", "csv", "json", "-o", "",
    ],
)  # fmt: skip
def test_export_paths_through_the_cli(
    cli_env: dict[str, str], db_url: str, tmp_path: Path, target: str
) -> None:
    env = dict(cli_env, COCAQ_DATABASE_URL=db_url)
    assert run_cocaq(["db", "upgrade"], env).code == 0
    (tmp_path / "dir").mkdir(exist_ok=True)
    before = sorted(os.listdir(tmp_path))
    r = run_cocaq(["export", "jobs", "-o", target], env, cwd=tmp_path)
    assert "Traceback" not in r.err and r.code in (0, 1, 2), (r.code, r.err)
    if r.code:
        assert r.err.count("\n") == 1, r.err
        assert sorted(os.listdir(tmp_path)) == before
    else:
        assert (tmp_path / target).read_text().startswith("cluster,job_id,")
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
