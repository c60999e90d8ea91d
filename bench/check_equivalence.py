#!/usr/bin/env python3
"""Check that the optimised importer stores exactly what the importer before it stored.

    .venv/bin/python bench/check_equivalence.py                 # ~2 minutes
    .venv/bin/python bench/check_equivalence.py --baseline-rev 79c38bc --lines 60000

The peer is cocaq/accounting/importer.py and cocaq/accounting/estimate.py of --baseline-rev, everything else
as in the tree.
Both import, each into its own fresh database, the same three dumps one after the other:
  1. bench/gen_sacct.py lines (fixed seed and end), plus a job that is RUNNING and then COMPLETED in
     the same batch, a reused job id (another submit time) and a second cluster;
  2. the same with one job line in ten changed (energy or CPU time): those jobs are updated;
  3. dump 1 again: the changed jobs change back;
with the bench configuration and with node groups added (one of them an unknown carbon zone), on
PostgreSQL and on SQLite; and two malformed dumps (a UID beyond 32 bits, a NUL in a comment) that must
fail the same way.  Compared: the summaries and every stored row of jobs (but updated_at), job_energy
and clusters, surrogate ids included.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import gen_sacct
from bench_import import make_baseline

DRIVER = Path(__file__).resolve().parent / "_equiv_driver.py"
EXTRA = [
    "9999999|9999999|x|u000|10000|lab00|cpu|normal|cpu-001|1|4|cpu=4,mem=8G,node=1|cpu=4,mem=8G,node=1|8G|"
    "2026-11-11T00:00:00|2026-11-11T00:00:00|Unknown|01:00:00|3600|RUNNING|0:0|00:00:00|||other|01:00:00",
    "9999999|9999999|x|u000|10000|lab00|cpu|normal|cpu-001|1|4|cpu=4,mem=8G,node=1|cpu=4,mem=8G,node=1|8G|"
    "2026-11-11T00:00:00|2026-11-11T00:00:00|2026-11-11T05:00:00|05:00:00|18000|COMPLETED|0:0|10:00:00|||"
    "other|01:00:00",
    "9999999|9999999|x|u000|10000|lab00|cpu|normal|cpu-001|1|4|cpu=4,mem=8G,node=1|cpu=4,mem=8G,node=1|8G|"
    "2026-11-12T00:00:00|2026-11-12T00:00:00|2026-11-12T05:00:00|05:00:00|18000|COMPLETED|0:0|10:00:00|||"
    "other|01:00:00",
]


def _line(**over: str) -> str:
    row = {
        "JobID": "100", "JobIDRaw": "100", "JobName": "x", "User": "u1", "UID": "1001", "Account": "lab",
        "Partition": "cpu", "QOS": "normal", "NodeList": "cpu-001", "NNodes": "1", "AllocCPUS": "4",
        "AllocTRES": "cpu=4,mem=8G,node=1", "ReqTRES": "", "ReqMem": "8G", "Submit": "2026-11-10T10:00:00",
        "Start": "2026-11-10T10:00:00", "End": "2026-11-10T20:00:00", "Elapsed": "10:00:00",
        "ElapsedRaw": "36000", "State": "COMPLETED", "ExitCode": "0:0", "TotalCPU": "01:00:00", "Comment": "",
        "ConsumedEnergyRaw": "", "Cluster": "bench", "Timelimit": "1-00:00:00",
    }  # fmt: skip
    row.update(over)
    return "|".join(row[f] for f in gen_sacct.FIELDS)


BAD = {"uid beyond 32 bits": _line(UID="3000000000"), "NUL in a comment": _line(Comment="a\x00b")}


def dumps(tmp: Path, lines: int, seed: int) -> tuple[Path, Path]:
    d1, d2 = tmp / "dump1.txt", tmp / "dump2.txt"
    with open(d1, "w", encoding="utf-8", newline="\n") as fh:
        gen_sacct.generate(fh, jobs=None, lines=lines, seed=seed, end=1_795_000_000.0)
        fh.write("\n".join(EXTRA) + "\n")
    rng = random.Random(seed)
    out = []
    for n, line in enumerate(d1.read_text().splitlines()):
        p = line.split("|")
        if n and "." not in p[0] and rng.random() < 0.1:
            if p[23] not in ("", "0"):
                p[23] = str(int(p[23]) + 1000)
            else:
                p[21] = "00:00:01"
        out.append("|".join(p))
    d2.write_text("\n".join(out) + "\n")
    return d1, d2


def run_driver(pkg_root: Path, url: str, batch: int, groups: bool, files: list[Path]) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(pkg_root))
    env = {k: v for k, v in env.items() if not k.startswith("COCAQ_") or k.startswith("COCAQ_TEST")}
    p = subprocess.run(
        [sys.executable, str(DRIVER), url, str(batch), "1" if groups else "0", *map(str, files)],
        env=env,
        capture_output=True,
        text=True,
        cwd=pkg_root,
    )
    if p.returncode:
        raise SystemExit(f"driver failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def snapshot_pg(dbname: str) -> tuple[str, int, int]:
    import psycopg

    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False)) as conn:
        cols = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs' "
                "AND column_name <> 'updated_at' ORDER BY ordinal_position"
            )
        ]
        jobs = conn.execute(
            f"SELECT {', '.join(cols)}, assumptions::text FROM jobs ORDER BY id"  # json: compare its text
        ).fetchall()
        energy = conn.execute("SELECT * FROM job_energy ORDER BY id").fetchall()
        clusters = conn.execute("SELECT id, name FROM clusters ORDER BY id").fetchall()
    digest = hashlib.md5(repr((jobs, energy, clusters)).encode()).hexdigest()
    return digest, len(jobs), len(energy)


def snapshot_sqlite(path: Path) -> tuple[str, int, int]:
    conn = sqlite3.connect(path)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(jobs)") if r[1] != "updated_at"]
    jobs = conn.execute(f"SELECT {', '.join(cols)} FROM jobs ORDER BY id").fetchall()
    energy = conn.execute("SELECT * FROM job_energy ORDER BY id").fetchall()
    clusters = conn.execute("SELECT id, name FROM clusters ORDER BY id").fetchall()
    conn.close()
    return hashlib.md5(repr((jobs, energy, clusters)).encode()).hexdigest(), len(jobs), len(energy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=60_000)
    p.add_argument("--sqlite-lines", type=int, default=15_000)
    p.add_argument("--batch-size", type=int, default=5_000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--baseline-rev", default="79c38bc")
    a = p.parse_args(argv)

    failures = 0
    with tempfile.TemporaryDirectory(prefix="cocaq-equiv-") as t:
        tmp = Path(t)
        base_root = tmp / "baseline"
        base_root.mkdir()
        label = make_baseline(base_root, a.baseline_rev)
        print(f"peer: importer.py and estimate.py of {label}")
        impls = {"before": base_root, "now": c.ROOT}
        (tmp / "pg").mkdir()
        d1, d2 = dumps(tmp / "pg", a.lines, a.seed)
        (tmp / "lite").mkdir()
        s1, s2 = dumps(tmp / "lite", a.sqlite_lines, a.seed)
        for backend, groups in [(b, g) for b in ("postgresql", "sqlite") for g in (False, True)]:
            res = {}
            for name, root in impls.items():
                if backend == "postgresql":
                    db = f"cocaq_equiv_{name}"
                    c.recreate_database(db)
                    summaries = run_driver(root, c.pg_url(db), a.batch_size, groups, [d1, d2, d1])
                    snap = snapshot_pg(db)
                    c.drop_database(db)
                else:
                    path = tmp / f"{name}-{int(groups)}.sqlite"
                    summaries = run_driver(root, f"sqlite:///{path}", a.batch_size // 5, groups, [s1, s2, s1])
                    snap = snapshot_sqlite(path)
                res[name] = (summaries, snap)
            same = res["before"] == res["now"]
            failures += not same
            s = res["now"][0]
            setup = "node groups" if groups else "bench.toml"
            print(
                f"{'IDENTICAL' if same else 'DIFFERENT'}: {backend}, {setup}: "
                f"{res['now'][1][1]:,} jobs, {res['now'][1][2]:,} energy rows; "
                + "; ".join(f"{x.get('inserted')}/{x.get('updated')}/{x.get('unchanged')}" for x in s)
                + " (inserted/updated/unchanged per dump)"
            )
            if not same:
                print(f"  before: {res['before']}\n  now:    {res['now']}")
        for what, line in BAD.items():
            f = tmp / "bad.txt"
            f.write_text("|".join(gen_sacct.FIELDS) + "\n" + _line() + "\n" + line + "\n")
            res = {}
            for name, root in impls.items():
                db = f"cocaq_equiv_{name}"
                c.recreate_database(db)
                res[name] = (run_driver(root, c.pg_url(db), a.batch_size, False, [f]), snapshot_pg(db))
                c.drop_database(db)
            same = res["before"] == res["now"]
            failures += not same
            print(f"{'IDENTICAL' if same else 'DIFFERENT'}: postgresql, {what}: {res['now'][0][0]}")
            if not same:
                print(f"  before: {res['before']}\n  now:    {res['now']}")
    print("all identical" if not failures else f"{failures} case(s) differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
