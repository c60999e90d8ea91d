"""`collector.db`: the collector's own SQLite database in the spool directory, until the database has it.

The collector keeps its samples, running per-job energy and state here (SQLite in WAL mode, readable by
root only), while the hooks' events stay files in the spool (`cocaq.collector.spool`). It survives
kill -9 and power loss, and never follows a symlink a user could plant; what it holds waits here for the
shipper (`cocaq.collector.ship`), and is dropped once the database has it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import time
import uuid
from typing import Any

from cocaq.collector.records import EnergyRow
from cocaq.collector.spool import SpoolError, ensure_dir

COLLECTOR_DB = "collector.db"
SCHEMA_VERSION = 1


_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, source TEXT NOT NULL, device TEXT NOT NULL,
    metric TEXT NOT NULL, job_id TEXT, value REAL NOT NULL);
CREATE TABLE IF NOT EXISTS energy (
    job_id TEXT NOT NULL, job_start REAL NOT NULL, component TEXT NOT NULL, device TEXT NOT NULL,
    source TEXT NOT NULL, method TEXT NOT NULL, energy_j REAL NOT NULL, t0 REAL NOT NULL, t1 REAL NOT NULL,
    final INTEGER NOT NULL DEFAULT 0, shipped_t1 REAL,
    PRIMARY KEY (job_id, job_start, component, device, source));
"""


def is_finite(v: Any) -> bool:
    """A finite number (what a float column holds on both databases); False for anything else."""
    try:
        return math.isfinite(v)
    except (TypeError, OverflowError):
        return False


class CollectorDB:
    """`collector.db`: samples waiting to ship, per-job energy so far, and the collector's state.

    A file that SQLite cannot read is renamed aside (`collector.db.corrupt-<ts>`) and a fresh one started,
    so one bad disk block costs the unshipped samples in it, never the collection that follows.
    """

    def __init__(self, spool_dir: str, max_mb: float = 512.0) -> None:
        self.spool_dir = spool_dir
        self.path = os.path.join(ensure_dir(spool_dir, 0o755), COLLECTOR_DB)
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.dropped = 0
        self.dropped_values = 0  # samples and energies that were not finite numbers
        self.recovered_from: str | None = None
        try:
            self.conn = self._open()
        except sqlite3.DatabaseError as exc:
            self.recovered_from = self._move_aside(str(exc))
            self.conn = self._open()

    def _open(self) -> sqlite3.Connection:
        if os.path.islink(self.path):
            raise SpoolError(f"spool: {self.path} is a symlink; refusing to use it")
        # The database and its -wal/-shm files hold every job's samples: readable by root only, whatever
        # the umask (SQLite creates the -wal and -shm files with the database's mode, or 0644 first).
        old_umask = os.umask(0o077)
        try:
            conn = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        finally:
            os.umask(old_umask)
        try:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    fd = os.open(self.path + suffix, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                    try:
                        os.fchmod(fd, 0o600)
                    finally:
                        os.close(fd)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=OFF")
            ok = conn.execute("PRAGMA quick_check").fetchone()
            if not ok or ok[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {ok[0] if ok else 'no answer'}")
            conn.executescript(_DDL)
            if conn.execute("SELECT value FROM meta WHERE key='incarnation'").fetchone() is None:
                conn.execute(
                    "INSERT INTO meta VALUES ('incarnation', ?), ('schema', ?)",
                    (uuid.uuid4().hex[:12], str(SCHEMA_VERSION)),
                )
            os.chmod(self.path, 0o600)
        except BaseException:
            conn.close()
            raise
        return conn

    def _move_aside(self, why: str) -> str:
        dest = f"{self.path}.corrupt-{int(time.time())}"
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.rename(self.path + suffix, dest + suffix)
        with open(dest + ".why", "w") as fh:
            fh.write(why + "\n")
        return dest

    @property
    def incarnation(self) -> str:
        row = self.conn.execute("SELECT value FROM meta WHERE key='incarnation'").fetchone()
        return str(row[0])

    # state: small JSON documents (trackers, counters) kept across restarts
    def get_state(self, key: str) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", ("state:" + key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def record_cycle(
        self,
        samples: list[tuple[float, str, str, str, str | None, float]],
        energy: list[EnergyRow],
        state: dict[str, Any],
    ) -> None:
        """One collection cycle, all or nothing: new samples, per-job energy so far, tracker state.

        A value that is not a finite number (a share divided by zero, a driver gone wrong) is no
        measurement: it is left out (and counted in `dropped_values`), never the cause of a cycle lost."""
        n = len(samples) + len(energy)
        samples = [x for x in samples if is_finite(x[5])]
        energy = [x for x in energy if is_finite(x[6]) and x[6] >= 0]
        self.dropped_values += n - len(samples) - len(energy)
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            c.executemany(
                "INSERT INTO samples (ts, source, device, metric, job_id, value) VALUES (?,?,?,?,?,?)",
                samples,
            )
            c.executemany(
                "INSERT INTO energy (job_id, job_start, component, device, source, method, energy_j, t0, t1,"
                " final) VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT (job_id, job_start, component, device,"
                " source) DO UPDATE SET energy_j=excluded.energy_j, t1=excluded.t1, method=excluded.method,"
                " final=max(final, excluded.final) WHERE excluded.t1 >= energy.t1",
                energy,
            )
            c.executemany(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                [("state:" + k, json.dumps(v, separators=(",", ":"))) for k, v in state.items()],
            )
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        self.enforce_cap()

    def finish_jobs(self, running: set[str]) -> int:
        """Jobs no longer running: their energy so far is final from the collector's side."""
        ids = [r[0] for r in self.conn.execute("SELECT DISTINCT job_id FROM energy WHERE final = 0")]
        ended = [(j,) for j in ids if j not in running]
        if ended:
            self.conn.executemany(  # shipped again: the database learns it is final too
                "UPDATE energy SET final = 1, shipped_t1 = NULL WHERE job_id = ? AND final = 0", ended
            )
        return len(ended)

    def enforce_cap(self) -> int:
        """Drop the oldest samples beyond the size cap; energy and state are small and always kept."""
        pages, size = (
            self.conn.execute("PRAGMA page_count").fetchone()[0],
            self.conn.execute("PRAGMA page_size").fetchone()[0],
        )
        free = self.conn.execute("PRAGMA freelist_count").fetchone()[0]
        if (pages - free) * size <= self.max_bytes:
            return 0
        total = self.conn.execute("SELECT count(*) FROM samples").fetchone()[0]
        drop = max(total // 10, 1)
        self.conn.execute(
            "DELETE FROM samples WHERE id IN (SELECT id FROM samples ORDER BY id LIMIT ?)", (drop,)
        )
        self.dropped += drop
        return drop

    def pending_samples(self, limit: int) -> list[tuple[int, float, str, str, str, str | None, float]]:
        return self.conn.execute(
            "SELECT id, ts, source, device, metric, job_id, value FROM samples ORDER BY id LIMIT ?", (limit,)
        ).fetchall()

    def delete_samples_upto(self, last_id: int) -> None:
        self.conn.execute("DELETE FROM samples WHERE id <= ?", (last_id,))

    def pending_energy(self) -> list[EnergyRow]:
        return [
            EnergyRow(*r)
            for r in self.conn.execute(
                "SELECT job_id, job_start, component, device, source, method, energy_j, t0, t1, final"
                " FROM energy WHERE shipped_t1 IS NULL OR shipped_t1 < t1"
            )
        ]

    def mark_energy_shipped(self, rows: list[EnergyRow]) -> None:
        """Rows now in the database (up to their `t1`); finals are dropped."""
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            c.executemany(
                "UPDATE energy SET shipped_t1=? WHERE job_id=? AND job_start=? AND component=? AND device=?"
                " AND source=?",
                [(r.t1, *r.key()) for r in rows],
            )
            c.execute("DELETE FROM energy WHERE final=1 AND shipped_t1 >= t1")
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def counts(self) -> dict[str, int]:
        return {
            "samples": self.conn.execute("SELECT count(*) FROM samples").fetchone()[0],
            "energy_unshipped": self.conn.execute(
                "SELECT count(*) FROM energy WHERE shipped_t1 IS NULL OR shipped_t1 < t1"
            ).fetchone()[0],
            "dropped": self.dropped,
        }

    def close(self) -> None:
        self.conn.close()
