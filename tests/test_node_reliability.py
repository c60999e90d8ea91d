"""What must survive on a real node: a database outage, kill -9 while shipping, an unwritable spool."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from cocaq.collector.localdb import CollectorDB
from cocaq.db import migrate
from tests.conftest import ROOT, new_database, run_cocaq
from tests.nodekit import cocaq_env, make_node


@pytest.fixture
def pg(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    url = new_database("postgresql", tmp_path, request)
    eng = create_engine(url)
    migrate.upgrade(eng)
    request.addfinalizer(eng.dispose)
    return eng


def _q(engine: Engine, sql: str) -> int:
    with engine.connect() as c:
        return int(c.execute(text(sql)).scalar_one())


def test_database_down_during_50_jobs_then_back_every_record_arrives_once(pg: Engine, tmp_path: Path) -> None:
    url = pg.url.render_as_string(hide_password=False)
    down = "postgresql+psycopg://postgres@127.0.0.1:1/cocaq"
    node = make_node(tmp_path, down, counter0=True, sources=("nvml",))
    env = cocaq_env(node)
    for i in range(50):
        job = 1000 + i
        gpus = {"SLURM_JOB_GPUS": str(i % 2)} if i % 2 == 0 else {}
        node.hook("prolog", job, **gpus)
        node.hook("epilog", job, **gpus)
        if i % 10 == 9:
            r = run_cocaq(["collector", "--once"], env=env)
            assert r.code == 0 and "not shipped: database unreachable" in r.err, r.err
    assert len(node.events()) == 100
    assert all(" ok " in line for line in node.log_lines())
    node.config.write_text(node.config.read_text().replace(down, url))  # the database is back
    r = run_cocaq(["collector", "--once"], env=env)
    assert r.code == 0 and "shipped 100 new events" in r.err, r.err
    r = run_cocaq(["collector", "--once"], env=env)
    assert "shipped 0 new events" in r.err, r.err
    assert _q(pg, "SELECT count(*) FROM node_events") == 100
    assert _q(pg, "SELECT count(DISTINCT job_id) FROM node_events") == 50
    assert (
        _q(pg, "SELECT count(*) FROM node_energy WHERE component = 'gpu' AND source = 'nvml' AND final") == 25
    )
    assert node.events() == []


def _spool_samples(db: CollectorDB, n: int, t0: float) -> None:
    rows = [
        (t0 + i * 0.001, "nvml", f"GPU-{i % 8}", "power_w", str(i % 16), float(i % 400)) for i in range(n)
    ]
    db.record_cycle(rows, [], {})


def test_kill_9_while_shipping_20_times_loses_and_duplicates_nothing(pg: Engine, tmp_path: Path) -> None:
    url = pg.url.render_as_string(hide_password=False)
    node = make_node(tmp_path, url, sources=())
    with open(node.config, "a") as fh:
        fh.write("ship_batch = 1000\n")
    rng = random.Random(20261121)
    db = CollectorDB(str(node.spool))
    expected_samples = 0
    t0 = 1_795_000_000.0
    job = 5000
    interrupted = 0
    lo, hi = 0.15, 0.5  # start-up takes ~0.2 s here and shipping 20k rows ~0.2 s; adapted below
    env = cocaq_env(node)
    for _ in range(20):
        _spool_samples(db, 20_000, t0 + expected_samples)
        expected_samples += 20_000
        for _ in range(10):  # jobs keep starting and ending while the collector is being killed
            job += 1
            node.hook("prolog", job)
        before = db.counts()["samples"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "cocaq", "collector", "--once"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(lo, hi))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        after = db.counts()["samples"]
        if 0 < after < before:
            interrupted += 1
        elif after == before:  # killed before it began shipping: aim later
            lo, hi = lo + 0.05, hi + 0.05
        else:  # finished before the kill: aim earlier
            lo, hi = max(0.05, lo - 0.05), max(lo + 0.1, hi - 0.05)
    assert interrupted >= 3, f"only {interrupted} of 20 kills landed mid-shipment; the test proves little"
    r = run_cocaq(["collector", "--once"], env=env)
    assert r.code == 0, r.err
    assert db.counts()["samples"] == 0 and node.events() == []
    assert _q(pg, "SELECT count(*) FROM samples") == expected_samples
    assert _q(pg, "SELECT count(*) FROM node_events") == 200
    # every batch recorded once; none of them double-counted rows
    assert _q(pg, "SELECT coalesce(sum(rows), 0) FROM node_shipments") >= expected_samples
    db.close()


def test_spool_not_writable_hooks_exit_zero_and_say_why(tmp_path: Path) -> None:
    blocker = tmp_path / "spool"
    blocker.write_text("a file where the spool directory should be\n")
    node = make_node(tmp_path, spool=blocker)
    took = node.hook("prolog", 77)
    assert took < 2.0
    line = node.log_lines()[-1]
    assert "FAILED" in line and (
        "File exists" in line or "Not a directory" in line or "not a directory" in line
    )
    os.unlink(blocker)


def test_hook_failures_are_counted_and_reported_by_the_collector(tmp_path: Path) -> None:
    node = make_node(tmp_path, sources=())
    for _ in range(3):
        node.hook("prolog", "not-a-number")
    r = run_cocaq(["collector", "--once", "--no-ship"], env=cocaq_env(node))
    assert r.code == 0 and "hooks: 3 failure(s) of kind ValueError" in r.err, r.err


def test_the_collector_database_and_its_wal_are_root_only(tmp_path: Path) -> None:
    """Every job's samples are in collector.db and its -wal/-shm: once created 0644 in a 0755 spool,
    readable by any user; 0600 now whatever the umask, and an older database's files are fixed."""
    import os
    import stat

    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    old = os.umask(0o022)
    try:
        db = CollectorDB(str(spool))
        db.conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
        db.conn.execute("INSERT INTO t VALUES (1)")
        modes = {
            p.name: stat.S_IMODE(p.stat().st_mode)
            for p in spool.iterdir()
            if p.name.startswith("collector.db")
        }
        db.conn.close()
        old_db = tmp_path / "old"
        old_db.mkdir(mode=0o755)
        import sqlite3

        c = sqlite3.connect(old_db / "collector.db")  # an older version's files, 0644
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("CREATE TABLE x (y)")
        assert stat.S_IMODE((old_db / "collector.db-wal").stat().st_mode) == 0o644
        again = CollectorDB(str(old_db))
        again_modes = {
            p.name: stat.S_IMODE(p.stat().st_mode)
            for p in old_db.iterdir()
            if p.name.startswith("collector.db")
        }
        again.conn.close()
        c.close()
    finally:
        os.umask(old)
    assert set(modes) >= {"collector.db", "collector.db-wal", "collector.db-shm"}, modes
    assert set(modes.values()) == {0o600}, modes
    assert set(again_modes.values()) == {0o600}, again_modes
