"""Shipping the spool to the database: at least once, stored exactly once.

Order of every step: write to the database and commit, then forget locally. A crash in between ships
the same records again, and the database's unique keys make the replay a no-op:
- hook events by their `uid` (ON CONFLICT DO NOTHING);
- per-job energy by (cluster, node, job, start, component, device, source), replaced only by a later `t1`,
  and a final value (the epilog's) never by a running one;
- samples in batches recorded in `node_shipments` in the same transaction: a batch already there is
  skipped without touching `samples`; otherwise rows go in with binary COPY (the fast path), and only
  if that still hits a duplicate (a re-cut batch after a crash) through a temp table and ON CONFLICT.

PostgreSQL is spoken to with psycopg directly and SQLite with sqlite3: no ORM on the nodes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from cocaq.collector.localdb import CollectorDB, is_finite
from cocaq.collector.records import EnergyRow
from cocaq.collector.spool import iter_events

log = logging.getLogger("cocaq.collector.ship")

SampleRow = tuple[
    int, float, str, str, str, "str | None", float
]  # id, ts, source, device, metric, job, value


class ShipError(Exception):
    """The database cannot take the records now (down, refused, not migrated); the spool keeps them."""


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _energy_from_event(rec: dict[str, Any]) -> list[EnergyRow]:
    rows: list[EnergyRow] = []
    for e in rec.get("energy") or []:
        try:
            rows.append(EnergyRow.from_entry(rec["job_id"], e))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("event %s: energy entry skipped: %s", rec.get("uid"), exc)
    return rows


def _energy_params(
    cluster_id: int, node: str, rows: Sequence[EnergyRow], ts: Any, flag: Any
) -> list[tuple[Any, ...]]:
    return [
        (cluster_id, node, j, ts(s), comp, dev, src, meth, e, ts(t0), ts(t1), flag(fin))
        for j, s, comp, dev, src, meth, e, t0, t1, fin in rows
        if is_finite(e) and e >= 0  # a counter gone wrong: never a measurement, never a stuck batch
    ]


def _finite(rows: Sequence[SampleRow]) -> Sequence[SampleRow]:
    """The samples whose value a float column holds on both databases (SQLite stores NaN as NULL, and
    one such row would fail its batch on every retry)."""
    if all(is_finite(r[6]) for r in rows):
        return rows
    return [r for r in rows if is_finite(r[6])]


class Target(Protocol):
    def cluster_id(self, name: str) -> int: ...
    def ship_events(self, cluster_id: int, records: Sequence[dict[str, Any]]) -> int: ...
    def ship_energy(self, cluster_id: int, node: str, rows: Sequence[EnergyRow]) -> None: ...
    def ship_samples(self, cluster_id: int, node: str, batch: str, rows: Sequence[SampleRow]) -> int: ...
    def close(self) -> None: ...


def connect(url: str, timeout_s: float = 5.0) -> Target:
    """A shipping connection for a cocaq database URL (the same URL the rest of cocaq uses)."""
    if url.startswith("sqlite:///"):
        return SqliteTarget(url[len("sqlite:///") :])
    if url.startswith(("postgresql://", "postgresql+psycopg://", "postgres://")):
        from cocaq.db.pgurl import conninfo

        return PgTarget(conninfo(url), timeout_s)
    raise ShipError(f"ship: unsupported database URL scheme in {url.split('://', 1)[0]!r}")


_ENERGY_UPSERT = (
    "INSERT INTO node_energy (cluster_id, node, job_id, job_start, component, device, source, method,"
    " energy_j, t0, t1, final) VALUES ({p}) ON CONFLICT (cluster_id, node, job_id, job_start, component,"
    " device, source) DO UPDATE SET energy_j = excluded.energy_j, t0 = excluded.t0, t1 = excluded.t1,"
    " method = excluded.method, final = excluded.final"
    " WHERE (excluded.t1 > node_energy.t1 AND (excluded.final OR NOT node_energy.final))"
    " OR (excluded.final AND NOT node_energy.final)"
)


class PgTarget:
    def __init__(self, conninfo: str, timeout_s: float) -> None:
        import psycopg

        self._psycopg = psycopg
        try:
            self.conn = psycopg.connect(conninfo, connect_timeout=max(int(timeout_s), 1), autocommit=False)
        except psycopg.Error as exc:
            raise ShipError(f"ship: cannot connect: {str(exc).strip().splitlines()[0]}") from None
        self._cluster_ids: dict[str, int] = {}

    def _run(self, fn: Any) -> Any:
        try:
            with self.conn.transaction():
                return fn(self.conn.cursor())
        except self._psycopg.Error as exc:
            raise ShipError(f"ship: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}") from None

    def cluster_id(self, name: str) -> int:
        if name not in self._cluster_ids:

            def go(cur: Any) -> int:
                cur.execute("INSERT INTO clusters (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (name,))
                cur.execute("SELECT id FROM clusters WHERE name = %s", (name,))
                return int(cur.fetchone()[0])

            self._cluster_ids[name] = self._run(go)
        return self._cluster_ids[name]

    def ship_events(self, cluster_id: int, records: Sequence[dict[str, Any]]) -> int:
        from psycopg.types.json import Json

        def go(cur: Any) -> int:
            new = 0
            for r in records:
                cur.execute(
                    "INSERT INTO node_events (uid, cluster_id, node, job_id, event, ts, payload)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (uid) DO NOTHING",
                    (r["uid"], cluster_id, r["node"], r["job_id"], r["event"], _dt(r["ts"]), Json(r)),
                )
                new += cur.rowcount
                energy = _energy_from_event(r)
                if energy:
                    cur.executemany(
                        _ENERGY_UPSERT.format(p=", ".join(["%s"] * 12)),
                        _energy_params(cluster_id, r["node"], energy, _dt, bool),
                    )
            return new

        return int(self._run(go))

    def ship_energy(self, cluster_id: int, node: str, rows: Sequence[EnergyRow]) -> None:
        def go(cur: Any) -> None:
            cur.executemany(
                _ENERGY_UPSERT.format(p=", ".join(["%s"] * 12)),
                _energy_params(cluster_id, node, rows, _dt, bool),
            )

        self._run(go)

    def ship_samples(self, cluster_id: int, node: str, batch: str, rows: Sequence[SampleRow]) -> int:
        psycopg = self._psycopg
        cols = "ts, cluster_id, node, source, device, metric, job_id, value"
        types = ["timestamptz", "int4", "text", "text", "text", "text", "text", "float8"]

        def copy_into(cur: Any, table: str) -> None:
            with cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(types)
                for _id, ts, src, dev, metric, job, value in _finite(rows):
                    cp.write_row((_dt(ts), cluster_id, node, src, dev, metric, job, value))

        def go(cur: Any) -> int:
            cur.execute(
                "INSERT INTO node_shipments (cluster_id, node, batch, rows, job_ids)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (cluster_id, node, batch) DO NOTHING RETURNING id",
                (cluster_id, node, batch, len(rows), _job_ids(rows)),
            )
            if cur.fetchone() is None:
                return 0  # committed before a crash: nothing to do but forget it locally
            try:
                with self.conn.transaction():
                    copy_into(cur, "samples")
                return len(rows)
            except psycopg.errors.UniqueViolation:
                cur.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS _cocaq_ship (LIKE samples) ON COMMIT DELETE ROWS"
                )
                copy_into(cur, "_cocaq_ship")
                cur.execute(
                    f"INSERT INTO samples ({cols}) SELECT {cols} FROM _cocaq_ship ON CONFLICT DO NOTHING"
                )
                return int(cur.rowcount)

        return int(self._run(go))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def _job_ids(rows: Sequence[SampleRow]) -> str | None:
    """The raw job ids a batch has samples of, each with its earliest sample's time (`123@1763650000`,
    space-separated): the aggregator derives those jobs' GPU use again from that hour on."""
    first: dict[str, float] = {}
    for r in rows:
        job, ts = r[5], r[1]
        if job and (job not in first or ts < first[job]):
            first[job] = ts
    return " ".join(f"{j}@{int(t)}" for j, t in sorted(first.items())) or None


def _sqlite_ts(ts: float) -> str:
    return _dt(ts).strftime("%Y-%m-%d %H:%M:%S.%f")  # SQLAlchemy's DATETIME storage on SQLite, in UTC


class SqliteTarget:
    """The embedded database (one machine, demo): same semantics as PostgreSQL, plain INSERTs."""

    def __init__(self, path: str) -> None:
        import sqlite3

        self._sqlite3 = sqlite3
        if not os.path.exists(path):
            raise ShipError(f"ship: {path}: no such database (run cocaq db upgrade)")
        self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.conn.execute("PRAGMA busy_timeout=30000")
        self._cluster_ids: dict[str, int] = {}

    def _run(self, fn: Any) -> Any:
        c = self.conn
        try:
            c.execute("BEGIN IMMEDIATE")
            try:
                out = fn(c)
                c.execute("COMMIT")
                return out
            except BaseException:
                c.execute("ROLLBACK")
                raise
        except self._sqlite3.Error as exc:
            raise ShipError(f"ship: {type(exc).__name__}: {exc}") from None

    def cluster_id(self, name: str) -> int:
        if name not in self._cluster_ids:

            def go(c: Any) -> int:
                c.execute(
                    "INSERT INTO clusters (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                    (name, _sqlite_ts(time.time())),
                )
                return int(c.execute("SELECT id FROM clusters WHERE name = ?", (name,)).fetchone()[0])

            self._cluster_ids[name] = self._run(go)
        return self._cluster_ids[name]

    def _energy(self, c: Any, cluster_id: int, node: str, rows: Sequence[EnergyRow]) -> None:
        c.executemany(
            _ENERGY_UPSERT.format(p=", ".join(["?"] * 12)).replace(
                "NOT node_energy.final", "node_energy.final = 0"
            ),
            _energy_params(cluster_id, node, rows, _sqlite_ts, int),
        )

    def ship_events(self, cluster_id: int, records: Sequence[dict[str, Any]]) -> int:
        def go(c: Any) -> int:
            new = 0
            for r in records:
                cur = c.execute(
                    "INSERT INTO node_events (uid, cluster_id, node, job_id, event, ts, payload, shipped_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (uid) DO NOTHING",
                    (
                        r["uid"],
                        cluster_id,
                        r["node"],
                        r["job_id"],
                        r["event"],
                        _sqlite_ts(r["ts"]),
                        json.dumps(r),
                        _sqlite_ts(time.time()),
                    ),
                )
                new += cur.rowcount
                self._energy(c, cluster_id, r["node"], _energy_from_event(r))
            return new

        return int(self._run(go))

    def ship_energy(self, cluster_id: int, node: str, rows: Sequence[EnergyRow]) -> None:
        self._run(lambda c: self._energy(c, cluster_id, node, rows))

    def ship_samples(self, cluster_id: int, node: str, batch: str, rows: Sequence[SampleRow]) -> int:
        def go(c: Any) -> int:
            cur = c.execute(
                "INSERT INTO node_shipments (cluster_id, node, batch, rows, job_ids, shipped_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (cluster_id, node, batch) DO NOTHING",
                (cluster_id, node, batch, len(rows), _job_ids(rows), _sqlite_ts(time.time())),
            )
            if cur.rowcount == 0:
                return 0
            cur = c.executemany(
                "INSERT INTO samples (ts, cluster_id, node, source, device, metric, job_id, value)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [
                    (_sqlite_ts(ts), cluster_id, node, s, d, m, j, v)
                    for _i, ts, s, d, m, j, v in _finite(rows)
                ],
            )
            return int(cur.rowcount)

        return int(self._run(go))

    def close(self) -> None:
        self.conn.close()


@dataclass
class ShipResult:
    events: int = 0  # new in the database
    events_seen: int = 0
    energy_rows: int = 0
    samples: int = 0  # new in the database
    batches: int = 0
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None

    def summary(self) -> str:
        s = (
            f"shipped {self.events} new events ({self.events_seen} read), {self.energy_rows} energy rows,"
            f" {self.samples} samples in {self.batches} batches"
        )
        if self.quarantined:
            s += f"; {len(self.quarantined)} bad spool files moved aside"
        if self.error:
            s += f"; stopped: {self.error}"
        return s


def ship_once(
    target: Target,
    spool_dir: str,
    db: CollectorDB | None,
    cluster: str,
    node: str,
    batch_size: int = 5000,
    max_batches: int | None = None,
    before_events: Callable[[list[dict[str, Any]]], None] | None = None,
) -> ShipResult:
    """Ship everything spooled now (events, then energy, then samples), oldest first.

    Stops at the first database error and returns it in `error`; what was not shipped stays spooled.
    """
    res = ShipResult()
    try:
        cid = target.cluster_id(cluster)
        while True:
            evs = list(iter_events(spool_dir, batch_size, res.quarantined))
            if not evs:
                break
            if before_events is not None:  # the collector closes what these records end, first
                before_events([e.record for e in evs])
            by_cluster: dict[str, list[Any]] = {}
            for ev in evs:
                by_cluster.setdefault(ev.record["cluster"], []).append(ev)
            for name, group in by_cluster.items():
                ccid = cid if name == cluster else target.cluster_id(name)
                res.events += target.ship_events(ccid, [e.record for e in group])
                res.events_seen += len(group)
                for e in group:  # committed: now forget
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)
            if len(evs) < batch_size:
                break
        if db is not None:
            energy = db.pending_energy()
            if energy:
                target.ship_energy(cid, node, energy)
                db.mark_energy_shipped(energy)
                res.energy_rows += len(energy)
            inc = db.incarnation
            while max_batches is None or res.batches < max_batches:
                rows = db.pending_samples(batch_size)
                if not rows:
                    break
                batch = f"{inc}:{rows[0][0]}-{rows[-1][0]}"
                res.samples += target.ship_samples(cid, node, batch, rows)
                db.delete_samples_upto(rows[-1][0])
                res.batches += 1
    except ShipError as exc:
        res.error = str(exc)
    return res
