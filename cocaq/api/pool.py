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
        with self.slots:
            try:
                db = self.free.get_nowait()
            except queue.Empty:
                db = connect(self.url)
            ok = False
            try:
                yield db
                ok = True
            finally:
                try:
                    db.renew()  # the next request reads a new snapshot
                except Exception:
                    ok = False
                if ok and db.dialect != "sqlite":  # (sqlite3 connections stay in their thread: not pooled)
                    self.free.put_nowait(db)
                else:
                    db.close()

    def close(self) -> None:
        while True:
            try:
                self.free.get_nowait().close()
            except queue.Empty:
                return
