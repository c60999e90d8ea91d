"""The few SQL spellings that differ between PostgreSQL and SQLite in the footprint's plain-SQL queries.

`cocaq user` runs on every login node and its queries go through cocaq.db.dbapi (psycopg or sqlite3) as
SQL text, without SQLAlchemy (whose dialect-aware functions, cocaq.db.sqlfuncs, the ORM paths use): the
totals (cocaq.footprint.totals) and the per-job facts (cocaq.footprint.jobfacts) spell greatest/least,
epoch seconds and a state's first word here, the same way, so that they read a job as the aggregator
does. Stdlib-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db


def greatest(db: Db, *xs: str) -> str:
    return f"{'greatest' if db.dialect == 'postgresql' else 'max'}({', '.join(xs)})"


def epoch(db: Db, col: str) -> str:
    """Seconds since 1970 of a timestamp column, to the microsecond (as the aggregator computes it)."""
    if db.dialect == "postgresql":
        # date_part is float8 arithmetic on the microseconds, extract(...)::float8 (the rollups') goes
        # through numeric: both round the same exact value to the nearest double; date_part is cheaper.
        return f"date_part('epoch', {col})"
    # SQLite keeps naive UTC text: whole seconds by strftime, the fraction from the text (julianday
    # would round to the millisecond and land a job starting at midnight a hair into the day before).
    return (
        f"(CAST(strftime('%%s', {col}) AS INTEGER)"
        f" + CASE WHEN length({col}) > 19 THEN CAST(substr({col}, 20) AS REAL) ELSE 0.0 END)"
    )


def first_word(db: Db, col: str) -> str:
    """`CANCELLED by 5` -> `CANCELLED`, as the rollups read a state."""
    if db.dialect == "postgresql":
        return f"split_part(coalesce({col}, ''), ' ', 1)"
    return (
        f"CASE WHEN instr(coalesce({col}, ''), ' ') > 0 THEN substr({col}, 1, instr({col}, ' ') - 1)"
        f" ELSE coalesce({col}, '') END"
    )


def labs_bound(within: tuple[str, ...] | None) -> tuple[str, ...]:
    """The labs (`%(in0)s`...) a query's jobs must belong to: () for no limit; a limit of no lab
    matches nothing (its one value, '', is no lab's name)."""
    return () if within is None else tuple(within) or ("",)
