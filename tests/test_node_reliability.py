"""What must survive on a real node: a database outage, kill -9 while shipping, an unwritable spool."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from cocaq.collector.localdb import CollectorDB
from tests.conftest import ROOT, migrated_database, run_cocaq
from tests.nodekit import assert_fails_fast, cocaq_env, make_node


@pytest.fixture
def pg(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    url = migrated_database("postgresql", tmp_path, request)
    eng = create_engine(url)
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


# Where the test stops the shipper, in its scratch database only (nothing of cocaq's): a trigger waits for
# an advisory lock the test holds, either before batch N+1's node_shipments row (N batches committed and
# forgotten locally) or after its samples are copied, before its commit; the test sees the wait in
# pg_stat_activity and kills then, at a known point instead of a guessed time.
_GATE_SQL = """
CREATE TABLE test_gate (at_shipments integer NOT NULL, point text NOT NULL);
INSERT INTO test_gate VALUES (0, 'off');
CREATE FUNCTION test_gate_wait(point text, mine integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM test_gate g WHERE g.point = test_gate_wait.point
             AND (SELECT count(*) FROM node_shipments) >= g.at_shipments + mine) THEN
    PERFORM pg_advisory_xact_lock(20261121);
  END IF;
END $$;
CREATE FUNCTION test_gate_before_batch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM test_gate_wait('before-batch', 0); RETURN NEW; END $$;
CREATE FUNCTION test_gate_before_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM test_gate_wait('before-commit', 1); RETURN NULL; END $$;
CREATE TRIGGER test_gate_a BEFORE INSERT ON node_shipments FOR EACH ROW EXECUTE FUNCTION test_gate_before_batch();
CREATE TRIGGER test_gate_b AFTER INSERT ON samples FOR EACH STATEMENT EXECUTE FUNCTION test_gate_before_commit();
"""
_GATE_DROP = """
DROP TRIGGER test_gate_a ON node_shipments; DROP TRIGGER test_gate_b ON samples;
DROP FUNCTION test_gate_before_batch(); DROP FUNCTION test_gate_before_commit();
DROP FUNCTION test_gate_wait(text, integer); DROP TABLE test_gate;
"""


def _wait_for(pred: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    """Poll `pred` until it returns something other than None/False; the timeout only keeps a broken run
    from hanging (it asserts no speed)."""
    end = time.monotonic() + timeout
    while (v := pred()) is None or v is False:
        assert time.monotonic() < end, f"still waiting after {timeout} s for {what}"
        time.sleep(0.01)
    return v


def _at_gate(admin: Any, proc: subprocess.Popen[bytes]) -> int | None:
    """The backend of ours that waits at the gate (for the test's advisory lock), if one does yet."""
    assert proc.poll() is None, f"the collector ended (exit {proc.returncode}) before it reached the gate"
    row = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND wait_event = 'advisory'"
    ).fetchone()
    return None if row is None else int(row[0])


def _backend_gone(admin: Any, pid: int) -> bool:
    return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 0


def test_kill_9_while_shipping_20_times_loses_and_duplicates_nothing(pg: Engine, tmp_path: Path) -> None:
    """20 rounds of 20 batches spooled, each round's collector killed with SIGKILL mid-shipment at a point
    the test chose (batch 1-19): before a batch's transaction, before its commit, or after its commit but
    before the collector forgot it locally (the test holds collector.db's write lock); then one collector
    ships what is left: every sample arrives once."""
    import psycopg

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
    env = cocaq_env(node)
    admin = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    admin.execute(_GATE_SQL)
    points = ["before-batch", "before-commit", "after-commit"]
    for i in range(20):
        _spool_samples(db, 20_000, t0 + expected_samples)
        expected_samples += 20_000
        for _ in range(10):  # jobs keep starting and ending while the collector is being killed
            job += 1
            node.hook("prolog", job)
        before = db.counts()["samples"]
        point, k = points[i % 3], rng.randint(1, 18)
        shipped = _q(pg, "SELECT count(*) FROM node_shipments")
        admin.execute("SELECT pg_advisory_lock(20261121)")
        gate = "before-batch" if point == "after-commit" else point
        admin.execute("UPDATE test_gate SET at_shipments = %s, point = %s", (shipped + k, gate))
        proc = subprocess.Popen(
            [sys.executable, "-m", "cocaq", "collector", "--once"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        gated = _wait_for(lambda p=proc: _at_gate(admin, p), f"the collector at batch {k + 1}")
        admin.execute("UPDATE test_gate SET point = 'off'")
        local = None
        if point == "after-commit":  # let batch k+1 commit while collector.db cannot forget it
            local = sqlite3.connect(db.path, timeout=60, isolation_level=None)
            local.execute("BEGIN IMMEDIATE")
            admin.execute("SELECT pg_advisory_unlock(20261121)")
            committed = shipped + k + 1
            _wait_for(lambda n=committed: _q(pg, "SELECT count(*) FROM node_shipments") == n, "its commit")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if local is not None:
            local.execute("ROLLBACK")
            local.close()
        else:  # its transaction dies with it, never committed
            admin.execute("SELECT pg_terminate_backend(%s)", (gated,))
            _wait_for(lambda pid=gated: _backend_gone(admin, pid), "its backend to end")
            admin.execute("SELECT pg_advisory_unlock(20261121)")
        after = db.counts()["samples"]
        # forgotten locally: the k batches shipped, and the one an after-commit kill left behind, shipped
        # again as a batch already there (node_shipments keeps it from counting twice)
        again = 1000 if i and points[(i - 1) % 3] == "after-commit" else 0
        assert before - after == k * 1000 + again, f"{point}, batch {k + 1}: {before - after} forgotten"
        if 0 < after < before:
            interrupted += 1
    admin.execute(_GATE_DROP)
    admin.close()
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
    usual = make_node(tmp_path / "healthy").hook_audit("prolog", 77)
    assert_fails_fast(node.hook_audit("prolog", 77), usual)
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
