"""The spool's records (cocaq.collector.records): written by the hook and the collector, read by the shipper.

`tests/data/spool_v1` holds a spool as the hooks and the collector wrote it before the records were
defined in one module (start, end with exact and edge energies, a ctld-start, a `meta` from the epilog
and one from the collector, a prolog's state): built again from the same values, each is the same bytes,
and each still ships.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.collector.localdb import CollectorDB
from cocaq.collector.records import EnergyRow, hook_event, meta_event, stamp, validate_event
from cocaq.collector.ship import connect, ship_once
from cocaq.collector.spool import dumps, iter_events, read_job_state
from tests.nodekit import make_node

V1 = Path(__file__).parent / "data" / "spool_v1"


def _v1_spool(tmp_path: Path) -> Path:
    spool = tmp_path / "spool"
    shutil.copytree(V1, spool)
    for p in (spool, *spool.rglob("*")):
        p.chmod(0o700 if p.is_dir() else 0o600)
    spool.chmod(0o755)
    return spool


def _rebuilt(rec: dict[str, Any]) -> dict[str, Any]:
    """The record made again through `records` from the values it holds."""
    if rec["event"] == "meta":
        job_first = next(iter(rec)) == "event" and list(rec)[1] == "job_id"  # the collector's
        out = meta_event(rec["meta"], rec["ts_ns"], rec["job_id"] if job_first else None)
        return stamp(out, rec["cluster"], rec["node"], rec["job_id"])
    out = hook_event(rec["event"], rec["cluster"], rec["node"], rec["job_id"], rec["ts_ns"], rec["job"])
    for k, v in rec.items():
        if k == "energy":
            v = [EnergyRow.from_entry(rec["job_id"], e).entry() for e in v]
        out.setdefault(k, v)
    return out


def test_old_spool_files_are_the_bytes_the_records_make() -> None:
    files = sorted((V1 / "events").glob("*.json"))
    kinds = set()
    for p in files:
        raw = p.read_bytes()
        rec = json.loads(raw)
        assert validate_event(rec) is None, p.name
        assert dumps(_rebuilt(rec)) == raw, p.name
        kinds.add((rec["event"], next(iter(rec))))
    assert kinds >= {("start", "v"), ("end", "v"), ("ctld-start", "v"), ("meta", "event")}
    sources = {e["source"] for p in files for e in json.loads(p.read_bytes()).get("energy", [])}
    assert sources == {"nvml", "nvml-power-edges"}


def test_old_spool_files_are_read_and_shipped(engine: Engine, tmp_path: Path) -> None:
    spool = _v1_spool(tmp_path)
    state = read_job_state(str(spool), "101")
    assert state is not None and state["job_id"] == "101" and len(state["gpus"]) == 2
    bad: list[tuple[str, str]] = []
    assert len(list(iter_events(str(spool), 100, bad))) == 7 and bad == []
    want = {
        EnergyRow.from_entry(r["job_id"], e)
        for p in sorted((V1 / "events").glob("*.json"))
        for r in [json.loads(p.read_bytes())]
        for e in r.get("energy", [])
    }
    target = connect(engine.url.render_as_string(hide_password=False))
    try:
        res = ship_once(target, str(spool), None, "cocaqtest", "vm")
    finally:
        target.close()
    assert res.error is None and (res.events, res.quarantined) == (7, [])
    _same(_shipped_energy(engine), want)
    with engine.connect() as c:
        uids = {r[0] for r in c.execute(text("SELECT uid FROM node_events"))}
    assert uids == {json.loads(p.read_bytes())["uid"] for p in (V1 / "events").glob("*.json")}


def _same(got: list[EnergyRow], want: Any) -> None:
    """The same rows, timestamps to the microsecond a timestamp column keeps."""
    want = sorted(want)

    def fields(r: EnergyRow) -> tuple[Any, ...]:
        return (r.job_id, r.component, r.device, r.source, r.method, r.energy_j, int(r.final))

    assert [fields(r) for r in got] == [fields(r) for r in want]
    for g, w in zip(got, want, strict=True):
        assert (g.job_start, g.t0, g.t1) == pytest.approx((w.job_start, w.t0, w.t1), abs=2e-6)


def _shipped_energy(engine: Engine) -> list[EnergyRow]:
    sql = (
        "SELECT job_id, job_start, component, device, source, method, energy_j, t0, t1, final"
        " FROM node_energy"
    )
    with engine.connect() as c:
        rows = c.execute(text(sql)).all()

    def ts(v: Any) -> float:
        if isinstance(v, str):  # SQLite: SQLAlchemy's DATETIME text, UTC
            from datetime import UTC, datetime

            v = datetime.fromisoformat(v).replace(tzinfo=UTC)
        return float(v.timestamp())

    return sorted(
        EnergyRow(j, ts(s), comp, dev, src, m, e, ts(t0), ts(t1), int(bool(f)))
        for j, s, comp, dev, src, m, e, t0, t1, f in rows
    )


def test_hook_and_collector_rows_round_trip_through_the_shipper(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node = make_node(tmp_path, url, counter0=True)
    node.hook("prolog", 301, SLURM_JOB_GPUS="0,1")
    node.hook("epilog", 301)
    (end,) = [e for e in node.events() if e["event"] == "end"]
    from_hook = [EnergyRow.from_entry(end["job_id"], e) for e in end["energy"]]
    assert len(from_hook) == 2 and all(r.final == 1 and r.source == "nvml" for r in from_hook)
    from_collector = [
        EnergyRow("302", 1_790_000_000.25, "gpu", "GPU-b", "nvml-power-integral", "measured", 12.5,
                  1_790_000_000.25, 1_790_000_060.5, False),
        EnergyRow("302", 1_790_000_000.25, "cpu", "", "rapl", "measured", 3.0, 1_790_000_000.25,
                  1_790_000_060.5, True),
    ]  # fmt: skip
    db = CollectorDB(str(node.spool))
    db.record_cycle([], from_collector, {})
    assert db.pending_energy() == from_collector
    target = connect(url)
    try:
        res = ship_once(target, str(node.spool), db, "cocaqtest", "vm")
    finally:
        target.close()
    assert res.error is None and res.energy_rows == 2
    assert db.pending_energy() == [], "shipped: nothing left to ship"
    _same(_shipped_energy(engine), from_hook + from_collector)
    db.close()


def test_energy_row_fields_and_entry() -> None:
    r = EnergyRow("7", 10.0, "gpu", "GPU-a", "nvml", "measured", 5.5, 10.5, 20.0, True)
    assert (r.job_id, r.job_start, r.component, r.device, r.source) == r.key() == r[:5]
    assert (r.method, r.energy_j, r.t0, r.t1, r.final) == ("measured", 5.5, 10.5, 20.0, True)
    assert r == ("7", 10.0, "gpu", "GPU-a", "nvml", "measured", 5.5, 10.5, 20.0, 1)
    assert list(r.entry()) == [
        "component", "device", "source", "method", "energy_j", "t0", "t1", "job_start", "final",
    ]  # fmt: skip
    assert EnergyRow.from_entry("7", json.loads(json.dumps(r.entry()))) == r
    with pytest.raises(KeyError):
        EnergyRow.from_entry("7", {"component": "gpu"})
