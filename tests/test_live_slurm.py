"""Live, end to end: a real Slurm job on the one-node test cluster (tests/slurm/cluster.sh, Slurm 22.05),
watched with `cocaq watch` while it runs, scraped by a real Prometheus from the collector's metrics
endpoint, and compared with the fake NVML's trace and with what cocaq stores for it.

The node: two fake A100s (minor 0 with an energy counter, minor 1 without: its energy is the integral of
the sampled power), the collector at 1 s cycles shipping every 2 s and serving `[collector]
metrics_listen`, a Prometheus scraping it every second as the Ansible role's scrape config does
(`honor_labels`). Needs root (it reconfigures the cluster's Prolog/Epilog). About 70 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from cocaq.collector import fakenvml
from cocaq.db.engine import make_engine
from tests.conftest import ROOT, new_database, run_cocaq
from tests.promkit import Prometheus, free_port, promtool_check_metrics
from tests.slurmkit import (
    NVML_INDEX,
    STATE_DIR,
    UUID,
    activate,
    cluster_lock,
    cluster_sh,
    hook_env,
    queue,
    sbatch,
    slurm_config,
    up_or_skip,
    wait_until,
    write_inputs,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

VERSION = "22.05"
SHIM_DIR = STATE_DIR / "shims-live"
DASHBOARD = ROOT / "ansible" / "roles" / "cocaq_server" / "files" / "grafana" / "cocaq.json"
JOB_PANEL = "Job GPU energy so far (J)"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "100"
    return env


def _cocaq(config: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return run_cocaq(["--config", str(config), *args], env or _env())


def _watch_json(config: Path, job: str, shipped: bool = True) -> dict[str, Any] | None:
    r = _cocaq(config, "watch", job, "-n", "1", "-o", "json")
    if not shipped and r.code == 4 and f"no job {job}" in r.err:
        return None  # its node has not shipped it yet
    assert r.code == 0, r.err
    [v] = json.loads(r.out.splitlines()[0])["jobs"]
    return dict(v)


@pytest.fixture(scope="module")
def node(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: runs a real Slurm cluster (tests/slurm/cluster.sh) with cocaq's hooks")
    stack = ExitStack()
    stack.enter_context(cluster_lock())
    tmp = tmp_path_factory.mktemp("live")
    outdir = Path(tempfile.mkdtemp(prefix="cocaq-live-", dir="/tmp"))
    os.chmod(outdir, 0o1777)
    hooks_on = False
    procs: list[subprocess.Popen[str]] = []
    try:
        db_url = new_database("postgresql", tmp, request)
        port = free_port()
        config, spec, _ = write_inputs(tmp, db_url, f'metrics_listen = "127.0.0.1:{port}"\n')
        r = _cocaq(config, "db", "upgrade")
        assert r.code == 0, r.err
        r = _cocaq(config, "hook", "shims", "--dir", str(SHIM_DIR), "--hook-config", str(config))
        assert r.code == 0, r.err
        prolog, epilog = str(SHIM_DIR / "cocaq-prolog"), str(SHIM_DIR / "cocaq-epilog")
        hooks_on = True
        up = cluster_sh("up", hook_env(prolog, epilog), VERSION)
        up_or_skip(up, VERSION)
        stack.enter_context(activate(VERSION))
        assert slurm_config("Prolog") == prolog
        collector = subprocess.Popen(
            [sys.executable, "-m", "cocaq", "--config", str(config), "collector"],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        procs.append(collector)
        prom = stack.enter_context(
            Prometheus(
                tmp / "prometheus",
                [
                    {
                        "job_name": "cocaq-nodes",
                        "honor_labels": True,
                        "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"node": "vm"}}],
                    }
                ],
            )
        )
        wait_until("Prometheus to scrape the collector", 30, lambda: prom.targets_up())
        yield {
            "config": config,
            "db_url": db_url,
            "spec": spec,
            "port": port,
            "prom": prom,
            "outdir": outdir,
            "collector": collector,
            "procs": procs,
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
        restore = cluster_sh("up", hook_env(), VERSION) if hooks_on else None
        stack.close()
        shutil.rmtree(outdir, ignore_errors=True)
        if restore is not None:
            assert restore.returncode == 0, f"restoring the cluster failed:\n{restore.stdout}{restore.stderr}"


def test_watch_a_real_running_job_and_scrape_it(node: dict[str, Any]) -> None:
    config, prom = node["config"], node["prom"]
    t_submit = time.time()
    job = sbatch("alice", node["outdir"], "--gres=gpu:2", "--account=lab_vision", "--time=2", "-J", "cocaq-live",
                 "--wrap", "sleep 45")  # fmt: skip

    # 1. `cocaq watch` sees it running, measured, from the node's first shipment (before any import)
    def measured() -> Any:
        if queue().get(job) != "RUNNING":
            return None
        v = _watch_json(config, job, shipped=False)
        if v is None:
            return None
        gpus = [g for g in v["gpus"] if g["power_w"] is not None and g["energy_j"]]
        return v if len(gpus) == 2 and v["running"] else None

    v = wait_until(f"cocaq watch to show job {job} measured", 40, measured, step=1.0)
    assert not v["in_accounting"] and (v["user"], v["account"]) == ("alice", "lab_vision")
    # follow it to the end in the background, as a user would (no TTY: one block per refresh)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "cocaq", "--config", str(config), "watch", job, "-i", "1"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    node["procs"].append(watcher)

    time.sleep(6)  # some seconds into the run
    v = _watch_json(config, job)
    assert v is not None
    engine = make_engine(node["db_url"])
    with engine.connect() as c:
        payload = c.execute(
            text("SELECT payload FROM node_events WHERE job_id = :j AND event = 'start'"), {"j": job}
        ).scalar_one()
    snaps = {g["uuid"]: g for g in (payload if isinstance(payload, dict) else json.loads(payload))["gpus"]}
    fakenvml.configure(str(node["spec"]))
    try:
        by_minor = {g["index"]: g for g in v["gpus"]}
        assert set(by_minor) == {0, 1}
        for minor, g in by_minor.items():
            assert g["uuid"] == UUID[minor]
            # the watts are the fake trace's at the sample's time
            assert g["power_w"] == pytest.approx(
                fakenvml.power_w_at(NVML_INDEX[minor], g["power_ts"]), abs=0.5
            )
        g0 = by_minor[0]  # the counter since the prolog's snapshot, to the millijoule
        want = (fakenvml.energy_mj_at(NVML_INDEX[0], g0["as_of_ts"]) - snaps[UUID[0]]["energy_mj"]) / 1e3
        assert g0["source"] == "nvml" and g0["energy_j"] == pytest.approx(want, abs=0.01)
        g1 = by_minor[1]  # no counter: the integral of 1 s samples, against the trace's exact energy
        t0 = float(snaps[UUID[1]]["ts"])
        want = (
            fakenvml.energy_mj_at(NVML_INDEX[1], g1["as_of_ts"]) - fakenvml.energy_mj_at(NVML_INDEX[1], t0)
        ) / 1e3
        assert g1["source"] == "nvml-power-integral" and g1["energy_j"] == pytest.approx(want, rel=0.05)
    finally:
        fakenvml.reset()

    # 2. Prometheus has the job's series, labelled, and the exposition is clean
    got = prom.wait_for(f'cocaq_job_gpu_power_watts{{job_id="{job}"}}')
    labels = {s["metric"]["gpu"]: s["metric"] for s in got}
    assert set(labels) == {"0", "1"}
    assert all(
        m["user"] == "alice" and m["account"] == "lab_vision" and m["partition"] for m in labels.values()
    )
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{node['port']}/metrics", timeout=5) as r:
        assert promtool_check_metrics(r.read().decode()) == ""

    # 3. the job ends; its series go stale; the import closes it and `cocaq watch` prints its footprint
    wait_until(f"job {job} to end", 90, lambda: job not in queue(), step=1.0)
    t_end = time.time()
    wait_until(
        "its series to go stale",
        15,
        lambda: prom.query(f'cocaq_job_gpu_power_watts{{job_id="{job}"}}') == [],
    )
    time.sleep(3)  # one shipment after the epilog's
    r = _cocaq(config, "reconcile", "--since", "1h", "--backend", "cli")
    assert r.code == 0, r.err
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert "RUNNING for" in out and "Power now:" in out
    assert "has ended; waiting" in out or "Energy drawn by the hardware:" in out
    tail = out[out.rfind(f"Job {job} on cluster") :]
    assert (
        tail.startswith(f"Job {job} on cluster")
        and "Energy drawn by the hardware:" in tail
        and "COMPLETED" in tail
    )

    # 4. PromQL over what was scraped gives each GPU's energy within 1% of what cocaq stores
    with engine.connect() as c:
        stored = dict(
            c.execute(
                text("SELECT device, energy_j FROM node_energy WHERE job_id = :j AND component = 'gpu'"),
                {"j": job},
            ).all()
        )
        total = c.execute(
            text(
                "SELECT sum(e.energy_j) FROM job_energy e JOIN jobs j ON j.id = e.job_pk"
                " WHERE j.job_id = :j AND e.component = 'gpu' AND e.method = 'measured'"
            ),
            {"j": job},
        ).scalar_one()
    engine.dispose()
    assert set(stored) == set(UUID.values())
    span = f"{int(time.time() - t_submit) + 10}s"
    for uuid, joules in stored.items():
        [s] = prom.query(
            f'max_over_time(cocaq_job_gpu_energy_joules_total{{job_id="{job}",uuid="{uuid}"}}[{span}])'
        )
        assert float(s["value"][1]) == pytest.approx(joules, rel=0.01), uuid
    # the dashboard's per-job panel, as Grafana would run it over the job's time range
    dash = json.loads(DASHBOARD.read_text())
    [panel] = [p for p in dash["panels"] if p.get("title") == JOB_PANEL]
    expr = panel["targets"][0]["expr"].replace("$job_id", job)
    expr = re.sub(r"\$\{?cluster\}?", ".*", expr)
    rng = prom.api("query_range", query=expr, start=f"{t_submit:.0f}", end=f"{t_end + 5:.0f}", step="1")
    [series] = rng["result"]
    assert float(series["values"][-1][1]) == pytest.approx(total, rel=0.01)
