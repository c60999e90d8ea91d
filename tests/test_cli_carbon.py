"""`cocaq carbon import|zones|show`, run as real processes on real databases with real Electricity Maps data."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cocaq.carbon.zones import zone_intensity
from tests.conftest import run_cocaq

DATA = Path(__file__).resolve().parent / "data" / "carbon"
ES = str(DATA / "ES_2023_hourly_slice.csv")
CISO = str(DATA / "US-CAL-CISO_2023_hourly_slice.csv")


@pytest.fixture
def env(cli_env: dict[str, str], db_url: str, tmp_path: Path) -> dict[str, str]:
    cfg = tmp_path / "cocaq.toml"
    cfg.write_text('[cluster]\nname = "hal"\ncarbon_zone = "ES"\n[carbon]\ngap_tolerance_s = 3600\n')
    e = dict(cli_env, COCAQ_DATABASE_URL=db_url, COCAQ_CONFIG=str(cfg))
    r = run_cocaq(["db", "upgrade"], e)
    assert r.code == 0, r.err
    return e


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
    assert "ES at 2023-07-01 05:30:00 UTC (lca): 153.09 gCO2eq/kWh" in r.out
    assert "series point: the row 2023-07-01 05:00..2023-07-01 06:00 UTC" in r.out
    assert "estimated (ESTIMATED_TIME_SLICER_AVERAGE)" in r.out
    # After the end, within the hour of tolerance: the nearest value, and how far it is.
    r = run_cocaq(["carbon", "show", "ES", "--at", "2023-07-04T00:30:00Z"], env)
    assert r.code == 0 and "239.03" in r.out and "nearest series value, 30 min away (tolerance 1 h)" in r.out
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
    assert r.code == 0 and ": 184.97 gCO2eq/kWh" in r.out and "series point" in r.out, r.out
    r = run_cocaq(["carbon", "show", "US-CAL-CISO", "--at", "2023-08-17T23:10"], env)
    assert "no lca series imported for US-CAL-CISO: annual figure of USA-CA" in r.out, r.out
    r = run_cocaq(["carbon", "show", "IT-NO", "--at", "2023-08-17"], env)
    assert "world average" in r.out and f"{zone_intensity('WORLD').g_per_kwh:.2f}" in r.out


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
    assert "10.00 gCO2eq/kWh" in r.out and "series point" in r.out, r.out  # valid until the next row


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
    assert r.code == 0 and f"({madrid:%H:%M} CEST)" in r.out and d["sbatch"] in r.out


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
