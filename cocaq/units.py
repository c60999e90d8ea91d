"""Units every layer converts between, defined once: standard library only, constants only.

A core leaf, so that the carbon zones, the accounting ledger, the footprint queries and the reports all
import the same number instead of keeping copies that could drift apart.
"""

J_PER_KWH = 3.6e6  # joules in a kilowatt-hour
