"""Shipping the spool: at least once, stored exactly once, on PostgreSQL (COPY) and SQLite."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from cocaq.collector.localdb import CollectorDB
from cocaq.collector.ship import ShipError, connect, ship_once
from tests.nodekit import make_node


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as c:
        return int(c.execute(text(sql)).scalar_one())


def _fill(db: CollectorDB, n: int, t0: float = 1_790_000_000.0, device: str = "GPU-x") -> None:
    samples = [(t0 + i, "nvml", device, "power_w", "7", float(i)) for i in range(n)]
    db.record_cycle(samples, [], {})


def test_events_energy_and_samples_arrive_once(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node = make_node(tmp_path, url, counter0=True)
    node.hook("prolog", 201, SLURM_JOB_GPUS="0,1")
    node.hook("epilog", 201)
    saved = tmp_path / "saved"
    shutil.copytree(node.spool / "events", saved)
    db = CollectorDB(str(node.spool))
    _fill(db, 1234)
    target = connect(url)
    res = ship_once(target, str(node.spool), db, "cocaqtest", "vm", batch_size=500)
    assert res.error is None and (res.events, res.samples, res.batches) == (2, 1234, 3)
    # The same events again (a crash between the commit and the unlink): stored once.
    for p in saved.iterdir():
        shutil.copy(p, node.spool / "events" / p.name)
    res = ship_once(target, str(node.spool), db, "cocaqtest", "vm")
    assert (res.events_seen, res.events) == (2, 0)
    assert _count(engine, "SELECT count(*) FROM node_events") == 2
    assert _count(engine, "SELECT count(*) FROM samples") == 1234
    assert _count(engine, "SELECT count(*) FROM node_energy WHERE component = 'gpu' AND final") == 2
    assert not list((node.spool / "events").iterdir())
    target.close()


def test_a_batch_committed_before_a_crash_is_not_stored_twice(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    db = CollectorDB(str(tmp_path / "spool"))
    _fill(db, 300)
    target = connect(url)
    cid = target.cluster_id("c")
    rows = db.pending_samples(200)
    # Shipped and committed, then killed before the spool forgot them:
    assert target.ship_samples(cid, "vm", f"{db.incarnation}:{rows[0][0]}-{rows[-1][0]}", rows) == 200
    res = ship_once(target, str(tmp_path / "spool"), db, "c", "vm", batch_size=200)
    assert res.error is None and res.samples == 100  # the replayed batch is recognised and skipped
    # A batch cut differently after the crash still stores each row once (ON CONFLICT path).
    _fill(db, 50, t0=1_790_000_000.0 + 250)  # 50 rows, all already shipped above (ts 250..299)
    res = ship_once(target, str(tmp_path / "spool"), db, "c", "vm")
    assert res.error is None and res.samples == 0
    assert _count(engine, "SELECT count(*) FROM samples") == 300
    target.close()


def test_energy_is_replaced_only_by_later_values(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    target = connect(url)
    cid = target.cluster_id("c")
    row = ("9", 1000.0, "gpu", "GPU-a", "nvml", "measured")
    target.ship_energy(cid, "vm", [(*row, 50.0, 1000.0, 1100.0, 0)])
    target.ship_energy(cid, "vm", [(*row, 90.0, 1000.0, 1200.0, 1)])  # the epilog's final value
    target.ship_energy(cid, "vm", [(*row, 70.0, 1000.0, 1150.0, 0)])  # a late, older collector value
    with engine.connect() as c:
        e, final = c.execute(text("SELECT energy_j, final FROM node_energy")).one()
    assert (e, bool(final)) == (90.0, True)
    target.close()


def test_database_down_keeps_everything_then_ships_it(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node = make_node(tmp_path, url)
    node.hook("prolog", 202)
    db = CollectorDB(str(node.spool))
    _fill(db, 10)
    down = (
        "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"
        if "postgresql" in url
        else "sqlite:///" + str(tmp_path / "missing.sqlite")
    )
    with pytest.raises(ShipError):
        connect(down)
    assert len(node.events()) == 1 and db.counts()["samples"] == 10
    res = ship_once(connect(url), str(node.spool), db, "cocaqtest", "vm")
    assert (res.events, res.samples) == (1, 10)


def test_corrupt_event_file_is_moved_aside_and_the_rest_ships(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node = make_node(tmp_path, url)
    node.hook("prolog", 203)
    events = node.spool / "events"
    (events / "00000000000000000001-1-start.json").write_bytes(b'{"uid": "half a rec')
    (events / "00000000000000000002-2-start.json").write_bytes(b'{"uid": 5}')
    big = events / "00000000000000000003-3-start.json"
    big.write_bytes(b" " * (300 * 1024))
    res = ship_once(connect(url), str(node.spool), None, "cocaqtest", "vm")
    assert res.events == 1 and len(res.quarantined) == 3
    reasons = " ".join(why for _, why in res.quarantined)
    assert "unreadable" in reasons and "missing or bad 'uid'" in reasons and "limit" in reasons
    q = node.spool / "quarantine"
    assert len(list(q.glob("*.why"))) == 3 and not list(events.iterdir())


def test_corrupt_collector_db_is_moved_aside(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    db = CollectorDB(str(spool))
    _fill(db, 5)
    db.close()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(str(spool / "collector.db") + suffix):
            os.unlink(str(spool / "collector.db") + suffix)
    (spool / "collector.db").write_bytes(b"SQLite format 3\0" + os.urandom(8192))
    db = CollectorDB(str(spool))
    assert db.recovered_from and os.path.exists(db.recovered_from)
    _fill(db, 3)
    assert db.counts()["samples"] == 3


def test_spool_is_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    db = CollectorDB(str(tmp_path / "spool"), max_mb=1.0)
    for i in range(20):
        _fill(db, 2000, t0=1_790_000_000.0 + i * 2000)
    c = db.counts()
    assert c["dropped"] > 0 and c["samples"] + c["dropped"] == 40_000
    size = os.path.getsize(tmp_path / "spool" / "collector.db")
    assert size < 3 * 1024 * 1024
    first = db.pending_samples(1)[0]
    assert first[0] > 1, "the oldest samples go first"


def test_sample_ids_never_repeat_after_shipping(tmp_path: Path) -> None:
    """Batches are named by row ids: a reused id would make a new batch look already shipped."""
    db = CollectorDB(str(tmp_path / "spool"))
    _fill(db, 5)
    last = db.pending_samples(10)[-1][0]
    db.delete_samples_upto(last)
    _fill(db, 5, t0=2_000_000_000.0)
    assert db.pending_samples(1)[0][0] > last
    with sqlite3.connect(tmp_path / "spool" / "collector.db") as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_record_cycle_is_all_or_nothing(tmp_path: Path) -> None:
    db = CollectorDB(str(tmp_path / "spool"))
    # (a value that is no number is left out, not a failure: a state that cannot be written fails it)
    with pytest.raises(TypeError):
        db.record_cycle([(time.time(), "nvml", "g", "util_pct", None, 1.0)], [], {"x": object()})
    assert db.counts()["samples"] == 0 and db.get_state("x") is None
    db.record_cycle([(time.time(), "nvml", "g", "util_pct", None, None)], [], {"x": 1})  # type: ignore[list-item]
    assert db.counts()["samples"] == 0 and db.get_state("x") == 1 and db.dropped_values == 1


def test_a_running_value_never_replaces_the_final_one(engine: Engine, tmp_path: Path) -> None:
    """The collector may read a GPU just after the epilog's last reading, before its state is gone."""
    url = engine.url.render_as_string(hide_password=False)
    target = connect(url)
    cid = target.cluster_id("c")
    row = ("9", 1000.0, "gpu", "GPU-a", "nvml", "measured")
    target.ship_energy(cid, "vm", [(*row, 90.0, 1000.0, 1200.0, 1)])  # the epilog
    target.ship_energy(cid, "vm", [(*row, 90.5, 1000.0, 1200.3, 0)])  # the collector, 0.3 s later
    with engine.connect() as c:
        assert c.execute(text("SELECT energy_j, final FROM node_energy")).one() == (90.0, True)
    target.close()


def test_the_collector_ships_that_a_job_ended(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    db = CollectorDB(str(tmp_path / "spool"))
    db.record_cycle(
        [], [("9", 1000.0, "gpu", "GPU-a", "nvml-power-integral", "measured", 5.0, 1000.0, 1010.0, False)], {}
    )
    target = connect(url)
    ship_once(target, str(tmp_path / "spool"), db, "c", "vm")
    db.finish_jobs(set())  # job 9 is no longer running
    ship_once(target, str(tmp_path / "spool"), db, "c", "vm")
    with engine.connect() as c:
        assert bool(c.execute(text("SELECT final FROM node_energy")).scalar_one()) is True
    assert db.conn.execute("SELECT count(*) FROM energy").fetchone()[0] == 0
    target.close()


def test_a_value_no_column_holds_never_blocks_its_batch(engine: Engine, tmp_path: Path) -> None:
    """A NaN or infinite sample (a cgroup share divided by zero, a driver gone wrong) once failed its
    batch on SQLite (NaN is stored as NULL) on every retry, and the spool behind it grew: such values are
    dropped at the database's door, the rest of the batch ships."""
    url = engine.url.render_as_string(hide_password=False)
    db = CollectorDB(str(tmp_path / "spool"))
    t0 = 1_790_000_000.0
    samples = [
        (t0 + i, "nvml", "GPU-x", "power_w", "7", v)
        for i, v in enumerate([1.0, float("nan"), 2.0, float("inf"), 3.0])
    ]
    db.record_cycle(samples, [], {})  # the collector's own spool: once, the whole cycle was lost
    assert db.dropped_values == 2
    target = connect(url)
    res = ship_once(target, str(tmp_path / "spool"), db, "c", "vm")
    assert res.error is None and _count(engine, "SELECT count(*) FROM samples") == 3
    assert not db.pending_samples(10), "the batch is done, not retried for ever"
    cid = target.cluster_id("c")
    bad = [
        (1, t0 + 9, "nvml", "GPU-x", "power_w", "7", float("nan")),
        (2, t0 + 10, "nvml", "GPU-x", "power_w", "7", 5.0),
    ]
    target.ship_samples(cid, "vm", "b-nan", bad)  # a spool written by an older collector
    assert _count(engine, "SELECT count(*) FROM samples") == 4
    target.ship_energy(
        cid,
        "vm",
        [("7", t0, "gpu", "GPU-x", "nvml", "measured", e, t0, t0 + 60, 1) for e in (float("nan"), -5.0)],
    )
    target.ship_energy(cid, "vm", [("7", t0, "gpu", "GPU-y", "nvml", "measured", 42.0, t0, t0 + 60, 1)])
    assert _count(engine, "SELECT count(*) FROM node_energy") == 1
    target.close()
