#!/usr/bin/env python3
"""Benchmark: reading N finished jobs from Slurm 25.11's accounting through pyslurm, `sacct --json` and
`sacct --parsable2`, all in one run (same machine, same slurmdbd, same jobs).

    tests/slurm/cluster.sh up 25.11 && tests/slurm/pyslurm.sh       # once
    .venv/bin/python bench/bench_slurm_backends.py --sizes 1000,10000,100000

Needs root (it writes to the test cluster's MariaDB). What it does:

1. loads the 25.11 test cluster's accounting database (`slurm_acct_db_2511`) with copies of real
   finished jobs: the jobs tests/slurm/capture_sacct.sh ran there (ids 24-40 that are neither array tasks
   nor het jobs, with their steps), copied in rounds 200 s apart starting 2020-01-01 UTC with new job ids
   from 5,000,000, until the largest size is there (INSERT ... SELECT over MariaDB's seq_ tables, the
   way slurmdbd stores them: the same rows, times shifted). Far in the past, so no test window meets them.
   A second run finds them and loads nothing.
2. for each size N, the window that holds N of them, read by each method in its own process, --repeat
   times (median): pyslurm (`cocaq.slurm.slurmdb.iter_slurmdb`: pyslurm.db.Jobs.load, then cocaq's
   reader), sacct --json (`run_sacct` + `iter_json`) and sacct --parsable2 (`run_sacct(use_json=False)` +
   `iter_parsable`); the records are counted and dropped. Wall clock of the whole reading; peak RSS of
   the Python process and, for the CLI, of the sacct process (RUSAGE_CHILDREN).

Prints the machine and a table; --json writes the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, print_machine

DB = "slurm_acct_db_2511"
JOBS, STEPS = "cocaqtest_job_table", "cocaqtest_step_table"
BASE = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp())
ROUND_S = 200
FIRST_ID = 5_000_000


def template(t: str = "") -> str:
    """The jobs copied: capture_sacct.sh's finished jobs on 25.11, not array tasks nor het jobs."""
    p = f"{t}." if t else ""
    return f"{p}id_job BETWEEN 24 AND 40 AND {p}id_array_job = 0 AND {p}het_job_id = 0 AND {p}time_end > 0"


TEMPLATE = template()
METHODS = ("pyslurm", "sacct --json", "sacct --parsable2")


def mysql(sql: str) -> str:
    p = subprocess.run(["mysql", "-u", "root", "-N", "-B", DB, "-e", sql], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"mysql: {p.stderr.strip()}\n{sql[:400]}")
    return p.stdout


def columns(table: str) -> list[str]:
    out = mysql(
        "SELECT column_name FROM information_schema.columns"
        f" WHERE table_schema = '{DB}' AND table_name = '{table}' ORDER BY ordinal_position"
    )
    return out.split()


def load(n_max: int) -> tuple[int, int]:
    """Copies of the template jobs until at least n_max exist; (template size, rounds)."""
    t = int(mysql(f"SELECT count(*) FROM {JOBS} WHERE {TEMPLATE}"))
    if t == 0:
        raise SystemExit("no template jobs: run tests/slurm/capture_sacct.sh tests/data/sacct 25.11 first")
    rounds = -(-n_max // t)
    have = int(mysql(f"SELECT count(*) FROM {JOBS} WHERE id_job >= {FIRST_ID}"))
    if have >= rounds * t:
        return t, rounds
    mysql(
        f"DELETE s FROM {STEPS} s JOIN {JOBS} j ON j.job_db_inx = s.job_db_inx WHERE j.id_job >= {FIRST_ID}"
    )
    mysql(f"DELETE FROM {JOBS} WHERE id_job >= {FIRST_ID}")
    tmin = int(mysql(f"SELECT min(time_submit) FROM {JOBS} WHERE {TEMPLATE}"))
    back = tmin - BASE  # (unsigned columns: subtract the positive distance, then add the round's offset)
    times = {"time_submit", "time_eligible", "time_start", "time_end"}
    cols = [c for c in columns(JOBS) if c != "job_db_inx"]
    sel = []
    for c in cols:
        if c == "id_job":
            sel.append(f"{FIRST_ID} + s.seq * 100 + (t.id_job - 24)")
        elif c in times:
            sel.append(f"IF(t.{c} > 0, t.{c} - {back} + s.seq * {ROUND_S}, 0)")
        else:
            sel.append(f"t.`{c}`")
    t0 = time.perf_counter()
    for lo in range(0, rounds, 2000):  # in slices: one statement of 100k rows holds locks a long time
        hi = min(rounds, lo + 2000) - 1
        mysql(
            f"INSERT INTO {JOBS} ({', '.join(f'`{c}`' for c in cols)}) SELECT {', '.join(sel)}"
            f" FROM {JOBS} t JOIN seq_{lo}_to_{hi} s WHERE {template('t')}"
        )
    scols = [c for c in columns(STEPS) if c != "job_db_inx"]
    ssel = []
    for c in scols:
        if c in ("time_start", "time_end"):
            ssel.append(f"IF(st.{c} > 0, st.{c} - (o.time_submit - n.time_submit), 0)")
        else:
            ssel.append(f"st.`{c}`")
    mysql(
        f"INSERT INTO {STEPS} (job_db_inx, {', '.join(f'`{c}`' for c in scols)})"
        f" SELECT n.job_db_inx, {', '.join(ssel)}"
        f" FROM {JOBS} n JOIN {JOBS} o ON o.id_job = (n.id_job - {FIRST_ID}) % 100 + 24"
        f" AND {template('o')}"
        f" JOIN {STEPS} st ON st.job_db_inx = o.job_db_inx WHERE n.id_job >= {FIRST_ID}"
    )
    print(f"loaded {rounds * t:,} jobs ({rounds} rounds of {t}) in {time.perf_counter() - t0:.0f} s")
    return t, rounds


CHILD = r"""
import json, resource, sys, time
from datetime import datetime, UTC
start = datetime.fromtimestamp(int(sys.argv[1]), UTC)
end = datetime.fromtimestamp(int(sys.argv[2]), UTC)
method = sys.argv[3]
t0 = time.perf_counter()
from cocaq.slurm.sacct import ParseStats, iter_json, iter_parsable
st = ParseStats()
if method == "pyslurm":
    import pyslurm
    from cocaq.slurm.slurmdb import iter_slurmdb
    n = sum(1 for _ in iter_slurmdb(start, end, all_users=True, stats=st, pyslurm=pyslurm))
else:
    from cocaq.slurm.run import run_sacct
    out = run_sacct(start, end, all_users=True, use_json=method == "sacct --json")
    assert out.kind == ("json" if method == "sacct --json" else "parsable"), out.kind
    if out.kind == "json":
        recs = iter_json(out.data, stats=st)
    else:
        recs = iter_parsable(out.data.splitlines(keepends=True), tz=UTC, delimiter=out.delimiter, stats=st)
    n = sum(1 for _ in recs)
wall = time.perf_counter() - t0
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"n": n, "steps": st.steps, "wall_s": wall, "rss_mb": me, "sacct_rss_mb": kids}))
"""


def read(method: str, start: int, end: int, env: dict[str, str]) -> dict[str, float]:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(start), str(end), method],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=3600,
    )  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"{method}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument(
        "--json-max",
        type=int,
        default=10_000,
        help="sacct --json only up to this many jobs: its RSS grows ~190 KB a job (1.9 GB at 10k), the"
        " reader's ~56 KB: 100k would not fit a 24 GiB machine",
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (the test cluster's MariaDB)")
    sizes = [int(s) for s in args.sizes.split(",")]
    m = machine()
    print_machine(m)
    envtext = subprocess.run([str(ROOT / "tests/slurm/cluster.sh"), "env", "25.11"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    env = dict(os.environ)
    for line in envtext.splitlines():
        k, _, v = line.removeprefix("export ").partition("=")
        env[k] = v.replace('"$PATH"', os.environ["PATH"]).replace("'", "")
    t, _rounds = load(max(sizes))
    results = []
    print(f"\n{'jobs':>8} {'method':18} {'wall s':>8} {'records':>8} {'py RSS MB':>10} {'sacct RSS MB':>12}")
    for n in sizes:
        end = BASE + (-(-n // t)) * ROUND_S - 1
        for method in METHODS:
            if method == "sacct --json" and n > args.json_max:
                print(f"{n:8,} {method:18} {'skipped: over --json-max (memory)':>40}")
                continue
            runs = [read(method, BASE, end, env) for _ in range(args.repeat)]
            r = {
                "jobs": n,
                "method": method,
                "records": runs[0]["n"],
                "steps": runs[0]["steps"],
                "wall_s": statistics.median(x["wall_s"] for x in runs),
                "walls": [round(x["wall_s"], 3) for x in runs],
                "rss_mb": max(x["rss_mb"] for x in runs),
                "sacct_rss_mb": max(x["sacct_rss_mb"] for x in runs) if method != "pyslurm" else None,
            }
            results.append(r)
            sr = f"{r['sacct_rss_mb']:12.0f}" if r["sacct_rss_mb"] else f"{'-':>12}"
            print(f"{n:8,} {method:18} {r['wall_s']:8.2f} {r['records']:8,} {r['rss_mb']:10.0f} {sr}")
    print("\nratios to sacct --json (wall), or to --parsable2 where --json was not run:")
    for n in sizes:
        of = [r for r in results if r["jobs"] == n]
        ref = next((r for r in of if r["method"] == "sacct --json"), None)
        note = ""
        if ref is None:  # --json not run at this size
            ref = next(r for r in of if r["method"] == "sacct --parsable2")
            note = " (no --json run: to --parsable2)"
        line = ", ".join(f"{r['method']} {r['wall_s'] / ref['wall_s']:.2f}" for r in of)
        print(f"  {n:,}{note}: {line}")
    if args.json_out:
        doc = {"machine": m, "results": results, "when": str(datetime.now(UTC))}
        Path(args.json_out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
