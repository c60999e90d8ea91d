"""Engines, connections and the one-line errors for a database that is down or not migrated."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import DatabaseError as SADatabaseError

from cocaq.errors import ConfigError, DatabaseError


def mask_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparseable database URL>"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def _pg_utc(dbapi_conn: Any, _record: Any) -> None:
    """Every session in UTC, as cocaq reads and writes its times: timestamps then come back with
    datetime.UTC itself, which the job loaders keep as they are (any other zone, the server's
    'Etc/UTC' included, was converted one value at a time: 0.1 s of a heavy user's month e-mail)."""
    was = dbapi_conn.autocommit
    dbapi_conn.autocommit = True
    dbapi_conn.execute("SET TimeZone = 'UTC'")
    dbapi_conn.autocommit = was


def make_engine(url: str, *, check: bool = True) -> Engine:
    """An engine for `url`; with `check`, connect once so a dead database fails here, in one line."""
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(f"config: database_url: not a database URL: {mask_url(url)}") from None
    kwargs: dict[str, Any] = {}
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    elif u.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": int(os.environ.get("COCAQ_TEST_CONNECT_TIMEOUT", "5"))}
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(u, **kwargs)
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise ConfigError(f"config: database_url: {mask_url(url)}: {exc}") from None
    if u.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    elif u.get_backend_name() == "postgresql":
        event.listen(engine, "connect", _pg_utc)
    if check:
        try:
            with engine.connect():
                pass
        except (OperationalError, SADatabaseError) as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc).splitlines()[0]
            raise DatabaseError(f"cannot connect to database {mask_url(url)}: {reason}") from None
    return engine


def require_schema(engine: Engine) -> None:
    """Fail in one line when the database has not been migrated (`cocaq db upgrade`)."""
    try:
        present = inspect(engine).has_table("jobs")
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot read database {mask_url(str(engine.url))}: {exc}") from None
    if not present:
        raise DatabaseError(
            f"database {mask_url(engine.url.render_as_string(hide_password=False))} has no cocaq schema: "
            "run `cocaq db upgrade`"
        )


@contextmanager
def begin(engine: Engine) -> Iterator[Any]:
    with engine.begin() as conn:
        yield conn
