#!/usr/bin/env python3
"""Validation of calibrated estimates (issue 18, part 4): measured jobs held out and estimated as if
nothing had measured them, the calibrated estimate against TDP x utilisation.

    .venv/bin/python bench/bench_calibration.py            # ~10 s: runs `cocaq demo` into a temp dir

1. `cocaq demo` (seed 42, 30 days) into a fresh SQLite database: its A100 jobs are measured (Slurm's node
   energy, the GPUs' share from their power samples), and what their GPUs drew depends on what the job
   did (training, LLMs, debugging, notebooks) and varies from job to job;
2. the measured GPU jobs that the table would learn from (cocaq.accounting.calibrate.measured_samples): W per
GPU,
   GPU-hours, energy-weighted GPU utilisation;
3. --splits times (20), a seeded shuffle holds out --holdout (30 %) of them; the table is learnt from the
   rest (GPU-hour weighted, `[estimate] calibrate_min_jobs` as configured) and each held-out job's GPU
   energy estimated by: TDP x the configured utilisation (the demo's 0.8, and the default 1.0), TDP x the
   job's own utilisation, the calibrated cell without the job's utilisation ("any"), and the calibrated
   cell of its utilisation bucket;
4. errors pooled over the splits: median and 90th percentile of |estimate / measured - 1| per job, and
   the bias of the total (sum of estimates / sum measured - 1, i.e. GPU-hour weighted);
5. the same jobs held out grouped, as `cocaq calibrate` judges them (cocaq.accounting.power_bases): whole
   runs (5 folds), and whole users (5 folds of users, so that no user's own jobs help): each basis's
   median error and how often its 10-90 % range held the measured power.

A random hold-out puts jobs of one run on both sides; on the demo, whose power the generator ties to the
job's kind and to each user's job, it flatters every table. The grouped figures are the ones to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cocaq.accounting import calibrate  # noqa: E402
from cocaq.config_load import load_config  # noqa: E402
from cocaq.db.engine import make_engine  # noqa: E402

LABELS = {
    "tdp_default": "TDP x 1.0 (the default `gpu_utilisation`)",
    "tdp_config": "TDP x 0.8 (the demo's `gpu_utilisation`)",
    "tdp_job_util": "TDP x the job's own GPU utilisation",
    "calibrated_any": "calibrated, utilisation unknown (model/partition, any)",
    "calibrated": "calibrated, the job's utilisation bucket",
}


def demo_database(workdir: Path) -> tuple[str, Path]:
    url = f"sqlite:///{workdir / 'demo.sqlite'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env.update(COCAQ_DATABASE_URL=url, COLUMNS="120")
    subprocess.run(
        [sys.executable, "-m", "cocaq", "demo", "--out", str(workdir / "demo")],
        env=env, cwd=workdir, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return url, workdir / "demo" / "cocaq-demo.toml"


def evaluate(url: str, cfg_path: Path, holdout: float, splits: int) -> dict[str, dict[str, float | int]]:
    cfg = load_config(cfg_path, environ={})
    engine = make_engine(url)
    with engine.connect() as conn:
        samples = calibrate.measured_samples(conn, cfg)
    engine.dispose()
    res = calibrate.holdout(samples, cfg, share=holdout, seeds=range(splits))
    out = {k: v.summary() for k, v in res.items()}
    # the default utilisation (1.0) on the same held-out jobs
    default = calibrate.holdout(
        samples, replace(cfg, estimate=replace(cfg.estimate, gpu_utilisation=1.0)), share=holdout,
        seeds=range(splits),
    )  # fmt: skip
    out = {"tdp_default": default["tdp_config"].summary(), **out}
    out["_"] = {"measured_jobs": len(samples), "holdout": holdout, "splits": splits}
    out["grouped"] = grouped(samples, cfg)
    return out


def grouped(samples: list[calibrate.Sample], cfg: object) -> dict[str, dict[str, dict[str, float | None]]]:
    """Each basis on held-out runs, and on held-out users (each user's jobs relabelled as one run)."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    by_user = [
        replace(s, array_job_id=zlib.crc32(str(s.user).encode())) for s in samples
    ]  # a user = one "run"
    out = {}
    for label, ss in (("runs", samples), ("users", by_user)):
        a = calibrate.assessment(ss, cfg, now)  # type: ignore[arg-type]
        out[label] = {
            k: {"used": b.used, "jobs": b.jobs, "median_err": b.median_err, "coverage": b.coverage}
            for k, b in a.bases.items()
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--holdout", type=float, default=0.3)
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--json", default=None, help="Also write the results here.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cocaq-bench-cal-") as tmp:
        url, cfg_path = demo_database(Path(tmp))
        res = evaluate(url, cfg_path, args.holdout, args.splits)
    meta = res["_"]
    print(
        f"{meta['measured_jobs']} measured GPU jobs of the demo; {meta['splits']} splits holding out "
        f"{meta['holdout']:.0%} each; {res['calibrated']['jobs']} held-out estimates per method\n"
    )
    print("| method | median abs. error | p90 abs. error | median signed | bias of the total |")
    print("|---|---:|---:|---:|---:|")
    for key, label in LABELS.items():
        r = res[key]
        print(
            f"| {label} | {r['median_abs']:.0%} | {r['p90_abs']:.0%} | {r['median_signed']:+.0%} | "
            f"{r['bias']:+.1%} |"
        )
    if res["tdp_job_util"]["jobs"] != res["calibrated"]["jobs"]:
        print(f"\n(TDP x the job's utilisation: the {res['tdp_job_util']['jobs']} with a known utilisation)")
    print("\nGrouped hold-out (5 folds of whole runs / of whole users), as `cocaq calibrate` judges:\n")
    print(
        "| basis | used (runs) | jobs | median abs. error | range held | used (users) | jobs | median "
        "| held |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    g = res["grouped"]
    for key in g["runs"]:
        a, b = g["runs"][key], g["users"][key]
        print(
            f"| {key} | {_yes(a)} | {a['jobs']} | {_pct(a['median_err'])} | {_pct(a['coverage'])} | "
            f"{_yes(b)} | {b['jobs']} | {_pct(b['median_err'])} | {_pct(b['coverage'])} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


def _yes(b: dict[str, float | None]) -> str:
    return "yes" if b["used"] else "no"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


if __name__ == "__main__":
    main()
