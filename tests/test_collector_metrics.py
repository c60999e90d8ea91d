"""`[collector] metrics_listen`: the collector's Prometheus endpoint, scraped over real HTTP.

A real Collector on a fixture node (fake NVML, RAPL and cgroup v2 trees, jobs started by the real prolog)
serves on a free port; what a scrape shows must be what the cycle recorded, to the bit: the same joules
the collector ships, with the labels of the prolog's record. promtool and a real Prometheus read it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cocaq.collector import spool
from cocaq.collector.daemon import Collector
from cocaq.collector.sources import Cycle
from cocaq.config_load import load_config
from cocaq.ml.meta import parse_comment
from tests.conftest import ROOT, run_cocaq
from tests.nodekit import UUID_BY_MINOR, Clock, Node, cocaq_env, make_node
from tests.promkit import Prometheus, free_port, promtool_check_metrics
from tests.sysfs_tree import CgroupTree, RaplTree, make_cgroup_v2, make_rapl

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _node(tmp_path: Path, listen: str | None, counter0: bool = True) -> tuple[Node, RaplTree, CgroupTree]:
    sys_root = tmp_path / "sys"
    rapl = make_rapl(sys_root, packages=1, dram=True)
    cg = make_cgroup_v2(sys_root / "fs" / "cgroup", node_cpus="0-15")
    node = make_node(tmp_path, counter0=counter0, sysfs_root=sys_root)
    with open(node.config, "a") as fh:
        fh.write("idle_baseline_w = 0\n")
        if listen is not None:
            fh.write(f'metrics_listen = "{listen}"\n')
    return node, rapl, cg


def _scrape(port: int, accept: str | None = None) -> tuple[str, str]:
    """(content type, body) of GET /metrics over real HTTP."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers["Content-Type"], r.read().decode("utf-8")


def _series(text: str) -> Series:
    """Every sample of a text exposition by (name, sorted labels), parsed by prometheus_client's parser."""
    out: Series = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _by_name(series: Series, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in series.items() if n == name}


def _busy_cycle(c: Collector, clock: Clock, rapl: RaplTree, cg: CgroupTree, cpu: dict[str, int]) -> Cycle:
    clock.now += 10.0
    rapl.add_joules("package-0", 1000.0)
    rapl.add_joules("package-0/dram", 100.0)
    for jid, usec in cpu.items():
        cg.set_cpu(jid, usec)
    return c.sample()


def _expected(cycle: Cycle, c: Collector) -> Series:
    """What the endpoint must show for a cycle, built from the cycle's own samples and energy rows."""
    states = spool.running_jobs(c.cfg.spool_dir)
    model = {"301": "llama-3-8b"}

    def job_labels(jid: str) -> dict[str, str]:
        job = states.get(jid, {}).get("job", {})
        return {
            "cluster": "cocaqtest",
            "node": c.node,
            "job_id": jid,
            "user": job.get("user", ""),
            "account": job.get("account", ""),
            "partition": job.get("partition", ""),
            "model": model.get(jid, ""),
        }

    def gpu_labels(jid: str, uuid: str) -> dict[str, str]:
        idx = {g["uuid"]: str(g["slurm_index"]) for g in states[jid]["gpus"]}
        return {**job_labels(jid), "gpu": idx[uuid], "uuid": uuid}

    out: Series = {}

    def put(name: str, labels: dict[str, str], v: float) -> None:
        out[(name, tuple(sorted(labels.items())))] = v

    for _ts, source, dev, metric, jid, v in cycle.samples:
        if jid is None:
            continue
        if (source, metric) == ("nvml", "power_w"):
            put("cocaq_job_gpu_power_watts", gpu_labels(jid, dev), v)
        elif (source, metric) == ("nvml", "util_pct"):
            put("cocaq_job_gpu_utilization_ratio", gpu_labels(jid, dev), v / 100)
        elif (source, metric) == ("nvml", "mem_used_mb"):
            put("cocaq_job_gpu_memory_used_bytes", gpu_labels(jid, dev), v * 1048576)
        elif (source, metric) == ("cgroup", "cpu_cores"):
            put("cocaq_job_cpu_cores", job_labels(jid), v)
    for r in cycle.energy:
        if r.component == "gpu":
            put("cocaq_job_gpu_energy_joules_total", gpu_labels(r.job_id, r.device), r.energy_j)
        else:
            put(
                "cocaq_job_host_energy_joules_total",
                {**job_labels(r.job_id), "component": r.component},
                r.energy_j,
            )
    return out


def _per_job(series: Series) -> Series:
    return {k: v for k, v in series.items() if k[0].startswith("cocaq_job_")}


def test_a_scrape_shows_the_cycle_exactly_with_the_prologs_labels(tmp_path: Path, clock: Clock) -> None:
    port = free_port()
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
    node.hook("prolog", 301, SLURM_JOB_GPUS="0,1", SLURM_JOB_COMMENT="cocaq: model=llama-3-8b bs=8")
    node.hook("prolog", 302, SLURM_JOB_PARTITION="cpu", SLURM_JOB_USER="bob", SLURM_JOB_ACCOUNT="lab_nlp")
    cg.add_job("301", cpus="0-3")
    cg.add_job("302", cpus="4-11")
    c = Collector(load_config(node.config, {}))
    try:
        assert c.metrics is not None
        c.sample()
        cycle = _busy_cycle(c, clock, rapl, cg, {"301": 30_000_000, "302": 10_000_000})
        ctype, text = _scrape(port)
        assert ctype.startswith("text/plain")
        got = _series(text)
        want = _expected(cycle, c)
        # every GPU of job 301 has all four series, both jobs their cores and CPU/DRAM shares
        names = sorted({n for n, _ in want})
        assert names == [
            "cocaq_job_cpu_cores",
            "cocaq_job_gpu_energy_joules_total",
            "cocaq_job_gpu_memory_used_bytes",
            "cocaq_job_gpu_power_watts",
            "cocaq_job_gpu_utilization_ratio",
            "cocaq_job_host_energy_joules_total",
        ]
        assert len(want) == 2 * 4 + 2 * (1 + 2)
        assert _per_job(got) == want  # the same values, bit for bit, and nothing else per job
        power = _by_name(got, "cocaq_job_gpu_power_watts")
        assert {dict(lab)["uuid"]: dict(lab)["gpu"] for lab in power} == {
            UUID_BY_MINOR[0]: "0",
            UUID_BY_MINOR[1]: "1",
        }
        lab = dict(next(iter(power)))
        assert (lab["user"], lab["account"], lab["partition"], lab["model"]) == (
            "alice",
            "lab_vision",
            "gpu",
            "llama-3-8b",
        )
        cores = {dict(k)["job_id"]: dict(k) for k in _by_name(got, "cocaq_job_cpu_cores")}
        assert (cores["302"]["user"], cores["302"]["account"], cores["302"]["model"]) == (
            "bob",
            "lab_nlp",
            "",
        )
        # the energy counter is what collector.db ships to node_energy
        shipped = {(r[0], r[2], r[3]): r[6] for r in c.db.pending_energy()}
        for labels, v in _by_name(got, "cocaq_job_gpu_energy_joules_total").items():
            d = dict(labels)
            assert shipped[(d["job_id"], "gpu", d["uuid"])] == v
        # health
        node_l = (("cluster", "cocaqtest"), ("node", c.node))
        assert got[("cocaq_collector_up", node_l)] == 1
        assert got[("cocaq_collector_cycles_total", node_l)] == 2
        assert got[("cocaq_collector_running_jobs", node_l)] == 2
        assert got[("cocaq_collector_source_errors_total", node_l)] == 0
        assert got[("cocaq_collector_last_sample_timestamp_seconds", node_l)] == cycle.ts
        assert ("cocaq_collector_last_ship_timestamp_seconds", node_l) not in got  # never shipped
        up = {dict(k)["source"]: v for k, v in _by_name(got, "cocaq_collector_source_up").items()}
        assert up == {"nvml": 1, "rapl": 1, "cgroup": 1}
        backlog = {
            dict(k)["kind"]: v for k, v in _by_name(got, "cocaq_collector_spool_backlog_records").items()
        }
        n_samples = c.db.conn.execute("SELECT count(*) FROM samples").fetchone()[0]
        assert backlog == {"events": 2, "samples": n_samples, "energy": c.db.counts()["energy_unshipped"]}
        # OpenMetrics when the scraper asks for it, with the same values
        ctype, om = _scrape(port, OPENMETRICS)
        assert ctype.startswith("application/openmetrics-text") and om.endswith("# EOF\n")
        assert "cocaq_job_gpu_energy_joules_total{" in om
    finally:
        c.close()


def test_a_finished_jobs_gauges_go_at_once_and_its_counters_after_keeping_its_final_values(
    tmp_path: Path, clock: Clock
) -> None:
    from cocaq.collector.metrics import ENDED_KEEP_S

    port = free_port()
    # GPU 0 has no energy counter: job 311's energy is an integral the epilog's record closes (a final
    # row in the cycle after its end); GPU 1 has one: job 314's final energy is the epilog's own reading
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}", counter0=False)
    for jid, gpus in (("311", "0"), ("314", "1"), ("313", "")):
        node.hook("prolog", jid, SLURM_JOB_GPUS=gpus) if gpus else node.hook("prolog", jid)
        cg.add_job(jid, cpus="0-3")
    c = Collector(load_config(node.config, {}))

    def by_job(got: Series) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for (name, labels), _ in _per_job(got).items():
            out.setdefault(str(dict(labels).get("job_id")), set()).add(name)
        return out

    real = time.monotonic() - clock.now  # the hooks run in real time (the fake GPUs too): keep in step

    def at(t: float) -> None:
        clock.now = t
        while time.monotonic() - real < t:
            time.sleep(0.05)

    try:
        at(clock.now + 0.5)
        c.sample()
        at(clock.now + 1.0)
        rapl.add_joules("package-0", 100.0)
        for jid in ("311", "314", "313"):
            cg.set_cpu(jid, 1_000_000)
        c.sample()
        assert set(by_job(_series(_scrape(port)[1]))) == {"311", "313", "314"}
        running = _series(_scrape(port)[1])
        at(clock.now + 0.5)
        node.hook("epilog", 311)  # ends: its end record arrives, its state goes
        node.hook("epilog", 314)
        cg.remove_job("311")
        cg.remove_job("314")
        (node.spool / "jobs" / "313.state").unlink()  # leaves the spool without an epilog (and its cgroup)
        cg.remove_job("313")
        at(time.monotonic() - real + 0.5)
        cycle = c.sample()
        assert any(r.job_id == "311" and r.final for r in cycle.energy) and "311" not in cycle.jobs
        got = _series(_scrape(port)[1])
        jobs = by_job(got)
        gauges = {"cocaq_job_gpu_power_watts", "cocaq_job_gpu_utilization_ratio", "cocaq_job_cpu_cores"}
        assert all(not (names & gauges) for names in jobs.values()), "an ended job's gauges go at once"
        assert (
            jobs["311"]
            == jobs["314"]
            == {"cocaq_job_gpu_energy_joules_total", "cocaq_job_host_energy_joules_total"}
        )
        assert jobs["313"] == {"cocaq_job_host_energy_joules_total"}
        assert got[("cocaq_collector_running_jobs", (("cluster", "cocaqtest"), ("node", c.node)))] == 0

        def gpu_energy(series: Series, job: str) -> float:
            [v] = [
                v
                for (n, lab), v in series.items()
                if n == "cocaq_job_gpu_energy_joules_total" and dict(lab)["job_id"] == job
            ]
            return v

        # the final values: the integral closed at the epilog's reading, the epilog's counter reading
        closed = [r for r in cycle.energy if r.job_id == "311" and r.final]
        assert gpu_energy(got, "311") == closed[0].energy_j
        end = next(e for e in node.events() if e["event"] == "end" and e["job_id"] == "314")
        final = [e["energy_j"] for e in end["energy"] if e["component"] == "gpu"]
        assert gpu_energy(got, "314") == final[0] >= gpu_energy(running, "314")
        assert promtool_check_metrics(_scrape(port)[1]) == ""
        # 314 is requeued: the same id runs again, with its running series and none kept
        node.hook("prolog", 314, SLURM_JOB_GPUS="1")
        cg.add_job("314", cpus="0-3")
        at(time.monotonic() - real + 0.5)
        c.sample()
        text = _scrape(port)[1]
        again = [k for k in _per_job(_series(text)) if dict(k[1])["job_id"] == "314"]
        lines = [x for x in text.splitlines() if x.startswith("cocaq_job_gpu_energy_joules_total{")]
        assert len([x for x in lines if 'job_id="314"' in x]) == 1, "one series, not a kept one beside it"
        assert "cocaq_job_gpu_power_watts" in {k[0] for k in again}
        assert promtool_check_metrics(text) == ""
        # ENDED_KEEP_S later the others are gone too: their series go stale
        clock.now += ENDED_KEEP_S
        _busy_cycle(c, clock, rapl, cg, {})
        assert set(by_job(_series(_scrape(port)[1]))) == {"314"}
        assert c.metrics is not None and c.metrics.ended == {}
        assert [k[0] for k in c.metrics.models] == ["314"]
    finally:
        c.close()


HOSTILE = {
    "user": 'mal"lory\\x\nnew line',
    "account": 'a}b{c="d"',
    "partition": 'gpu\\\\"',
}
COMMENT = 'cocaq: model="we\\"ird\\n"'


def _hostile_job(node: Node) -> None:
    """A start record as a broken or malicious prolog could leave it: quotes, backslashes, newlines,
    a lone surrogate (not UTF-8), a number where a string belongs."""
    spool.write_job_state(
        str(node.spool),
        "777",
        {
            "job_id": "777",
            "ts": time.time(),
            "uid": "x",
            "gpus": [{"uuid": UUID_BY_MINOR[0], "slurm_index": '0"\n', "energy_mj": 1}],
            "job": {**HOSTILE, "comment": COMMENT},
        },
    )
    spool.write_job_state(
        str(node.spool),
        "778",
        {"job_id": "778", "ts": time.time(), "gpus": [], "job": {"user": "\udcff", "account": 7}},
    )


def test_hostile_label_values_are_escaped_and_promtool_is_clean(tmp_path: Path, clock: Clock) -> None:
    port = free_port()
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
    _hostile_job(node)
    cg.add_job("777", cpus="0-3")
    cg.add_job("778", cpus="4-7")
    c = Collector(load_config(node.config, {}))
    try:
        c.sample()
        _busy_cycle(c, clock, rapl, cg, {"777": 5_000_000, "778": 5_000_000})
        text = _scrape(port)[1]
        assert promtool_check_metrics(text) == ""
        got = _series(text)
        power = _by_name(got, "cocaq_job_gpu_power_watts")
        assert len(power) == 1
        lab = dict(next(iter(power)))
        assert {k: lab[k] for k in HOSTILE} == HOSTILE  # escaped on the wire, the same values read back
        assert lab["gpu"] == '0"\n' and lab["model"] == parse_comment(COMMENT)["model"] == "we\\"
        other = {dict(k)["job_id"]: dict(k) for k in _by_name(got, "cocaq_job_cpu_cores")}["778"]
        assert other["user"] == "?" and other["account"] == "7"
        om = _scrape(port, OPENMETRICS)[1]
        assert om.endswith("# EOF\n") and 'user="mal\\"lory\\\\x\\nnew line"' in om
    finally:
        c.close()


def test_promtool_and_a_real_prometheus_read_it(tmp_path: Path, clock: Clock) -> None:
    port = free_port()
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
    node.hook("prolog", 321, SLURM_JOB_GPUS="1")
    cg.add_job("321", cpus="0-3")
    c = Collector(load_config(node.config, {}))
    try:
        c.sample()
        cycle = _busy_cycle(c, clock, rapl, cg, {"321": 8_000_000})
        text = _scrape(port)[1]
        assert promtool_check_metrics(text) == ""
        joules = next(r.energy_j for r in cycle.energy if r.component == "gpu")
        scrape = [{"job_name": "cocaq-node", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
        with Prometheus(tmp_path / "prom", scrape) as prom:
            got = prom.wait_for('cocaq_job_gpu_energy_joules_total{job_id="321",gpu="1"}')
            assert len(got) == 1 and float(got[0]["value"][1]) == joules
            assert got[0]["metric"]["user"] == "alice" and got[0]["metric"]["uuid"] == UUID_BY_MINOR[1]
            assert prom.wait_for('cocaq_collector_up{cluster="cocaqtest"} == 1')
    finally:
        c.close()


def test_a_port_in_use_is_one_error_line_and_collection_goes_on(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
        node.hook("prolog", 331, SLURM_JOB_GPUS="1")
        with caplog.at_level(logging.ERROR, logger="cocaq.collector"):
            c = Collector(load_config(node.config, {}))
        try:
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(errors) == 1 and f"metrics: not serving on 127.0.0.1:{port}" in errors[0]
            assert "Address already in use" in errors[0] and "\n" not in errors[0]
            assert c.metrics is None
            c.sample()
            cycle = _busy_cycle(c, clock, rapl, cg, {})
            assert any(r.job_id == "331" for r in cycle.energy) and c.cycles == 2
        finally:
            c.close()
    # an address that does not resolve: the same, one line
    caplog.clear()
    with open(node.config, "a") as fh:
        fh.write("")
    cfg = load_config(node.config, {})
    from dataclasses import replace

    cfg = replace(cfg, collector=replace(cfg.collector, metrics_listen="no-such-host.invalid:9830"))
    with caplog.at_level(logging.ERROR, logger="cocaq.collector"):
        c = Collector(cfg)
    try:
        assert c.metrics is None and c.sample() is not None
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "metrics: not serving on no-such-host.invalid:9830" in errors[0]
    finally:
        c.close()


def test_a_bad_address_is_a_one_line_config_error(tmp_path: Path) -> None:
    node, _rapl, _cg = _node(tmp_path, "localhost:99999")
    r = run_cocaq(["collector", "--once", "--no-ship"], env=cocaq_env(node))
    assert r.code != 0 and "collector.metrics_listen" in r.err and "port 1-65535" in r.err, r.err
    assert "Traceback" not in r.err and r.err.strip().count("\n") == 0
    for bad in ("9830", "[::1:9830", "a b:9830", "[fe80::1%eth0]:9830"):
        node2, _r, _c = _node(tmp_path / bad.replace("/", "_"), bad)
        r = run_cocaq(["collector", "--once", "--no-ship"], env=cocaq_env(node2))
        assert r.code != 0 and "collector.metrics_listen" in r.err and "Traceback" not in r.err, (bad, r.err)
    node3, _r, _c = _node(tmp_path / "cli", None)
    r = run_cocaq(["collector", "--once", "--no-ship", "--metrics-listen", "1.2.3.4"], env=cocaq_env(node3))
    assert r.code == 2 and "--metrics-listen" in r.err and "Traceback" not in r.err, r.err


# --- the real daemon, as a process: what it imports and whether it listens ---------------------------


def _listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on: its socket inodes found in LISTEN state in /proc/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)
            for line in fh:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:
                    ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def _sampled(node: Node) -> int:
    """Samples the running daemon has committed to collector.db (WAL: readable while it writes)."""
    path = node.spool / "collector.db"
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM samples").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def _run_daemon(node: Node, args: list[str], port: int | None) -> tuple[set[str], set[int], str]:
    """`cocaq collector` as a daemon until it has sampled (and, with a port, served a job's series):
    (the modules it imported, the ports it listened on, the last scrape)."""
    err = node.root / "daemon.err"
    argv = [sys.executable, "-X", "importtime", "-m", "cocaq", "collector", "--interval", "1", "--no-ship"]
    with open(err, "w") as fh:
        p = subprocess.Popen([*argv, *args], env=cocaq_env(node), stderr=fh, cwd=ROOT)
    body = ""
    try:
        deadline = time.monotonic() + 60
        while True:
            assert p.poll() is None, err.read_text()[-2000:]
            assert time.monotonic() < deadline, err.read_text()[-2000:]
            time.sleep(0.3)
            if _sampled(node) == 0:
                continue
            if port is None:
                break
            try:
                body = _scrape(port)[1]
            except OSError:
                continue
            if "cocaq_job_gpu_power_watts{" in body:
                break
        ports = _listening_ports(p.pid)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    assert p.returncode == 0, err.read_text()[-2000:]
    mods = {
        line.rsplit("|", 1)[1].strip()
        for line in err.read_text().splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    return mods, ports, body


def test_off_the_daemon_imports_no_prometheus_client_and_listens_nowhere(tmp_path: Path) -> None:
    node, _rapl, cg = _node(tmp_path, None)
    node.hook("prolog", 341, SLURM_JOB_GPUS="1")
    cg.add_job("341")
    mods, ports, _ = _run_daemon(node, [], None)
    assert "cocaq.collector.sources" in mods and "cocaq.collector.daemon" in mods  # (the listing works)
    assert not {m for m in mods if m.split(".")[0] == "prometheus_client"}
    assert "cocaq.collector.metrics" not in mods
    assert ports == set()


def test_on_from_the_command_line_the_daemon_serves(tmp_path: Path) -> None:
    node, _rapl, cg = _node(tmp_path, None)
    node.hook("prolog", 351, SLURM_JOB_GPUS="1")
    cg.add_job("351")
    port = free_port()
    mods, ports, body = _run_daemon(node, ["--metrics-listen", f"127.0.0.1:{port}"], port)
    assert "prometheus_client" in mods and ports == {port}
    assert 'job_id="351"' in body and promtool_check_metrics(body) == ""


def test_a_scrape_reads_no_gpu_no_file_and_no_database(tmp_path: Path, clock: Clock) -> None:
    """Issue 20: metrics "from what it already samples, no extra NVML calls": scrapes in the server's
    thread touch neither NVML nor the spool's database nor any file; only the main loop's cycles do."""
    import threading

    port = free_port()
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
    node.hook("prolog", 321, SLURM_JOB_GPUS="0,1")
    cg.add_job("321", cpus="0-3")
    c = Collector(load_config(node.config, {}))
    calls: list[tuple[str, str]] = []  # (what, thread)

    nvml = next(s for s in c.sources if s.name == "nvml")
    read = nvml.nvml.read  # type: ignore[attr-defined]

    def counted_read(d: object) -> object:
        calls.append(("nvml", threading.current_thread().name))
        return read(d)

    nvml.nvml.read = counted_read  # type: ignore[attr-defined]

    class Conn:  # collector.db's sqlite3 connection, counted
        def __init__(self, real: object) -> None:
            self.real = real

        def __getattr__(self, name: str) -> object:
            calls.append(("db", threading.current_thread().name))
            return getattr(self.real, name)

    c.db.conn = Conn(c.db.conn)  # type: ignore[assignment]
    opened: list[str] = []
    main = threading.main_thread()
    active = [True]

    def audit(event: str, args: tuple[object, ...]) -> None:  # the server's threads opening anything
        if active[0] and event == "open" and threading.current_thread() is not main:
            opened.append(str(args[0]))

    sys.addaudithook(audit)
    try:
        c.sample()
        _busy_cycle(c, clock, rapl, cg, {"321": 5_000_000})
        main_calls = len(calls)
        assert {w for w, _ in calls} == {"nvml", "db"}, "the cycles read the GPUs and write the spool"
        for _ in range(5):
            assert "cocaq_job_gpu_power_watts{" in _scrape(port)[1]
        assert len(calls) == main_calls, f"a scrape read the GPUs or the database: {calls[main_calls:]}"
        assert all(t == main.name for _, t in calls)
        assert opened == [], f"a scrape opened files: {opened}"
    finally:
        active[0] = False  # (an audit hook cannot be removed: it stops recording)
        c.close()
