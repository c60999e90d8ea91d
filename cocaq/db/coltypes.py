"""Column types shared by the ORM models and the Core-only query paths (which must not import the ORM)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps stored in UTC and always read back timezone-aware (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: cocaq stores only timezone-aware times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@overload
def as_utc(d: datetime) -> datetime: ...
@overload
def as_utc(d: None) -> None: ...
def as_utc(d: datetime | None) -> datetime | None:
    """A time from a query that UTCDateTime did not type (a raw SQL column): naive means UTC."""
    if d is None:
        return None
    return d.replace(tzinfo=UTC) if d.tzinfo is None else d
