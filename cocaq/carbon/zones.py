"""Default grid carbon intensity per zone, from the data files that ship with codecarbon.

The JSON files are read straight from the installed package's data folder: importing codecarbon is slow
and heavy, and a report over last month's jobs needs only a few numbers from it. Zones are ISO3 countries
(`FRA`), US states (`USA-CA`), Canadian provinces (`CAN-QC`), Nordic bidding zones (`SE3`) and `WORLD`.
An unknown zone never raises: it gets the world average and the flag "unknown-zone", so one typo in a
node group does not stop a monthly report, yet the report can say which figures are guesses.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cocaq.errors import ConfigError
from cocaq.units import KWH_PER_MWH

G_PER_LB = 453.59237  # exact, by the 1959 international yard and pound agreement

# Paths inside codecarbon's package folder.
_DATA_DIR = "data/private_infra"
_GLOBAL = "global_energy_mix.json"
_PER_SOURCE = "carbon_intensity_per_source.json"
_USA = "2023/usa_emissions.json"
_CANADA = "2023/canada_energy_mix.json"
_NORDIC = "nordic_emissions.json"
_CANADA_YEAR = 2023  # the data folder's vintage; the file itself carries no year

# Canada's mix keys -> carbon_intensity_per_source.json keys. Only fossil sources count, as in codecarbon's
# own `_region_energy_mix_to_emissions_rate`: hydro, nuclear, wind, solar and biomass count as zero.
_CANADA_SOURCES = {"coal": "coal", "petroleum": "petroleum", "naturalGas": "natural_gas"}

_PROVINCE_CODES = {
    "alberta": "AB",
    "british columbia": "BC",
    "manitoba": "MB",
    "new brunswick": "NB",
    "newfoundland and labrador": "NL",
    "northwest territories": "NT",
    "nova scotia": "NS",
    "nunavut": "NU",
    "ontario": "ON",
    "prince edward island": "PE",
    "quebec": "QC",
    "saskatchewan": "SK",
    "yukon": "YT",
}

# A zone id as a series is stored under: codecarbon's (FRA, USA-CA, CAN-QC, SE3, WORLD), Electricity Maps'
# (DE, SE3, DK-DK1, US-CAL-CISO, US-MIDA-PJM) or a site's own (HAL-DC): ASCII letters and digits in parts
# joined by `-` or `_`. Nothing else, so a zone cannot be a path (`../X`), carry a quote or a control
# character into a report or a CSV, or be a sentence; 32 characters is twice the longest real id.
ZONE_MAX = 32
ZONE_RULE = f"letters and digits joined by - or _, at most {ZONE_MAX} characters (FR, SE3, US-CAL-CISO)"
_ZONE = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*", re.ASCII)

WORLD_AVERAGE_G_PER_KWH: float  # read on first use (see __getattr__), so importing never touches disk


@dataclass(frozen=True)
class Intensity:
    """A grid carbon intensity and where it came from, so reports can cite it."""

    zone: str  # canonical code; for an unknown zone, the zone as given (stripped), so a report can name it
    g_per_kwh: float
    source: str
    year: int | None  # the year the figure refers to
    flag: str | None = None  # "unknown-zone": not found, world average used


def __getattr__(name: str) -> Any:
    if name == "WORLD_AVERAGE_G_PER_KWH":
        return _world().g_per_kwh
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def valid_zone(zone: str) -> bool:
    """Whether `zone` (stripped) is a zone id by ZONE_RULE: every real form, and no path, quote or control."""
    z = zone.strip()
    return len(z) <= ZONE_MAX and _ZONE.fullmatch(z) is not None


def zone_intensity(zone: str) -> Intensity:
    """The default intensity for `zone` (any case; ISO2, state and province names accepted).

    Raises ConfigError only when codecarbon's data cannot be read, never for an unknown zone.
    """
    found = _resolve(" ".join(zone.split()).upper())
    if found is not None:
        return found
    world = _world()
    return Intensity(
        zone=zone.strip(),
        g_per_kwh=world.g_per_kwh,
        source=world.source,
        year=world.year,
        flag="unknown-zone",
    )


def known_zones() -> list[str]:
    """Every canonical zone code, sorted."""
    zones = {"WORLD", *_countries(), *_nordic()}
    zones.update(i.zone for i in _us_states().values())
    zones.update(i.zone for i in _provinces().values())
    return sorted(zones)


def _resolve(key: str) -> Intensity | None:
    """Look up a stripped, upper-cased zone."""
    if key == "WORLD":
        return _world()
    prefix, dash, region = key.partition("-")
    if dash:
        region = " ".join(region.replace("_", " ").replace("-", " ").split())
        if prefix in ("US", "USA"):
            return _us_states().get(region)
        if prefix in ("CA", "CAN"):
            return _provinces().get(region)
        return None
    if len(key) == 3 and key.isalpha():
        return _countries().get(key)
    if key in _nordic():  # before ISO2, so FI is the Nordic zone rather than FIN
        return _nordic()[key]
    if len(key) == 2 and key.isalpha():
        iso3 = _iso3(key)
        return _countries().get(iso3) if iso3 else None
    return None


@functools.cache
def _iso3(iso2: str) -> str | None:
    import pycountry  # codecarbon depends on it; imported here as most lookups never need it

    country = pycountry.countries.get(alpha_2=iso2)
    return str(country.alpha_3) if country is not None else None


@functools.cache
def _codecarbon() -> tuple[Path, str]:
    """codecarbon's data folder and version, found without importing it (find_spec runs no package code)."""
    try:
        spec = importlib.util.find_spec("codecarbon")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ConfigError("codecarbon is not installed; cocaq reads its default carbon intensities from it")
    try:
        version = importlib.metadata.version("codecarbon")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("codecarbon's distribution metadata is missing; reinstall codecarbon") from None
    return Path(locations[0]) / _DATA_DIR, version


def _path(name: str) -> Path:
    return _codecarbon()[0] / name


def _source(name: str, detail: str) -> str:
    return f"codecarbon {_codecarbon()[1]}: {name} ({detail})"


@functools.cache
def _load(name: str) -> Any:
    path = _path(name)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read codecarbon data file {path}: {e.strerror or e}") from None
    except ValueError as e:  # bad JSON or bad UTF-8
        raise ConfigError(f"codecarbon data file {path} is not valid JSON: {e}") from None


@contextmanager
def _parsing(name: str) -> Iterator[None]:
    """Turn a surprise in a file's structure into one line that names the file."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ConfigError(f"unexpected content in codecarbon data file {_path(name)}: {e!r}") from None


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} is {value!r}, not a non-negative number")
    return float(value)


def _year(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@functools.cache
def _world() -> Intensity:
    data = _load(_PER_SOURCE)
    with _parsing(_PER_SOURCE):
        g = _number(data["world_average"], "world_average")
    return Intensity("WORLD", g, _source(_PER_SOURCE, "world_average, IEA"), None)


@functools.cache
def _countries() -> dict[str, Intensity]:
    data = _load(_GLOBAL)
    out: dict[str, Intensity] = {}
    with _parsing(_GLOBAL):
        for iso3, row in data.items():
            if row.get("carbon_intensity") is None:  # codecarbon would rebuild it from the mix; rare enough
                continue
            g = _number(row["carbon_intensity"], f"{iso3} carbon_intensity")
            out[iso3.upper()] = Intensity(
                iso3.upper(), g, _source(_GLOBAL, "Our World in Data"), _year(row.get("year"))
            )
    return out


@functools.cache
def _us_states() -> dict[str, Intensity]:
    """Keyed by both the 2-letter code and the upper-cased name."""
    data = _load(_USA)
    out: dict[str, Intensity] = {}
    with _parsing(_USA):
        if data.get("_unit", {}).get("emissions", "lbs/MWh") != "lbs/MWh":
            raise ValueError(f"emissions unit is {data['_unit']['emissions']!r}, not 'lbs/MWh'")
        meta = data.get("_source", {})
        source = _source(_USA, str(meta.get("name", "EPA eGRID")))
        year = _year(meta.get("year"))
        for name, row in data.items():
            if name.startswith("_") or name.lower() == "usa":  # the national figure: USA comes from OWID
                continue
            code = row.get("regionCode") or _state_code(name)
            if not (isinstance(code, str) and len(code) == 2):
                raise ValueError(f"no 2-letter code for state {name!r}")
            g = _number(row["emissions"], f"{name} emissions") * G_PER_LB / KWH_PER_MWH  # lb/MWh -> g/kWh
            intensity = Intensity(f"USA-{code.upper()}", g, source, year)
            out[code.upper()] = intensity
            out[" ".join(name.split()).upper()] = intensity
    return out


def _state_code(name: str) -> str | None:
    """A state's code for a file entry that lacks regionCode."""
    import pycountry

    for sub in pycountry.subdivisions.get(country_code="US") or []:
        if str(sub.name).lower() == name.lower():
            return str(sub.code).removeprefix("US-")
    return None


@functools.cache
def _provinces() -> dict[str, Intensity]:
    """Keyed by both the 2-letter code and the upper-cased name."""
    data = _load(_CANADA)
    factors = _load(_PER_SOURCE)
    out: dict[str, Intensity] = {}
    source = _source(_CANADA, f"generation mix x {_PER_SOURCE}, fossil sources only as codecarbon does")
    with _parsing(_CANADA):
        for name, mix in data.items():
            code = _PROVINCE_CODES.get(name.lower())
            if code is None:
                raise ValueError(f"unknown province {name!r}")
            total = _number(mix["total"], f"{name} total")
            if total == 0:
                raise ValueError(f"{name} total is 0")
            g = 0.0
            for mix_key, factor_key in _CANADA_SOURCES.items():
                share = _number(mix.get(mix_key, 0), f"{name} {mix_key}")
                with _parsing(_PER_SOURCE):
                    factor = _number(factors[factor_key], factor_key)
                g += share / total * factor
            intensity = Intensity(f"CAN-{code}", g, source, _CANADA_YEAR)
            out[code] = intensity
            out[name.upper()] = intensity
    return out


@functools.cache
def _nordic() -> dict[str, Intensity]:
    data = _load(_NORDIC)
    out: dict[str, Intensity] = {}
    with _parsing(_NORDIC):
        for zone, row in data["data"].items():
            if row.get("unit", "gCO2eq/kWh") != "gCO2eq/kWh":
                raise ValueError(f"{zone} unit is {row['unit']!r}, not 'gCO2eq/kWh'")
            detail = str(row.get("description") or f"bidding zone {zone}")
            if zone.upper() == "FI":
                detail += f", preferred over FIN in {_GLOBAL}"
            g = _number(row["emission_factor"], f"{zone} emission_factor")
            out[zone.upper()] = Intensity(zone.upper(), g, _source(_NORDIC, detail), _year(row.get("year")))
    return out
