"""Plain DB-API connections (psycopg, sqlite3) for the login-node commands, without SQLAlchemy.

`cocaq user` runs on every login node, and importing SQLAlchemy was most of its run time; its few
read-only queries need a connection, bound parameters and nothing else. `connect()` turns the configured
`database_url` (`postgresql+psycopg://`, `postgresql://`, `sqlite:///PATH`) into one (PostgreSQL through
psycopg2 where installed, for its import time, else psycopg 3), with the same
one-line errors as `cocaq.db.engine`: a bad URL is a config error, an unreachable database exit 3 with the
password masked, a missing schema says to run `cocaq db upgrade`.

SQL is written once, in psycopg's style (`%(name)s` parameters, `%%` for a percent sign); for SQLite it
becomes `:name`. Datetimes are bound as each backend stores them: aware on PostgreSQL, naive UTC text
(`YYYY-MM-DD HH:MM:SS[.ffffff]`, as `cocaq.db.coltypes.UTCDateTime` writes) on SQLite.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from cocaq.db.pgurl import URL_PARTS as _URL
from cocaq.db.pgurl import conninfo as pg_conninfo
from cocaq.errors import ConfigError, DatabaseError

# As SQLAlchemy's make_url splits a URL (scheme, user, password, then the rest as written).
_POSTGRES = ("postgresql", "postgresql+psycopg")
_SQLITE = ("sqlite", "sqlite+pysqlite")
_PARAM = re.compile(r"%\((\w+)\)s|%%")
_PG_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
# The session: no JIT, and UTC (times come back with datetime.UTC itself, kept as they are: see
# cocaq.db.engine._pg_utc)
_PG_SESSION = "SET jit = off; SET TimeZone = 'UTC'"
_SNAPSHOT_ID = re.compile(r"[0-9A-F]{1,8}-[0-9A-F]{1,16}(-[0-9]{1,10})?")  # pg_export_snapshot()'s form
# The tables the login-node commands read: their absence means an old or empty schema.
TABLES = ("jobs", "job_energy", "job_metrics", "daily_rollups", "aggregator_state", "clusters")
_UNDEFINED = ("42P01", "42703")  # PostgreSQL's undefined_table, undefined_column
_SQLITE_UNDEFINED = ("no such table", "no such column")


def mask_url(url: str) -> str:
    """The URL with its password as `***` (as cocaq.db.engine.mask_url writes it, for the same messages)."""
    m = _URL.fullmatch(url.strip())
    if m is None:
        return "<unparseable database URL>"
    if m["password"] is None:
        return url.strip()
    return f"{m['scheme']}://{m['user']}:***@{m['rest']}"


def _sqlite_text(d: datetime) -> str:
    """A bound time as UTCDateTime stores it, but whole seconds without a fraction: then `col >= t` and
    `col < t` compare stored text of either form ('...:00' or '...:00.000000') as the times compare."""
    if d.tzinfo is None:
        raise ValueError(f"naive datetime {d!r}: cocaq binds only timezone-aware times")
    d = d.astimezone(UTC)
    return d.strftime("%Y-%m-%d %H:%M:%S.%f" if d.microsecond else "%Y-%m-%d %H:%M:%S")


class Db:
    """One connection that reads one snapshot (a read-only transaction), so that what the aggregator
    wrote and its watermark agree within a command."""

    def __init__(
        self,
        raw: Any,
        dialect: str,
        url: str,
        errors: tuple[type[Exception], ...],
        begin: str | None = None,
    ) -> None:
        self.raw = raw
        self.dialect = dialect  # "postgresql" or "sqlite", as SQLAlchemy names them
        self.url = url
        self._errors = errors
        self._begin = begin  # what opens the snapshot again after a rollback (None: the driver does)

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement with bound parameters; driver errors become one-line DatabaseErrors."""
        p = dict(params or {})
        if self.dialect == "sqlite":
            sql = _PARAM.sub(lambda m: f":{m[1]}" if m[1] else "%", sql)
            p = {k: _sqlite_text(v) if isinstance(v, datetime) else v for k, v in p.items()}
        try:
            cur = self.raw.execute(sql, p)
            return list(cur.fetchall()) if cur.description is not None else []
        except self._errors as exc:
            raise self._error(exc) from None

    def renew(self) -> None:
        """End this snapshot: the next statement reads a new one, read-only as the first (a pooled
        connection between requests, `cocaq watch` between refreshes). psycopg2 opens the transaction
        itself; psycopg 3 (autocommit) and sqlite3 (isolation_level None) need their BEGIN again."""
        try:
            self.raw.rollback()
            if self._begin is not None:
                self.raw.execute(self._begin)
        except self._errors as exc:
            raise self._error(exc) from None

    def snapshot(self) -> str | None:
        """This transaction's snapshot, exported for another connection to read the same rows
        (`adopt`); None on SQLite, which has no such thing."""
        if self.dialect != "postgresql":
            return None
        return str(self.rows("SELECT pg_export_snapshot()")[0][0])

    def adopt(self, snapshot: str) -> None:
        """Read another connection's exported snapshot (`snapshot()`) from now on: a new read-only
        transaction whose first statement sets it (valid while the exporting transaction is open)."""
        if not _SNAPSHOT_ID.fullmatch(snapshot):  # (inlined: SET takes no bound parameter)
            raise ValueError(f"not an exported snapshot's id: {snapshot!r}")
        self.renew()
        self.rows(f"SET TRANSACTION SNAPSHOT '{snapshot}'")

    def timestamp(self, v: Any) -> datetime | None:
        """A timestamp column's value as an aware UTC datetime (SQLite returns the stored text)."""
        if v is None:
            return None
        if isinstance(v, str):
            v = datetime.fromisoformat(v)
        assert isinstance(v, datetime)
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)

    def _error(self, exc: Exception) -> DatabaseError:
        reason = _first_line(exc)
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)  # psycopg 3, psycopg2
        undefined = state in _UNDEFINED or reason.startswith(_SQLITE_UNDEFINED)
        if not undefined:
            return DatabaseError(f"database {mask_url(self.url)}: {reason}")
        if "jobs" in self._missing_tables():
            return DatabaseError(f"database {mask_url(self.url)} has no cocaq schema: run `cocaq db upgrade`")
        return DatabaseError(
            f"database {mask_url(self.url)} has an older cocaq schema ({reason}): run `cocaq db upgrade`"
        )

    def _missing_tables(self) -> set[str]:
        try:
            self.raw.rollback()
            if self.dialect == "sqlite":
                cur = self.raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            else:
                cur = self.raw.execute(
                    "SELECT c.relname FROM pg_class c WHERE c.oid IN "
                    "(SELECT to_regclass(t) FROM unnest(%(t)s::text[]) AS t)",
                    {"t": list(TABLES)},
                )
            present = {r[0] for r in cur.fetchall()}
        except self._errors:
            return set()
        return set(TABLES) - present

    def close(self) -> None:
        with contextlib.suppress(*self._errors):
            self.raw.rollback()
        self.raw.close()

    def __enter__(self) -> Db:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def wrap(conn: Any) -> Db:
    """A Db over a SQLAlchemy Connection's driver connection (sqlite3 or psycopg 3), inside its
    transaction: so that the library code written for `cocaq user`'s plain connections serves the
    reports and the API too. Closing it is the SQLAlchemy connection's business."""
    raw = conn.connection.driver_connection
    dialect = conn.dialect.name
    if dialect == "sqlite":
        import sqlite3

        errors: tuple[type[Exception], ...] = (sqlite3.Error,)
    else:
        import psycopg

        errors = (psycopg.Error,)
    return Db(raw, dialect, conn.engine.url.render_as_string(hide_password=True), errors)


def connect(url: str) -> Db:
    """A read-only connection to the configured database, or a one-line error."""
    m = _URL.fullmatch(url.strip())
    if m is None:
        raise ConfigError(f"config: database_url: not a database URL: {mask_url(url)}")
    scheme = m["scheme"].lower()
    if scheme in _SQLITE:
        return _connect_sqlite(url, m)
    if scheme in _POSTGRES:
        return _connect_postgres(url, m)
    raise ConfigError(
        f"config: database_url: {mask_url(url)}: unsupported database "
        "(use postgresql+psycopg://... or sqlite:///PATH)"
    )


def _connect_sqlite(url: str, m: re.Match[str]) -> Db:
    import sqlite3

    if m["user"] is not None:
        raise ConfigError(f"config: database_url: not a database URL: {mask_url(url)}")
    rest = m["rest"].split("?", 1)[0]
    path = rest[1:] if rest.startswith("/") else rest  # sqlite:///rel.db, sqlite:////abs.db
    if path in ("", ":memory:") or not Path(path).expanduser().is_file():
        # Nothing to read: say so as for an empty database, and leave no file behind.
        raise DatabaseError(f"database {mask_url(url)} has no cocaq schema: run `cocaq db upgrade`")
    try:
        raw = sqlite3.connect(str(Path(path).expanduser()), timeout=10.0, isolation_level=None)
        raw.execute("BEGIN")  # one snapshot from the first read on
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot connect to database {mask_url(url)}: {_first_line(exc)}") from None
    return Db(raw, "sqlite", url, (sqlite3.Error,), begin="BEGIN")


class _Psycopg2:
    """A psycopg2 connection with psycopg 3's `execute()` (returning the cursor), as Db uses it."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def execute(self, sql: str, params: Any = None) -> Any:
        cur = self._raw.cursor()
        cur.execute(sql, params)
        return cur

    def rollback(self) -> None:
        self._raw.rollback()

    def close(self) -> None:
        self._raw.close()


def _connect_postgres(url: str, m: re.Match[str]) -> Db:
    # psycopg2 where it is installed: it imports in ~35 ms against psycopg 3's ~120 ms, which is most
    # of what `cocaq user` may take on a login node. Same SQL (both take %(name)s parameters).
    driver = os.environ.get("COCAQ_TEST_PG_DRIVER", "")
    if driver != "psycopg":
        try:
            import psycopg2
        except ImportError:
            if driver == "psycopg2":
                raise
        else:
            return _connect_psycopg2(url, m, psycopg2)
    import psycopg

    conninfo = pg_conninfo(url)
    timeout = int(os.environ.get("COCAQ_TEST_CONNECT_TIMEOUT", "5"))
    try:
        raw = psycopg.connect(conninfo, autocommit=True, connect_timeout=timeout)
    except psycopg.ProgrammingError as exc:  # a conninfo libpq cannot parse (its message quotes the URL)
        reason = _first_line(exc).replace(conninfo, mask_url(conninfo))
        if m["password"]:
            reason = reason.replace(m["password"], "***")
        raise ConfigError(f"config: database_url: {mask_url(url)}: {reason}") from None
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot connect to database {mask_url(url)}: {_first_line(exc)}") from None
    try:
        # No JIT for the session (it costs more than these short statements take, and a pooled connection
        # keeps it through every later snapshot: a statement of its own, as one with the BEGIN would be
        # undone with the transaction), then the snapshot.
        raw.execute(_PG_SESSION)
        raw.execute(_PG_BEGIN)
    except psycopg.Error as exc:
        raise DatabaseError(f"database {mask_url(url)}: {_first_line(exc)}") from None
    return Db(raw, "postgresql", url, (psycopg.Error,), begin=_PG_BEGIN)


def _connect_psycopg2(url: str, m: re.Match[str], psycopg2: Any) -> Db:
    conninfo = pg_conninfo(url)
    timeout = int(os.environ.get("COCAQ_TEST_CONNECT_TIMEOUT", "5"))
    try:
        raw = psycopg2.connect(conninfo, connect_timeout=timeout)
    except psycopg2.ProgrammingError as exc:  # a conninfo libpq cannot parse
        reason = _first_line(exc).replace(conninfo, mask_url(conninfo))
        if m["password"]:
            reason = reason.replace(m["password"], "***")
        raise ConfigError(f"config: database_url: {mask_url(url)}: {reason}") from None
    except psycopg2.Error as exc:
        reason = _first_line(exc)
        if m["password"]:
            reason = reason.replace(m["password"], "***")
        raise DatabaseError(f"cannot connect to database {mask_url(url)}: {reason}") from None
    try:
        # No JIT for the session (as above: SET LOCAL ended with the first snapshot, and a pooled
        # connection's later requests compiled the advice's statements again), then the first statement
        # of each transaction opens it: one snapshot, read-only.
        raw.autocommit = True
        raw.cursor().execute(_PG_SESSION)
        raw.autocommit = False
        raw.set_session(isolation_level="REPEATABLE READ", readonly=True)
    except psycopg2.Error as exc:
        raise DatabaseError(f"database {mask_url(url)}: {_first_line(exc)}") from None
    return Db(_Psycopg2(raw), "postgresql", url, (psycopg2.Error,))


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
