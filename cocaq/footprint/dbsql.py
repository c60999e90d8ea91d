"""The footprint's plain-SQL queries' spellings of what differs between PostgreSQL and SQLite, per Db.

`cocaq user` runs on every login node and its queries go through cocaq.db.dbapi (psycopg or sqlite3) as
SQL text, without SQLAlchemy: the totals (cocaq.footprint.totals) and the per-job facts
(cocaq.footprint.jobfacts) spell greatest/least, epoch seconds and a state's first word as
cocaq.db.dialect does for the Db's dialect, as the aggregator's SQLAlchemy functions (cocaq.db.sqlfuncs)
do, so that they read a job as the aggregator does. Stdlib-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cocaq.db import dialect

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db


def greatest(db: Db, *xs: str) -> str:
    return dialect.greatest(db.dialect, *xs)


def epoch(db: Db, col: str) -> str:
    """Seconds since 1970 of a timestamp column, to the microsecond (as the aggregator computes it)."""
    return dialect.epoch_exact(db.dialect, col, percent="%%")  # dbapi's SQL is psycopg's: `%%` is a `%`


def first_word(db: Db, col: str) -> str:
    """`CANCELLED by 5` -> `CANCELLED`, as the rollups read a state."""
    return dialect.first_word(db.dialect, col)


def labs_bound(within: tuple[str, ...] | None) -> tuple[str, ...]:
    """The labs (`%(in0)s`...) a query's jobs must belong to: () for no limit; a limit of no lab
    matches nothing (its one value, '', is no lab's name)."""
    return () if within is None else tuple(within) or ("",)
