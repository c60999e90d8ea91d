"""Units every layer converts between, and the one formula they all apply, defined once: standard
library only, no imports.

A core leaf, so that the carbon zones, the accounting ledger, the footprint queries and the reports all
import the same number instead of keeping copies that could drift apart (tests/test_formulas.py fails on
a new inline copy).
"""

J_PER_KWH = 3.6e6  # joules in a kilowatt-hour

# The conversions by a thousand and by an hour, named by what they convert. Integers, so that a division
# or a product gives what the literal gave (an int stays an int, `//` floors to an int); where the code
# wants a float (SQL's `/ 3600.0`, an SQLAlchemy literal, a product that must be a float), it says so
# with `float(...)` or `{S_PER_HOUR}.0`.
S_PER_HOUR = 3600  # seconds in an hour
MS_PER_S = 1000  # milliseconds in a second (Slurm's CPU times in sacct --json, timings)
NS_PER_US = 1000  # nanoseconds in a microsecond (cgroup v1's cpuacct.usage)
MILLIJOULES_PER_J = 1000  # NVML's energy counter counts millijoules
MILLIWATTS_PER_W = 1000  # NVML's power readings and limits are milliwatts
G_PER_KG = 1000  # grams in a kilogram (CO2e)
KG_PER_TONNE = 1000  # kilograms in a tonne (CO2e)
WH_PER_KWH = 1000  # watt-hours in a kilowatt-hour
KWH_PER_MWH = 1000  # kilowatt-hours in a megawatt-hour (eGRID's lb/MWh)


def co2_grams_of_kwh(kwh: float, pue: float, g_per_kwh: float) -> float:
    """CO2-equivalent grams for `kwh` drawn by the IT load: scaled by the site's PUE to what the facility
    drew, times the grid's intensity (g CO2e per kWh)."""
    return kwh * pue * g_per_kwh


def co2_grams(energy_j: float, pue: float, g_per_kwh: float) -> float:
    """CO2-equivalent grams for `energy_j` joules drawn by the IT load (co2_grams_of_kwh)."""
    return co2_grams_of_kwh(energy_j / J_PER_KWH, pue, g_per_kwh)
