#!/usr/bin/env python3
"""Benchmark: how fresh `cocaq watch` is, and what one refresh costs the database.

    .venv/bin/python bench/bench_live.py                 # ~3 minutes: I = 2 s, S = 10 s, then 10 s / 60 s
    .venv/bin/python bench/bench_live.py --quick         # ~1.5 minutes: the first setting only

The issue's target: what the collector sampled reaches `cocaq watch` within one sampling interval (I)
plus one shipping interval (S). The node, in a temporary directory: 8 fake A100s (`nvml = "fake:8"`), a
RAPL and cgroup tree, 4 running jobs started by the real prolog (two GPUs each), the real collector as a
subprocess (`cocaq collector`, I and S from its config) shipping to a scratch PostgreSQL database. In this
process a poller does what `cocaq watch 4000` does at each refresh (cocaq.footprint.live.live on a new
snapshot: one statement) every 0.25 s, and for every sample timestamp of the job it sees for the first
time, records `latency = time seen - time sampled`. Reported: the largest and median latency over the run
against I + S (the target), and the refresh statement's time (median, p90) with 8 GPUs on the node.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c

from tests.sysfs_tree import make_cgroup_v2, make_rapl

DB = "cocaq_bench_live"
JOBS = 4


def setup(d: Path, interval: float, ship: float) -> tuple[Path, dict[str, str]]:
    sysfs = d / "sys"
    rapl = make_rapl(sysfs, packages=2)
    cg = make_cgroup_v2(sysfs / "fs" / "cgroup", node_cpus="0-63")
    cfg = d / "cocaq.toml"
    cfg.write_text(
        f'database_url = "{c.pg_url(DB)}"\nspool_dir = "{d / "spool"}"\n[cluster]\nname = "bench"\n'
        f'[collector]\nsources = ["nvml", "rapl", "cgroup"]\nnvml = "fake:8"\nsysfs_root = "{sysfs}"\n'
        f'hook_log = "{d / "hook.log"}"\nannotate_dir = "{d / "annotations"}"\n'
        f"interval_s = {interval}\nship_interval_s = {ship}\n"
    )
    env = c.cocaq_env(DB)
    env.pop("COCAQ_DATABASE_URL", None)
    prolog = c.write_shims(d, cfg, env)["cocaq-prolog"]
    for i in range(JOBS):
        subprocess.run(["/bin/sh", prolog], env=c.prolog_env(i, "gpu", f"{2 * i},{2 * i + 1}"), check=True)
        cg.add_job(str(4000 + i), cpus=f"{16 * i}-{16 * i + 15}")
    del rapl
    return cfg, env


def run(interval: float, ship: float, seconds: float) -> dict[str, float]:
    from cocaq.config_load import load_config
    from cocaq.db.dbapi import connect
    from cocaq.footprint.live import Ask, fetch

    c.recreate_database(DB)
    with tempfile.TemporaryDirectory(prefix="cocaq-bench-live-") as tmp:
        d = Path(tmp)
        cfg_path, env = setup(d, interval, ship)
        subprocess.run([c.COCAQ, "--config", str(cfg_path), "db", "upgrade"], env=env, check=True)
        cfg = load_config(cfg_path, {})
        log = open(d / "collector.log", "w")  # noqa: SIM115 - closed below
        argv = [c.COCAQ, "--config", str(cfg_path), "collector"]
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
        seen: set[float] = set()
        latencies: list[float] = []
        query_ms: list[float] = []
        try:
            db = connect(cfg.database_url)
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                db.raw.rollback()  # a new snapshot, as each refresh of `cocaq watch`
                t0 = time.perf_counter()
                rows = fetch(db, Ask(("4000",)), time.time())
                query_ms.append((time.perf_counter() - t0) * 1000)
                now = time.time()
                for r in rows:
                    if r[0] == "s" and r[19] not in seen:
                        seen.add(r[19])
                        latencies.append(now - float(r[19]))
                time.sleep(0.25)
            db.close()
        finally:
            p.terminate()
            p.wait(timeout=30)
            log.close()
        c.drop_database(DB)
    warm = latencies  # (the collector and the poller start together: every sample counts)
    return {
        "interval_s": interval,
        "ship_interval_s": ship,
        "target_s": interval + ship,
        "samples_seen": len(warm),
        "latency_max_s": max(warm),
        "latency_median_s": statistics.median(warm),
        "max_over_target": max(warm) / (interval + ship),
        "refresh_query_ms_median": statistics.median(query_ms),
        "refresh_query_ms_p90": c.p90(query_ms),
        "refreshes": len(query_ms),
    }


def at_scale(jobs: int, refreshes: int = 50) -> dict[str, float]:
    """One refresh's statement on a database as a busy site's: `jobs` jobs over 30 days, two GPUs each
    (a tenth of the running ones not imported yet: their prolog records unlinked), 10 s samples of the
    last hour of each running one (at most 1,000), 30 days of node events. Timed: one job by id, one not
    imported yet, and one user's running jobs."""
    import psycopg

    from cocaq.config_load import load_config
    from cocaq.db.dbapi import connect
    from cocaq.footprint.live import Ask, fetch

    c.recreate_database(DB)
    with tempfile.TemporaryDirectory(prefix="cocaq-bench-live-") as tmp:
        cfg_path = Path(tmp) / "cocaq.toml"
        cfg_path.write_text(f'database_url = "{c.pg_url(DB)}"\n[cluster]\nname = "bench"\n')
        env = c.cocaq_env(DB)
        env.pop("COCAQ_DATABASE_URL", None)
        subprocess.run([c.COCAQ, "--config", str(cfg_path), "db", "upgrade"], env=env, check=True)
        cfg = load_config(cfg_path, {})
    running = min(max(jobs // 50, 1), 1000)
    sql = f"""
INSERT INTO clusters (name) VALUES ('bench') ON CONFLICT DO NOTHING;
INSERT INTO jobs (cluster_id, job_id, job_id_raw, user_name, account, partition, n_nodes, alloc_cpus,
  alloc_gpus, submit_time, start_time, end_time, elapsed_s, time_limit_s, state, is_open, energy_j,
  energy_measured_j, pue, co2_g, updated_at)
SELECT 1, g::text, g, 'user' || (g % 500), 'lab' || (g % 40), 'gpu', 1, 8, 2,
  now() - (g * interval '1 second' * {30 * 86400 // jobs}) - interval '1 minute',
  now() - (g * interval '1 second' * {30 * 86400 // jobs}),
  CASE WHEN g <= {running} THEN NULL ELSE now() - (g * interval '1 second' * {30 * 86400 // jobs})
    + interval '1 hour' END,
  3600, 86400, CASE WHEN g <= {running} THEN 'RUNNING' ELSE 'COMPLETED' END, g <= {running}, 1e6, 1e6,
  1.2, 100, now()
FROM generate_series(1, {jobs}) g WHERE g % 10 <> 0 OR g > {running};
INSERT INTO node_events (uid, cluster_id, node, job_id, event, ts, payload, job_pk)
SELECT 'b/' || g || '/' || e, 1, 'n' || (g % 200), g::text, e,
  now() - (g * interval '1 second' * {30 * 86400 // jobs}) + CASE e WHEN 'end' THEN interval '1 hour'
    ELSE interval '0' END,
  json_build_object('ts', 0, 'job', json_build_object('user', 'user' || (g % 500), 'account',
    'lab' || (g % 40), 'partition', 'gpu'), 'gpus', json_build_array(json_build_object('uuid',
    'GPU-' || g || '-0', 'slurm_index', 0), json_build_object('uuid', 'GPU-' || g || '-1', 'slurm_index',
    1))),
  (SELECT id FROM jobs j WHERE j.cluster_id = 1 AND j.job_id_raw = g)
FROM generate_series(1, {jobs}) g, (VALUES ('start'), ('end')) v(e)
WHERE e = 'start' OR g > {running};
INSERT INTO node_energy (cluster_id, node, job_id, job_start, component, device, source, method, energy_j,
  t0, t1, final)
SELECT 1, 'n' || (g % 200), g::text, now() - (g * interval '1 second' * {30 * 86400 // jobs}), 'gpu',
  'GPU-' || g || '-' || d, 'nvml', 'measured', 5e5, now() - (g * interval '1 second' * {30 * 86400 // jobs}),
  now(), g > {running}
FROM generate_series(1, {jobs}) g, generate_series(0, 1) d;
"""
    samples = f"""
INSERT INTO samples (ts, cluster_id, node, source, device, metric, job_id, value)
SELECT now() - k * interval '10 seconds', 1, 'n' || (g % 200), 'nvml', 'GPU-' || g || '-' || d, m,
  g::text, 250
FROM generate_series(1, {running}) g, generate_series(0, 1) d, generate_series(0, 359) k,
  (VALUES ('power_w'), ('util_pct'), ('mem_used_mb'), ('energy_j')) v(m);
"""
    from datetime import UTC, datetime

    from cocaq.db.engine import make_engine
    from cocaq.db.migrate import ensure_sample_partitions

    engine = make_engine(c.pg_url(DB))
    ensure_sample_partitions(engine, datetime.now(UTC))
    engine.dispose()
    with psycopg.connect(c.pg_url(DB, sqlalchemy=False), autocommit=True) as conn:
        conn.execute(sql)
        conn.execute(samples)
        conn.execute("ANALYZE")
        n_samples = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
        n_events = conn.execute("SELECT count(*) FROM node_events").fetchone()[0]
    out: dict[str, float] = {"jobs": jobs, "running": running, "samples": n_samples, "node_events": n_events}
    db = connect(cfg.database_url)
    for name, ask in (("by_id", Ask(("7",))), ("by_user", Ask(user="user7")), ("not_imported", Ask(("10",)))):
        ms = []
        for _ in range(refreshes):
            db.raw.rollback()
            t0 = time.perf_counter()
            rows = fetch(db, ask, time.time())
            ms.append((time.perf_counter() - t0) * 1000)
        out[f"{name}_rows"] = len(rows)
        out[f"{name}_ms_median"] = statistics.median(ms)
        out[f"{name}_ms_p90"] = c.p90(ms)
    # the read API's GET /metrics on the same database (a scrape of the site's figures)
    from datetime import UTC, datetime

    from cocaq.api.site_metrics import read_site
    from cocaq.db.engine import make_engine

    engine = make_engine(cfg.database_url)
    ms = []
    with engine.connect() as conn:
        for _ in range(10):
            db.raw.rollback()
            t0 = time.perf_counter()
            site = read_site(db, conn, cfg, datetime.now(UTC))
            ms.append((time.perf_counter() - t0) * 1000)
    engine.dispose()
    out["site_metrics_labs"] = len(site.labs)
    out["site_metrics_ms_median"] = statistics.median(ms)
    out["site_metrics_ms_p90"] = c.p90(ms)
    db.close()
    c.drop_database(DB)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only I = 2 s, S = 10 s")
    ap.add_argument("--scale-only", action="store_true", help="only the refresh on a big database")
    ap.add_argument("--jobs", type=int, default=200_000, help="jobs in the big database (default 200,000)")
    args = ap.parse_args()
    c.print_machine(c.machine())
    big = at_scale(args.jobs)
    print(json.dumps(big))
    print(
        f"A refresh on a database of {big['jobs']:,} jobs, {big['node_events']:,} node events and "
        f"{big['samples']:,} samples: one job by id {big['by_id_ms_median']:.1f} ms median "
        f"({big['by_id_ms_p90']:.1f} p90), a user's running jobs {big['by_user_ms_median']:.1f} ms "
        f"({big['by_user_ms_p90']:.1f}), a job not imported yet {big['not_imported_ms_median']:.1f} ms "
        f"({big['not_imported_ms_p90']:.1f}); the API's GET /metrics ({big['site_metrics_labs']:.0f} labs) "
        f"{big['site_metrics_ms_median']:.0f} ms ({big['site_metrics_ms_p90']:.0f})"
    )
    if args.scale_only:
        return
    settings = [(2.0, 10.0, 75.0)] if args.quick else [(2.0, 10.0, 75.0), (10.0, 60.0, 150.0)]
    results = []
    for interval, ship, seconds in settings:
        r = run(interval, ship, seconds)
        results.append(r)
        print(json.dumps(r))
        verdict = "within" if r["latency_max_s"] <= r["target_s"] else "OVER"
        print(
            f"I = {interval:g} s, S = {ship:g} s: each sample reached the watcher at most "
            f"{r['latency_max_s']:.2f} s after it was taken (median {r['latency_median_s']:.2f} s), "
            f"{verdict} the target "
            f"I + S = {r['target_s']:g} s ({r['max_over_target']:.2f} of it); one refresh = one statement, "
            f"{r['refresh_query_ms_median']:.1f} ms median, {r['refresh_query_ms_p90']:.1f} ms p90"
        )


if __name__ == "__main__":
    main()
