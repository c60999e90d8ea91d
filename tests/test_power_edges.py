"""The power integral of a GPU without an energy counter spans the whole job: a trapezoid from the
prolog's power reading to the collector's first sample, the samples' trapezoids, and one from the last
sample to the epilog's reading, whatever the collector's phase (issue 18).

The GPUs draw a linear ramp, on which a trapezoid is exact at any sample times: each integral must equal
the fake's exact energy between the prolog's and the epilog's readings. The hooks run in-process, on the
same virtual clock as the collector and the fake GPUs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.accounting.measured import _best_per_device
from cocaq.collector import fakenvml, spool
from cocaq.collector.daemon import Collector
from cocaq.config_load import load_config
from cocaq.prolog_epilog import hook
from tests.nodekit import UUID_BY_MINOR, Node, make_node

T0 = 1_800_000_000.0
# minor 0: no energy counter; minor 1: a counter (its exact path must stay as it is)
RAMP_GPUS = """
epoch = {epoch}
[[gpu]]
uuid = "{u0}"
minor = 0
pci_bus_id = "00000000:07:00.0"
trace = "{csv}"
energy_counter = false
[[gpu]]
uuid = "{u1}"
minor = 1
pci_bus_id = "00000000:87:00.0"
trace = "{csv}"
"""


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def time(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return int(self.now * 1e9)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(time, "time", c.time)
    monkeypatch.setattr(time, "time_ns", c.time_ns)
    yield c


def _node(tmp_path: Path, url: str = "sqlite:///unused") -> Node:
    node = make_node(tmp_path, url, sources=("nvml",))
    csv = tmp_path / "ramp.csv"
    csv.write_text("t_s,power_w\n0,80\n4000,380\n")  # +0.075 W/s for 4000 s
    spec = RAMP_GPUS.format(epoch=T0 - 100.0, u0=UUID_BY_MINOR[0], u1=UUID_BY_MINOR[1], csv=csv)
    (tmp_path / "fake-gpus.toml").write_text(spec)
    return node


def _hook(node: Node, monkeypatch: pytest.MonkeyPatch, kind: str, job_id: int, gpus: str = "0,1") -> None:
    """The hook as slurmd runs it, in this process (so on the virtual clock)."""
    for k, v in node.env(kind, job_id, SLURM_JOB_GPUS=gpus).items():
        monkeypatch.setenv(k, v)
    assert hook.main(["--config", str(node.config), kind]) == 0
    assert "FAILED" not in node.log.read_text()


def _truth(node: Node, job_id: int, minor: int) -> tuple[float, float, float]:
    """(energy J, start, end) of the GPU between the prolog's and the epilog's readings."""
    start = json.loads(next((node.spool / "events").glob(f"*-{job_id}-start.json")).read_bytes())
    end = json.loads(next((node.spool / "events").glob(f"*-{job_id}-end.json")).read_bytes())
    uuid = UUID_BY_MINOR[minor]
    t0 = next(g["ts"] for g in start["gpus"] if g["uuid"] == uuid)
    t1 = next(g["ts"] for g in end["gpus"] if g["uuid"] == uuid)
    fakenvml.configure(str(node.root / "fake-gpus.toml"))
    index = minor  # NVML's order is the bus ids', which RAMP_GPUS gives in minor order
    return (fakenvml.energy_mj_at(index, t1) - fakenvml.energy_mj_at(index, t0)) / 1000.0, t0, t1


def _final_rows(c: Collector, job_id: int) -> dict[str, tuple[float, float, int]]:
    rows = c.db.conn.execute(
        "SELECT device, source, energy_j, t1, final FROM energy WHERE job_id = ?", (str(job_id),)
    ).fetchall()
    return {f"{d}/{s}": (e, t1, f) for d, s, e, t1, f in rows}


@pytest.mark.parametrize("phase", [0.0, 2.5, 7.0, 9.9])
def test_the_integral_runs_from_the_prolog_to_the_epilog_whatever_the_phase(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch, phase: float
) -> None:
    node = _node(tmp_path)
    c = Collector(load_config(node.config, {}))
    c.sample()  # the collector's grid: T0, T0 + 10, ...
    clock.now = T0 + phase
    _hook(node, monkeypatch, "prolog", 401)
    for k in range(1, 5):
        clock.now = T0 + 10 * k
        c.sample()
    clock.now = T0 + 43.3
    _hook(node, monkeypatch, "epilog", 401)
    clock.now = T0 + 50
    c.sample()
    truth, t0, t1 = _truth(node, 401, 0)
    rows = _final_rows(c, 401)
    e, t_row, final = rows[f"{UUID_BY_MINOR[0]}/nvml-power-integral"]
    assert final == 1 and t_row == pytest.approx(t1)
    # exact on a ramp (to the fake's whole-milliwatt readings), not just close
    assert e == pytest.approx(truth, rel=1e-5), (e, truth, t1 - t0)
    # the GPU with a counter: the exact counter path, as before
    assert f"{UUID_BY_MINOR[1]}/nvml" in rows and f"{UUID_BY_MINOR[1]}/nvml-power-integral" not in rows
    c.close()


def test_a_job_between_two_samples_gets_the_edges_trapezoid_from_the_epilog(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node(tmp_path)
    clock.now = T0 + 1
    _hook(node, monkeypatch, "prolog", 402)
    clock.now = T0 + 8.5
    _hook(node, monkeypatch, "epilog", 402)
    truth, _t0, t1 = _truth(node, 402, 0)
    end = json.loads(next((node.spool / "events").glob("*-402-end.json")).read_bytes())
    (edges,) = [e for e in end["energy"] if e["source"] == "nvml-power-edges"]
    assert edges["device"] == UUID_BY_MINOR[0] and edges["final"] is True
    assert edges["energy_j"] == pytest.approx(truth, rel=1e-5) and edges["t1"] == pytest.approx(t1)
    assert [e["source"] for e in end["energy"] if e["device"] == UUID_BY_MINOR[1]] == ["nvml"]
    # a long job: two readings say little of what happened between them, so no edges row
    clock.now = T0 + 100
    _hook(node, monkeypatch, "prolog", 403)
    clock.now = T0 + 100 + hook.EDGES_MAX_S + 1
    _hook(node, monkeypatch, "epilog", 403)
    end = json.loads(next((node.spool / "events").glob("*-403-end.json")).read_bytes())
    assert [e["source"] for e in end["energy"]] == ["nvml"]


def test_a_sample_taken_after_the_epilog_read_the_gpus_is_taken_back(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epilog reads the GPUs, writes its record, then removes the job's state: a sample in between
    still sees the job running; its interval beyond the epilog's reading is not the job's."""
    node = _node(tmp_path)
    clock.now = T0 + 2
    _hook(node, monkeypatch, "prolog", 404)
    state = (node.spool / "jobs" / "404.state").read_bytes()
    c = Collector(load_config(node.config, {}))
    for t in (T0 + 10, T0 + 20):
        clock.now = t
        c.sample()
    clock.now = T0 + 24
    _hook(node, monkeypatch, "epilog", 404)
    (node.spool / "jobs" / "404.state").write_bytes(state)  # not removed yet
    clock.now = T0 + 27
    c.sample()
    spool.remove_job_state(str(node.spool), "404")
    clock.now = T0 + 30
    c.sample()
    truth, _t0, _t1 = _truth(node, 404, 0)
    e, t_row, final = _final_rows(c, 404)[f"{UUID_BY_MINOR[0]}/nvml-power-integral"]
    assert final == 1 and t_row == pytest.approx(T0 + 27)  # replaces the running row of T0 + 27
    assert e == pytest.approx(truth, rel=1e-5)
    c.close()


def test_the_epilog_record_closes_the_job_even_when_it_ships_in_the_same_breath(
    engine: Engine, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epilog ran after the collector's last sample and before its ship: the ship takes its record
    away, so the ship itself closes the integral first, and the final value goes to the database."""
    url = engine.url.render_as_string(hide_password=False)
    node = _node(tmp_path, url)
    clock.now = T0 + 3
    _hook(node, monkeypatch, "prolog", 405, gpus="0")
    c = Collector(load_config(node.config, {}))
    for t in (T0 + 10, T0 + 20, T0 + 30):
        clock.now = t
        c.sample()
    clock.now = T0 + 36
    _hook(node, monkeypatch, "epilog", 405, gpus="0")
    truth, _t0, _t1 = _truth(node, 405, 0)
    res = c.ship()
    assert res.error is None and res.events == 2
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT node, component, device, source, energy_j, t1, final FROM node_energy"
                " WHERE job_id = '405' ORDER BY source"
            )
        ).all()
    # the epilog's two-reading trapezoid (a short job) is there too, and gives way to the integral
    assert [(r.source, bool(r.final)) for r in rows] == [
        ("nvml-power-edges", True),
        ("nvml-power-integral", True),
    ]
    (best,) = _best_per_device(rows)
    assert best.source == "nvml-power-integral" and best.energy_j == pytest.approx(truth, rel=1e-5)
    c.close()


def test_a_restarted_collector_closes_the_job_that_ended_while_it_was_down(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node(tmp_path)
    clock.now = T0 + 1
    _hook(node, monkeypatch, "prolog", 406, gpus="0")
    c = Collector(load_config(node.config, {}))
    for t in (T0 + 10, T0 + 20):
        clock.now = t
        c.sample()
    c.close()  # stopped; the job ends meanwhile
    clock.now = T0 + 26
    _hook(node, monkeypatch, "epilog", 406, gpus="0")
    clock.now = T0 + 90
    c2 = Collector(load_config(node.config, {}))
    c2.sample()
    truth, _t0, _t1 = _truth(node, 406, 0)
    e, _t_row, final = _final_rows(c2, 406)[f"{UUID_BY_MINOR[0]}/nvml-power-integral"]
    assert final == 1 and e == pytest.approx(truth, rel=1e-5)
    # closed once: later cycles neither reopen nor change it
    clock.now = T0 + 100
    c2.sample()
    assert _final_rows(c2, 406)[f"{UUID_BY_MINOR[0]}/nvml-power-integral"][0] == e
    assert c2.sources[0].waiting_jobs() == set()
    c2.close()


def test_an_epilog_record_that_is_not_json_is_skipped_not_fatal(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    node = _node(tmp_path)
    clock.now = T0 + 1
    _hook(node, monkeypatch, "prolog", 407, gpus="0")
    c = Collector(load_config(node.config, {}))
    clock.now = T0 + 10
    c.sample()
    (node.spool / "events" / f"{int((T0 + 12) * 1e9):020d}-407-end.json").write_bytes(b"\xff{not json")
    clock.now = T0 + 20
    c.sample()  # logs, goes on
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    assert c.sources[0].waiting_jobs() == {"407"}
    c.close()


def _sampled_job(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch, job_id: int
) -> tuple[Collector, dict[str, Any], tuple[float, float, int]]:
    """A job on GPU 0 sampled twice: the collector, the prolog's record and the running integral row."""
    node = _node(tmp_path)
    clock.now = T0 + 1
    _hook(node, monkeypatch, "prolog", job_id, gpus="0")
    start = json.loads(next((node.spool / "events").glob(f"*-{job_id}-start.json")).read_bytes())
    c = Collector(load_config(node.config, {}))
    for t in (T0 + 10, T0 + 20):
        clock.now = t
        c.sample()
    return c, start, _final_rows(c, job_id)[f"{UUID_BY_MINOR[0]}/nvml-power-integral"]


def test_an_epilog_without_a_power_reading_finalises_the_integral_at_the_last_sample(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU lost by the end (or an older hook) gives no reading to close on: the integral stays at the
    last sample, becomes final, and the job is no longer waited for (its record is not re-read)."""
    c, start, running = _sampled_job(tmp_path, clock, monkeypatch, 408)
    nvml = c.sources[0]
    end = {"event": "end", "job_id": "408", "job_start": start["ts"]}
    end["gpus"] = [{"uuid": UUID_BY_MINOR[0], "ts": T0 + 25, "power_w": None, "gone": True}]
    (row,) = nvml.end_job(end)
    assert row[6] == running[0] and row[8] == running[1] and row[9] is True
    assert nvml.waiting_jobs() == set() and nvml.end_job(end) == []
    c.close()


@pytest.mark.parametrize(
    "gpus", [None, 7, "GPU-x", {"uuid": "GPU-x"}, [], [None, 3], [{"uuid": "GPU-other"}]]
)
def test_an_epilog_record_without_this_gpu_closes_it_at_the_last_sample(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch, gpus: object
) -> None:
    """A damaged end record, or one that does not name the GPU, ends the job all the same: no error,
    no re-reading every cycle; the integral is final at its last sample."""
    c, start, running = _sampled_job(tmp_path, clock, monkeypatch, 409)
    nvml = c.sources[0]
    (row,) = nvml.end_job({"event": "end", "job_id": "409", "job_start": start["ts"], "gpus": gpus})
    assert (row[3], row[6], row[8], row[9]) == (UUID_BY_MINOR[0], running[0], running[1], True)
    assert nvml.waiting_jobs() == set()
    c.close()
