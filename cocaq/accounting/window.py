"""How much of a job counts in a time window: the one formula every total over a window uses.

A job that ran across a window's edge counts in it by the share of its run time inside the window
[lo, hi) (all times seconds since 1970, UTC): its `overlap` (seconds of [t0, t0 + el) inside it) over its
run time `el`. Its energy, CO2 and every other per-job quantity count times that `share`, CPU- and GPU-hours
by the overlap itself. A job that never ran (el == 0) has no run time to split: it counts whole in the
window its start is in, and in no other. So every window made of consecutive windows adds up exactly to
the whole (a month is its days, a day is never counted twice), which is why the aggregator's daily
rollups, `cocaq user/lab` and the monthly reports can add rollup days and jobs from the edges together
and agree to the bit. A job still running counts by the run time known so far. A job "ran in" a window
when its share there is > 0 (one that ended exactly at `lo` did not). The formula is written here once,
in each form its users need, and tests/test_window_share.py holds the forms to the same numbers: Python
floats (`overlap`, `share`: the aggregator's SQLite path), SQL text (`overlap_sql`, `share_sql`: the
aggregator's PostgreSQL statement and the footprint query, which must not import SQLAlchemy on login
nodes) and SQLAlchemy expressions (`overlap_expr`, `share_expr`: the reports). Each form computes the
same floating-point operations in the same order, so they round alike. This module is stdlib-only; the
SQLAlchemy forms import it when called. (The model statistics, cocaq.footprint.by_model, deliberately
count a run whole in the window it ended in: epochs and tokens belong to the whole run.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cocaq.db import dialect as sql


def overlap(t0: float, el: float, lo: float, hi: float) -> float:
    """Seconds of a run [t0, t0 + el) inside [lo, hi); `el` already >= 0."""
    return max(0.0, min(t0 + el, hi) - max(t0, lo))


def share(t0: float, el: float, lo: float, hi: float) -> float:
    """The share of a job (start t0, run time el >= 0) that counts in [lo, hi), 0.0 to 1.0."""
    if el > 0:
        return overlap(t0, el, lo, hi) / el
    return 1.0 if lo <= t0 < hi else 0.0


# --- SQL text --------------------------------------------------------------------------------------------


def overlap_sql(t0: str, el: str, lo: str, hi: str, dialect: str) -> str:
    """`overlap` in SQL; the arguments are SQL expressions (float seconds), `dialect` "postgresql" or
    "sqlite" (cocaq.db.dialect spells greatest and least)."""
    ends = f"{sql.least(dialect, f'{t0} + {el}', hi)} - {sql.greatest(dialect, t0, lo)}"
    return sql.greatest(dialect, "0.0", ends)


def share_sql(t0: str, el: str, ov: str, windows: Sequence[tuple[str, str]]) -> str:
    """`share` in SQL, given `ov`, the job's overlap with the windows (an expression or a column holding
    `overlap_sql`, summed over the windows where there are several disjoint ones). A job without run time
    counts whole where its start is in one of `windows`; none: nowhere."""
    if len(windows) == 1:
        starts_in = f"{t0} >= {windows[0][0]} AND {t0} < {windows[0][1]}"
    else:
        starts_in = " OR ".join(f"({t0} >= {lo} AND {t0} < {hi})" for lo, hi in windows) or "1 = 0"
    return f"CASE WHEN {el} > 0 THEN {ov} / {el} WHEN {starts_in} THEN 1.0 ELSE 0.0 END"


# --- SQLAlchemy ------------------------------------------------------------------------------------------


def _float(x: Any) -> Any:
    from sqlalchemy import Float, literal

    return literal(x, Float) if isinstance(x, (int, float)) else x


def overlap_expr(t0: Any, el: Any, lo: Any, hi: Any) -> Any:
    """`overlap` as a SQLAlchemy expression (columns, or floats bound as literals)."""
    from cocaq.db.sqlfuncs import greatest, least

    return greatest(_float(0.0), least(t0 + el, _float(hi)) - greatest(t0, _float(lo)))


def share_expr(t0: Any, el: Any, ov: Any, lo: Any, hi: Any) -> Any:
    """`share` as a SQLAlchemy expression, given `ov` (`overlap_expr`, or a column holding it)."""
    from sqlalchemy import and_, case

    return case((el > 0, ov / el), (and_(t0 >= _float(lo), t0 < _float(hi)), _float(1.0)), else_=_float(0.0))
