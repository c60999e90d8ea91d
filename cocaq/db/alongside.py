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
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db

T = TypeVar("T")


class Alongside(Generic[T]):
    """`work(connection)` started on `other` in a thread (reading `db`'s snapshot), or kept for `db`;
    `result()` waits for it (or runs it) and re-raises what it raised."""

    def __init__(self, db: Db, other: Db | None, work: Callable[[Db], T]) -> None:
        self._db, self._work = db, work
        self._thread: threading.Thread | None = None
        self._got: list[T] = []
        self._failed: list[BaseException] = []
        sid = db.snapshot() if other is not None else None
        if other is not None and sid is not None:
            other.adopt(sid)
            self._thread = threading.Thread(target=self._run, args=(other,), name="cocaq-alongside")
            self._thread.start()

    def _run(self, other: Db) -> None:
        try:
            self._got.append(self._work(other))
        except BaseException as exc:  # handed to result(), in the request's thread
            self._failed.append(exc)

    @property
    def beside(self) -> bool:
        """Whether the work runs on a second connection (what tests check)."""
        return self._thread is not None

    def result(self) -> T:
        if self._thread is None:
            return self._work(self._db)
        self._thread.join()
        if self._failed:
            raise self._failed[0]
        return self._got[0]

    def __enter__(self) -> Alongside[T]:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is not None:
            self._thread.join()
