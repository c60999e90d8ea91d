#!/usr/bin/env python3
"""Benchmark: issue 21's shifting model on a month's jobs: 1,000,000 jobs in under a minute on one core.

    .venv/bin/python bench/bench_shifting.py            # ~1 minute
    .venv/bin/python bench/bench_shifting.py --jobs 200000 --slack-h 168

The series: a year of hourly intensity, the shared Electricity Maps export for Spain 2023
(`../shared/data/carbon/ES_2023_hourly.csv`, LCA column) when it is beside the clone, else a synthetic
year with the same daily swing. The jobs: submitted uniformly over the year, lengths log-normal (median
40 min, 5% over 12 h, at most 7 days), slack 24 h (`--slack-h`). Timed: `cocaq.carbon.shifting.batch`
(numpy, one process, one thread: OMP/BLAS are not involved) over all of them, and the exact per-job
path (`Series.shift`) over the first 10,000 as the reference, with the largest relative difference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _common as c  # noqa: E402

from cocaq.carbon.shifting import HOUR, Series, batch  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "carbon" / "ES_2023_hourly.csv"


def year_series() -> tuple[Series, str]:
    if SHARED.exists():
        t0, vals = c.hourly_csv(SHARED, "lca")
        return Series(t0, vals, outside=sum(vals) / len(vals)), f"{SHARED.name} ({len(vals)} hours, LCA)"
    t0 = datetime(2023, 1, 1, tzinfo=UTC).timestamp()
    vals = [150 + 90 * math.sin(2 * math.pi * (h % 24) / 24) + 40 * math.sin(h / 97.0) for h in range(8760)]
    return Series(t0, vals, outside=150.0), "synthetic year (8760 hours)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--slack-h", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import numpy as np

    series, what = year_series()
    rng = np.random.default_rng(args.seed)
    n = args.jobs
    submit = series.t0 + rng.uniform(0, 8760 * HOUR, n)
    length = np.minimum(np.exp(rng.normal(math.log(40 * 60), 1.6, n)), 7 * 24 * HOUR)
    slack = np.full(n, args.slack_h * HOUR)
    t = time.process_time()
    w = time.perf_counter()
    got = batch(series, submit, length, slack)
    cpu, wall = time.process_time() - t, time.perf_counter() - w
    k = min(n, 10_000)
    t = time.process_time()
    worst = 0.0
    for i in range(k):
        s = series.shift(float(submit[i]), float(length[i]), float(slack[i]))
        for key, v in (
            ("now_g", s.now_g),
            ("contiguous_g", s.contiguous_g),
            ("interruptible_g", s.interruptible_g),
        ):
            worst = max(worst, abs(got[key][i] - v) / max(abs(v), 1e-9))
    exact_cpu = time.process_time() - t
    saving = 1 - got["contiguous_g"] / got["now_g"]
    saving_i = 1 - got["interruptible_g"] / got["now_g"]
    out = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "series": what,
        "jobs": n,
        "slack_h": args.slack_h,
        "batch_cpu_s": cpu,
        "batch_wall_s": wall,
        "exact_cpu_s_per_10k": exact_cpu * 10_000 / k,
        "exact_cpu_s_for_all_est": exact_cpu * n / k,
        "max_rel_diff_batch_vs_exact": worst,
        "mean_saving_contiguous": float(saving.mean()),
        "mean_saving_interruptible": float(saving_i.mean()),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(out, indent=1))
    print(
        f"{n:,} jobs, slack {args.slack_h:g} h, {what}: batch {cpu:.1f} s CPU ({wall:.1f} s wall) -> "
        f"{'met' if cpu < 60 else 'MISSED'} (under 60 s: {cpu / 60:.2f} of it); the exact path "
        f"{exact_cpu * n / k:.0f} s for all (from {k:,}); largest difference {worst:.1e}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
