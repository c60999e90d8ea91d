"""The read API's database connections, reused from one request to the next."""

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cocaq.db.dbapi import Db, connect


class Pool:
    """Reused read-only connections (cocaq.db.dbapi), at most `size`: a connection costs more than a
    footprint query on PostgreSQL, and the server's threads (40) must not open one each. A request
    waits for a free one; each request starts a new snapshot."""

    def __init__(self, url: str, size: int = 16) -> None:
        self.url = url
        self.free: queue.LifoQueue[Db] = queue.LifoQueue(maxsize=size)
        self.slots = threading.BoundedSemaphore(size)

    @contextmanager
    def db(self) -> Iterator[Db]:
        with self.slots, self._lent() as db:
            yield db

    @contextmanager
    def spare(self) -> Iterator[Db | None]:
        """A second connection, for a request's statements to run beside its own (cocaq.db.alongside),
        or None: on SQLite (its connections stay in their thread), or when every slot is taken. It never
        waits: requests each holding a slot and waiting for a second would wait on one another."""
        if self.url.strip().lower().startswith("sqlite") or not self.slots.acquire(blocking=False):
            yield None
            return
        try:
            with self._lent() as db:
                yield db
        finally:
            self.slots.release()

    @contextmanager
    def _lent(self) -> Iterator[Db]:
        try:
            db = self.free.get_nowait()
        except queue.Empty:
            db = connect(self.url)
        ok = False
        try:
            yield db
            ok = True
        finally:
            # (sqlite3 connections stay in their thread: not pooled)
            if ok and db.dialect != "sqlite" and _renewed(db):
                self.free.put_nowait(db)
            else:
                db.close()

    def close(self) -> None:
        while True:
            try:
                self.free.get_nowait().close()
            except queue.Empty:
                return


def _renewed(db: Db) -> bool:
    """Whether the connection starts a new snapshot for the next request (False: a broken one)."""
    try:
        db.renew()
    except Exception:
        return False
    return True
