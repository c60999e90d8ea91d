#!/usr/bin/env python3
"""Benchmark: the Slurm Prolog/Epilog hooks as whole processes, the way slurmd runs them.

    .venv/bin/python bench/bench_hooks.py            # ~2 minutes on 2 cores

For each scenario, in its own temporary directory: a cocaq.toml (spool dir, hook log, a fake sysfs tree
with 2 RAPL packages + DRAM and a cgroup v2 tree, `[cluster] name`), the shims from `cocaq hook shims`,
and a `cocaq collector --interval 1` (ship_interval_s = 1) running in the background against the same
spool for the whole scenario. Then --pairs (300) jobs: `/bin/sh cocaq-prolog`, `/bin/sh cocaq-epilog`,
each with only the environment slurmd gives a hook (SLURM_SCRIPT_CONTEXT, SLURM_JOB_ID, SLURM_JOB_USER,
SLURM_JOB_UID, SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION, SLURMD_NODENAME, SLURM_JOB_GPUS=0,1; no PATH),
timed from posix_spawn to wait4 (CPU from the child's rusage, which includes the timeout and python
processes below the shell). Interleaved with every pair, the floors, measured the same way:
  * `/bin/sh -c true`
  * `python -I -S -c pass` (the shims' interpreter)
  * the shim's own wrapper around nothing: `/bin/sh` running `timeout -k 2 20 python -I -S -c pass`
The first pair of each scenario runs with the hook's settings cache cold (new config file) and is
reported on its own, not in the statistics.

Scenarios:
  * up:        nvml = "fake:2", database_url = the live PostgreSQL (a migrated scratch database); the
               collector ships every second while the hooks run
  * down:      the same with database_url = postgresql://...@127.0.0.1:1/... (nothing listens there)
  * up-nonvml: sources = ["rapl", "cgroup"], database up, collector shipping

Also measured: what importing the real NVML binding (`pynvml`, nvidia-ml-py) costs a hook, with
`python -X importtime` and as whole processes (`import pynvml` vs `pass`), since on a GPU node the hook
imports it instead of the fake (nvmlInit on real hardware is not measured: no GPU here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import _common as c
from sysfs_tree import make_cgroup_v2, make_rapl

PY = sys.executable  # what the shims run (write_shims uses the generating interpreter)
DOWN_URL = "postgresql://postgres@127.0.0.1:1/cocaq_bench_hooks"
LOG_LINE = re.compile(r" (prolog|epilog) job=(\d+) ok ([0-9.]+)ms gpus=(\d+)(.*)$")


def pctl(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): p99 of 300 values is the 297th smallest."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def spawn(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms from posix_spawn to wait4, CPU ms of the child and its waited-for descendants)."""
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env)
    _, status, ru = os.wait4(pid, 0)
    wall = (time.perf_counter_ns() - t0) / 1e6
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} exited {status}")
    return wall, (ru.ru_utime + ru.ru_stime) * 1000


def slurm_env(context: str, job_id: int) -> dict[str, str]:
    return {
        "SLURM_SCRIPT_CONTEXT": context,
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_ACCOUNT": "lab-physics",
        "SLURM_JOB_PARTITION": "gpu_a100",
        "SLURMD_NODENAME": "gpu-n001",
        "SLURM_JOB_GPUS": "0,1",
    }


def write_config(d: Path, database_url: str, sources: list[str]) -> Path:
    cfg = d / "cocaq.toml"
    cfg.write_text(
        f'database_url = "{database_url}"\n'
        f'spool_dir = "{d / "spool"}"\n'
        "[cluster]\n"
        'name = "bench"\n'
        "[collector]\n"
        "interval_s = 1\n"
        "ship_interval_s = 1\n"
        f"sources = {json.dumps(sources)}\n"
        'nvml = "fake:2"\n'
        f'sysfs_root = "{d / "sys"}"\n'
        f'hook_log = "{d / "hook.log"}"\n'
    )
    return cfg


def node_events(dbname: str) -> int:
    import psycopg

    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False)) as conn:
        row = conn.execute("SELECT count(*) FROM node_events").fetchone()
    return int(row[0]) if row else 0


def scenario(
    name: str, dbname: str, database_url: str, sources: list[str], pairs: int, base: int
) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"cocaq-bench-hooks-{name}-") as tmp:
        d = Path(tmp)
        make_rapl(d / "sys", packages=2, dram=True)
        make_cgroup_v2(d / "sys" / "fs" / "cgroup", node_cpus="0-63")
        cfg = write_config(d, database_url, sources)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
        shims = c.write_shims(d, cfg, env)
        prolog, epilog = shims["cocaq-prolog"], shims["cocaq-epilog"]
        # The floor that has the shim's shape: sh -> timeout -> python -I -S, doing nothing.
        wrapper = d / "shims" / "floor-wrapper"
        wrapper.write_text(
            f"#!/bin/sh\n/usr/bin/timeout -k 2 20 {PY} -I -S -c pass </dev/null >/dev/null 2>&1\nexit 0\n"
        )

        col_log = open(d / "collector.log", "w")  # noqa: SIM115 - closed below
        collector = subprocess.Popen(
            [c.COCAQ, "--config", str(cfg), "collector", "--interval", "1"],
            env=env,
            stdout=col_log,
            stderr=subprocess.STDOUT,
        )
        time.sleep(3)  # let it start and ship once
        if collector.poll() is not None:
            raise SystemExit(f"collector exited {collector.returncode}: {(d / 'collector.log').read_text()}")

        cold = (
            spawn(["/bin/sh", prolog], slurm_env("prolog_slurmd", base))[0],
            spawn(["/bin/sh", epilog], slurm_env("epilog_slurmd", base))[0],
        )
        t: dict[str, list[float]] = {k: [] for k in ("prolog", "epilog", "sh", "python", "wrapper")}
        cpu: dict[str, list[float]] = {k: [] for k in t}
        t_run = time.perf_counter()
        for i in range(1, pairs + 1):
            for key, argv, e in (
                ("prolog", ["/bin/sh", prolog], slurm_env("prolog_slurmd", base + i)),
                ("sh", ["/bin/sh", "-c", "true"], {}),
                ("python", [PY, "-I", "-S", "-c", "pass"], {}),
                ("epilog", ["/bin/sh", epilog], slurm_env("epilog_slurmd", base + i)),
                ("wrapper", ["/bin/sh", str(wrapper)], {}),
            ):
                w, u = spawn(argv, e)
                t[key].append(w)
                cpu[key].append(u)
        run_s = time.perf_counter() - t_run
        time.sleep(2.5)  # let the collector ship what the last hooks wrote
        shipped = node_events(dbname) if database_url != DOWN_URL else 0
        alive = collector.poll() is None
        collector.send_signal(signal.SIGTERM)
        try:
            collector.wait(20)
        except subprocess.TimeoutExpired:
            collector.kill()
            collector.wait()
        col_log.close()
        col_text = (d / "collector.log").read_text()

        in_hook: dict[str, list[float]] = {"prolog": [], "epilog": []}
        failed = warned = 0
        for line in (d / "hook.log").read_text().splitlines():
            m = LOG_LINE.search(line)
            if not m:
                failed += 1
                continue
            if int(m.group(2)) != base:
                in_hook[m.group(1)].append(float(m.group(3)))
            if m.group(5):
                warned += 1
        left = len(os.listdir(d / "spool" / "events")) if (d / "spool" / "events").is_dir() else 0

    res: dict[str, object] = {
        "scenario": name,
        "database_url": database_url,
        "sources": sources,
        "pairs": pairs,
        "run_s": run_s,
        "cold_first_pair_ms": cold,
        "hook_log_failed_lines": failed,
        "hook_log_lines_with_warnings": warned,
        "collector_alive_at_end": alive,
        "collector_ship_warnings": col_text.count("the spool keeps"),
        "node_events_in_db": shipped,
        "event_files_left_in_spool": left,
        "in_hook_ms_median": {k: statistics.median(v) if v else None for k, v in in_hook.items()},
    }
    for k in t:
        res[k] = {
            "median_ms": statistics.median(t[k]),
            "p90_ms": pctl(t[k], 90),
            "p99_ms": pctl(t[k], 99),
            "max_ms": max(t[k]),
            "cpu_median_ms": statistics.median(cpu[k]),
        }
    return res


def pynvml_cost(runs: int) -> dict[str, float] | None:
    """Import time of the real NVML binding: -X importtime (cumulative) and as whole processes."""
    from cocaq.prolog_epilog.shims import import_paths

    head = f"import sys; sys.path[:0] = {import_paths()!r}"
    probe = subprocess.run([PY, "-I", "-S", "-c", head + "; import pynvml"], capture_output=True)
    if probe.returncode != 0:
        return None
    cum = []
    for _ in range(runs):
        p = subprocess.run(
            [PY, "-X", "importtime", "-I", "-S", "-c", head + "; import pynvml"],
            capture_output=True,
            text=True,
        )
        for line in p.stderr.splitlines():
            parts = [x.strip() for x in line.split("|")]
            if len(parts) == 3 and parts[2] == "pynvml":
                cum.append(int(parts[1]) / 1000)
    with_imp, without = [], []
    for _ in range(runs):
        without.append(spawn([PY, "-I", "-S", "-c", head], {})[0])
        with_imp.append(spawn([PY, "-I", "-S", "-c", head + "; import pynvml"], {})[0])
    import importlib.metadata

    import pynvml

    try:
        version = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return {
        "importtime_cumulative_ms_median": statistics.median(cum),
        "process_without_ms_median": statistics.median(without),
        "process_with_import_ms_median": statistics.median(with_imp),
        "difference_ms": statistics.median(with_imp) - statistics.median(without),
        "version": f"nvidia-ml-py {version}",
        "file": pynvml.__file__,
    }


def show(r: dict[str, object]) -> None:
    print(
        f"\n== {r['scenario']}: sources {r['sources']}, database_url {r['database_url']}, {r['pairs']} pairs"
        f" in {r['run_s']:.1f} s"
    )
    print(f"{'what':42s} {'median ms':>10s} {'p90':>8s} {'p99':>8s} {'max':>8s} {'cpu ms':>8s}")
    labels = {
        "prolog": "prolog (/bin/sh cocaq-prolog)",
        "epilog": "epilog (/bin/sh cocaq-epilog)",
        "sh": "floor: /bin/sh -c true",
        "python": "floor: python -I -S -c pass",
        "wrapper": "floor: sh + timeout + python -I -S -c pass",
    }
    for k, label in labels.items():
        s = r[k]
        assert isinstance(s, dict)
        print(
            f"{label:42s} {s['median_ms']:10.1f} {s['p90_ms']:8.1f} {s['p99_ms']:8.1f} {s['max_ms']:8.1f}"
            f" {s['cpu_median_ms']:8.1f}"
        )
    cold = r["cold_first_pair_ms"]
    assert isinstance(cold, tuple)
    print(f"first pair, settings cache cold: prolog {cold[0]:.1f} ms, epilog {cold[1]:.1f} ms")
    print(
        f"in-hook time (hook log) median: {r['in_hook_ms_median']};"
        f" failed log lines {r['hook_log_failed_lines']},"
        f" lines with warnings {r['hook_log_lines_with_warnings']}"
    )
    print(
        f"collector alive at the end: {r['collector_alive_at_end']};"
        f" ship warnings {r['collector_ship_warnings']};"
        f" node_events in the database {r['node_events_in_db']}; event files left in the spool"
        f" {r['event_files_left_in_spool']}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=300)
    p.add_argument("--db", default="cocaq_bench_hooks")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the scratch database")
    a = p.parse_args(argv)

    m = c.machine()
    c.print_machine(m)
    c.recreate_database(a.db)
    try:
        up_url = c.pg_url(a.db, sqlalchemy=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
        env["COCAQ_DATABASE_URL"] = c.pg_url(a.db)
        c.run_process([c.COCAQ, "db", "upgrade"], env)
        results = []
        for n, (name, url, sources) in enumerate(
            (
                ("up", up_url, ["nvml", "rapl", "cgroup"]),
                ("down", DOWN_URL, ["nvml", "rapl", "cgroup"]),
                ("up-nonvml", up_url, ["rapl", "cgroup"]),
            )
        ):
            if name == "up-nonvml":
                with c_psycopg(a.db) as conn:
                    conn.execute("TRUNCATE node_events, node_energy")
            r = scenario(name, a.db, url, sources, a.pairs, 1_000_000 * (n + 1))
            show(r)
            results.append(r)
        nv = pynvml_cost(15)
        if nv is None:
            print("\npynvml is not importable here: its import cost is not measured")
        else:
            print(
                f"\nreal pynvml ({nv['version']}) import: -X importtime cumulative"
                f" {nv['importtime_cumulative_ms_median']:.1f} ms"
                f" (median of 15); whole process with it {nv['process_with_import_ms_median']:.1f} ms vs"
                f" {nv['process_without_ms_median']:.1f} ms without: +{nv['difference_ms']:.1f} ms"
            )
        print("\ntargets: median < 50 ms, p99 < 150 ms")
        for r in results:
            for k in ("prolog", "epilog"):
                s = r[k]
                assert isinstance(s, dict)
                ok = s["median_ms"] < 50 and s["p99_ms"] < 150
                print(
                    f"  {r['scenario']:10s} {k}: median {s['median_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms -> "
                    f"{'met' if ok else 'MISSED'}"
                )
        if a.json:
            a.json.write_text(json.dumps({"machine": m, "scenarios": results, "pynvml": nv}, indent=2))
    finally:
        if not a.keep:
            c.drop_database(a.db)
    return 0


def c_psycopg(dbname: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(c.pg_url(dbname, sqlalchemy=False), autocommit=True)


if __name__ == "__main__":
    sys.exit(main())
