"""One statement of a request beside another, in the same snapshot: the heavy user's footprint and the
jobs its advice reads are two scans of the same window that need not wait for each other.

The second connection reads the first's exported snapshot (cocaq.db.dbapi.Db.snapshot/adopt), so both
see the same rows, as one connection would; without one (SQLite, no spare connection in the pool) the
work runs on the request's own connection, after what it does in between, as before. The thread is
always waited for before the block ends: the pool must not lend its connection again while it reads.
Standard library only: `cocaq user` reads through it on login nodes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Self, TypeVar

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db

T = TypeVar("T")


class _Work(Generic[T]):
    """`work` run in a thread on a connection, or kept to run on `db` when its result is asked for."""

    def __init__(self, db: Db, work: Callable[[Db], T]) -> None:
        self._db, self._work = db, work
        self._thread: threading.Thread | None = None
        self._got: list[T] = []
        self._failed: list[BaseException] = []

    def _start(self, conn: Db, name: str) -> None:
        self._thread = threading.Thread(target=self._run, args=(conn,), name=name)
        self._thread.start()

    def _run(self, conn: Db) -> None:
        try:
            self._got.append(self._work(conn))
        except BaseException as exc:  # handed to result(), in the caller's thread
            self._failed.append(exc)

    def result(self) -> T:
        if self._thread is None:
            return self._work(self._db)
        self._thread.join()
        if self._failed:
            raise self._failed[0]
        return self._got[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is not None:
            self._thread.join()


class Alongside(_Work[T]):
    """`work(connection)` started on `other` in a thread (reading `db`'s snapshot), or kept for `db`;
    `result()` waits for it (or runs it) and re-raises what it raised."""

    def __init__(self, db: Db, other: Db | None, work: Callable[[Db], T]) -> None:
        super().__init__(db, work)
        if other is not None and (sid := db.snapshot()) is not None:
            other.adopt(sid)
            self._start(other, "cocaq-alongside")

    @property
    def beside(self) -> bool:
        """Whether the work runs on a second connection (what tests check)."""
        return self._thread is not None


class Meanwhile(_Work[T]):
    """`work(db)` on the same connection in a thread (PostgreSQL), for the caller to do what needs no
    database while the statement runs: the caller must not use `db` until `result()`. On SQLite (its
    connection stays in its thread) the work runs when `result()` asks for it."""

    def __init__(self, db: Db, work: Callable[[Db], T]) -> None:
        super().__init__(db, work)
        if db.dialect == "postgresql":
            self._start(db, "cocaq-meanwhile")
