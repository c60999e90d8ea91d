"""The few SQL functions whose spelling differs between PostgreSQL and SQLite."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement


class epoch(FunctionElement[float]):
    """Seconds since 1970 of a timestamp column."""

    type = Float()
    inherit_cache = True
    name = "epoch"


@compiles(epoch, "postgresql")
def _epoch_pg(element: Any, compiler: Any, **kw: Any) -> str:
    return f"EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)})"


@compiles(epoch, "sqlite")
def _epoch_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return f"((julianday({compiler.process(element.clauses, **kw)}) - 2440587.5) * 86400.0)"


class greatest(FunctionElement[float]):
    type = Float()
    inherit_cache = True
    name = "greatest"


class least(FunctionElement[float]):
    type = Float()
    inherit_cache = True
    name = "least"


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


@compiles(least, "sqlite")
def _least_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return f"min({compiler.process(element.clauses, **kw)})"


@compiles(greatest)
def _greatest_default(element: Any, compiler: Any, **kw: Any) -> str:
    return f"GREATEST({compiler.process(element.clauses, **kw)})"


@compiles(least)
def _least_default(element: Any, compiler: Any, **kw: Any) -> str:
    return f"LEAST({compiler.process(element.clauses, **kw)})"


class utcnow(FunctionElement[Any]):
    """The database's current time, to the microsecond's format on SQLite too.

    SQLite's CURRENT_TIMESTAMP is "YYYY-MM-DD HH:MM:SS", which compares as a string *below* the same
    second as SQLAlchemy stores it ("...:SS.000000"); change detection by timestamp needs one format.
    """

    inherit_cache = True
    name = "utcnow"

    @property
    def type(self) -> Any:  # type: ignore[override]
        from cocaq.db.coltypes import UTCDateTime

        return UTCDateTime()


@compiles(utcnow, "sqlite")
def _utcnow_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"


@compiles(utcnow)
def _utcnow_default(element: Any, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


class epoch_exact(FunctionElement[float]):
    """Seconds since 1970 of a timestamp column, exact to the microsecond on both dialects.

    (epoch above uses julianday on SQLite, a few µs off: a job starting at midnight would count
    a hair in the day before; the rollups and cocaq.footprint.totals read the text instead, as here.)
    """

    type = Float()
    inherit_cache = True
    name = "epoch_exact"


@compiles(epoch_exact, "postgresql")
def _epoch_exact_pg(element: Any, compiler: Any, **kw: Any) -> str:
    return f"CAST(EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)}) AS DOUBLE PRECISION)"


@compiles(epoch_exact, "sqlite")
def _epoch_exact_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    col = compiler.process(element.clauses, **kw)
    return (
        f"(CAST(strftime('%s', {col}) AS INTEGER)"
        f" + CASE WHEN length({col}) > 19 THEN CAST(substr({col}, 20) AS REAL) ELSE 0.0 END)"
    )


class first_word(FunctionElement[str]):
    """`CANCELLED by 5` -> `CANCELLED`, as the rollups read a state."""

    type = String()
    inherit_cache = True
    name = "first_word"


@compiles(first_word, "postgresql")
def _first_word_pg(element: Any, compiler: Any, **kw: Any) -> str:
    return f"split_part(coalesce({compiler.process(element.clauses, **kw)}, ''), ' ', 1)"


@compiles(first_word, "sqlite")
def _first_word_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    c = compiler.process(element.clauses, **kw)
    return (
        f"CASE WHEN instr(coalesce({c}, ''), ' ') > 0 THEN substr({c}, 1, instr({c}, ' ') - 1)"
        f" ELSE coalesce({c}, '') END"
    )


class floor_(FunctionElement[float]):
    """floor() of a non-negative number (SQLite may lack floor(): a cast truncates, the same there)."""

    type = Float()
    inherit_cache = True
    name = "floor_"


@compiles(floor_, "postgresql")
def _floor_pg(element: Any, compiler: Any, **kw: Any) -> str:
    return f"floor({compiler.process(element.clauses, **kw)})"


@compiles(floor_, "sqlite")
def _floor_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS INTEGER)"
