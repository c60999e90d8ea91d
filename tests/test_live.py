"""Running jobs, measured so far (cocaq.footprint.live): the collector's real shipments into a real
database, read back as `cocaq watch`, `cocaq job` and /v1/live show them, against the fake NVML's trace."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.collector import fakenvml
from cocaq.collector.daemon import Collector
from cocaq.config_load import load_config
from cocaq.db.dbapi import connect
from cocaq.footprint import live as live_mod
from cocaq.footprint.live import Ask, live
from cocaq.footprint.lookup import UnknownName
from cocaq.units import J_PER_KWH
from tests.conftest import run_cocaq
from tests.nodekit import UUID_BY_MINOR, Clock, cocaq_env, make_node
from tests.sysfs_tree import make_cgroup_v2, make_rapl

# nodekit's fake GPUs: minor 1 is NVML index 0 (bus 07), minor 0 is NVML index 1 (bus 87)
NVML_INDEX = {0: 1, 1: 0}


def _node(tmp_path: Path, url: str, counter0: bool = False):  # type: ignore[no-untyped-def]
    sys_root = tmp_path / "sys"
    rapl = make_rapl(sys_root, packages=1, dram=True)
    cg = make_cgroup_v2(sys_root / "fs" / "cgroup", node_cpus="0-15")
    node = make_node(tmp_path, url, counter0=counter0, sysfs_root=sys_root)
    with open(node.config, "a") as fh:
        fh.write("idle_baseline_w = 0.0\n")
    return node, rapl, cg


def _run(node: Any, rapl: Any, cg: Any, clock: Clock, job: str, cycles: int = 6) -> Collector:
    """The job's prolog, `cycles` collector cycles 10 s apart on a busy node, one shipment."""
    node.hook("prolog", job, SLURM_JOB_GPUS="0,1")
    cg.add_job(job, cpus="0-3")
    c = Collector(load_config(node.config, {}))
    clock.now = max(clock.now, time.time()) + 1.0
    c.sample()
    for i in range(cycles):
        rapl.add_joules("package-0", 900.0)
        rapl.add_joules("package-0/dram", 60.0)
        cg.set_cpu(job, (i + 1) * 30_000_000)
        clock.now += 10.0
        c.sample()
    res = c.ship()
    assert res is not None and res.error is None
    return c


def _two_cycles(node: Any, clock: Clock) -> Collector:
    """Two collector cycles 10 s apart after the prologs already run, and one shipment."""
    c = Collector(load_config(node.config, {}))
    clock.now = max(clock.now, time.time()) + 1.0
    c.sample()
    clock.now += 10.0
    c.sample()
    assert c.ship().error is None
    return c


class Counting:
    """A Db whose statements are counted (the one-query-a-refresh promise)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.dialect = db.dialect
        self.n = 0

    def rows(self, sql: str, params: Any = None) -> list[Any]:
        self.n += 1
        return list(self.db.rows(sql, params))


def _fake_energy_j(minor: int, t0: float, t1: float) -> float:
    return (fakenvml.energy_mj_at(NVML_INDEX[minor], t1) - fakenvml.energy_mj_at(NVML_INDEX[minor], t0)) / 1e3


def test_a_running_job_not_yet_imported_is_measured_so_far_in_one_query(
    engine: Engine, tmp_path: Path, clock: Clock
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, rapl, cg = _node(tmp_path, url)
    c = _run(node, rapl, cg, clock, "401")
    cfg = load_config(node.config, {})
    prolog = next(e for e in node.events() if e["event"] == "start") if node.events() else None
    with engine.connect() as conn:
        start_ts = conn.execute(
            text("SELECT payload FROM node_events WHERE job_id = '401' AND event = 'start'")
        ).scalar_one()
    payload = start_ts if isinstance(start_ts, dict) else json.loads(start_ts)
    t_prolog = float(payload["ts"])
    with connect(url) as raw:
        db = Counting(raw)
        views = live(db, cfg, Ask(("401",)), now=clock.now)  # type: ignore[arg-type]
    assert db.n == 1, "one statement a refresh"
    assert prolog is None or prolog["job_id"] == "401"
    assert len(views) == 1
    v = views[0]
    assert v["running"] and v["state"] == "RUNNING" and not v["in_accounting"]
    assert (v["user"], v["account"], v["partition"]) == ("alice", "lab_vision", "gpu")
    assert v["start_ts"] == pytest.approx(t_prolog)
    by_index = {g["index"]: g for g in v["gpus"]}
    assert set(by_index) == {0, 1}
    last = clock.now  # the last cycle read the GPUs at this time
    fakenvml.configure(str(node.root / "fake-gpus.toml"))
    try:
        for minor, g in by_index.items():
            assert g["uuid"] == UUID_BY_MINOR[minor]
            # power now: the fake's reading at the last sample, to the watt
            assert g["power_w"] == pytest.approx(fakenvml.power_w_at(NVML_INDEX[minor], last), abs=0.5)
            snap = next(x for x in payload["gpus"] if x["uuid"] == g["uuid"])
            want = _fake_energy_j(minor, float(snap.get("ts", t_prolog)), last)
            if minor == 1:  # the counter since the prolog's snapshot: exact
                assert g["source"] == "nvml"
                got_mj = fakenvml.energy_mj_at(NVML_INDEX[minor], last) - snap["energy_mj"]
                assert g["energy_j"] == pytest.approx(got_mj / 1e3, abs=1e-3)
            else:  # minor 0 has no counter: the integral of 10 s samples of a varying trace
                # the trapezoids of the fake's power at the prolog's reading and each sample
                assert g["source"] == "nvml-power-integral"
                ts = [float(snap["ts"]), *(last - 10.0 * k for k in range(6, -1, -1))]
                w = [float(snap["power_w"])] + [fakenvml.power_w_at(NVML_INDEX[minor], t) for t in ts[1:]]
                trapz = sum((w[k] + w[k + 1]) / 2 * (ts[k + 1] - ts[k]) for k in range(len(ts) - 1))
                assert g["energy_j"] == pytest.approx(trapz, rel=1e-3)
                assert g["energy_j"] == pytest.approx(want, rel=0.3)  # and the trace's, at 10 s samples
    finally:
        fakenvml.reset()
    parts = {(p["component"], p["method"]): p for p in v["parts"]}
    assert set(parts) == {("gpu", "measured"), ("cpu", "measured"), ("dram", "measured")}
    gpu_j = sum(g["energy_j"] for g in v["gpus"])
    assert parts[("gpu", "measured")]["energy_j"] == pytest.approx(gpu_j)
    # the node's only job gets all of RAPL's energy (idle baseline 0), the first cycle's excepted
    assert parts[("cpu", "measured")]["energy_j"] == pytest.approx(900.0 * 6, rel=1e-6)
    assert parts[("dram", "measured")]["energy_j"] == pytest.approx(60.0 * 6, rel=1e-6)
    assert v["energy_kwh"] == pytest.approx((gpu_j + 5400 + 360) / J_PER_KWH)
    assert v["energy_estimated_kwh"] == 0.0
    assert v["estimate_note"] and "not in cocaq's import" in v["estimate_note"]
    assert v["projection"] is None, "no time limit known before the import"
    assert v["power_w"] == pytest.approx(
        sum(g["power_w"] for g in v["gpus"])
        + sum(p["power_w"] for p in v["parts"] if p["component"] != "gpu")
    )
    assert v["co2_kg"] == pytest.approx(
        v["energy_kwh"] * v["carbon"]["pue"] * v["carbon"]["g_per_kwh"] / 1000
    )
    assert any(w is not None for _, w in v["power_series"])
    assert v["newest_sample_ts"] == pytest.approx(last)
    json.dumps(v)  # what the API sends
    c.close()


def _import_running(
    engine: Engine, job: str, start: float, limit_s: float = 3600.0, raw: int | None = None
) -> None:
    """The job as the importer writes a RUNNING one (the columns live reads)."""
    with engine.begin() as conn:
        cid = conn.execute(text("SELECT id FROM clusters WHERE name = 'cocaqtest'")).scalar_one()
        conn.execute(
            text(
                "INSERT INTO jobs (cluster_id, job_id, job_id_raw, user_name, account, partition, n_nodes,"
                " alloc_cpus, alloc_gpus, req_mem_mb, submit_time, start_time, elapsed_s, time_limit_s,"
                " state, is_open, energy_j, energy_measured_j, pue, carbon_zone, carbon_g_per_kwh, co2_g,"
                " updated_at) VALUES (:cid, :job, :raw, 'alice', 'lab_vision', 'gpu', 1, 4, 2, 32768, :t,"
                " :t, 0, :limit, 'RUNNING', :open, 0, 0, 1.3, 'FR', 50.0, 0, :t)"
            ),
            {
                "cid": cid,
                "job": job,
                "raw": int(job) if raw is None else raw,
                "t": datetime.fromtimestamp(start, UTC),
                "limit": limit_s,
                "open": True,
            },
        )


def test_an_imported_running_job_gets_its_estimates_projection_and_carbon(
    engine: Engine, tmp_path: Path, clock: Clock
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, rapl, cg = _node(tmp_path, url)
    with open(node.config, "a") as fh:  # no RAPL: CPU and memory are estimated
        fh.write('sources = ["nvml", "cgroup"]\n')
    node.config.write_text(node.config.read_text().replace('sources = ["nvml", "rapl", "cgroup"]\n', ""))
    c = _run(node, rapl, cg, clock, "402")
    cfg = load_config(node.config, {})
    with engine.connect() as conn:
        t0 = conn.execute(text("SELECT min(t0) FROM node_energy WHERE job_id = '402'")).scalar_one()
    start = (
        (t0 if isinstance(t0, datetime) else datetime.fromisoformat(str(t0))).replace(tzinfo=UTC).timestamp()
    )
    _import_running(engine, "402", start)
    with connect(url) as db:
        v = live(db, cfg, Ask(("402",)), now=clock.now)[0]
    assert v["in_accounting"] and v["running"] and v["estimate_note"] is None
    parts = {(p["component"], p["method"]): p for p in v["parts"]}
    assert set(parts) == {("gpu", "measured"), ("cpu", "estimated"), ("dram", "estimated")}
    elapsed = clock.now - start
    hw, _ = cfg.hardware_for("gpu", None)
    assert parts[("cpu", "estimated")]["energy_j"] == pytest.approx(4 * elapsed * hw.cpu_tdp_w_per_core)
    assert parts[("dram", "estimated")]["energy_j"] == pytest.approx(32 * elapsed * cfg.estimate.mem_w_per_gb)
    assert v["carbon"] == {"zone": "FR", "g_per_kwh": 50.0, "pue": 1.3, "source": "the job's record"}
    assert v["co2_kg"] == pytest.approx(v["energy_kwh"] * 1.3 * 50.0 / 1000)
    p = v["projection"]
    assert p is not None and p["method"] == "estimated"
    assert p["until_ts"] == pytest.approx(start + 3600.0)
    assert v["energy_j"] < p["energy_j"] < v["energy_j"] + 3600 * (2 * 400 + 4 * hw.cpu_tdp_w_per_core + 40)
    c.close()
    # `cocaq job`: the job's facts, then what was measured so far instead of the import's estimate
    r = run_cocaq(["job", "402"], {**cocaq_env(node), "COLUMNS": "100"})
    assert r.code == 0, r.err
    assert "lab (account)" in r.out and "RUNNING for" in r.out and "At its time limit" in r.out
    assert "Energy so far:" in r.out and "Energy drawn by the hardware:" not in r.out
    r = run_cocaq(["job", "402", "-o", "json"], cocaq_env(node))
    assert json.loads(r.out)["live"]["job_id"] == "402"


def test_an_array_task_is_found_by_its_sacct_id_and_by_its_raw_id(
    engine: Engine, tmp_path: Path, clock: Clock
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, rapl, cg = _node(tmp_path, url)
    c = _run(node, rapl, cg, clock, "905", cycles=2)  # the node knows the raw id (SLURM_JOB_ID)
    c.close()
    with engine.connect() as conn:
        t0 = conn.execute(text("SELECT min(t0) FROM node_energy WHERE job_id = '905'")).scalar_one()
    start = (t0 if isinstance(t0, datetime) else datetime.fromisoformat(str(t0))).replace(tzinfo=UTC)
    _import_running(engine, "900_3", start.timestamp(), raw=905)  # sacct shows it as 900_3
    cfg = load_config(node.config, {})
    with connect(url) as db:
        for asked in ("900_3", "905"):
            [v] = live(db, cfg, Ask((asked,)), now=clock.now)
            assert (v["job_id"], v["job_id_raw"], v["in_accounting"]) == ("900_3", "905", True)
            assert len(v["gpus"]) == 2 and all(g["energy_j"] for g in v["gpus"])
        assert live(db, cfg, Ask(("900",)), now=clock.now) == []  # the array's own id is no task
        with pytest.raises(UnknownName):  # a cluster nowhere in the database: a typo, not "no job"
            live(db, cfg, Ask(("905",), cluster="elsewhere"), now=clock.now)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO clusters (name) VALUES ('elsewhere')"))
    with connect(url) as db:
        assert live(db, cfg, Ask(("905",), cluster="elsewhere"), now=clock.now) == []  # not on that one


def test_the_job_ends_then_waits_for_its_accounting(engine: Engine, tmp_path: Path, clock: Clock) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, rapl, cg = _node(tmp_path, url)
    c = _run(node, rapl, cg, clock, "403", cycles=3)
    cfg = load_config(node.config, {})
    node.hook("epilog", "403")
    cg.remove_job("403") if hasattr(cg, "remove_job") else None
    clock.now += 10.0
    c.sample()
    assert c.ship().error is None
    with connect(url) as db:
        v = live(db, cfg, Ask(("403",)), now=clock.now)[0]
        assert not v["running"] and v["state"] == "ENDED" and not v["accounted"]
        assert v["power_w"] is None and v["projection"] is None
        # the user's running jobs no longer list it
        assert [x["job_id"] for x in live(db, cfg, Ask(user="alice"), now=clock.now) if x["running"]] == []
    c.close()


def test_a_users_running_jobs_in_one_query(engine: Engine, tmp_path: Path, clock: Clock) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, _rapl, _cg = _node(tmp_path, url)
    node.hook("prolog", "411", SLURM_JOB_GPUS="0")
    node.hook("prolog", "412", SLURM_JOB_GPUS="1", SLURM_JOB_USER="bob", SLURM_JOB_UID="1002")
    c = _two_cycles(node, clock)
    cfg = load_config(node.config, {})
    with connect(url) as raw:
        db = Counting(raw)
        alice = live(db, cfg, Ask(user="alice"), now=clock.now)  # type: ignore[arg-type]
        bob = live(db, cfg, Ask(user="bob"), now=clock.now)  # type: ignore[arg-type]
        nobody = live(db, cfg, Ask(user="carol"), now=clock.now)  # type: ignore[arg-type]
    assert db.n == 3
    assert [v["job_id"] for v in alice] == ["411"] and [v["job_id"] for v in bob] == ["412"]
    assert nobody == []
    assert [g["index"] for g in alice[0]["gpus"]] == [0] and [g["index"] for g in bob[0]["gpus"]] == [1]
    c.close()


# --- pure: the rows a query returns -----------------------------------------------------------------


def _cfg() -> Any:
    from tests.builders import default_config

    return default_config()


def _start(node: str, ts: float, gpus: list[dict[str, Any]], user: str = "alice") -> tuple[Any, ...]:
    payload = json.dumps(
        {"ts": ts, "gpus": gpus, "job": {"user": user, "account": "lab", "partition": "gpu"}}
    )
    return (
        "v",
        1,
        "7",
        node,
        "start",
        None,
        None,
        payload,
        None,
        None,
        "c1",
        *[None] * 8,
        ts,
        None,
        None,
        None,
    )


def _energy(node: str, comp: str, dev: str, src: str, j: float, start: float, t1: float) -> tuple[Any, ...]:
    return (
        "e",
        1,
        "7",
        node,
        comp,
        dev,
        src,
        None,
        None,
        None,
        None,
        None,
        j,
        *[None] * 6,
        start,
        t1,
        None,
        0,
    )


def _sample(node: str, dev: str, metric: str, v: float, ts: float) -> tuple[Any, ...]:
    return (
        "s",
        1,
        "7",
        node,
        "nvml",
        dev,
        metric,
        None,
        None,
        None,
        None,
        None,
        v,
        *[None] * 6,
        ts,
        None,
        None,
        None,
    )


def test_a_reused_id_shows_only_its_newest_run_and_the_counter_wins_over_the_integral() -> None:
    now = 1_800_000_000.0
    old, new = now - 5 * 86400, now - 100
    rows = [
        _start("n1", old, [{"uuid": "GPU-a", "slurm_index": 3}]),
        _energy("n1", "gpu", "GPU-a", "nvml", 9e9, old, old + 50),  # the earlier run of the id
        _start("n1", new, [{"uuid": "GPU-a", "slurm_index": 0}]),
        _energy("n1", "gpu", "GPU-a", "nvml-power-edges", 26_000.0, new, now - 1),  # the epilog's edges
        _energy("n1", "gpu", "GPU-a", "nvml-power-integral", 25_000.0, new, now - 5),
        _energy("n1", "gpu", "GPU-a", "nvml", 24_000.0, new, now - 5),
        _energy("n1", "gpu", "GPU-a", "nvml", 23_000.0, new, now - 15),  # an older row of the counter
        _sample("n1", "GPU-a", "power_w", 250.0, now - 15),
        _sample("n1", "GPU-a", "power_w", 260.0, now - 5),
        _sample("n1", "GPU-a", "util_pct", 50.0, now - 15),
        _sample("n1", "GPU-a", "util_pct", 70.0, now - 5),
    ]
    [v] = live_mod.views(rows, _cfg(), now)
    assert v["start_ts"] == new and v["running"]
    [g] = v["gpus"]
    assert (g["index"], g["energy_j"], g["source"]) == (0, 24_000.0, "nvml")
    assert (g["power_w"], g["util_pct"], g["util_pct_mean"]) == (260.0, 70.0, 60.0)
    assert v["energy_j"] == 24_000.0


def test_power_history_sums_gpus_per_bin_and_leaves_gaps() -> None:
    now = 1_800_000_000.0
    rows = [_start("n1", now - 3600, [])]
    for i in range(0, 300, 10):  # the last 5 minutes only: the first half of the window is a gap
        rows.append(_sample("n1", "GPU-a", "power_w", 100.0, now - 300 + i))
        rows.append(_sample("n2", "GPU-b", "power_w", 200.0, now - 300 + i))
    [v] = live_mod.views(rows, _cfg(), now)
    series = [w for _, w in v["power_series"]]
    assert len(series) == live_mod.BINS, "10 s bins: the default sampling interval"
    assert all(w is None for w in series[: live_mod.BINS // 2])
    assert all(w == pytest.approx(300.0) for w in series[live_mod.BINS // 2 :])


def test_a_stale_gpu_has_no_power_now() -> None:
    now = 1_800_000_000.0
    rows = [_start("n1", now - 3600, [{"uuid": "GPU-a", "slurm_index": 0}])]
    rows.append(_sample("n1", "GPU-a", "power_w", 300.0, now - 400))  # the collector stopped shipping
    [v] = live_mod.views(rows, _cfg(), now)
    assert v["gpus"][0]["power_w"] is None and v["power_w"] == 0.0


# --- the CLI -------------------------------------------------------------------------------------------


def test_watch_and_job_show_the_running_job(engine: Engine, tmp_path: Path, clock: Clock) -> None:
    url = engine.url.render_as_string(hide_password=False)
    node, rapl, cg = _node(tmp_path, url)
    c = _run(node, rapl, cg, clock, "421")
    c.close()
    env = {**cocaq_env(node), "COLUMNS": "60"}
    r = run_cocaq(["watch", "421", "-n", "1"], env)
    assert r.code == 0, r.err
    assert "Job 421 (alice, lab_vision, gpu)" in r.out
    assert "Power now:" in r.out and "Energy so far:" in r.out and "CO2e so far:" in r.out
    assert max(len(line) for line in r.out.splitlines()) <= 60
    r = run_cocaq(["watch", "421", "-n", "1", "-o", "json"], env)
    assert r.code == 0, r.err
    got = json.loads(r.out.splitlines()[0])
    assert got["jobs"][0]["job_id"] == "421" and got["jobs"][0]["running"]
    # `cocaq job` on it: the same view, once
    r = run_cocaq(["job", "421"], env)
    assert r.code == 0, r.err
    assert "RUNNING for" in r.out and "Energy so far:" in r.out and "measured" in r.out
    r = run_cocaq(["job", "421", "-o", "json"], env)
    assert r.code == 0 and json.loads(r.out)["job_id"] == "421" and json.loads(r.out)["running"]
    # in a terminal: rich's Live redraws in place (cursor movement), twice
    import shutil
    import subprocess

    if shutil.which("script"):
        cmd = f"{sys.executable} -m cocaq watch 421 -n 2 -i 0.5"
        p = subprocess.run(
            ["script", "-qec", cmd, "/dev/null"], env=env, capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 0, p.stdout + p.stderr
        assert "\x1b[" in p.stdout and p.stdout.count("Energy so far:") >= 2
    r = run_cocaq(["watch", "-n", "1"], {**env, "USER": "alice", "LOGNAME": "alice"})
    assert r.code == 0, r.err
    r = run_cocaq(["watch", "99999", "-n", "1"], env)
    assert r.code == 4 and "no job 99999" in r.err
    r = run_cocaq(["watch", "12x"], env)
    assert r.code != 0 and "not a Slurm job id" in r.err
    r = run_cocaq(["watch", "421", "--window", "5s"], env)
    assert r.code != 0 and "--window" in r.err


# --- the read API: /v1/live, only one's own jobs --------------------------------------------------------


def test_the_api_serves_live_views_of_ones_own_jobs_only(
    engine: Engine, tmp_path: Path, clock: Clock
) -> None:
    import pwd

    from fastapi.testclient import TestClient

    from cocaq.api.client import payload_for
    from cocaq.api.server import create_app

    url = engine.url.render_as_string(hide_password=False)
    node, _rapl, _cg = _node(tmp_path, url)
    # daemon (uid 1) runs the job; bin (uid 2) is another user; root an admin
    node.hook("prolog", "431", SLURM_JOB_GPUS="0", SLURM_JOB_USER="daemon", SLURM_JOB_UID="1")
    c = _two_cycles(node, clock)
    c.close()
    with open(node.config, "a") as fh:
        fh.write('[api]\nadmin_users = ["root"]\n')
    cfg = load_config(node.config, {})

    def decode(cred: str) -> tuple[int, bytes]:  # "uid path": what munged would vouch for
        uid, _, path = cred.partition(" ")
        return int(uid), payload_for("GET", path)

    def get(who: str, **params: str) -> Any:
        uid = pwd.getpwnam(who).pw_uid
        return api.get("/v1/live", params=params, headers={"Authorization": f"MUNGE {uid} /v1/live"})

    with TestClient(create_app(cfg, decode=decode), base_url="http://api") as api:
        r = get("daemon", jobs="431")
        assert r.status_code == 200, r.text
        [v] = r.json()["jobs"]
        assert v["job_id"] == "431" and v["user"] == "daemon" and v["running"]
        with connect(url) as db:  # the same view as the database path, to the number
            [direct] = live(db, cfg, Ask(("431",)), now=v["now_ts"])
        assert v["energy_j"] == direct["energy_j"] and v["gpus"] == direct["gpus"]
        assert get("root", jobs="431").json()["jobs"][0]["job_id"] == "431"
        r = get("bin", jobs="431")
        assert r.status_code == 403 and "not found, or not yours" in r.json()["detail"]
        assert get("bin", jobs="999999").status_code == 403  # absent and someone else's read the same
        assert [x["job_id"] for x in get("daemon", user="daemon").json()["jobs"]] == ["431"]
        assert get("bin", user="daemon").status_code == 403
        assert get("bin", user="bin").json()["jobs"] == []
        assert get("daemon").status_code == 400
        assert get("daemon", jobs="431;DROP").status_code == 422
        assert get("daemon", jobs=",".join(["1"] * 101)).status_code == 422


def test_a_running_job_on_a_node_without_a_collector_is_estimated_and_says_so(
    engine: Engine, tmp_path: Path
) -> None:
    from tests.builders import write_config

    with engine.begin() as conn:
        conn.execute(text("INSERT INTO clusters (name) VALUES ('cocaqtest')"))
    start = time.time() - 1800
    _import_running(engine, "441", start)
    url = engine.url.render_as_string(hide_password=False)
    cfg_path = write_config(tmp_path / "cocaq.toml", url)
    cfg = load_config(cfg_path, {})
    with connect(url) as db:
        [v] = live(db, cfg, Ask(("441",)))
    assert v["running"] and v["in_accounting"] and v["gpus"] == []
    assert {p["method"] for p in v["parts"]} == {"estimated"}
    hw, _ = cfg.hardware_for("gpu", None)
    [gpu] = [p for p in v["parts"] if p["component"] == "gpu"]
    assert gpu["energy_j"] == pytest.approx(2 * v["elapsed_s"] * hw.gpu_tdp_w * cfg.estimate.gpu_utilisation)
    assert v["power_w"] == pytest.approx(sum(p["power_w"] for p in v["parts"]))
    r = run_cocaq(["--config", str(cfg_path), "watch", "441", "-n", "1"], {"COLUMNS": "100"})
    assert r.code == 0, r.err
    assert "Nothing measured yet" in r.out and "estimated" in r.out


def test_a_running_job_says_one_run_time_and_no_power_now_for_an_estimate(
    engine: Engine, tmp_path: Path
) -> None:
    """Issue 32: `cocaq job` of a running job says its run time once (the facts' row and the live line
    alike, now minus its start, not the import's minutes-old elapsed); a power that is a rated-power
    estimate is called so, never "Power now"; a collector that shipped samples and then stopped is not
    "nothing measured" (the GPU memory shown came from those samples); one that never shipped is."""
    import re

    from tests.builders import write_config

    with engine.begin() as conn:
        conn.execute(text("INSERT INTO clusters (name) VALUES ('cocaqtest')"))
        cid = conn.execute(text("SELECT id FROM clusters WHERE name = 'cocaqtest'")).scalar_one()
    start = time.time() - 3000
    _import_running(engine, "451", start, limit_s=12 * 3600)  # imported with elapsed_s 0
    _import_running(engine, "452", start, limit_s=12 * 3600)  # no collector ever shipped of it
    with engine.begin() as conn:  # its collector shipped two minutes of samples, then stopped
        for i, metric in enumerate(("power_w", "util_pct", "mem_used_mb")):
            for k in range(3):
                conn.execute(
                    text(
                        "INSERT INTO samples (ts, cluster_id, node, source, device, metric, job_id, value)"
                        " VALUES (:ts, :cid, 'n1', 'nvml', 'GPU-a', :m, '451', :v)"
                    ),
                    {"ts": datetime.fromtimestamp(start + 60 + 60 * k, UTC), "cid": cid, "m": metric,
                     "v": (250.0, 90.0, 4096.0)[i]},
                )  # fmt: skip
    url = engine.url.render_as_string(hide_password=False)
    cfg_path = write_config(tmp_path / "cocaq.toml", url)
    env = {"COLUMNS": "100"}
    assert run_cocaq(["--config", str(cfg_path), "aggregate"], env).code == 0
    r = run_cocaq(["--config", str(cfg_path), "job", "451"], env)
    assert r.code == 0, r.err
    out = " ".join(r.out.split())
    [row] = re.findall(r"run time (\d+:\d\d:\d\d) so far of a 12:00:00 limit \(\d+%\)", out)
    [live_line] = re.findall(r"RUNNING for (\d+:\d\d:\d\d) of a 12:00:00 limit", out)
    assert row == live_line, r.out
    h, m, s = map(int, row.split(":"))
    assert abs(h * 3600 + m * 60 + s - 3000) < 60, "now minus the start, not the import's elapsed_s"
    assert "Power now" not in out and "Power, estimated from rated power (none of it measured): " in out
    assert re.search(r"GPU memory at most 4(\.0)? GB on one GPU .*so far", out), r.out
    assert "Nothing measured yet" not in out, "samples came: the GPU memory above is from them"
    assert "No sample in the last 10 min: the newest is from " in out, r.out
    assert re.search(r"At its time limit, \d{4}-\d\d-\d\d \d\d:\d\d ", out), r.out
    d = json.loads(run_cocaq(["--config", str(cfg_path), "job", "451", "-o", "json"], env).out)
    assert d["elapsed_s"] == d["live"]["elapsed_s"] and abs(d["elapsed_s"] - 3000) < 60
    assert d["live"]["power_estimated_w"] == pytest.approx(d["live"]["power_w"])
    r = run_cocaq(["--config", str(cfg_path), "job", "452"], env)
    out = " ".join(r.out.split())
    assert r.code == 0 and "Nothing measured yet" in out and "GPU memory" not in out, r.out
    assert "Power now" not in out
    r = run_cocaq(
        ["--config", str(cfg_path), "watch", "-n", "1"], {**env, "USER": "alice", "LOGNAME": "alice"}
    )
    out = " ".join(r.out.split())
    assert r.code == 0 and "alice's running jobs: 2, drawing" in out, r.out
    assert "(estimated from rated power: none of it measured)" in out and " now" not in out.split("┏")[0]


def test_a_pending_jobs_row_without_a_prolog_record_is_nothing_to_watch_not_an_error() -> None:
    """sacct imports a pending job (no start time) before any node ran its prolog: no live view (the
    watch says the job has not started), where the view's start was once the minimum of no prolog."""
    now = 1_800_000_000.0
    pending = ("j", 1, "7", None, "alice", "lab", "gpu", "PENDING", *[None] * 2, "c1", *[None] * 8,
               None, None, now - 60, True)  # fmt: skip
    assert len(pending) == len(_start("n1", now, []))
    assert live_mod.views([pending], _cfg(), now) == []
    # once its prolog ran, the same row shows the run from the prolog's time
    [v] = live_mod.views(
        [pending, _start("n1", now - 30, [{"uuid": "GPU-a", "slurm_index": 0}])], _cfg(), now
    )
    assert v["start_ts"] == now - 30 and v["running"]
