"""Node measurements joined to sacct's jobs: measured where measured, estimated only for the rest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.accounting import measured
from cocaq.accounting.importer import import_records
from cocaq.collector.ship import connect
from tests.builders import config, job

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


# this file's cluster is on France's grid; its jobs (alice's, in lab "lab") ran on two GPUs of node "vm"
_cfg = partial(config, cluster={"carbon_zone": "FRA"})
_job = partial(job, gpus=2, node_list="vm", queued=timedelta(minutes=1))


def _event(raw: int, start: datetime, gpu_j: dict[str, float], end_after_h: float = 1.0) -> list[dict]:
    t0 = start.timestamp()
    t1 = t0 + end_after_h * 3600
    base = {"cluster": "c", "node": "vm", "job_id": str(raw), "job": {"user": "alice"}}
    start_ev = {**base, "uid": f"c/vm/{raw}/start/{t0}", "event": "start", "ts": t0}
    energy = [
        {"component": "gpu", "device": u, "source": "nvml", "method": "measured", "energy_j": e, "t0": t0,
         "t1": t1, "job_start": t0, "final": True}
        for u, e in gpu_j.items()
    ]  # fmt: skip
    end_ev = {
        **base,
        "uid": f"c/vm/{raw}/end/{t1}",
        "event": "end",
        "ts": t1,
        "job_start": t0,
        "energy": energy,
    }
    return [start_ev, end_ev]


def _energy_rows(engine: Engine, raw: int) -> list[tuple[str, str, str, float]]:
    with engine.connect() as c:
        return [
            (r[0], r[1], r[2], round(r[3], 3))
            for r in c.execute(
                text(
                    "SELECT e.component, e.method, e.source, e.energy_j FROM job_energy e JOIN jobs j ON j.id = e.job_pk"
                    " WHERE j.job_id_raw = :r ORDER BY e.component, e.source"
                ),
                {"r": raw},
            )
        ]


def _totals(engine: Engine, raw: int) -> tuple[float, float, float]:
    with engine.connect() as c:
        return tuple(  # type: ignore[return-value]
            c.execute(
                text("SELECT energy_j, energy_measured_j, co2_g FROM jobs WHERE job_id_raw = :r"), {"r": raw}
            ).one()
        )


def test_measured_gpu_energy_replaces_the_estimate(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    import_records(engine, [_job(500, T0)], cfg, source="sacct-json")
    est_before = _energy_rows(engine, 500)
    assert ("gpu", "estimated", "tdp-estimate", 2 * 3600 * 400.0) in est_before
    target = connect(url)
    target.ship_events(target.cluster_id("c"), _event(500, T0, {"GPU-a": 900_000.0, "GPU-b": 700_000.0}))
    res = measured.refresh(engine, cfg)
    assert (res.events_linked, res.jobs_measured) == (2, 1)
    rows = _energy_rows(engine, 500)
    assert ("gpu", "measured", "nvml", 1_600_000.0) in rows
    assert not any(c == "gpu" and m == "estimated" for c, m, _, _ in rows), rows
    cpu = next(r for r in rows if r[0] == "cpu")
    assert cpu[1] == "estimated" and cpu[3] == 2 * 3600 * 10.0  # nothing measured the CPU: still estimated
    energy, meas, co2 = _totals(engine, 500)
    assert energy == pytest.approx(1_600_000 + 72_000) and meas == pytest.approx(1_600_000)
    assert co2 > 0
    # Idempotent, and a re-import (a later sacct record of the same job) keeps the measurement.
    measured.refresh(engine, cfg)
    assert _energy_rows(engine, 500) == rows
    later = _job(500, T0)
    later.total_cpu_s = 3600 * 3.0
    s = import_records(engine, [later], cfg, source="sacct-json")
    assert s.updated == 1 and s.measured == 1
    rows2 = _energy_rows(engine, 500)
    assert ("gpu", "measured", "nvml", 1_600_000.0) in rows2
    assert not any(c == "gpu" and m == "estimated" for c, m, _, _ in rows2), rows2
    assert next(r for r in rows2 if r[0] == "cpu")[3] == 3600 * 3 * 10.0


def test_gpus_nothing_measured_keep_their_share_of_the_estimate(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    import_records(engine, [_job(501, T0, gpus=4)], cfg, source="sacct-json")
    target = connect(url)
    target.ship_events(target.cluster_id("c"), _event(501, T0, {"GPU-a": 1_000_000.0}))
    measured.refresh(engine, cfg)
    rows = _energy_rows(engine, 501)
    assert ("gpu", "measured", "nvml", 1_000_000.0) in rows
    assert ("gpu", "estimated", "tdp-estimate", 3 * 3600 * 400.0) in rows  # 3 of 4 GPUs unmeasured


def test_a_reused_job_id_gets_only_its_own_measurements(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    earlier = T0 - timedelta(days=40)  # Slurm wrapped its job ids: the same raw id again
    import_records(engine, [_job(502, T0), _job(502, earlier)], cfg, source="sacct-json")
    target = connect(url)
    cid = target.cluster_id("c")
    target.ship_events(cid, _event(502, T0, {"GPU-a": 111.0}))
    target.ship_events(cid, _event(502, earlier, {"GPU-a": 222.0}))
    measured.refresh(engine, cfg)
    with engine.connect() as c:
        got = c.execute(
            text(
                "SELECT j.start_time, e.energy_j FROM job_energy e JOIN jobs j ON j.id = e.job_pk"
                " WHERE e.source = 'nvml' ORDER BY j.start_time"
            )
        ).all()
    assert [round(e) for _, e in got] == [222, 111]  # by start: the earlier job first


def test_events_of_jobs_sacct_has_not_shown_wait_unlinked(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    target = connect(url)
    target.ship_events(target.cluster_id("c"), _event(503, T0, {"GPU-a": 5.0}))
    res = measured.refresh(engine, cfg)
    assert (res.events_linked, res.events_unmatched) == (0, 2)
    import_records(engine, [_job(503, T0)], cfg, source="sacct-json")  # the import links them itself
    assert ("gpu", "measured", "nvml", 5.0) in _energy_rows(engine, 503)


def test_after_a_counter_reset_the_value_covering_the_whole_job_wins(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    import_records(engine, [_job(504, T0, gpus=1)], cfg, source="sacct-json")
    target = connect(url)
    cid = target.cluster_id("c")
    t0 = T0.timestamp()
    target.ship_events(cid, _event(504, T0, {}))
    # exact until the driver reset 10 minutes in; the integral through it covers the whole hour
    target.ship_energy(
        cid, "vm", [("504", t0, "gpu", "GPU-a", "nvml", "measured", 150_000.0, t0, t0 + 600, 1)]
    )
    target.ship_energy(
        cid,
        "vm",
        [("504", t0, "gpu", "GPU-a", "nvml-power-integral", "measured", 900_000.0, t0, t0 + 3590, 1)],
    )
    measured.refresh(engine, cfg)
    gpu = [r for r in _energy_rows(engine, 504) if r[0] == "gpu"]
    assert gpu == [("gpu", "measured", "nvml-power-integral", 900_000.0)]


def test_cocaq_job_shows_the_gpus_the_node_saw_and_their_energy(engine: Engine, tmp_path: Path) -> None:
    from cocaq.footprint.one_job import find_jobs

    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    import_records(engine, [_job(505, T0, gpus=2)], cfg, source="sacct-json")
    evs = _event(505, T0, {"GPU-b": 7.2e6})
    evs[0]["gpus"] = [
        {"slurm_index": 1, "uuid": "GPU-b", "name": "A100", "pci_bus_id": "0:87"},
        {"slurm_index": 0, "uuid": "GPU-a", "name": "A100", "pci_bus_id": "0:07"},
    ]
    target = connect(url)
    target.ship_events(target.cluster_id("c"), evs)
    measured.refresh(engine, cfg)
    with engine.connect() as conn:
        (job,) = find_jobs(conn, "505")
    got = {(g["slurm_index"], g["uuid"], g["source"], g["energy_kwh"]) for g in job["gpus"]}
    assert got == {(1, "GPU-b", "nvml", 2.0), (0, "GPU-a", None, None)}


def test_events_that_never_match_do_not_hold_back_the_others(engine: Engine, tmp_path: Path) -> None:
    """Linking once took the oldest 20,000 unlinked events each run: as many that never match (a job sacct
    never showed) stalled it for everyone. Every unlinked event is now looked at, page by page."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    target = connect(url)
    cid = target.cluster_id("c")
    for i in range(15):  # older and newer than the job's events, none of them ever matching
        target.ship_events(cid, _event(9000 + i, T0 - timedelta(days=3), {"GPU-a": 1.0}))
        target.ship_events(cid, _event(9100 + i, T0 + timedelta(days=3), {"GPU-a": 1.0}))
    target.ship_events(cid, _event(505, T0, {"GPU-a": 7.0}))
    import_records(engine, [_job(505, T0)], cfg, source="t")
    with engine.begin() as conn:
        res = measured.link_events(conn, now=T0 + timedelta(days=4), limit=4)
    assert res.events_linked == 0, "the import linked them already"
    with engine.begin() as conn:
        conn.execute(text("UPDATE node_events SET job_pk = NULL"))
        res = measured.link_events(conn, now=T0 + timedelta(days=4), limit=4)
        assert (res.events_linked, res.events_unmatched) == (2, 60)
        res = measured.link_events(conn, now=T0 + timedelta(days=4), limit=4, max_events=10)
        assert (res.events_linked, res.events_unmatched) == (0, 10), "bounded work per run"
    measured.refresh(engine, cfg)
    assert ("gpu", "measured", "nvml", 7.0) in _energy_rows(engine, 505)


def test_implausible_node_measurements_are_dropped_and_one_jobs_failure_stays_its_own(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A counter gone wrong (NaN, negative, exajoules for an hour) is dropped, the GPU estimated instead;
    a failure while one job's measurements are applied leaves the other jobs' applied."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    import_records(engine, [_job(r, T0, gpus=1) for r in (601, 602, 603, 604)], cfg, source="sacct-json")
    target = connect(url)
    cid = target.cluster_id("c")
    t0 = T0.timestamp()
    for raw, e in ((601, float("nan")), (602, 9.2e18), (603, 500_000.0), (604, 400_000.0)):
        target.ship_events(cid, _event(raw, T0, {}))
        target.ship_energy(
            cid, "vm", [(str(raw), t0, "gpu", "GPU-a", "nvml", "measured", e, t0, t0 + 3600, 1)]
        )
    real = measured._rewrite

    def fails_for_604(conn: Any, cfg_: Any, job: Any, *a: Any) -> None:
        if job.job_id == "604":
            raise ValueError("unforeseen")
        real(conn, cfg_, job, *a)

    monkeypatch.setattr(measured, "_rewrite", fails_for_604)
    res = measured.refresh(engine, cfg)
    assert res.jobs_measured == 1
    assert [r for r in _energy_rows(engine, 603) if r[0] == "gpu"] == [("gpu", "measured", "nvml", 500_000.0)]
    for raw in (601, 602, 604):
        gpu = [r for r in _energy_rows(engine, raw) if r[0] == "gpu"]
        assert gpu and all(r[1] == "estimated" for r in gpu), (raw, gpu)


def test_one_gpu_stored_under_two_node_names_counts_once(engine: Engine, tmp_path: Path) -> None:
    """The hooks record under Slurm's node name and an older collector under the host's: the same GPU
    UUID twice, under "vm" and "vm-host". It is one GPU: its energy counts once (the exact counter)."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    import_records(engine, [_job(520, T0)], cfg, source="sacct-json")
    target = connect(url)
    target.ship_events(target.cluster_id("c"), _event(520, T0, {"GPU-a": 900_000.0, "GPU-b": 700_000.0}))
    t0, t1 = T0.timestamp(), T0.timestamp() + 3600
    twin = [
        {"component": "gpu", "device": u, "source": "nvml-power-integral", "method": "measured",
         "energy_j": e, "t0": t0, "t1": t1, "job_start": t0, "final": True}
        for u, e in {"GPU-a": 880_000.0, "GPU-b": 690_000.0}.items()
    ]  # fmt: skip
    ev = {"cluster": "c", "node": "vm-host", "job_id": "520", "job": {"user": "alice"}, "event": "end",
          "uid": f"c/vm-host/520/end/{t1}", "ts": t1, "job_start": t0, "energy": twin}  # fmt: skip
    target.ship_events(target.cluster_id("c"), [ev])
    measured.refresh(engine, cfg)
    gpu = [r for r in _energy_rows(engine, 520) if r[0] == "gpu"]
    assert gpu == [("gpu", "measured", "nvml", 1_600_000.0)], gpu
