#!/usr/bin/env python3
"""Issue 21, point 4: the temporal-shifting computation of Sukprasert et al. (EuroSys 2024) on the shared
2023 hourly series of Spain and California (CAISO), with cocaq.carbon.shifting.

    .venv/bin/python bench/repro_shifting.py             # a few seconds; prints the docs' table
    .venv/bin/python bench/repro_shifting.py --basis direct

The computation, as in the paper's temporal analysis: a job of length L hours arrives at each hour of the
year; with a slack S it may start any time in [arrival, arrival + S] and run without a break
(*deferrable*: the best contiguous start), or run in any L hours of [arrival, arrival + S + L]
(*interruptible*: the L lowest hours); both against running at once. The window's end is the deadline
arrival + S + L; an arrival whose deadline falls after the year's last hour is left out (the year's edge:
no value from another year is assumed), so each cell averages 8760 - L - S + 1 arrivals. Reported per
cell: the mean over arrivals of each arrival's reduction (1 - shifted / now), and the reduction of the
total (1 - sum shifted / sum now). The series are the shared Electricity Maps exports
(`../shared/data/carbon/`, LCA by default); they are read here, not copied into the repository.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _common as c  # noqa: E402

from cocaq.carbon.shifting import HOUR, Series, batch  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "carbon"
ZONES = {"ES": "ES_2023_hourly.csv", "US-CAL-CISO": "US-CAL-CISO_2023_hourly.csv"}
LENGTHS_H = (1, 6, 24)
SLACKS_H = (24, 168)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--basis", choices=["lca", "direct"], default="lca")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import numpy as np

    out = []
    for zone, name in ZONES.items():
        path = SHARED / name
        if not path.exists():
            raise SystemExit(f"{path} is not there: this reproduction reads the shared series")
        t0, vals = c.hourly_csv(path, args.basis)
        series = Series(t0, vals, outside=sum(vals) / len(vals))  # (never used: windows stay in the year)
        n = len(vals)
        for length_h in LENGTHS_H:
            for slack_h in SLACKS_H:
                arrivals = n - length_h - slack_h + 1  # the deadline within the year
                a = t0 + np.arange(arrivals) * HOUR
                r = batch(series, a, np.full(arrivals, length_h * HOUR), np.full(arrivals, slack_h * HOUR))
                now, dfr, itr = r["now_g"], r["contiguous_g"], r["interruptible_g"]
                out.append(
                    {
                        "zone": zone,
                        "basis": args.basis,
                        "length_h": length_h,
                        "slack_h": slack_h,
                        "arrivals": arrivals,
                        "mean_g_now": float(now.mean()),
                        "deferrable_mean_reduction": float((1 - dfr / now).mean()),
                        "deferrable_total_reduction": float(1 - dfr.sum() / now.sum()),
                        "interruptible_mean_reduction": float((1 - itr / now).mean()),
                        "interruptible_total_reduction": float(1 - itr.sum() / now.sum()),
                    }
                )
    head = (
        "zone",
        "L",
        "S",
        "arrivals",
        "mean now g/kWh",
        "deferrable: mean (total)",
        "interruptible: mean (total)",
    )
    print("| " + " | ".join(head) + " |")
    print("|---|---|---|---|---|---|---|")
    for o in out:
        print(
            f"| {o['zone']} | {o['length_h']} h | {o['slack_h']} h | {o['arrivals']:,} | "
            f"{o['mean_g_now']:.0f} | "
            f"{o['deferrable_mean_reduction']:.1%} ({o['deferrable_total_reduction']:.1%}) | "
            f"{o['interruptible_mean_reduction']:.1%} ({o['interruptible_total_reduction']:.1%}) |"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
