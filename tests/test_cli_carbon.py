"""`cocaq carbon import|zones|show`, run as real processes on real databases with real Electricity Maps data."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cocaq.carbon.zones import zone_intensity
from cocaq.footprint.advice_words import num
from tests.conftest import run_cocaq

DATA = Path(__file__).resolve().parent / "data" / "carbon"
ES = str(DATA / "ES_2023_hourly_slice.csv")
CISO = str(DATA / "US-CAL-CISO_2023_hourly_slice.csv")


@pytest.fixture
def env(cli_env: dict[str, str], migrated_db_url: str, tmp_path: Path) -> dict[str, str]:
    cfg = tmp_path / "cocaq.toml"
    cfg.write_text('[cluster]\nname = "hal"\ncarbon_zone = "ES"\n[carbon]\ngap_tolerance_s = 3600\n')
    return dict(cli_env, COCAQ_DATABASE_URL=migrated_db_url, COCAQ_CONFIG=str(cfg))


def test_import_zones_show(env: dict[str, str]) -> None:
    r = run_cocaq(["carbon", "import", ES], env)
    assert r.code == 0, r.err
    assert "imported 96, replaced 0, unchanged 0, skipped 0" in r.err
    assert "ES (lca): 2023-06-30 00:00 to 2023-07-04 00:00 UTC, 96 rows, hourly" in r.err
    r = run_cocaq(["carbon", "import", ES], env)  # again: nothing changes
    assert r.code == 0 and "imported 0, replaced 0, unchanged 96, skipped 0" in r.err, r.err
    r = run_cocaq(["carbon", "import", CISO, "--basis", "direct"], env)
    assert r.code == 0 and "US-CAL-CISO (direct)" in r.err, r.err

    r = run_cocaq(["carbon", "zones", "--format", "json"], env)
    assert r.code == 0, r.err
    zones = {(z["zone"], z["basis"]): z for z in json.loads(r.out)}
    assert set(zones) == {("ES", "lca"), ("US-CAL-CISO", "direct")}
    es = zones[("ES", "lca")]
    assert (es["first"], es["last"]) == ("2023-06-30T00:00:00+00:00", "2023-07-04T00:00:00+00:00")
    assert (es["points"], es["resolution_s"], es["resolution"], es["gaps"]) == (96, 3600.0, "hourly", 0)
    assert es["sources"] == ["Electricity Maps (ES_2023_hourly_slice.csv)"]
    r = run_cocaq(["carbon", "zones", "--format", "csv"], env)
    rows = list(csv.DictReader(io.StringIO(r.out)))
    assert [(x["zone"], x["basis"], x["points"]) for x in rows] == [
        ("ES", "lca", "96"),
        ("US-CAL-CISO", "direct", "96"),
    ]
    r = run_cocaq(["carbon", "zones"], env)
    assert r.code == 0 and "US-CAL-CISO" in r.out and "hourly" in r.out and "2023-08-20 00:00" in r.out

    # A series point (an hour Electricity Maps estimated), with an offset in --at.
    r = run_cocaq(["carbon", "show", "ES", "--at", "2023-07-01T07:30+02:00"], env)
    assert r.code == 0, r.err
    assert "ES at 2023-07-01 05:30:00 UTC (lca): 153 g CO2e/kWh" in r.out
    assert "series point: the row 2023-07-01 05:00..2023-07-01 06:00 UTC" in r.out
    assert "estimated (ESTIMATED_TIME_SLICER_AVERAGE)" in r.out
    # After the end, within the hour of tolerance: the nearest value, and how far it is.
    r = run_cocaq(["carbon", "show", "ES", "--at", "2023-07-04T00:30:00Z"], env)
    assert r.code == 0 and "239 g CO2e/kWh" in r.out
    assert "nearest series value, 30 min away (tolerance 1 h)" in r.out
    # Beyond it: Spain's annual figure from codecarbon.
    r = run_cocaq(["carbon", "show", "ES", "--at", "2023-07-05", "--format", "json"], env)
    d = json.loads(r.out)
    esp = zone_intensity("ESP")
    assert (d["method"], d["fallback_zone"], d["g_per_kwh"], d["year"]) == (
        "annual",
        "ESP",
        esp.g_per_kwh,
        esp.year,
    )
    assert d["has_series"] is True and d["source"] == esp.source
    # The direct basis of CAISO; the lca basis was never imported: California's annual figure (eGRID).
    r = run_cocaq(["carbon", "show", "US-CAL-CISO", "--at", "2023-08-17T23:10", "--basis", "direct"], env)
    assert r.code == 0 and ": 185 g CO2e/kWh" in r.out and "series point" in r.out, r.out
    r = run_cocaq(["carbon", "show", "US-CAL-CISO", "--at", "2023-08-17T23:10"], env)
    assert "no lca series imported for US-CAL-CISO: annual figure of USA-CA" in r.out, r.out
    r = run_cocaq(["carbon", "show", "IT-NO", "--at", "2023-08-17"], env)
    assert "world average" in r.out and f"{num(zone_intensity('WORLD').g_per_kwh)} g CO2e/kWh" in r.out


def test_zone_override_and_skipped_rows(env: dict[str, str], tmp_path: Path) -> None:
    f = tmp_path / "mine.csv"
    f.write_text(
        "zone,datetime,gco2_per_kwh\nx,2026-01-01T00:00Z,10\nx,2026-01-01T01:00Z,oops\nx,2026-01-01T02:00Z,-1\n"
        "x,2026-01-01T03:00Z,30\nx,2026-01-01T03:00Z,31\n"
    )
    r = run_cocaq(["carbon", "import", str(f), "--zone", "HAL-DC"], env)
    assert r.code == 0, r.err
    assert "HAL-DC (lca)" in r.err and "imported 2, replaced 0, unchanged 0, skipped 3" in r.err
    assert "skipped 1: bad number (line 3)" in r.err
    assert "skipped 1: negative value (line 4)" in r.err
    assert "skipped 1: duplicate time (line 6)" in r.err
    r = run_cocaq(["carbon", "show", "HAL-DC", "--at", "2026-01-01T02:30"], env)
    assert "10 g CO2e/kWh" in r.out and "series point" in r.out, r.out  # valid until the next row


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x01\x02binary", "not a CSV file (binary data)"),
        (b"<html><body>404</body></html>\n", "no recognisable header"),
        (b"zone,datetime,gco2_per_kwh\nFR,never,1\n", "no usable rows (skipped: 1 bad time)"),
        (b"zone,datetime,gco2_per_kwh\n", "no usable rows after the header"),
    ],
)
def test_bad_file_is_one_line(env: dict[str, str], tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_bytes(content)
    r = run_cocaq(["carbon", "import", str(f)], env)
    assert r.code == 4, (r.out, r.err)
    assert r.err.startswith("cocaq: error: ") and message in r.err and r.err.count("\n") == 1, r.err
    assert "Traceback" not in r.err


def test_usage_errors(env: dict[str, str], tmp_path: Path) -> None:
    r = run_cocaq(["carbon", "import", str(tmp_path / "missing.csv")], env)
    assert r.code == 4 and r.err.startswith("cocaq: error: cannot read") and r.err.count("\n") == 1, r.err
    r = run_cocaq(["carbon", "import", ES, "--basis", "marginal"], env)
    assert r.code == 2 and "Traceback" not in r.err
    r = run_cocaq(["carbon", "show", "ES", "--at", "the day before"], env)
    assert r.code == 2 and r.err.startswith("cocaq: error: bad date") and r.err.count("\n") == 1, r.err
    r = run_cocaq(["carbon", "zones"], env)
    assert r.code == 0 and "no carbon-intensity series imported" in r.err


# --- `cocaq carbon when` (issue 21) ---------------------------------------------------------------------


def _es_lca() -> dict[float, float]:
    """The slice's hourly LCA values by hour start (epoch), read here independently of cocaq."""
    from datetime import UTC, datetime

    with open(ES, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    col = next(i for i, h in enumerate(rows[0]) if "LCA" in h)
    return {datetime.fromisoformat(r[0]).replace(tzinfo=UTC).timestamp(): float(r[col]) for r in rows[1:]}


def _best(values: dict[float, float], at: float, hours: int, within_h: int) -> tuple[float, float, float]:
    """Brute force over whole-hour starts (the series is hourly and `at` on the hour): (start, avg, now)."""

    def avg(t: float) -> float:
        return sum(values[t + 3600 * k] for k in range(hours)) / hours

    starts = [at + 3600 * k for k in range(within_h + 1)]
    g, t = min((avg(t), t) for t in starts)
    return t, g, avg(at)


def test_when_from_the_imported_series(env: dict[str, str]) -> None:
    from datetime import UTC, datetime

    assert run_cocaq(["carbon", "import", ES], env).code == 0
    at = datetime(2023, 7, 2, tzinfo=UTC).timestamp()
    r = run_cocaq(["carbon", "when", "--hours", "6", "--at", "2023-07-02T00:00", "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    start, g, now = _best(_es_lca(), at, 6, 24)
    assert d["source"] == "forecast" and d["zone"] == "ES"
    assert d["now_g_per_kwh"] == pytest.approx(now)
    assert d["best"]["g_per_kwh"] == pytest.approx(g)
    assert datetime.fromisoformat(d["best"]["start"]).timestamp() == start
    assert d["best"]["saving"] == pytest.approx(1 - g / now)
    assert d["interruptible_g_per_kwh"] <= d["best"]["g_per_kwh"]
    # the cluster has no timezone here: --begin in the machine's local time, as sbatch reads it
    local = datetime.fromtimestamp(start, UTC).astimezone()
    assert d["sbatch"] == f"sbatch --begin={local:%Y-%m-%dT%H:%M}"
    table = run_cocaq(["carbon", "when", "--hours", "6", "--at", "2023-07-02T00:00"], env)
    assert table.code == 0 and f"{(1 - g / now):.0%} less CO2" in table.out
    assert "from the imported lca series for these hours" in table.out


def test_when_from_a_typical_day_and_in_the_clusters_time(env: dict[str, str], tmp_path: Path) -> None:
    from datetime import UTC, datetime

    cfg = tmp_path / "madrid.toml"
    cfg.write_text('[cluster]\nname = "hal"\ncarbon_zone = "ES"\ntimezone = "Europe/Madrid"\n')
    env = dict(env, COCAQ_CONFIG=str(cfg))
    assert run_cocaq(["carbon", "import", ES], env).code == 0
    # after the slice: each coming hour is the mean of the same UTC hour over the slice's four days
    values = _es_lca()
    typical: dict[float, float] = {}
    at = datetime(2023, 7, 4, 6, tzinfo=UTC).timestamp()
    for k in range(6 + 24 + 1):
        t = at + 3600 * k
        same = [v for u, v in values.items() if (t - u) % 86400 == 0 and u < at]
        typical[t] = sum(same) / len(same)
    start, g, now = _best(typical, at, 6, 24)
    r = run_cocaq(["carbon", "when", "--hours", "6", "--at", "2023-07-04T06:00", "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["source"] == "typical" and "last 4 weeks (4 days with values)" in d["source_text"]
    assert d["best"]["g_per_kwh"] == pytest.approx(g) and d["now_g_per_kwh"] == pytest.approx(now)
    assert datetime.fromisoformat(d["best"]["start"]).timestamp() == start
    madrid = datetime.fromtimestamp(start, UTC).astimezone(__import__("zoneinfo").ZoneInfo("Europe/Madrid"))
    assert d["sbatch"] == f"sbatch --begin={madrid:%Y-%m-%dT%H:%M}"
    r = run_cocaq(["carbon", "when", "--hours", "6", "--at", "2023-07-04T06:00"], env)
    assert r.code == 0 and f"{madrid:%Y-%m-%d %H:%M} CEST (UTC+02:00; " in r.out and d["sbatch"] in r.out


def test_when_errors_are_one_line(env: dict[str, str]) -> None:
    r = run_cocaq(["carbon", "when", "--hours", "6", "--zone", "FR"], env)
    assert (
        r.code == 4 and r.err.startswith("cocaq: error: no lca series for zone FR") and r.err.count("\n") == 1
    )
    for args, what in (
        (["--hours", "0"], "--hours"),
        (["--hours", "nan"], "--hours"),
        (["--hours", "6", "--within", "40d"], "--within"),
        (["--hours", "6", "--within", "soon"], "bad duration"),
        (["--hours", "6", "--at", "someday"], "bad date"),
    ):
        r = run_cocaq(["carbon", "when", *args], env)
        assert r.code == 2 and what in r.err and r.err.count("\n") == 1, (args, r.err)


# --- the --begin line around daylight-saving changes, and a window past the series' end (issue 32) ---

ES_SPRING = str(DATA / "ES_2023_spring_dst_slice.csv")
ES_AUTUMN = str(DATA / "ES_2023_autumn_dst_slice.csv")
CISO_AUTUMN = str(DATA / "US-CAL-CISO_2023_autumn_dst_slice.csv")


def _lca(path: str) -> dict[float, float]:
    """A slice's hourly LCA values by hour start (epoch), read here independently of cocaq."""
    from datetime import UTC, datetime

    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    col = next(i for i, h in enumerate(rows[0]) if "LCA" in h)
    return {datetime.fromisoformat(r[0]).replace(tzinfo=UTC).timestamp(): float(r[col]) for r in rows[1:]}


def _exact_best(values: dict[float, float], at: float, hours: float, within_h: float) -> tuple[float, float]:
    """Brute force on a one-minute grid of starts over a piecewise-constant hourly series: (start, avg)."""

    def avg(t: float) -> float:
        total, x, end = 0.0, t, t + hours * 3600
        while x < end:
            h = x - x % 3600
            y = min(h + 3600, end)
            total += values[h] * (y - x)
            x = y
        return total / (hours * 3600)

    starts = [at + 60 * k for k in range(round(within_h * 60) + 1)]
    g, t = min((round(avg(t), 9), t) for t in starts)
    return t, g


def _zone_env(env: dict[str, str], tmp_path: Path, zone: str, tz: str) -> dict[str, str]:
    cfg = tmp_path / f"{zone}.toml"
    cfg.write_text(f'[cluster]\nname = "hal"\ncarbon_zone = "{zone}"\ntimezone = "{tz}"\n')
    return dict(env, COCAQ_CONFIG=str(cfg))


@pytest.mark.parametrize(
    ("zone", "tz", "path", "at", "hours", "within", "wall"),
    [
        # 2023-10-29 in Madrid: 02:00-02:59 twice (CEST, then CET); the best start is the second 02:30
        ("ES", "Europe/Madrid", ES_AUTUMN, "2023-10-29T01:00Z", "1", "30m", "2023-10-29T02:30"),
        # 2023-11-05 in Los Angeles: 01:00-01:59 twice (PDT, then PST); the best start is 01:30 PST
        (
            "US-CAL-CISO",
            "America/Los_Angeles",
            CISO_AUTUMN,
            "2023-11-05T07:30Z",
            "3",
            "2h",
            "2023-11-05T01:30",
        ),
    ],
)
def test_when_a_start_in_the_hour_that_repeats_is_asked_for_in_utc(
    env: dict[str, str],
    tmp_path: Path,
    zone: str,
    tz: str,
    path: str,
    at: str,
    hours: str,
    within: str,
    wall: str,
) -> None:
    """Slurm reads --begin, now+N too, through the local time (parse_time.c: mktime with tm_isdst = -1):
    a wall time shown twice may be taken for the other one, an hour off. The line names it in UTC."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    env = _zone_env(env, tmp_path, zone, tz)
    assert run_cocaq(["carbon", "import", path], env).code == 0
    a = datetime.fromisoformat(at).timestamp()
    start, g = _exact_best(_lca(path), a, float(hours), {"30m": 0.5, "2h": 2.0}[within])
    local = datetime.fromtimestamp(start, UTC).astimezone(ZoneInfo(tz))
    assert f"{local:%Y-%m-%dT%H:%M}" == wall and local.fold == 1  # the case: the second of the two
    r = run_cocaq(["carbon", "when", "--hours", hours, "--within", within, "--at", at, "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert datetime.fromisoformat(d["best"]["start"]).timestamp() == start
    assert d["best"]["g_per_kwh"] == pytest.approx(g)
    utc = datetime.fromtimestamp(start, UTC)
    assert d["sbatch"] == f"TZ=UTC sbatch --begin={utc:%Y-%m-%dT%H:%M}"
    b = d["begin"]
    assert b["ambiguous"] is True and b["relative"] is None  # now+N goes through the local time too
    assert (b["local"], b["zone"], b["abbreviation"]) == (local.isoformat(), tz, local.tzname())
    r = run_cocaq(["carbon", "when", "--hours", hours, "--within", within, "--at", at], env)
    assert r.code == 0, r.err
    assert f"--begin={wall}" not in r.out and "--begin=now+" not in r.out  # never the bare wall time
    assert f"  TZ=UTC sbatch --begin={utc:%Y-%m-%dT%H:%M} job.sh" in r.out
    off = local.utcoffset().total_seconds() / 3600  # type: ignore[union-attr]
    assert f"{local:%Y-%m-%d %H:%M} {local.tzname()} (UTC{off:+03.0f}:00; {utc:%H:%M} UTC)" in r.out
    assert f"{local:%H:%M} comes twice in {tz} that night (clocks go back from" in r.out


def test_when_a_start_after_clocks_go_forward_gives_the_real_wait(
    env: dict[str, str], tmp_path: Path
) -> None:
    """2023-03-26 in Madrid: 02:00 CET jumps to 03:00 CEST. Submitted at 01:00 CET, a 03:00 CEST start is
    one hour later, not two: the line has its offset, and now+N counts the real hour."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    env = _zone_env(env, tmp_path, "ES", "Europe/Madrid")
    assert run_cocaq(["carbon", "import", ES_SPRING], env).code == 0
    at = "2023-03-26T00:00Z"
    a = datetime.fromisoformat(at).timestamp()
    start, g = _exact_best(_lca(ES_SPRING), a, 1.0, 3.0)
    local = datetime.fromtimestamp(start, UTC).astimezone(ZoneInfo("Europe/Madrid"))
    assert (start - a, f"{local:%H:%M %Z}") == (3600.0, "03:00 CEST")  # the case
    r = run_cocaq(["carbon", "when", "--hours", "1", "--within", "3h", "--at", at, "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["best"]["g_per_kwh"] == pytest.approx(g)
    assert d["sbatch"] == "sbatch --begin=2023-03-26T03:00"  # shown once: Slurm reads it right
    b = d["begin"]
    assert (b["ambiguous"], b["relative"], b["abbreviation"], b["utc_offset"]) == (
        False,
        "now+1hour",
        "CEST",
        "UTC+02:00",
    )
    r = run_cocaq(["carbon", "when", "--hours", "1", "--within", "3h", "--at", at], env)
    assert r.code == 0, r.err
    assert "Best start: 2023-03-26 03:00 CEST (UTC+02:00; 01:00 UTC)" in r.out
    assert "  sbatch --begin=2023-03-26T03:00 job.sh" in r.out
    assert "Europe/Madrid time, as Slurm reads it; or --begin=now+1hour if you submit at 01:00 CET." in r.out
    assert (
        "clocks go forward from 02:00 CET to 03:00 CEST on 2023-03-26: the start is 1 h after 01:00 CET, "
        in r.out
    )
    assert "not the 2 h the wall clock shows" in r.out


def test_when_a_start_just_after_the_repeated_hour_keeps_its_wall_time(
    env: dict[str, str], tmp_path: Path
) -> None:
    """03:00 CET on 2023-10-29 is shown once: the plain line, its offset, and a wait that counts the
    hour the clocks went back."""
    env = _zone_env(env, tmp_path, "ES", "Europe/Madrid")
    assert run_cocaq(["carbon", "import", ES_AUTUMN], env).code == 0
    r = run_cocaq(["carbon", "when", "--hours", "1", "--within", "3h", "--at", "2023-10-29T00:00Z"], env)
    assert r.code == 0, r.err
    assert "Best start: 2023-10-29 03:00 CET (UTC+01:00; 02:00 UTC)" in r.out
    assert "  sbatch --begin=2023-10-29T03:00 job.sh" in r.out and "TZ=UTC" not in r.out
    assert "or --begin=now+2hours if you submit at 02:00 CEST." in r.out
    assert "the start is 2 h after 02:00 CEST, not the 1 h the wall clock shows" in r.out


def test_when_a_window_past_the_series_end_keeps_the_hours_it_covers(env: dict[str, str]) -> None:
    """The slice ends 2023-07-04 00:00 UTC: from 2023-07-03 18:00 a 6 h job's first hours are the series'
    own, only the hours after its end come from the typical day, and the answer says which."""
    from datetime import UTC, datetime

    assert run_cocaq(["carbon", "import", ES], env).code == 0
    values = _es_lca()
    end = datetime(2023, 7, 4, tzinfo=UTC).timestamp()
    at = datetime(2023, 7, 3, 18, tzinfo=UTC).timestamp()
    coming: dict[float, float] = {}
    for k in range(6 + 24 + 1):
        t = at + 3600 * k
        if t < end:
            coming[t] = values[t]
        else:  # the mean of the same UTC hour on the series' days before it
            same = [v for u, v in values.items() if (t - u) % 86400 == 0 and u < t]
            coming[t] = sum(same) / len(same)
    start, g, now = _best(coming, at, 6, 24)
    assert now == pytest.approx(sum(values[at + 3600 * k] for k in range(6)) / 6)  # all six from the series
    r = run_cocaq(["carbon", "when", "--hours", "6", "--at", "2023-07-03T18:00", "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["source"] == "mixed"
    assert d["now_g_per_kwh"] == pytest.approx(now)
    assert d["best"]["g_per_kwh"] == pytest.approx(g)
    assert datetime.fromisoformat(d["best"]["start"]).timestamp() == start
    assert d["spans"] == [
        {"start": "2023-07-03T18:00:00+00:00", "end": "2023-07-04T00:00:00+00:00", "source": "series"},
        {"start": "2023-07-04T00:00:00+00:00", "end": "2023-07-05T00:00:00+00:00", "source": "typical"},
    ]
    assert d["best"]["hours_from"] == {"typical": 6.0}
    # a start 3 h before the end: half of its hours from each
    r = run_cocaq(
        ["carbon", "when", "--hours", "6", "--within", "0h", "--at", "2023-07-03T21:00", "-o", "json"], env
    )
    d = json.loads(r.out)
    assert d["best"]["hours_from"] == {"series": 3.0, "typical": 3.0}
    half = [values[at + 3600 * k] for k in range(3, 6)]
    later = [
        sum(v for u, v in values.items() if (t - u) % 86400 == 0) / 4 for t in (end, end + 3600, end + 7200)
    ]
    assert d["now_g_per_kwh"] == pytest.approx(sum(half + later) / 6)
    r = run_cocaq(["carbon", "when", "--hours", "6", "--at", "2023-07-03T18:00"], env)
    assert r.code == 0, r.err
    assert "Zone ES (lca), hour by hour:" in r.out
    assert "  2023-07-03 18:00 to 2023-07-04 00:00 UTC (6 h): the imported lca series" in r.out
    assert "  2023-07-04 00:00 to 2023-07-05 00:00 UTC (24 h): a typical day" in r.out
    assert "(all of it from the typical day)" in r.out
