"""The demo's carbon intensity: six real weeks of Spain's grid, replayed onto the demo's weeks, so that its
jobs get their CO2 by the hour and `cocaq carbon when` has hours ahead."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

DEMO_SERIES = "ES_2023-04-03_6weeks_hourly.csv"  # in cocaq/carbon/data, with its NOTICE.md


def demo_series(engine: Any, end: datetime) -> int:
    """Import six real weeks of Spain's hourly intensity (Electricity Maps, 2023) with `cocaq carbon
    import`'s parser, moved by whole weeks to end four days after `end` (weekdays and hours of the day
    kept): the demo's jobs get their CO2 by the hour and when-to-run figures, and `cocaq carbon when`
    has hours ahead. The source says it is a replay. Returns the hours written."""
    from dataclasses import replace as dc_replace
    from importlib.resources import files

    from cocaq.carbon.series_import import parse_csv, write_rows

    data = files("cocaq.carbon").joinpath("data", DEMO_SERIES).read_bytes()
    parsed = parse_csv(data, DEMO_SERIES, basis="lca")
    last = max(r.end for r in parsed.rows)
    week = 7 * 86400.0
    shift = math.ceil(((end + timedelta(days=4)).timestamp() - last) / week) * week
    parsed.rows = [dc_replace(r, start=r.start + shift, end=r.end + shift) for r in parsed.rows]
    parsed.source = "Electricity Maps ES 2023-04-03..05-14, replayed onto the demo's weeks (ODbL)"
    with engine.begin() as conn:
        write_rows(conn, parsed)
    return len(parsed.rows)
