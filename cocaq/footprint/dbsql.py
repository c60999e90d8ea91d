"""The footprint's plain-SQL queries' spellings of what differs between PostgreSQL and SQLite, per Db.

`cocaq user` runs on every login node and its queries go through cocaq.db.dbapi (psycopg or sqlite3) as
SQL text, without SQLAlchemy: the totals (cocaq.footprint.totals), the per-job facts
(cocaq.footprint.jobfacts, cocaq.footprint.advice_jobs) and the running jobs (cocaq.footprint.live)
spell greatest/least, epoch seconds, a state's first word, false, a JSON field, the text type and the
planner's fence as cocaq.db.dialect does for the Db's dialect, as the aggregator's SQLAlchemy functions
(cocaq.db.sqlfuncs) do, so that they read a job as the aggregator does. Stdlib-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cocaq.db import dialect

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db


def greatest(db: Db, *xs: str) -> str:
    return dialect.greatest(db.dialect, *xs)


def least(db: Db, *xs: str) -> str:
    return dialect.least(db.dialect, *xs)


def false(db: Db) -> str:
    return dialect.false(db.dialect)


def planner_fence(db: Db, before: str) -> str:
    """What keeps the planner from inlining a subquery (PostgreSQL's OFFSET 0), led by `before`."""
    return dialect.planner_fence(db.dialect, before)


def json_text(db: Db, col: str, *keys: str) -> str:
    """The text at the path of `keys` in JSON column `col`."""
    return dialect.json_text(db.dialect, col, *keys)


def text_type(db: Db) -> str:
    return dialect.text_type(db.dialect)


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


def labs_clause(col: str, within: tuple[str, ...] | None, p: dict[str, Any]) -> str:
    """` AND col IN (%(in0)s, ...)` for `within` (labs_bound), its values put in `p`; "" for no limit."""
    labs = labs_bound(within)
    p.update({f"in{i}": lab for i, lab in enumerate(labs)})
    return f" AND {col} IN ({', '.join(f'%(in{i})s' for i in range(len(labs)))})" if labs else ""
