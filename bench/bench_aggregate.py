#!/usr/bin/env python3
"""Benchmark: `cocaq aggregate` (full and one incremental hour) and `cocaq user --since 30d` on a year.

    .venv/bin/python bench/bench_aggregate.py --reuse   # builds cocaq_bench_agg once (~10 min), reuses it
    .venv/bin/python bench/bench_aggregate.py --reuse --skip-full   # only (b) and (c)

The database (`cocaq_bench_agg`, kept with --reuse) is a year of a site:
  * 1,000,000 jobs: bench/gen_sacct.py writes 1,006,037 job lines (each with its .batch and .extern
    steps, submissions over the year ending now) and `cocaq import sacct --file` imports them, as a site
    would.  The generated file is kept next to the database (--cache-dir) for the incremental runs.
  * an hourly carbon-intensity series for the year for both of the cluster's zones (DEU; FRA for
    gpu_h100), written as a plain `zone,datetime,gco2_per_kwh` CSV and imported with `cocaq carbon import`.
  * 20,000,000 GPU samples: monthly partitions for the whole year (cocaq.db.migrate.ensure_sample_partitions),
    then, for the GPU jobs taken in a fixed pseudo-random order until the 20 M rows are reached, nvml
    power_w and util_pct per GPU every 10-60 s (per job) over the whole run, job_id = the raw job id
    as the collector writes it, ~10% of the sample times idle (util < 5%).  Generated in PostgreSQL
    (INSERT ... SELECT over generate_series), values deterministic.
  * VACUUM ANALYZE, then one `cocaq aggregate --full` (the first one after the load: it writes every
    job's CO2) whose time is reported as "first full".

Measured, whole processes (wall clock around the subprocess):
  (a) `cocaq aggregate --full` (--full-runs times; target <= 45 s, issue 34): every job and day derived
      again, GPU use by hour from `job_gpu_hours` (the samples are unchanged since the build's run)
  (a') `cocaq aggregate --full --rescan-samples` (--rescan-runs times): the same, every sample read again
  (b) one incremental hour, --runs times, each for a different hour of the last days: the jobs that
      ended in that hour are put back as they were while running (state RUNNING, open, no end time,
      their samples from that hour on deleted), `cocaq aggregate` runs (not timed: the hourly run that
      saw them running), then their samples of the hour are written again and recorded as shipped
      (node_shipments, as the collector does), their final sacct lines (from the kept file) are
      imported with `cocaq import sacct --file`, as the next hour's import does; then the timed
      `cocaq -v aggregate` (target <= 1 s, issue 34), its phases from the log line.
  (b') the same for --runs other hours, with the timed run as the scheduler's hourly job makes it:
      `run_aggregate` in this process, which has imported cocaq and made its engine before (the
      scheduler is one long-running process; its hourly job pays no start-up).
      Before each hour, the changes the previous iterations made (minutes earlier) and the aggregator's
      watermarks are moved an hour back, as an hour would have passed between two hourly runs.
  (c) `cocaq user HEAVY --since 30d --format json` (the user with the most jobs in the window) and the
      floor `python -m cocaq --version`, interleaved, --runs times each (target < 0.3 s).
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import gen_sacct

SURVIVAL = 0.994
SAMPLES = 20_000_000
FLOOR = "floor: python -m cocaq --version"


def _pg(dbname: str, autocommit: bool = False):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(c.pg_url(dbname, sqlalchemy=False), autocommit=autocommit)


def job_count(dbname: str) -> int:
    with _pg(dbname) as conn:
        try:
            row = conn.execute("SELECT count(*) FROM jobs").fetchone()
        except Exception:
            return 0
    return int(row[0]) if row else 0


def sample_count(dbname: str) -> int:
    with _pg(dbname) as conn:
        try:
            row = conn.execute("SELECT count(*) FROM samples").fetchone()
        except Exception:
            return 0
    return int(row[0]) if row else 0


# Per GPU job: a step of 10-60 s; rows = 2 metrics x GPUs x sample times.
_STEP = "(10 + (j.job_id_raw % 6) * 10)"
_PICK = f"""
    SELECT j.id, j.alloc_gpus * (floor(j.elapsed_s / {_STEP}) + 1) * 2 AS n,
           sum(j.alloc_gpus * (floor(j.elapsed_s / {_STEP}) + 1) * 2)
               OVER (ORDER BY (j.id * 2654435761) % 4294967296, j.id) AS cum
    FROM jobs j
    WHERE j.alloc_gpus > 0 AND j.start_time IS NOT NULL AND j.job_id_raw IS NOT NULL AND j.elapsed_s > 0
"""
# The samples of the jobs in temp table `pick(id)`; node k of n_nodes carries GPUs g with g*n/gpus = k.
_GEN = f"""
    INSERT INTO samples (ts, cluster_id, node, source, device, metric, job_id, value)
    SELECT j.start_time + make_interval(secs => k * {_STEP}), j.cluster_id,
           CASE WHEN j.n_nodes <= 1 THEN j.node_list
                ELSE split_part(j.node_list, '[', 1) || ((g * j.n_nodes) / j.alloc_gpus) END,
           'nvml', 'gpu' || (g % greatest(j.alloc_gpus / greatest(j.n_nodes, 1), 1)), m.metric,
           j.job_id_raw::text,
           CASE WHEN m.metric = 'util_pct' THEN
                CASE WHEN ((j.job_id_raw * 31 + k * 7 + g) % 10) = 0 THEN ((k + g) % 4)::float8
                     ELSE 40 + ((j.job_id_raw * 13 + k * 17 + g * 5) % 61) END
           ELSE CASE WHEN ((j.job_id_raw * 31 + k * 7 + g) % 10) = 0 THEN 60 + ((k * 3 + g) % 20)
                     ELSE tdp * (0.45 + ((j.job_id_raw * 11 + k * 29 + g * 3) % 50) / 100.0) END
           END
    FROM jobs j
    JOIN pick p ON p.id = j.id
    CROSS JOIN LATERAL (SELECT CASE j.partition WHEN 'gpu_h100' THEN 700.0 WHEN 'gpu_v100' THEN 300.0
                                    ELSE 400.0 END AS tdp) t
    CROSS JOIN LATERAL generate_series(0, j.alloc_gpus - 1) g
    CROSS JOIN LATERAL generate_series(0, floor(j.elapsed_s / {_STEP})::int) k
    CROSS JOIN (VALUES ('power_w'), ('util_pct')) m(metric)
    ON CONFLICT DO NOTHING
"""


def build(dbname: str, jobs: int, seed: int, cache: Path) -> dict[str, float]:
    env = c.cocaq_env(dbname)
    cfg = ["--config", str(c.CONFIG)]
    out: dict[str, float] = {}
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / "sacct.txt"
    stage = cache / "imported.json"  # a build that stopped after the import goes on from there
    if stage.exists() and path.exists() and c.database_exists(dbname) and job_count(dbname) >= jobs * 0.99:
        out.update(json.loads(stage.read_text()))
        end = out["end"]
        print(f"going on from the import of {job_count(dbname):,} jobs", flush=True)
    else:
        t0 = time.perf_counter()
        end = float(int(time.time()) // 3600 * 3600)
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            n_lines, n_jobs = gen_sacct.generate(fh, jobs=jobs, lines=None, seed=seed, end=end)
        out["generate_s"] = time.perf_counter() - t0
        print(f"generated {n_lines:,} lines ({n_jobs:,} job lines) in {out['generate_s']:.1f} s", flush=True)
        c.recreate_database(dbname)
        c.run_process([c.COCAQ, *cfg, "db", "upgrade"], env)
        imp = c.run_process([c.COCAQ, *cfg, "import", "sacct", "--file", str(path)], env)
        out["import_s"] = imp.wall_s
        out["end"] = end
        print(f"cocaq import sacct: {imp.wall_s:.1f} s", flush=True)
        stage.write_text(json.dumps(out))

    # carbon intensity: hourly for the year (and a margin) for both zones
    t0 = time.perf_counter()
    first = datetime.fromtimestamp(end, UTC) - timedelta(days=400)
    first = first.replace(minute=0, second=0, microsecond=0)
    hours = int((datetime.fromtimestamp(end, UTC) + timedelta(days=2) - first).total_seconds() // 3600)
    csv_path = cache / "intensity.csv"
    with open(csv_path, "w", encoding="utf-8") as fh:
        fh.write("zone,datetime,gco2_per_kwh\n")
        for zone, base in (("DEU", 380.0), ("FRA", 60.0)):
            for h in range(hours):
                t = first + timedelta(hours=h)
                daily = (1.0 + 0.25 * ((t.hour - 12) ** 2) / 144.0) * (1.0 + 0.1 * ((h // 24) % 7) / 7.0)
                fh.write(f"{zone},{t:%Y-%m-%dT%H:%M:%SZ},{base * daily:.2f}\n")
    c.run_process([c.COCAQ, *cfg, "carbon", "import", str(csv_path)], env)
    out["intensity_s"] = time.perf_counter() - t0
    print(f"carbon intensity: {2 * hours:,} hourly rows in {out['intensity_s']:.1f} s", flush=True)

    # sample partitions for every month of the data, then the samples
    from cocaq.db.engine import make_engine
    from cocaq.db.migrate import ensure_sample_partitions

    engine = make_engine(c.pg_url(dbname))
    with _pg(dbname) as conn:
        lo = conn.execute("SELECT min(start_time) FROM jobs").fetchone()[0]  # type: ignore[index]
    m = lo.replace(day=1, hour=0, minute=0, second=0, microsecond=0, tzinfo=UTC)
    made = 0
    while m <= datetime.now(UTC) + timedelta(days=62):
        made += len(ensure_sample_partitions(engine, m, months_ahead=0))
        m = (m + timedelta(days=32)).replace(day=1)
    engine.dispose()
    t0 = time.perf_counter()
    with _pg(dbname) as conn:
        conn.execute("DELETE FROM samples")
        conn.execute(f"CREATE TEMP TABLE pick AS SELECT id FROM ({_PICK}) x WHERE cum <= {SAMPLES}")
        n_pick = conn.execute("SELECT count(*) FROM pick").fetchone()[0]  # type: ignore[index]
        conn.execute(_GEN)
        conn.commit()
    out["samples_s"] = time.perf_counter() - t0
    print(
        f"samples: {made} partitions made, {n_pick:,} GPU jobs sampled in {out['samples_s']:.1f} s",
        flush=True,
    )
    t0 = time.perf_counter()
    with _pg(dbname, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    out["vacuum_analyze_s"] = time.perf_counter() - t0
    r = c.run_process([c.COCAQ, *cfg, "aggregate", "--full"], env)
    out["first_full_s"] = r.wall_s
    print(f"first cocaq aggregate --full: {r.wall_s:.1f} s: {r.stderr.strip()}", flush=True)
    with _pg(dbname, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    (cache / "build.json").write_text(json.dumps(out))
    return out


# --- (b) one incremental hour ------------------------------------------------------------------------


def _hour_jobs(dbname: str, hour: datetime) -> list[tuple[int, str]]:
    with _pg(dbname) as conn:
        return [
            (int(r[0]), str(r[1]))
            for r in conn.execute(
                "SELECT id, job_id FROM jobs WHERE end_time >= %s AND end_time < %s AND NOT is_open",
                (hour, hour + timedelta(hours=1)),
            )
        ]


def _final_lines(sacct: Path, job_ids: set[str], out: Path) -> int:
    n = 0
    with open(sacct, encoding="utf-8") as fh, open(out, "w", encoding="utf-8") as w:
        w.write(fh.readline())
        for line in fh:
            jid = line.split("|", 1)[0].split(".", 1)[0]
            if jid in job_ids:
                w.write(line)
                n += 1
    return n


def incremental(
    dbname: str, cache: Path, hour: datetime, warm: tuple[Any, Any] | None = None
) -> dict[str, Any]:
    env = c.cocaq_env(dbname)
    cfg = ["--config", str(c.CONFIG)]
    jobs = _hour_jobs(dbname, hour)
    pks = [j[0] for j in jobs]
    with _pg(dbname) as conn:
        # An hour passes between two hourly runs: what the previous iterations changed (minutes ago, in
        # this benchmark) moves an hour back, as it would be, so that each run sees one hour's changes.
        for sql in (
            "UPDATE jobs SET updated_at = updated_at - interval '1 hour' "
            "WHERE updated_at > now() - interval '1 hour'",
            "UPDATE node_shipments SET shipped_at = shipped_at - interval '1 hour' "
            "WHERE shipped_at > now() - interval '1 hour'",
            "UPDATE aggregator_state SET watermark = watermark - interval '1 hour'",
        ):
            conn.execute(sql)
        # as they were while running, an hour before: no end, open, no samples yet for the last hour
        conn.execute(
            "UPDATE jobs SET state = 'RUNNING', is_open = true, end_time = NULL, record_hash = NULL, "
            "updated_at = now() WHERE id = ANY(%s)",
            (pks,),
        )
        conn.execute("CREATE TEMP TABLE pick AS SELECT unnest(%s::bigint[]) AS id", (pks,))
        # the collector had shipped their samples up to the start of the hour; the rest comes now
        conn.execute(
            "DELETE FROM samples s USING jobs j, pick p WHERE p.id = j.id AND s.cluster_id = j.cluster_id "
            "AND s.job_id = j.job_id_raw::text AND s.ts >= greatest(j.start_time, %s)",
            (hour,),
        )
        conn.commit()
    c.run_process([c.COCAQ, *cfg, "aggregate"], env)  # the previous hour's run
    with tempfile.TemporaryDirectory(prefix="cocaq-bench-") as tmp:
        f = Path(tmp) / "hour.txt"
        n_lines = _final_lines(cache / "sacct.txt", {j[1] for j in jobs}, f)
        with _pg(dbname) as conn:  # the collector shipped their samples
            conn.execute("CREATE TEMP TABLE pick AS SELECT unnest(%s::bigint[]) AS id", (pks,))
            conn.execute(_GEN)
            n_samples = conn.execute(
                "SELECT count(*) FROM samples s JOIN jobs j ON s.job_id = j.job_id_raw::text "
                "AND s.cluster_id = j.cluster_id JOIN pick p ON p.id = j.id WHERE s.ts >= %s",
                (hour,),
            ).fetchone()[0]  # type: ignore[index]
            # ... and recorded, per batch, which jobs the samples belong to and from when (as
            # collector/ship.py does)
            conn.execute(
                "INSERT INTO node_shipments (cluster_id, node, batch, rows, job_ids) "
                "SELECT j.cluster_id, 'bench', 'hour-' || %s || '-' || j.cluster_id || '-' || %s, %s, "
                "string_agg(j.job_id_raw::text || '@' || "
                "floor(extract(epoch FROM greatest(j.start_time, %s)))::bigint, ' ') "
                "FROM jobs j JOIN pick p ON p.id = j.id GROUP BY j.cluster_id",
                (hour.isoformat(), time.time_ns(), n_samples, hour),
            )
            conn.commit()
        imp = c.run_process([c.COCAQ, *cfg, "import", "sacct", "--file", str(f)], env)
    if warm is None:  # `cocaq aggregate` as a whole process, as cron or an admin runs it
        r = c.run_process([c.COCAQ, "-v", *cfg, "aggregate"], env)
        wall, summary, phases = r.wall_s, _summary(r.stderr), _phases(r.stderr)
    else:  # the scheduler's hourly job, in its long-running process (imports and engine made before)
        from cocaq.accounting.aggregate import run_aggregate

        engine, config = warm
        t0 = time.perf_counter()
        s = run_aggregate(engine, config)
        wall, summary, phases = time.perf_counter() - t0, s.line(), dict(s.phases)
    return {
        "jobs": len(jobs),
        "lines": n_lines,
        "samples": n_samples,
        "import_s": imp.wall_s,
        "aggregate_s": wall,
        "summary": summary,
        "phases": phases,
    }


def _summary(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("aggregated ")]
    return lines[-1] if lines else stderr.strip()


def _phases(stderr: str) -> dict[str, float]:
    """The aggregator's phases from its `-v` log line ('aggregate: gpu hours from samples 0.12 s, ...')."""
    import re

    for ln in stderr.splitlines():
        if "aggregate: " in ln and " s, " in ln:
            part = ln.split("aggregate: ", 1)[1]
            return {m[1]: float(m[2]) for m in re.finditer(r"([a-z][a-z ]*?) ([0-9.]+) s", part)}
    return {}


def heavy_user(dbname: str) -> tuple[str, int]:
    since = datetime.now(UTC) - timedelta(days=30)
    with _pg(dbname) as conn:
        row = conn.execute(
            "SELECT user_name, count(*) FROM jobs WHERE start_time < now() "
            "AND (end_time >= %s OR end_time IS NULL) GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 1",
            (since,),
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--db", default="cocaq_bench_agg")
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/cocaq_bench_agg"))
    p.add_argument("--runs", type=int, default=5, help="incremental hours, and (x3) user runs")
    p.add_argument("--full-runs", type=int, default=2)
    p.add_argument("--skip-full", action="store_true")
    p.add_argument(
        "--rescan-runs", type=int, default=1, help="runs of (a') --full --rescan-samples (every sample read)"
    )
    p.add_argument("--seed", type=int, default=20261121)
    p.add_argument("--reuse", action="store_true", help="use the database if it is already loaded; keep it")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)

    m = c.machine()
    c.print_machine(m)
    res: dict[str, object] = {"machine": m}
    ok = (
        a.reuse
        and c.database_exists(a.db)
        and (a.cache_dir / "build.json").exists()
        and (a.cache_dir / "sacct.txt").exists()
        and job_count(a.db) >= a.jobs
    )
    if ok:
        print(f"reusing database {a.db} ({job_count(a.db):,} jobs, {sample_count(a.db):,} samples)")
        res["build"] = json.loads((a.cache_dir / "build.json").read_text())
    else:
        res["build"] = build(a.db, int(a.jobs / SURVIVAL) + 1, a.seed, a.cache_dir)
    env = c.cocaq_env(a.db)
    cfg = ["--config", str(c.CONFIG)]

    full: list[float] = []
    full_phases: list[dict[str, float]] = []
    if not a.skip_full:
        for _ in range(a.full_runs):
            r = c.run_process([c.COCAQ, "-v", *cfg, "aggregate", "--full"], env)
            full.append(r.wall_s)
            full_phases.append(_phases(r.stderr))
            print(f"(a) cocaq aggregate --full: {r.wall_s:.2f} s: {_summary(r.stderr)}", flush=True)
            print(f"    phases: {full_phases[-1]}", flush=True)
        res["full"] = full
        res["full_phases"] = full_phases
    rescan: list[float] = []
    for _ in range(0 if a.skip_full else a.rescan_runs):
        r = c.run_process([c.COCAQ, *cfg, "aggregate", "--full", "--rescan-samples"], env)
        rescan.append(r.wall_s)
        print(
            f"(a') cocaq aggregate --full --rescan-samples: {r.wall_s:.2f} s: {r.stderr.strip()}", flush=True
        )
    res["full_rescan"] = rescan

    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    inc = []
    for i in range(a.runs):
        hour = base - timedelta(days=2 + i, hours=7 * i)
        r_ = incremental(a.db, a.cache_dir, hour)
        inc.append(r_)
        print(
            f"(b) hour {hour:%Y-%m-%d %H:00}: {r_['jobs']} jobs ({r_['lines']} lines, "
            f"{r_['samples']:,} samples) "
            f"imported in {r_['import_s']:.2f} s; cocaq aggregate {r_['aggregate_s']:.2f} s: "
            f"{r_['summary']}; phases {r_['phases']}",
            flush=True,
        )
    res["incremental"] = inc
    # (b') the same, as the scheduler runs its hourly job: run_aggregate in a process that has run before
    from cocaq.config_load import load_config
    from cocaq.db.engine import make_engine

    warm = (make_engine(c.pg_url(a.db)), load_config(c.CONFIG, {"COCAQ_DATABASE_URL": c.pg_url(a.db)}))
    inc_warm = []
    for i in range(a.runs):
        hour = base - timedelta(days=2 + a.runs + i, hours=7 * i + 3)
        r_ = incremental(a.db, a.cache_dir, hour, warm)
        inc_warm.append(r_)
        print(
            f"(b') hour {hour:%Y-%m-%d %H:00}: {r_['jobs']} jobs, in the scheduler's process "
            f"{r_['aggregate_s']:.2f} s: {r_['summary']}; phases {r_['phases']}",
            flush=True,
        )
    res["incremental_warm"] = inc_warm

    heavy, n = heavy_user(a.db)
    commands = {
        FLOOR: [sys.executable, "-m", "cocaq", "--version"],
        f"cocaq user {heavy} --since 30d": [
            c.COCAQ, *cfg, "user", heavy, "--since", "30d", "--format", "json",
        ],
    }  # fmt: skip
    for argv_ in commands.values():
        c.run_process(argv_, env)
    times: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(3 * a.runs):
        for k, argv_ in commands.items():
            times[k].append(c.run_process(argv_, env).wall_s)
    res["user"] = {"user": heavy, "jobs_in_window": n, "times": times}

    print()
    print("| what | median s | runs |")
    print("|---|---:|---|")
    b = res["build"]
    assert isinstance(b, dict)
    if "first_full_s" in b:
        print(f"| first cocaq aggregate --full after the load (build) | {b['first_full_s']:.2f} | 1 |")
    if full:
        runs = ", ".join(f"{x:.2f}" for x in full)
        print(f"| (a) cocaq aggregate --full | {statistics.median(full):.2f} | {runs} |")
    if rescan:
        runs = ", ".join(f"{x:.2f}" for x in rescan)
        print(f"| (a') cocaq aggregate --full --rescan-samples | {statistics.median(rescan):.2f} | {runs} |")
    agg = [x["aggregate_s"] for x in inc]
    print(
        f"| (b) cocaq aggregate, one incremental hour "
        f"({statistics.median([x['jobs'] for x in inc]):.0f} jobs "
        f"median) | {statistics.median(agg):.2f} | {', '.join(f'{x:.2f}' for x in agg)} |"
    )
    if inc_warm:
        agg_w = [x["aggregate_s"] for x in inc_warm]
        print(
            f"| (b') the same hour in the scheduler's process "
            f"({statistics.median([x['jobs'] for x in inc_warm]):.0f} jobs "
            f"median) | {statistics.median(agg_w):.2f} | {', '.join(f'{x:.2f}' for x in agg_w)} |"
        )
    for k, ts in times.items():
        print(f"| (c) {k} | {statistics.median(ts):.3f} | p90 {c.p90(ts):.3f} |")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
