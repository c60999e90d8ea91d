#!/usr/bin/env python3
"""Benchmark: `cocaq user U --since 30d` as a whole process on a PostgreSQL database of 1,000,000 jobs.

    .venv/bin/python bench/bench_user_query.py            # ~8 minutes on 2 cores (most of it the load)
    .venv/bin/python bench/bench_user_query.py --reuse    # keep and reuse the loaded database

The database (`cocaq_bench_query`) is loaded the way a site loads one: bench/gen_sacct.py writes
1,006,037 job lines (each followed by its .batch and .extern steps: 3 M lines, a year of submissions
ending now; the parser skips the ~0.55% that never started, leaving >= 1,000,000 jobs),
`cocaq import sacct --file` imports it and `cocaq aggregate --full` builds the daily rollups that
`cocaq user` reads; then VACUUM ANALYZE, as autovacuum would have done on a live database.  With --reuse
an already loaded database is used as it is (aggregated first if the aggregator never ran on it).

Then, interleaved round-robin so the machine's noise hits every command alike, 15 runs each of
  * `cocaq user <heavy> --since 30d --format json`   the user with the most jobs in the window
  * `cocaq user <median> --since 30d --format json`  the user with the median number of jobs in it
  * `cocaq user <nobody> --since 30d --format json`  an account of this machine without jobs
  * the heavy user again with `--from-jobs`          no rollups: what reading them saves
  * `python -m cocaq --version`                      the floor: interpreter start and cocaq's CLI import
  * `python -c 'import <what cocaq user imports>'`  the floor of the command's imports alone
and, in this process on a warm connection, the SQL alone (cocaq.footprint.totals.user_footprint, 15 runs
each, and the heavy user with --from-jobs).  Prints EXPLAIN (ANALYZE, BUFFERS) of the heavy user's
statement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import gen_sacct

# What `cocaq user --format json` imports beyond `cocaq --version` (no SQLAlchemy, no rich).
USER_IMPORTS = "import cocaq.cli.app, cocaq.footprint.totals, cocaq.db.dbapi, cocaq.cli.terminal, psycopg"
FLOOR = "floor: python -m cocaq --version"
IMPORTS = "floor: python -c 'import <the modules the user command loads>'"
# About 0.55% of generated job lines never start (pending at the end, cancelled while pending) and are
# skipped by the parser: generate a little more so that at least --jobs jobs land in the database.
SURVIVAL = 0.994


def job_count(dbname: str) -> int:
    import psycopg

    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False)) as conn:
        row = conn.execute("SELECT count(*) FROM jobs").fetchone()
    return int(row[0]) if row else 0


def build(dbname: str, jobs: int, seed: int) -> dict[str, float]:
    env = c.cocaq_env(dbname)
    cfg = ["--config", str(c.CONFIG)]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="cocaq-bench-") as tmp:
        path = Path(tmp) / f"sacct-{jobs}-jobs.txt"
        t0 = time.perf_counter()
        end = float(int(time.time()) // 3600 * 3600)
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            n_lines, n_jobs = gen_sacct.generate(fh, jobs=jobs, lines=None, seed=seed, end=end)
        out["generate_s"] = time.perf_counter() - t0
        out["lines"] = n_lines
        print(f"generated {n_lines:,} lines ({n_jobs:,} job lines) in {out['generate_s']:.1f} s")
        c.recreate_database(dbname)
        c.run_process([c.COCAQ, *cfg, "db", "upgrade"], env)
        imp = c.run_process([c.COCAQ, *cfg, "import", "sacct", "--file", str(path)], env, rss=True)
        out["import_s"] = imp.wall_s
        out["import_rss_mb"] = imp.max_rss_mb or 0.0
        summary = next((ln for ln in imp.stderr.splitlines() if "records read" in ln), "")
        print(
            f"loaded with cocaq import sacct in {imp.wall_s:.1f} s "
            f"(peak RSS {imp.max_rss_mb:.0f} MiB): {summary}"
        )
    import psycopg

    t0 = time.perf_counter()
    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE job_energy")
    out["vacuum_analyze_s"] = time.perf_counter() - t0
    out["aggregate_s"] = aggregate(dbname)
    return out


def watermark(dbname: str) -> object:
    import psycopg

    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False)) as conn:
        row = conn.execute("SELECT watermark FROM aggregator_state WHERE name = 'jobs'").fetchone()
    return row[0] if row else None


def aggregate(dbname: str) -> float:
    """`cocaq aggregate --full` (the daily rollups `cocaq user` reads), then VACUUM ANALYZE of its tables."""
    import psycopg

    r = c.run_process([c.COCAQ, "--config", str(c.CONFIG), "aggregate", "--full"], c.cocaq_env(dbname))
    print(f"cocaq aggregate --full in {r.wall_s:.1f} s: {' '.join(r.stderr.strip().splitlines()[-1:])}")
    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False), autocommit=True) as conn:
        for t in ("daily_rollups", "job_metrics", "aggregator_state"):
            conn.execute(f"VACUUM ANALYZE {t}")
    return r.wall_s


def pick_users(dbname: str, since: datetime) -> tuple[str, int, str, int, str]:
    """(heavy user, jobs, median user, jobs, a user without jobs) for the window since `since`."""
    rows, nobody = c.users_by_jobs(dbname, since)
    heavy, heavy_n = rows[0]
    med, med_n = rows[len(rows) // 2]
    return heavy, heavy_n, med, med_n, nobody


def sql_only(dbname: str, users: list[str], runs: int) -> tuple[dict[str, list[float]], str]:
    """user_footprint() in this process on a warm connection (key "U" with the rollups, "U --from-jobs"
    without); and EXPLAIN ANALYZE of the heavy user's statement."""
    from cocaq.db.dbapi import connect
    from cocaq.footprint import totals as fp

    times: dict[str, list[float]] = {}
    with connect(c.pg_url(dbname)) as db:
        now = datetime.now(UTC)
        w = fp.Window(now - timedelta(days=30), now)
        cases = [(u, False) for u in users] + [(users[0], True)]
        for u, from_jobs in cases:  # warm: plans, catalog, buffers
            fp.user_footprint(db, u, w, from_jobs=from_jobs)
            fp.user_footprint(db, u, w, from_jobs=from_jobs)
        for _ in range(runs):
            for u, from_jobs in cases:
                t0 = time.perf_counter()
                fp.user_footprint(db, u, w, from_jobs=from_jobs)
                times.setdefault(u + (" --from-jobs" if from_jobs else ""), []).append(
                    time.perf_counter() - t0
                )
        plan = fp.plan_window(w, fp.read_watermark(db))
        sql = fp.footprint_sql(
            db, None, "user", None, edges=len(plan.edges), rollups=plan.rollup_days > 0, top=True
        )
        explain = db.rows("EXPLAIN (ANALYZE, BUFFERS) " + sql, fp._params(w, users[0], None, plan, 5))
    return times, "\n".join(r[0] for r in explain)


def import_breakdown(env: dict[str, str]) -> list[tuple[str, float]]:
    """Cumulative import time (ms) of the big pieces `cocaq user` loads, from python -X importtime."""
    import re
    import subprocess

    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", USER_IMPORTS], env=env, capture_output=True, text=True
    )
    cum: dict[str, float] = {}
    for line in p.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and m.group(3) in PIECES and m.group(3) not in cum:
            cum[m.group(3)] = int(m.group(1)) / 1000
    return sorted(cum.items(), key=lambda kv: -kv[1])


PIECES = (
    "sqlalchemy", "sqlalchemy.orm", "cocaq.db.schema", "psycopg", "click", "cocaq.config", "rich.console",
    "cocaq.footprint.totals", "cocaq.cli.app", "cocaq.cli.terminal", "cocaq.db.engine", "cocaq.db.dbapi",
    "platformdirs",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--db", default="cocaq_bench_query")
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--seed", type=int, default=20261121)
    p.add_argument("--reuse", action="store_true", help="use the database if it is already loaded; keep it")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    a = p.parse_args(argv)

    m = c.machine()
    c.print_machine(m)
    res: dict[str, object] = {"machine": m}
    if a.reuse and c.database_exists(a.db) and job_count(a.db) >= a.jobs:
        print(f"reusing database {a.db} ({job_count(a.db):,} jobs)")
        if watermark(a.db) is None:
            res["build"] = {"aggregate_s": aggregate(a.db)}
    else:
        res["build"] = build(a.db, int(a.jobs / SURVIVAL) + 1, a.seed)
    n_jobs = job_count(a.db)
    res["jobs"] = n_jobs

    since = datetime.now(UTC) - timedelta(days=30)
    heavy, heavy_n, med, med_n, nobody = pick_users(a.db, since)
    users = {"heavy": heavy, "median": med, "none": nobody}
    print(
        f"{n_jobs:,} jobs; in the last 30 days: heavy user {heavy} {heavy_n:,} jobs, "
        f"median user {med} {med_n:,} jobs, {nobody} none"
    )

    env = c.cocaq_env(a.db)
    py = sys.executable
    commands: dict[str, list[str]] = {
        FLOOR: [py, "-m", "cocaq", "--version"],
        IMPORTS: [py, "-c", USER_IMPORTS],
    }
    user_cmd = [c.COCAQ, "--config", str(c.CONFIG), "user"]
    for kind, u in users.items():
        commands[f"cocaq user ({kind}: {u})"] = [*user_cmd, u, "--since", "30d", "--format", "json"]
    commands[f"cocaq user --from-jobs (heavy: {heavy})"] = [
        *user_cmd, heavy, "--since", "30d", "--format", "json", "--from-jobs",
    ]  # fmt: skip
    for argv_ in commands.values():  # warm the page cache and .pyc files once
        c.run_process(argv_, env)
    times: dict[str, list[float]] = {k: [] for k in commands}
    answers: dict[str, int] = {}
    for _ in range(a.runs):
        for name, argv_ in commands.items():
            r = c.run_process(argv_, env)
            times[name].append(r.wall_s)
            if name.startswith("cocaq user"):
                answers[name] = json.loads(r.stdout)["jobs"]
    sql_times, plan = sql_only(a.db, list(users.values()), a.runs)

    floor = statistics.median(times[FLOOR])
    imports = statistics.median(times[IMPORTS])
    print()
    print(f"| what ({a.runs} runs each, whole process unless noted) | median s | p90 s | x floor |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        extra = f" -> {answers[name]:,} jobs in the window" if name in answers else ""
        print(
            f"| {name}{extra} | {statistics.median(ts):.3f} | {c.p90(ts):.3f} | "
            f"{statistics.median(ts) / floor:.1f} |"
        )
    for name, ts in sql_times.items():
        print(
            f"| SQL only, user_footprint() in-process, warm connection ({name}) | "
            f"{statistics.median(ts):.4f} | {c.p90(ts):.4f} | |"
        )
    print()
    measured = [k for k in times if k.startswith("cocaq user (")]  # the target: with the rollups
    worst = max(statistics.median(times[k]) for k in measured)
    worst_p90 = max(c.p90(times[k]) for k in measured)
    print(
        f"floor (python -m cocaq --version) median {floor:.3f} s; the user command's imports alone "
        f"{imports:.3f} s; slowest cocaq user median {worst:.3f} s = {worst / floor:.1f}x the floor, "
        f"{worst - imports:.3f} s above its imports"
    )
    verdict = "MET" if worst < 0.3 else "MISSED"
    print(
        f"target: cocaq user --since 30d under 0.3 s on {n_jobs:,} jobs: {verdict} "
        f"(median {worst:.3f} s, p90 {worst_p90:.3f} s)"
    )
    pieces = import_breakdown(env)
    print(
        "imports of the user command, cumulative ms (python -X importtime, one run; nested pieces overlap): "
        + ", ".join(f"{k} {v:.0f}" for k, v in pieces)
    )
    print()
    print("EXPLAIN (ANALYZE, BUFFERS) of the heavy user's statement (rollups + edges + top jobs):")
    print(plan)
    res.update(
        users={
            k: {"user": u, "jobs_in_window": answers.get(f"cocaq user ({k}: {u})")} for k, u in users.items()
        },
        times={k: {"median": statistics.median(v), "p90": c.p90(v), "runs": v} for k, v in times.items()},
        sql={k: {"median": statistics.median(v), "p90": c.p90(v)} for k, v in sql_times.items()},
        plan=plan,
        import_ms=dict(pieces),
    )
    if a.json:
        a.json.write_text(json.dumps(res, indent=2, default=str))
    if not a.reuse:
        c.drop_database(a.db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
