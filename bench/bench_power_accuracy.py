#!/usr/bin/env python3
"""Benchmark: how close a GPU's energy from sampled power comes to the truth (issue 18).

    .venv/bin/python bench/bench_power_accuracy.py             # ~4 minutes on 2 cores
    .venv/bin/python bench/bench_power_accuracy.py --quick     # fewer windows, ~30 s

A node with four fake GPUs (collector/fakenvml.py's trace models, at 1 s resolution): `training`
(plateaus with per-second noise, data-loader stalls of 2-4 s, an eval pass, a checkpoint write),
`inference` (Poisson request bursts of 2-15 s), `light` (notebook cells of 5-60 s), all three without an
energy counter, so their energy comes from sampled power; and a `training` GPU with a counter (the exact
path, as a check). Jobs of 60 s, 120 s, 300 s and whole runs (the training trace's 90 s start and its
30 min body) start at random offsets in the traces; the collector's sampling grid has a random phase.
Everything runs through cocaq's own code on a virtual clock: the real prolog and epilog
(`cocaq.prolog_epilog.hook.main`, writing the real spool), the collector's job list (`daemon._running`)
and its NVML source (`NvmlSource.collect`, then `end_job` with the epilog's record, as the daemon does).

Two ways NVML reports power are modelled: the instantaneous power (Volta, GA100), and the average of the
last second that `nvmlDeviceGetPowerUsage` reports on Ampere (but GA100), Hopper and later.

Methods, per GPU and job (truth: the fake's exact energy between the prolog's and the epilog's readings):
  * integral        cocaq now: trapezoids from the prolog's reading through the samples to the epilog's
  * before-18       cocaq before issue 18: the first sample's power over at most one interval before it,
                    the samples' trapezoids, nothing after the last sample
  * sample-mean     plain sampling: the mean of the samples' power times the job's length
  * edges           the trapezoid of the prolog's and the epilog's readings alone (the epilog's
                    `nvml-power-edges`, which cocaq uses only for jobs <= 60 s that no sample saw)
  * counter         the exact path (a GPU with an energy counter), as a check: error ~0
Reported per reading, interval and window: bias (mean signed error), median, p95 and max |error|, in %.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cocaq.collector import fakenvml, sources  # noqa: E402
from cocaq.collector.daemon import _running  # noqa: E402
from cocaq.config_load import load_config  # noqa: E402
from cocaq.prolog_epilog import hook  # noqa: E402

EPOCH = 1_800_000_000.0
TRAINING_START_S = 90.0  # the training trace's non-repeating start
TRAINING_PERIOD_S = 1800.0
WHOLE_S = TRAINING_START_S + TRAINING_PERIOD_S
GPUS = [  # (trace, energy counter)
    ("training", False),
    ("inference", False),
    ("light", False),
    ("training", True),
]
READINGS = {"instant": 0.0, "avg-1s": 1.0}


class Clock:
    def __init__(self) -> None:
        self.now = EPOCH

    def time(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return round(self.now * 1e9)


def _uuid(i: int) -> str:
    return f"GPU-00000000-bbbb-4000-8000-{i:012d}"


def make_node(d: Path, average_s: float, interval: float) -> Path:
    spec = d / "gpus.toml"
    lines = [f"epoch = {EPOCH}"]
    for i, (trace, counter) in enumerate(GPUS):
        lines += [
            "[[gpu]]",
            f'uuid = "{_uuid(i)}"',
            f"minor = {i}",
            f'pci_bus_id = "00000000:{0x10 + i:02x}:00.0"',
            f'trace = "{trace}"',
            f"energy_counter = {'true' if counter else 'false'}",
            f"power_average_s = {average_s}",
            f"phase_s = {137.0 * i}",
        ]
    spec.write_text("\n".join(lines) + "\n")
    cfg = d / "cocaq.toml"
    cfg.write_text(
        f'spool_dir = "{d / "spool"}"\n'
        '[cluster]\nname = "bench"\n'
        "[collector]\n"
        f'nvml = "fake:{spec}"\n'
        f'hook_log = "{d / "hook.log"}"\n'
        f'annotate_dir = "{d / "annotations"}"\n'
        f'sysfs_root = "{d / "sys"}"\n'
        'sources = ["nvml"]\n'
        f"interval_s = {interval}\n"
    )
    return cfg


def run_hook(cfg: Path, kind: str, job_id: int) -> dict[str, Any]:
    os.environ.update(
        {
            "SLURM_SCRIPT_CONTEXT": f"{kind}_slurmd",
            "SLURM_JOB_ID": str(job_id),
            "SLURM_JOB_UID": "1001",
            "SLURM_JOB_GID": "1001",
            "SLURM_JOB_USER": "bench",
            "SLURMD_NODENAME": "node1",
            "SLURM_JOB_GPUS": ",".join(str(i) for i in range(len(GPUS))),
        }
    )
    hook.main(["--config", str(cfg), kind])
    events = Path(load_config(cfg, {}).spool_dir) / "events"
    event = "start" if kind == "prolog" else "end"
    (path,) = events.glob(f"*-{job_id}-{event}.json")
    rec: dict[str, Any] = json.loads(path.read_bytes())
    path.unlink()  # nobody ships here: keep the spool small
    return rec


def one_job(
    cfg: Path, clock: Clock, job_id: int, start: float, length: float, interval: float, phase: float
) -> dict[str, dict[str, float]]:
    """The errors (relative, signed) of each method for each GPU of one job."""
    ccfg = load_config(cfg, {}).collector
    spool = load_config(cfg, {}).spool_dir
    src = sources.NvmlSource(ccfg)
    end_t = start + length
    grid0 = start - phase  # the collector's previous tick before the job
    clock.now = grid0
    src.collect(sources.Cycle(ts=clock.now, dt=None, jobs=_running(spool, clock.now)))
    clock.now = start
    prolog = run_hook(cfg, "prolog", job_id)
    samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
    running: dict[str, float] = {}
    k = 1
    while grid0 + k * interval < end_t:
        clock.now = grid0 + k * interval
        cyc = sources.Cycle(ts=clock.now, dt=interval, jobs=_running(spool, clock.now))
        src.collect(cyc)
        for ts, s, dev, metric, jid, v in cyc.samples:
            if s == "nvml" and metric == "power_w" and jid == str(job_id):
                samples[dev].append((ts, v))
        for e in cyc.energy:
            if e[4] == "nvml-power-integral":
                running[e[3]] = e[6]
        k += 1
    clock.now = end_t
    end = run_hook(cfg, "epilog", job_id)
    clock.now = grid0 + k * interval  # the next tick: the job is gone; its epilog record closes it
    src.collect(sources.Cycle(ts=clock.now, dt=interval, jobs=_running(spool, clock.now)))
    closed = {e[3]: e[6] for e in src.end_job(end)}
    src.close()

    at_start = {g["uuid"]: g for g in prolog["gpus"]}
    at_end = {g["uuid"]: g for g in end["gpus"]}
    counter_rows = {e["device"]: e["energy_j"] for e in end["energy"] if e["source"] == "nvml"}
    out: dict[str, dict[str, float]] = {}
    for i, (trace, has_counter) in enumerate(GPUS):
        u = _uuid(i)
        t0, t1 = at_start[u]["ts"], at_end[u]["ts"]
        truth = (fakenvml.energy_mj_at(i, t1) - fakenvml.energy_mj_at(i, t0)) / 1000.0
        label = f"{trace}{'+counter' if has_counter else ''}"
        errs: dict[str, float] = {}
        p0, p1 = at_start[u]["power_w"], at_end[u]["power_w"]
        errs["edges"] = (p0 + p1) / 2 * (t1 - t0) / truth - 1
        if has_counter:
            errs["counter"] = counter_rows[u] / truth - 1
        else:
            s = samples.get(u, [])
            if u in closed:
                errs["integral"] = closed[u] / truth - 1
            if s:
                # before issue 18: the head was the first sample's power over at most one interval
                # (the prolog's reading was not used) and nothing was added after the last sample
                head_new = (p0 + s[0][1]) / 2 * (s[0][0] - t0)
                head_old = s[0][1] * min(s[0][0] - t0, interval)
                errs["before-18"] = (running[u] - head_new + head_old) / truth - 1
                errs["sample-mean"] = statistics.fmean(v for _, v in s) * (t1 - t0) / truth - 1
        out[label] = errs
    return out


def pctl(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer windows (a smoke run)")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--json", type=Path, help="also write every statistic here")
    args = ap.parse_args()
    n_short, n_whole = (40, 6) if args.quick else (500, 60)
    windows = [("60 s", 60.0, n_short), ("120 s", 120.0, n_short), ("300 s", 300.0, n_short)]
    windows.append(("whole run", WHOLE_S, n_whole))
    intervals = [1.0, 5.0, 10.0, 30.0]
    rng = random.Random(args.seed)
    clock = Clock()
    time.time, time.time_ns = clock.time, clock.time_ns  # type: ignore[assignment]
    errors: dict[tuple[str, float, str, str, str], list[float]] = defaultdict(list)
    job_id = 1000
    t_start = time.perf_counter()
    for reading, average_s in READINGS.items():
        for interval in intervals:
            with tempfile.TemporaryDirectory(prefix="cocaq-bench-acc-") as tmp:
                cfg = make_node(Path(tmp), average_s, interval)
                fakenvml.configure(str(Path(tmp) / "gpus.toml"))
                for wname, length, n in windows:
                    for _ in range(n):
                        job_id += 1
                        if wname == "whole run":
                            start = EPOCH + rng.uniform(0.0, 1.0)
                        else:
                            start = EPOCH + TRAINING_START_S + rng.uniform(0.0, TRAINING_PERIOD_S * 2)
                        phase = rng.uniform(0.0, interval)
                        for gpu, errs in one_job(cfg, clock, job_id, start, length, interval, phase).items():
                            for method, e in errs.items():
                                errors[(reading, interval, wname, gpu, method)].append(e)
    elapsed = time.perf_counter() - t_start

    rows = []
    for (reading, interval, wname, gpu, method), es in sorted(errors.items(), key=lambda kv: str(kv[0])):
        rows.append(
            {
                "reading": reading,
                "interval_s": interval,
                "window": wname,
                "gpu": gpu,
                "method": method,
                "n": len(es),
                "bias_pct": 100 * statistics.fmean(es),
                "median_pct": 100 * statistics.median(abs(e) for e in es),
                "p95_pct": 100 * pctl([abs(e) for e in es], 95),
                "max_pct": 100 * max(abs(e) for e in es),
            }
        )
    print(f"# {len(rows)} cells, {job_id - 1000} jobs x {len(GPUS)} GPUs, {elapsed:.0f} s, seed {args.seed}")
    order = {"integral": 0, "before-18": 1, "sample-mean": 2, "edges": 3, "counter": 4}
    wins = {w: i for i, (w, _, _) in enumerate(windows)}
    header = "| bias % (95% CI) | median % | p95 % | max % |"

    def stats(es: list[float]) -> str:
        a = [abs(e) for e in es]
        half = 1.96 * statistics.stdev(es) / math.sqrt(len(es)) if len(es) > 1 else math.nan
        return (
            f"{100 * statistics.fmean(es):+.2f} (+-{100 * half:.2f}) | {100 * statistics.median(a):.2f}"
            f" | {100 * pctl(a, 95):.2f} | {100 * max(a):.2f} |"
        )

    print(f"\nPer trace, at the default 10 s interval:\n\n| reading | trace | window | method | n {header}")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for (reading, interval, wname, gpu, method), es in sorted(
        errors.items(), key=lambda kv: (kv[0][0], kv[0][3], wins[kv[0][2]], order[kv[0][4]])
    ):
        if interval == 10.0 and method in ("integral", "before-18", "sample-mean", "counter"):
            print(f"| {reading} | {gpu} | {wname} | {method} | {len(es)} | {stats(es)}")
    # all intervals, the three counter-less GPUs pooled
    pooled: dict[tuple[str, float, str, str], list[float]] = defaultdict(list)
    for (reading, interval, wname, gpu, method), es in errors.items():
        if "+counter" not in gpu or method == "counter":
            pooled[(reading, interval, wname, method)].extend(es)
    print(
        "\nThe three GPUs without a counter pooled, by interval:\n\n"
        f"| reading | interval | window | method | n {header}"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for (reading, interval, wname, method), es in sorted(
        pooled.items(), key=lambda kv: (kv[0][0], kv[0][1], wins[kv[0][2]], order[kv[0][3]])
    ):
        print(f"| {reading} | {interval:g} s | {wname} | {method} | {len(es)} | {stats(es)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"\nper-GPU detail: {args.json}")


if __name__ == "__main__":
    main()
