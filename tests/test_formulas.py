"""One definition per formula (issue 37, point 1): CO2 = kWh x PUE x intensity is cocaq.units.co2_grams
(and co2_grams_of_kwh), joules per kWh is cocaq.units.J_PER_KWH. This fails on a new inline copy, in the
style of tests/test_layers.py (which it follows: every module of the package, the component folders too)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cocaq.units import J_PER_KWH, co2_grams, co2_grams_of_kwh

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ("cocaq", "collector", "prolog_epilog", "reports", "migrations")
HOME = ROOT / "cocaq" / "units.py"

COPIES = {
    # PUE times an intensity, or the other way round, on one line: the CO2 formula written out again
    "CO2 = kWh x PUE x intensity": re.compile(
        r"\bpue\b.*\*.*(g_per_kwh|intensity)|(g_per_kwh|intensity)\b.*\*.*\bpue\b"
    ),
    "joules per kWh": re.compile(r"(?<![\w.])3\.6e6\b|(?<![\w.])3_600_000(\.0)?\b|(?<![\w.])3600000(\.0)?\b"),
    "J_PER_KWH defined again": re.compile(r"^\s*J_PER_KWH\s*[:=]"),
}


def sources() -> list[Path]:
    out = []
    for top in PACKAGE:
        out += sorted((ROOT / top).rglob("*.py"))
    return [p for p in out if p.resolve() != HOME.resolve() and "__pycache__" not in p.parts]


def copies(path: Path) -> list[str]:
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        for what, pattern in COPIES.items():
            if pattern.search(code):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{where}:{n}: {what}: {line.strip()}")
    return found


def test_no_module_writes_these_formulas_out_again() -> None:
    found = [c for p in sources() for c in copies(p)]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_copy(tmp_path: Path) -> None:
    """The test itself: each pattern catches the copies it is for, and not the calls that replace them."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "co2_kg = energy_j / J_PER_KWH * pue * g_per_kwh / 1000\n"
        "g = kwh * c.carbon_g_per_kwh * c.pue\n"
        "kwh = energy_j / 3.6e6\n"
        "J_PER_KWH = 3_600_000.0\n"
        "co2 = co2_grams(energy_j, pue, g_per_kwh)  # pue * g_per_kwh in a comment is fine\n"
    )
    found = copies(bad)
    assert [f.split(": ")[1] for f in found] == [
        "CO2 = kWh x PUE x intensity", "CO2 = kWh x PUE x intensity", "joules per kWh", "joules per kWh",
        "J_PER_KWH defined again",
    ], found  # fmt: skip


@pytest.mark.parametrize(("j", "pue", "g"), [(3.6e6, 1.0, 100.0), (1.8e7, 1.35, 56.0), (0.0, 2.0, 400.0)])
def test_the_formula(j: float, pue: float, g: float) -> None:
    assert co2_grams(j, pue, g) == co2_grams_of_kwh(j / J_PER_KWH, pue, g) == j / J_PER_KWH * pue * g
