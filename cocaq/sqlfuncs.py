"""The few SQL functions whose spelling differs between PostgreSQL and SQLite."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float
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
        from cocaq.dbtypes import UTCDateTime

        return UTCDateTime()


@compiles(utcnow, "sqlite")
def _utcnow_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"


@compiles(utcnow)
def _utcnow_default(element: Any, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"
