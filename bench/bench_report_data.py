#!/usr/bin/env python3
"""Benchmark: the monthly reports' data layer (reports/data.py) on a month of 100,000 jobs, 1,000 users.

    .venv/bin/python bench/bench_report_data.py            # builds cocaq_bench_reports (~2 minutes), times it
    .venv/bin/python bench/bench_report_data.py --reuse    # reuse the loaded database

The database (`cocaq_bench_reports`, PostgreSQL from $COCAQ_BENCH_PG_URL, bench/bench.toml's cluster):
  * --jobs jobs (100,000) in the month (--month, default 2026-10) and a third as many in the month before
    (for the trend), generated here as JobRecords and written with cocaq.accounting.importer.import_records
    (COPY on
    PostgreSQL), as `cocaq import sacct` writes them: 1,000 users in 50 labs with a Zipf-like skew (user
    rank r gets weight 1/r), partitions gpu_a100 / gpu_h100 / gpu_v100 / cpu, 1-8 GPUs, log-normal run
    times (median 1 h, up to 3 days, so some cross days and the month's edges), states COMPLETED / FAILED /
    "CANCELLED by UID" / TIMEOUT / OUT_OF_MEMORY / NODE_FAIL, time limits, TotalCPU.
  * GPU use by hour: for every GPU job, `job_gpu_hours` rows written directly in SQL (energy, a per-job
    utilisation, idle time), as the aggregator keeps them once it has read a job's samples; real nvml
    samples (every 30 s, per GPU) for --sampled multi-GPU jobs, half of them with every GPU but the first
    idle, shipped (node_shipments) so that `run_aggregate` derives their GPU hours from the samples.
  * model_metadata for 5% of the GPU jobs (one merged row each, most with a precision); `run_aggregate`
    (timed), VACUUM ANALYZE.

Then, in this process on a warm connection, --runs times each (median and max):
  admin_month(month) (with a first_report mapping of 200 users), users_month(month) (all users: the
  sender's batch), user_month for the heaviest and the median user, lab_month for the biggest lab, and
  suggest_for_user over every user's month.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

PARTITIONS = (("gpu_a100", 0.30), ("gpu_h100", 0.08), ("gpu_v100", 0.12), ("cpu", 0.50))
GPUS = ((1, 0.55), (2, 0.2), (4, 0.17), (8, 0.08))
STATES = (
    ("COMPLETED", 0.85), ("FAILED", 0.06), ("CANCELLED by 1000", 0.04), ("TIMEOUT", 0.03),
    ("OUT_OF_MEMORY", 0.01), ("NODE_FAIL", 0.01),
)  # fmt: skip
MODELS = ("llama-7b", "resnet50", "bert-base", "vit-b16", "whisper-small", "unet")


def _pick(rng: random.Random, table: tuple[tuple[Any, float], ...]) -> Any:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def month_bounds(label: str) -> tuple[datetime, datetime, datetime]:
    y, m = (int(x) for x in label.split("-"))
    start = datetime(y, m, 1, tzinfo=UTC)
    end = datetime(y + (m == 12), m % 12 + 1, 1, tzinfo=UTC)
    prev = datetime(y - (m == 1), (m - 2) % 12 + 1, 1, tzinfo=UTC)
    return prev, start, end


def records(n: int, lo: datetime, hi: datetime, seed: int, first_raw: int) -> Iterator[Any]:
    """n jobs starting in [lo, hi), deterministic for a seed."""
    from cocaq.slurm.record import JobRecord

    rng = random.Random(seed)
    users = [f"u{i:04d}" for i in range(1000)]
    weights = [1 / (r + 1) for r in range(len(users))]
    span = (hi - lo).total_seconds()
    for k in range(n):
        ui = rng.choices(range(len(users)), weights=weights)[0]
        part = _pick(rng, PARTITIONS)
        gpus = 0 if part == "cpu" else _pick(rng, GPUS)
        cpus = max(1, gpus * 8) if gpus else rng.choice((1, 2, 4, 8, 16, 32, 64))
        el = min(3 * 86400.0, max(30.0, rng.lognormvariate(math.log(3600), 1.2)))
        state = _pick(rng, STATES)
        limit = el if state == "TIMEOUT" else el * rng.uniform(1.2, 12.0)
        start = lo + timedelta(seconds=rng.uniform(0, span))
        raw = first_raw + k
        yield JobRecord(
            job_id=str(raw), job_id_raw=raw, user_name=users[ui], account=f"lab{ui % 50:02d}",
            partition=part, submit_time=start - timedelta(seconds=rng.uniform(0, 7200)), start_time=start,
            end_time=start + timedelta(seconds=el), elapsed_s=el, state=state, node_list=f"n{raw % 400:03d}",
            n_nodes=1, alloc_cpus=cpus, alloc_gpus=gpus, total_cpu_s=cpus * el * rng.uniform(0.05, 1.0),
            req_mem_mb=4096.0 * cpus, cluster="bench", time_limit_s=math.ceil(limit / 60) * 60.0,
            name=f"job-{raw % 97}",
        )  # fmt: skip


# job_gpu_hours for every GPU job that has none (the sampled ones get theirs from the samples): per hour
# the job touched, its GPUs' seconds in it, a per-job utilisation (jobs with id % 9 = 0 idle notebooks),
# power from the utilisation, idle seconds and energy.
GPU_HOURS_SQL = """
INSERT INTO job_gpu_hours (cluster_id, job_id, hour, energy_j, util_energy, seconds, idle_s, idle_j)
SELECT cluster_id, job_id_raw::text, h,
       s * p, s * p * u, s, s * idle, s * idle * 60.0
FROM (
    SELECT j.cluster_id, j.job_id_raw, h.h,
           j.alloc_gpus * greatest(0.0, least(t1, (h.h + 1) * 3600.0) - greatest(t0, h.h * 3600.0)) AS s,
           CASE WHEN mod(j.id, 9) = 0 THEN 1.0 ELSE 20.0 + mod(j.id * 37, 80) END AS u,
           CASE WHEN mod(j.id, 9) = 0 THEN 0.95 ELSE mod(j.id * 13, 20) / 100.0 END AS idle,
           CASE WHEN mod(j.id, 9) = 0 THEN 60.0 ELSE 80.0 + 3.0 * mod(j.id * 37, 80) END AS p
    FROM (SELECT id, cluster_id, job_id_raw, alloc_gpus, extract(epoch FROM start_time)::float8 AS t0,
                 extract(epoch FROM start_time)::float8 + elapsed_s AS t1
          FROM jobs WHERE alloc_gpus > 0 AND NOT (id = ANY(%(sampled)s))) j
    CROSS JOIN LATERAL generate_series(floor(j.t0 / 3600)::bigint, floor(j.t1 / 3600)::bigint) AS h(h)
) x WHERE s > 0
"""

# nvml samples every 30 s per GPU over each sampled job's run: GPU 0 busy; the others idle when the job id
# is even (a job holding GPUs it does not use), busy otherwise.
SAMPLES_SQL = """
INSERT INTO samples (ts, cluster_id, node, source, device, metric, job_id, value)
SELECT t, j.cluster_id, 'bench-' || j.job_id_raw, 'nvml', 'gpu' || g, m.metric, j.job_id_raw::text,
       CASE WHEN g > 0 AND mod(j.job_id_raw, 2) = 0
            THEN (CASE m.metric WHEN 'util_pct' THEN 0.0 ELSE 55.0 END)
            ELSE (CASE m.metric WHEN 'util_pct' THEN 85.0 ELSE 320.0 END) END
FROM jobs j
CROSS JOIN LATERAL generate_series(j.start_time, j.end_time - interval '1 second', interval '30 seconds') AS t
CROSS JOIN LATERAL generate_series(0, j.alloc_gpus - 1) AS g
CROSS JOIN (VALUES ('util_pct'), ('power_w')) AS m(metric)
WHERE j.id = ANY(%(sampled)s)
"""


def build(dbname: str, jobs: int, month: str, sampled: int, seed: int) -> dict[str, float]:
    import psycopg
    from sqlalchemy import insert, text

    from cocaq.accounting.aggregate import _set_state, run_aggregate
    from cocaq.accounting.gpu_hours import gpu_params_key
    from cocaq.accounting.importer import import_records
    from cocaq.config_load import load_config
    from cocaq.db import migrate
    from cocaq.db.engine import make_engine
    from cocaq.db.schema import ModelMetadata

    prev, lo, hi = month_bounds(month)
    out: dict[str, float] = {}
    c.recreate_database(dbname)
    engine = make_engine(c.pg_url(dbname))
    migrate.upgrade(engine)
    cfg = load_config(c.CONFIG, {"COCAQ_DATABASE_URL": c.pg_url(dbname)})
    t0 = time.perf_counter()
    both = [*records(jobs, lo, hi, seed, 1_000_000), *records(jobs // 3, prev, lo, seed + 1, 5_000_000)]
    s = import_records(engine, both, cfg, source="sacct-json")
    out["import_s"] = time.perf_counter() - t0
    print(f"import_records: {s.inserted:,} jobs in {out['import_s']:.1f} s")

    t0 = time.perf_counter()
    rng = random.Random(seed + 2)
    with engine.begin() as conn:
        multi = [
            r[0]
            for r in conn.execute(
                text(
                    "SELECT id FROM jobs WHERE alloc_gpus >= 2 AND start_time >= :lo AND elapsed_s < 6 * 3600"
                ),
                {"lo": lo},
            )
        ]
        pick = sorted(rng.sample(multi, min(sampled, len(multi))))
        gh = conn.exec_driver_sql(GPU_HOURS_SQL, {"sampled": pick}).rowcount
        n_samples = conn.exec_driver_sql(SAMPLES_SQL, {"sampled": pick}).rowcount
        raws = [
            str(r[0])
            for r in conn.execute(text("SELECT job_id_raw FROM jobs WHERE id = ANY(:p)"), {"p": pick})
        ]
        cid = conn.execute(text("SELECT id FROM clusters WHERE name = 'bench'")).scalar_one()
        conn.execute(
            text(
                "INSERT INTO node_shipments (cluster_id, node, batch, rows, job_ids)"
                " VALUES (:c, 'bench', 'b1', :n, :j)"
            ),
            {"c": cid, "n": n_samples, "j": " ".join(raws)},
        )
        # job_gpu_hours are up to date for these parameters: the first run need not rebuild them all
        _set_state(conn, "gpu_hours", datetime.now(UTC) - timedelta(minutes=1), gpu_params_key(cfg))
        gpu_jobs = [r[0] for r in conn.execute(text("SELECT id FROM jobs WHERE alloc_gpus > 0 ORDER BY id"))]
        meta = []
        for pk in rng.sample(gpu_jobs, len(gpu_jobs) // 20):
            # one merged row per job: mostly the precision column, a few rows of the first shape (extra)
            kinds = (("bf16", None), ("fp32", None), (None, {"dtype": "float32"}), (None, None))
            precision, extra = rng.choice(kinds)
            model = rng.choice(MODELS)
            meta.append(
                {"job_pk": pk, "model_name": model, "framework": "pytorch", "precision": precision,
                 "batch_size": rng.choice((16, 32, 64)), "epochs": float(rng.randint(1, 10)), "extra": extra,
                 "sources": {"model": "api", "precision": "api"} if precision else {"model": "comment"}}
            )  # fmt: skip
        conn.execute(insert(ModelMetadata), meta)
    out["gpu_hours_rows"] = gh
    out["samples"] = n_samples
    out["setup_s"] = time.perf_counter() - t0
    print(
        f"job_gpu_hours {gh:,} rows, {n_samples:,} samples of {len(pick)} multi-GPU jobs, "
        f"{len(meta):,} model_metadata rows in {out['setup_s']:.1f} s"
    )
    t0 = time.perf_counter()
    res = run_aggregate(engine, cfg)
    out["aggregate_s"] = time.perf_counter() - t0
    print(f"run_aggregate: {res.line()}")
    engine.dispose()
    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False), autocommit=True) as pc:
        pc.execute("VACUUM ANALYZE")
    return out


def timed(fn: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--sampled", type=int, default=300, help="multi-GPU jobs with real per-GPU samples")
    p.add_argument("--db", default="cocaq_bench_reports")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seed", type=int, default=20261121)
    p.add_argument("--reuse", action="store_true", help="use the database if it is already loaded")
    a = p.parse_args(argv)

    from sqlalchemy import text

    from cocaq.config_load import load_config
    from cocaq.db.engine import make_engine
    from cocaq.reports import admin_report, lab_report, user_report
    from cocaq.reports.suggest import suggest_for_user

    m = c.machine()
    c.print_machine(m)
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]))
    exists = c.database_exists(a.db)
    if not (a.reuse and exists):
        build(a.db, a.jobs, a.month, a.sampled, a.seed)
    cfg = load_config(c.CONFIG, {"COCAQ_DATABASE_URL": c.pg_url(a.db)})
    engine = make_engine(c.pg_url(a.db))
    _prev, lo, hi = month_bounds(a.month)
    with engine.connect() as conn:
        n = conn.execute(
            text(
                "SELECT count(*) FROM jobs WHERE start_time < :hi AND (end_time >= :lo OR end_time IS NULL)"
            ),
            {"lo": lo, "hi": hi},
        ).scalar_one()
        by_user = conn.execute(
            text(
                "SELECT user_name, count(*) FROM jobs WHERE start_time < :hi AND end_time >= :lo "
                "GROUP BY 1 ORDER BY 2 DESC, 1"
            ),
            {"lo": lo, "hi": hi},
        ).all()
        lab = conn.execute(
            text(
                "SELECT account FROM jobs WHERE start_time >= :lo GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
            ),
            {"lo": lo},
        ).scalar_one()
    heavy, med = by_user[0], by_user[len(by_user) // 2]
    first = {u: lo + timedelta(days=10, hours=i % 24) for i, (u, _n) in enumerate(by_user[:200])}
    print(f"{n:,} jobs ran in {a.month}; {len(by_user):,} users; heavy {heavy[0]} ({heavy[1]:,} jobs), "
          f"median {med[0]} ({med[1]:,} jobs); biggest lab {lab}")  # fmt: skip

    results: dict[str, list[float]] = {}
    with engine.connect() as conn:
        cases: dict[str, Callable[[], Any]] = {
            f"admin_month(conn, cfg, {a.month!r}, first_report=<200 users>, window_days=10)": lambda: (
                admin_report.admin_month(conn, cfg, lo, first_report=first, window_days=10)
            ),
            f"users_month(conn, cfg, {a.month!r})  # all users": lambda: user_report.users_month(
                conn, cfg, lo
            ),
            f"user_month(conn, cfg, {heavy[0]!r}, {a.month!r})  # heaviest": lambda: user_report.user_month(
                conn, cfg, heavy[0], lo
            ),
            f"user_month(conn, cfg, {med[0]!r}, {a.month!r})  # median": lambda: user_report.user_month(
                conn, cfg, med[0], lo
            ),
            f"lab_month(conn, cfg, {lab!r}, {a.month!r})  # biggest lab": lambda: lab_report.lab_month(
                conn, cfg, lab, lo
            ),
        }
        outputs: dict[str, Any] = {}
        for name, fn in cases.items():
            fn()  # warm: the plan cache and the buffers
            results[name], outputs[name] = timed(fn, a.runs)
        months = next(v for k, v in outputs.items() if k.startswith("users_month"))
        t, sugg = timed(lambda: {u: suggest_for_user(mo, cfg) for u, mo in months.items()}, a.runs)
        results[f"suggest_for_user over {len(months):,} users"] = t
    print(f"\nin this process, warm connection, {a.runs} runs each (median / max):")
    for name, ts in results.items():
        print(f"  {statistics.median(ts) * 1000:9.1f} ms / {max(ts) * 1000:9.1f} ms  {name}")
    adm = next(v for k, v in outputs.items() if k.startswith("admin_month"))
    counts: dict[str, int] = {}
    for ss in sugg.values():
        for s in ss:
            counts[s.id] = counts.get(s.id, 0) + 1
    print(
        f"\nadmin: {adm.totals.jobs:,} jobs, {adm.totals.energy_kwh:,.0f} kWh, "
        f"{adm.totals.co2_kg:,.0f} kg CO2, "
        f"{len(adm.by_lab)} labs; before/after: {len(adm.before_after.users)} users compared, "
        f"{len(adm.before_after.excluded)} excluded, {len(adm.before_after.pending)} pending"
    )
    examined = sum(1 for mo in months.values() for j in mo.gpu_jobs if j.devices)
    n_gpu = sum(len(mo.gpu_jobs) for mo in months.values())
    print(
        f"users_month: {len(months):,} users, {n_gpu:,} GPU jobs, {examined} multi-GPU jobs examined per GPU;"
        f" suggestions: {counts}"
    )
    engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
