"""Default carbon intensities read from codecarbon's installed data files, checked against those files."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cocaq.carbon import zones as carbon
from cocaq.errors import ConfigError

_SPEC = importlib.util.find_spec("codecarbon")
assert _SPEC is not None and _SPEC.submodule_search_locations, "codecarbon is not installed"
DATA = Path(_SPEC.submodule_search_locations[0]) / "data" / "private_infra"
VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"


def _json(name: str) -> Any:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def _clear_caches() -> None:
    for name in dir(carbon):
        clear = getattr(getattr(carbon, name), "cache_clear", None)
        if clear is not None:
            clear()


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    _clear_caches()
    yield
    _clear_caches()


def test_country_from_global_energy_mix() -> None:
    row = _json("global_energy_mix.json")["FRA"]
    got = carbon.zone_intensity("FRA")
    assert got.zone == "FRA"
    assert got.g_per_kwh == row["carbon_intensity"]
    assert got.year == row["year"]
    assert got.flag is None
    assert "global_energy_mix.json" in got.source


def test_source_names_installed_version() -> None:
    from importlib.metadata import version

    assert carbon.zone_intensity("FRA").source.startswith(f"codecarbon {version('codecarbon')}: ")


@pytest.mark.parametrize("spelling", ["FR", "fra", " FRA ", "fr", "Fra"])
def test_country_aliases(spelling: str) -> None:
    assert carbon.zone_intensity(spelling) == carbon.zone_intensity("FRA")


def test_us_state_converted_from_lbs_per_mwh() -> None:
    lbs_per_mwh = _json("2023/usa_emissions.json")["california"]["emissions"]
    got = carbon.zone_intensity("USA-CA")
    assert got.zone == "USA-CA"
    # 1 lb = 453.59237 g and 1 MWh = 1000 kWh
    assert got.g_per_kwh == pytest.approx(lbs_per_mwh * 453.59237 / 1000, rel=1e-12)
    assert got.year == 2023
    assert got.flag is None


@pytest.mark.parametrize(
    "spelling", ["US-CA", "usa-ca", "US-California", "USA-california", " us-CALIFORNIA "]
)
def test_us_state_aliases(spelling: str) -> None:
    assert carbon.zone_intensity(spelling) == carbon.zone_intensity("USA-CA")


def test_us_state_with_multiword_name() -> None:
    assert carbon.zone_intensity("US-new york").zone == "USA-NY"
    assert carbon.zone_intensity("USA-District of Columbia").zone == "USA-DC"


def test_canadian_province_from_generation_mix() -> None:
    mix = _json("2023/canada_energy_mix.json")["alberta"]
    per_source = _json("carbon_intensity_per_source.json")
    expected = (
        mix["coal"] * per_source["coal"]
        + mix["petroleum"] * per_source["petroleum"]
        + mix["naturalGas"] * per_source["natural_gas"]
    ) / mix["total"]
    got = carbon.zone_intensity("CAN-AB")
    assert got.zone == "CAN-AB"
    assert got.g_per_kwh == pytest.approx(expected, rel=1e-12)
    assert got.year == 2023


def test_canadian_province_close_to_codecarbon_own_factors() -> None:
    # codecarbon's own code uses unrounded factors (kg/kWh); ours, from the JSON, agree within 0.2 %.
    mix = _json("2023/canada_energy_mix.json")["saskatchewan"]
    codecarbon_g = (
        1000
        * (mix["coal"] * 0.995725971 + mix["petroleum"] * 0.8166885263 + mix["naturalGas"] * 0.7438415916)
        / mix["total"]
    )
    assert carbon.zone_intensity("CAN-SK").g_per_kwh == pytest.approx(codecarbon_g, rel=2e-3)


@pytest.mark.parametrize("spelling", ["CA-QC", "can-qc", "CAN-quebec", "CA-Quebec"])
def test_canadian_province_aliases(spelling: str) -> None:
    assert carbon.zone_intensity(spelling) == carbon.zone_intensity("CAN-QC")
    assert carbon.zone_intensity(spelling).zone == "CAN-QC"


def test_every_province_in_file_is_known() -> None:
    provinces = {z for z in carbon.known_zones() if z.startswith("CAN-")}
    assert len(provinces) == len(_json("2023/canada_energy_mix.json"))


def test_nordic_bidding_zone() -> None:
    row = _json("nordic_emissions.json")["data"]["SE3"]
    got = carbon.zone_intensity("se3")
    assert got.zone == "SE3"
    assert got.g_per_kwh == row["emission_factor"]
    assert got.year == row["year"]
    assert "nordic_emissions.json" in got.source


def test_fi_prefers_nordic_file_fin_uses_global() -> None:
    nordic = _json("nordic_emissions.json")["data"]["FI"]
    fi = carbon.zone_intensity("FI")
    assert (fi.zone, fi.g_per_kwh) == ("FI", nordic["emission_factor"])
    assert "nordic_emissions.json" in fi.source
    fin = carbon.zone_intensity("FIN")
    assert (fin.zone, fin.g_per_kwh) == ("FIN", _json("global_energy_mix.json")["FIN"]["carbon_intensity"])


def test_unknown_zone_gets_world_average_and_flag() -> None:
    got = carbon.zone_intensity("Atlantis")
    assert got.g_per_kwh == 475
    assert got.flag == "unknown-zone"
    assert got.zone == "Atlantis"
    assert carbon.zone_intensity("US-XX").flag == "unknown-zone"
    assert carbon.zone_intensity("CAN-atlantis").flag == "unknown-zone"
    assert carbon.zone_intensity("QQ").flag == "unknown-zone"


@pytest.mark.parametrize("spelling", ["WORLD", "world", " World "])
def test_world_is_not_flagged(spelling: str) -> None:
    got = carbon.zone_intensity(spelling)
    assert (got.zone, got.g_per_kwh, got.flag) == ("WORLD", 475, None)


def test_world_average_constant() -> None:
    assert _json("carbon_intensity_per_source.json")["world_average"] == 475
    assert carbon.WORLD_AVERAGE_G_PER_KWH == 475


def test_known_zones() -> None:
    zones = carbon.known_zones()
    assert zones == sorted(zones)
    assert len(zones) == len(set(zones))
    assert {"FRA", "USA-CA", "CAN-QC", "SE3", "FI", "WORLD"} <= set(zones)
    assert "USA-USA" not in zones and "US-USA" not in zones
    for zone in zones:  # every listed code resolves to itself, unflagged
        got = carbon.zone_intensity(zone)
        assert (got.zone, got.flag) == (zone, None)


def test_co2_grams() -> None:
    from cocaq.units import co2_grams  # (its one definition: tests/test_formulas.py)

    assert co2_grams(3.6e6, 1.5, 400) == pytest.approx(600)
    assert co2_grams(0, 1.5, 400) == 0


def test_codecarbon_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    with pytest.raises(ConfigError, match="codecarbon is not installed"):
        carbon.zone_intensity("FRA")


@pytest.mark.parametrize(
    ("name", "content", "zone"),
    [
        ("global_energy_mix.json", "{not json", "FRA"),
        ("global_energy_mix.json", '{"FRA": {"carbon_intensity": "lots"}}', "FRA"),
        ("2023/usa_emissions.json", '{"california": {"regionCode": "CA"}}', "USA-CA"),
        ("2023/canada_energy_mix.json", '{"quebec": {"coal": 1}}', "CAN-QC"),
        ("nordic_emissions.json", '{"SE3": {}}', "SE3"),
        ("carbon_intensity_per_source.json", "[]", "WORLD"),
        ("global_energy_mix.json", None, "FRA"),  # missing
    ],
)
def test_bad_data_file_is_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, content: str | None, zone: str
) -> None:
    shutil.copytree(DATA, tmp_path, dirs_exist_ok=True)
    if content is None:
        (tmp_path / name).unlink()
    else:
        (tmp_path / name).write_text(content, encoding="utf-8")
    monkeypatch.setattr(carbon, "_codecarbon", lambda: (tmp_path, "0.0"))
    with pytest.raises(ConfigError) as info:
        carbon.zone_intensity(zone)
    message = str(info.value)
    assert str(tmp_path / name) in message
    assert "\n" not in message


def test_does_not_import_codecarbon() -> None:
    script = textwrap.dedent(
        """
        import sys
        import cocaq.carbon.zones as c
        assert c.zone_intensity("FRA").flag is None
        assert c.zone_intensity("FR").zone == "FRA"
        c.known_zones(); c.zone_intensity("USA-CA"); c.zone_intensity("CAN-QC"); c.zone_intensity("SE3")
        c.zone_intensity("nowhere"); c.WORLD_AVERAGE_G_PER_KWH
        print(sorted(m for m in sys.modules if m == "codecarbon" or m.startswith("codecarbon.")))
        """
    )
    python = VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable)
    done = subprocess.run(
        [str(python), "-c", script],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
