"""The collector: sources on a fixture node, per-job attribution, restarts, and `--once` without hardware."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from cocaq.collector.daemon import Collector
from cocaq.config_load import load_config
from tests.conftest import run_cocaq
from tests.nodekit import UUID_BY_MINOR, Clock, cocaq_env, make_node
from tests.sysfs_tree import make_cgroup_v2, make_rapl


def _node(tmp_path: Path, url: str, baseline: float = 0.0):  # type: ignore[no-untyped-def]
    sys_root = tmp_path / "sys"
    rapl = make_rapl(sys_root, packages=1, dram=True)
    cg = make_cgroup_v2(sys_root / "fs" / "cgroup", node_cpus="0-15")
    node = make_node(tmp_path, url, counter0=True, sysfs_root=sys_root)
    with open(node.config, "a") as fh:
        fh.write(f"idle_baseline_w = {baseline}\n")
    return node, rapl, cg


def _step(c: Collector, clock: Clock, dt: float = 10.0):  # type: ignore[no-untyped-def]
    clock.now += dt
    return c.sample()


def test_cpu_and_dram_energy_split_by_cpu_time_and_gpus_by_owner(
    engine: Engine, tmp_path: Path, clock: Clock
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, rapl, cg = _node(tmp_path, url)
    node.hook("prolog", 301, SLURM_JOB_GPUS="1")
    node.hook("prolog", 302, SLURM_JOB_PARTITION="cpu")
    cg.add_job("301", cpus="0-3")
    cg.add_job("302", cpus="4-11")
    cfg = load_config(node.config, {})
    c = Collector(cfg)
    assert {n for n, why in c.status.items() if why is None} == {"nvml", "rapl", "cgroup"}
    first = c.sample()
    rapl.add_joules("package-0", 1000.0)
    rapl.add_joules("package-0/dram", 100.0)
    cg.set_cpu("301", 30_000_000)
    cg.set_cpu("302", 10_000_000)
    cycle = _step(c, clock)
    by = {(e[0], e[2], e[4]): e[6] for e in cycle.energy}
    # idle baseline 0 W: all of it by CPU time, 30 s against 10 s
    assert by[("301", "cpu", "rapl")] == pytest.approx(750.0)
    assert by[("302", "cpu", "rapl")] == pytest.approx(250.0)
    assert by[("301", "dram", "rapl")] == pytest.approx(75.0)
    gpu = [e for e in cycle.energy if e[2] == "gpu"]
    assert [(e[0], e[3], e[4]) for e in gpu] == [("301", UUID_BY_MINOR[1], "nvml")]
    metrics = {(s[1], s[3]) for s in cycle.samples}
    assert {
        ("nvml", "power_w"),
        ("nvml", "util_pct"),
        ("nvml", "mem_used_mb"),
        ("nvml", "energy_j"),
    } <= metrics
    assert {("rapl", "power_w"), ("cgroup", "cpu_cores"), ("cgroup", "mem_mb")} <= metrics
    owner = {s[2]: s[4] for s in cycle.samples if s[1] == "nvml" and s[3] == "power_w"}
    assert owner == {UUID_BY_MINOR[1]: "301", UUID_BY_MINOR[0]: None}
    res = c.ship()
    assert res.error is None and res.events == 2
    assert res.samples == len(first.samples) + len(cycle.samples)
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                text("SELECT job_id || '/' || component || '/' || source, energy_j FROM node_energy")
            ).all()
        )
    assert rows["301/cpu/rapl"] == pytest.approx(750.0) and rows["302/cpu/rapl"] == pytest.approx(250.0)
    assert "301/gpu/nvml" in rows
    c.close()


def test_a_restarted_collector_loses_no_interval(tmp_path: Path, clock: Clock) -> None:
    node, rapl, cg = _node(tmp_path, "sqlite:///unused")
    node.hook("prolog", 303)
    cg.add_job("303", cpus="0-15")
    cfg = load_config(node.config, {})
    c = Collector(cfg)
    c.sample()
    rapl.add_joules("package-0", 500.0)
    cg.set_cpu("303", 5_000_000)
    _step(c, clock)
    c.close()  # stopped (or killed after its last committed cycle)
    rapl.add_joules("package-0", 300.0)
    cg.set_cpu("303", 8_000_000)
    c2 = Collector(cfg)
    cycle = _step(c2, clock)
    e = {(x[0], x[2]): x[6] for x in cycle.energy}
    assert e[("303", "cpu")] == pytest.approx(800.0), "the counters came back from the spool"
    c2.close()


def test_jobs_that_end_are_finalised_and_forgotten_once_shipped(
    engine: Engine, tmp_path: Path, clock: Clock
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, _rapl, _cg = _node(tmp_path, url)
    node.hook("prolog", 304, SLURM_JOB_GPUS="1")
    c = Collector(load_config(node.config, {}))
    c.sample()
    _step(c, clock, 5.0)
    node.hook("epilog", 304)
    _step(c, clock, 5.0)
    assert c.ship().error is None
    assert c.db.counts()["energy_unshipped"] == 0
    with engine.connect() as conn:
        got = conn.execute(text("SELECT final FROM node_energy WHERE job_id = '304'")).scalars().all()
    assert got and all(got)
    assert c.db.conn.execute("SELECT count(*) FROM energy").fetchone()[0] == 0
    c.close()


def test_once_on_a_node_without_gpu_or_rapl_ships_the_hooks_records(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node = make_node(tmp_path, url, sysfs_root=tmp_path / "empty-sys")
    with open(node.config, "a") as fh:
        fh.write("")
    node.config.write_text(node.config.read_text().replace('nvml = "fake:', 'nvml = "pynvml"\n# "fake:'))
    node.hook("prolog", 305)
    node.hook("epilog", 305)
    r = run_cocaq(["collector", "--once"], env=cocaq_env(node))
    assert r.code == 0, r.err
    assert "sources on: none" in r.err
    assert "off: nvml: nvml:" in r.err and "off: rapl: rapl:" in r.err and "off: cgroup: cgroup:" in r.err
    assert "shipped 2 new events" in r.err
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM node_events")).scalar_one() == 2


def test_a_gpu_lost_mid_job_keeps_the_energy_measured_until_then(
    engine: Engine, tmp_path: Path, clock: Clock
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, _rapl, _cg = _node(tmp_path, url)
    node.hook("prolog", 306, SLURM_JOB_GPUS="1")
    c = Collector(load_config(node.config, {}))
    c.sample()
    before = _step(c, clock, 10.0)
    (e_before,) = [e for e in before.energy if e[2] == "gpu"]
    node.gpu1_gone_flag.touch()  # falls off the bus
    lost = _step(c, clock, 10.0)
    assert ("nvml", UUID_BY_MINOR[1], "gone") in {(s[1], s[2], s[3]) for s in lost.samples}
    assert not [e for e in lost.energy if e[2] == "gpu"], "no made-up energy for a lost GPU"
    node.hook("epilog", 306)
    end = node.events()[-1]
    assert end["energy"] == [] and any("gone" in e for e in end["errors"]), end["errors"]
    _step(c, clock, 10.0)
    assert c.ship().error is None
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT source, energy_j, final FROM node_energy WHERE job_id = '306'")
        ).all()
    assert [(r[0], round(r[1], 6), bool(r[2])) for r in rows] == [("nvml", round(e_before[6], 6), True)]
    assert e_before[6] > 10 * 40, "ten seconds of a training GPU"
    c.close()


def test_pm_counters_source_reads_hpe_node_power(tmp_path: Path, clock: Clock) -> None:
    node = make_node(tmp_path, sources=("pm_counters",), sysfs_root=tmp_path / "sys")
    pm = tmp_path / "sys" / "cray" / "pm_counters"
    pm.mkdir(parents=True)
    (pm / "power").write_text("412 W\n")
    (pm / "energy").write_text("123456 J\n")
    (pm / "cpu_power").write_text("garbage\n")  # skipped, not fatal
    c = Collector(load_config(node.config, {}))
    cycle = c.sample()
    got = {(s[1], s[2], s[3]): s[5] for s in cycle.samples}
    assert got == {("pm_counters", "node", "power_w"): 412.0, ("pm_counters", "node", "energy_j"): 123456.0}
    c.close()


def test_a_job_starting_between_two_cycles_gets_its_first_intervals_cpu_energy(
    tmp_path: Path, clock: Clock
) -> None:
    """Its cgroup's CPU time so far all falls in this interval (the previous cycle did not see it), so
    it takes its share of the interval's RAPL energy instead of leaving it to the other jobs."""
    node, rapl, cg = _node(tmp_path, "sqlite:///unused")
    node.hook("prolog", 311)
    cg.add_job("311", cpus="0-7")
    c = Collector(load_config(node.config, {}))
    c.sample()
    node.hook("prolog", 312)
    cg.add_job("312", cpus="8-15")
    rapl.add_joules("package-0", 1000.0)
    cg.set_cpu("311", 5_000_000)
    cg.set_cpu("312", 5_000_000)  # 5 s since it started, within this interval
    cycle = _step(c, clock)
    e = {(x[0], x[2]): x[6] for x in cycle.energy}
    assert e[("311", "cpu")] == pytest.approx(500.0) and e[("312", "cpu")] == pytest.approx(500.0)
    c.close()
    # a collector starting afresh splits nothing on its first cycle: jobs' past CPU time is not its own
    node2, rapl2, cg2 = _node(tmp_path / "fresh", "sqlite:///unused")
    node2.hook("prolog", 313)
    cg2.add_job("313", cpus="0-15")
    cg2.set_cpu("313", 3600_000_000)
    c2 = Collector(load_config(node2.config, {}))
    assert not [x for x in c2.sample().energy if x[2] == "cpu"]
    rapl2.add_joules("package-0", 100.0)
    cg2.set_cpu("313", 3610_000_000)
    assert {(x[0], x[2]): x[6] for x in _step(c2, clock).energy}[("313", "cpu")] == pytest.approx(100.0)
    c2.close()


def test_a_node_slurm_names_otherwise_than_its_host_is_stored_under_slurms_name(
    engine: Engine, tmp_path: Path, clock: Clock
) -> None:
    """slurm.conf's NodeName need not be the host name (NodeHostname): the hooks record under Slurm's name
    (SLURMD_NODENAME, as sacct's NodeList has it), and the collector's own records must too, or one node's
    energy is stored under two names and counted twice (found by bench/real_gpu_check.py)."""
    url = engine.url.render_as_string(hide_password=False)
    node, rapl, cg = _node(tmp_path, url)
    node.hook("prolog", 311, SLURM_JOB_GPUS="1", SLURMD_NODENAME="gpu-n07")
    cg.add_job("311", cpus="0-3")
    c = Collector(load_config(node.config, {}))
    c.sample()
    rapl.add_joules("package-0", 500.0)
    cg.set_cpu("311", 30_000_000)
    _step(c, clock)
    assert c.node == "gpu-n07"
    node.hook("epilog", 311, SLURMD_NODENAME="gpu-n07")
    _step(c, clock)
    assert c.ship().error is None
    c.close()
    with engine.connect() as conn:
        names = set(
            conn.execute(text("SELECT DISTINCT node FROM node_energy WHERE job_id = '311'")).scalars()
        )
        sampled = set(conn.execute(text("SELECT DISTINCT node FROM samples")).scalars())
    assert names == {"gpu-n07"} and sampled <= {"gpu-n07"}, (names, sampled)
    # a restart keeps the name before any job runs again
    assert Collector(load_config(node.config, {})).node == "gpu-n07"
