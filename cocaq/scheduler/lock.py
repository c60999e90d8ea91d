"""Only one scheduler acts: a PostgreSQL session-level advisory lock, or an fcntl lock beside a SQLite file.

Standby schedulers keep trying; the holder's death (its connection or its process gone) frees the lock,
so a standby takes over without an operator.  Kept apart from the job table and the daemon's loop: the
lock is the one part whose failure modes (dead hosts, server restarts) need their own reading."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from cocaq.errors import ConfigError
from cocaq.scheduler.jobs import HOST

log = logging.getLogger("cocaq.scheduler")

LOCK_KEY = int.from_bytes(b"cocaqsch", "big")


class PgAdvisoryLock:
    """pg_try_advisory_lock on a dedicated autocommit connection, kept open while active.

    The lock is the session's: it goes when the connection does (the process dies, the server restarts),
    and `healthy()` notices that. Keepalives make the server drop a dead host's session within a minute or
    two rather than the system default of hours.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: Any = None
        u = make_url(url)
        connect_args: dict[str, Any] = {
            "connect_timeout": int(os.environ.get("COCAQ_TEST_CONNECT_TIMEOUT", "5")),
            "application_name": f"cocaq-scheduler {HOST}:{os.getpid()}"[:63],
        }
        self._engine = create_engine(
            u, poolclass=NullPool, isolation_level="AUTOCOMMIT", connect_args=connect_args
        )

    def describe(self) -> str:
        return f"PostgreSQL advisory lock {LOCK_KEY}"

    def try_acquire(self) -> bool:
        conn = self._engine.connect()
        try:
            for setting in (
                "tcp_keepalives_idle = 30",
                "tcp_keepalives_interval = 10",
                "tcp_keepalives_count = 3",
                "idle_session_timeout = 0",  # a site-wide timeout must not end the lock's idle session
            ):
                with contextlib.suppress(SQLAlchemyError):  # an older server without the setting
                    conn.execute(text(f"SET {setting}"))
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar())
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    def healthy(self) -> bool:
        if self._conn is None:
            return False
        try:
            n = self._conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                    " AND granted AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1"
                ),
                {"hi": LOCK_KEY >> 32, "lo": LOCK_KEY & 0xFFFFFFFF},
            ).scalar()
        except SQLAlchemyError:
            return False
        return bool(n)

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
        except SQLAlchemyError:
            pass  # the session is gone, and the lock with it
        finally:
            conn.close()

    def holder(self) -> str | None:
        """Who holds the lock now (for logs and --status), or None."""
        with self._engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT l.pid, a.application_name, a.client_addr FROM pg_locks l"
                    " LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                    " AND l.classid::bigint = :hi AND l.objid::bigint = :lo"
                    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ),
                {"hi": LOCK_KEY >> 32, "lo": LOCK_KEY & 0xFFFFFFFF},
            ).first()
        if row is None:
            return None
        who = row.application_name or "a session"
        return (
            f"{who} (server backend {row.pid}{', from ' + str(row.client_addr) if row.client_addr else ''})"
        )

    def close(self) -> None:
        self.release()
        self._engine.dispose()


class FileLock:
    """An fcntl (flock) lock on a file next to the SQLite database; the kernel frees it when we die."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def describe(self) -> str:
        return f"lock file {self.path}"

    def try_acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"cocaq-scheduler {HOST}:{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def healthy(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def holder(self) -> str | None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                who = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
                return who or "another process"
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        self.release()


Lock = PgAdvisoryLock | FileLock


def lock_for(url: str) -> Lock:
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "postgresql":
        return PgAdvisoryLock(url)
    if backend == "sqlite":
        if not u.database or u.database == ":memory:" or u.database.startswith("file:"):
            raise ConfigError("config: database_url: the scheduler needs a database file or PostgreSQL")
        db = Path(u.database).expanduser().resolve()
        return FileLock(db.with_name(db.name + ".scheduler.lock"))
    raise ConfigError(f"config: database_url: the scheduler supports PostgreSQL and SQLite, not {backend}")
