"""The few SQL functions whose spelling differs between PostgreSQL and SQLite, as SQLAlchemy constructs.

Each compiles to the text cocaq.db.dialect spells for the dialect it is compiled for, the same text the
plain-SQL queries embed.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from cocaq.db import dialect


def _args(element: Any, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


class epoch(FunctionElement[float]):
    """Seconds since 1970 of a timestamp column (a few µs off on SQLite: cocaq.db.dialect.epoch)."""

    type = Float()
    inherit_cache = True
    name = "epoch"


@compiles(epoch)
def _epoch(element: Any, compiler: Any, **kw: Any) -> str:
    return dialect.epoch(compiler.dialect.name, _args(element, compiler, **kw))


class greatest(FunctionElement[float]):
    type = Float()
    inherit_cache = True
    name = "greatest"


class least(FunctionElement[float]):
    type = Float()
    inherit_cache = True
    name = "least"


@compiles(greatest)
def _greatest(element: Any, compiler: Any, **kw: Any) -> str:
    return dialect.greatest(compiler.dialect.name, _args(element, compiler, **kw))


@compiles(least)
def _least(element: Any, compiler: Any, **kw: Any) -> str:
    return dialect.least(compiler.dialect.name, _args(element, compiler, **kw))


class utcnow(FunctionElement[Any]):
    """The database's current time, to the microsecond's format on SQLite too (cocaq.db.dialect.utcnow)."""

    inherit_cache = True
    name = "utcnow"

    @property
    def type(self) -> Any:  # type: ignore[override]
        from cocaq.db.coltypes import UTCDateTime

        return UTCDateTime()


@compiles(utcnow)
def _utcnow(element: Any, compiler: Any, **kw: Any) -> str:
    return dialect.utcnow(compiler.dialect.name)


class epoch_exact(FunctionElement[float]):
    """Seconds since 1970 of a timestamp column, exact to the microsecond on both dialects.

    (epoch above uses julianday on SQLite, a few µs off: a job starting at midnight would count
    a hair in the day before; the rollups and cocaq.footprint.totals read the text instead, as here.)
    """

    type = Float()
    inherit_cache = True
    name = "epoch_exact"


@compiles(epoch_exact)
def _epoch_exact(element: Any, compiler: Any, **kw: Any) -> str:
    return dialect.epoch_exact(compiler.dialect.name, _args(element, compiler, **kw))


class first_word(FunctionElement[str]):
    """`CANCELLED by 5` -> `CANCELLED`, as the rollups read a state."""

    type = String()
    inherit_cache = True
    name = "first_word"


@compiles(first_word)
def _first_word(element: Any, compiler: Any, **kw: Any) -> str:
    return dialect.first_word(compiler.dialect.name, _args(element, compiler, **kw))


class floor_(FunctionElement[float]):
    """floor() of a non-negative number (SQLite may lack floor(): a cast truncates, the same there)."""

    type = Float()
    inherit_cache = True
    name = "floor_"


@compiles(floor_)
def _floor(element: Any, compiler: Any, **kw: Any) -> str:
    return dialect.floor(compiler.dialect.name, _args(element, compiler, **kw))
