"""Units every layer converts between, and the one formula they all apply, defined once: standard
library only, no imports.

A core leaf, so that the carbon zones, the accounting ledger, the footprint queries and the reports all
import the same number instead of keeping copies that could drift apart (tests/test_formulas.py fails on
a new inline copy).
"""

J_PER_KWH = 3.6e6  # joules in a kilowatt-hour


def co2_grams_of_kwh(kwh: float, pue: float, g_per_kwh: float) -> float:
    """CO2-equivalent grams for `kwh` drawn by the IT load: scaled by the site's PUE to what the facility
    drew, times the grid's intensity (g CO2e per kWh)."""
    return kwh * pue * g_per_kwh


def co2_grams(energy_j: float, pue: float, g_per_kwh: float) -> float:
    """CO2-equivalent grams for `energy_j` joules drawn by the IT load (co2_grams_of_kwh)."""
    return co2_grams_of_kwh(energy_j / J_PER_KWH, pue, g_per_kwh)
