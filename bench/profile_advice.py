#!/usr/bin/env python3
"""Where the advice's time goes for one user: the jobs' query, the rows as JobFacts, the rules.

    .venv/bin/python bench/profile_advice.py                    # u000 on cocaq_bench_agg, the last 30 days
    .venv/bin/python bench/profile_advice.py --user u395 --runs 5

In-process and warm (the first run is shown too): the parts of `cocaq user U --since 30d` that
cocaq.footprint.lookup.add_advice adds, timed one by one.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="cocaq_bench_agg")
    p.add_argument("--user", default="u000")
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)

    from cocaq.config_load import load_config
    from cocaq.db import dbapi
    from cocaq.footprint import advice, jobfacts

    cfg = load_config(c.CONFIG)
    db = dbapi.connect(c.pg_url(a.db, sqlalchemy=False))
    until = datetime.now(UTC)
    since = until - timedelta(days=a.days)
    params = {
        "since": since.timestamp(),
        "until": until.timestamp(),
        "since_ts": since,
        "until_ts": until,
        "key": a.user,
    }
    ctx = advice.Context(
        since=since,
        until=until,
        idle_threshold_pct=cfg.aggregate.idle_gpu_util_pct,
        interactive_names=cfg.advice.interactive_names,
    )
    print("run | jobs | query s | JobFacts s | rules s | suggestions")
    for i in range(a.runs):
        t0 = time.perf_counter()
        rows = db.rows(jobfacts._sql(db, "user", False), params)
        t1 = time.perf_counter()
        rows.sort(key=lambda r: (r[6], -r[-1], r[0]))
        hw: dict[object, object] = {}
        facts = [jobfacts._facts(db, cfg, r, hw) for r in rows]  # type: ignore[arg-type]
        t2 = time.perf_counter()
        found = advice.candidates(facts, ctx)
        t3 = time.perf_counter()
        ids = [x.id for x in found]
        print(f"{i + 1} | {len(rows):,} | {t1 - t0:.3f} | {t2 - t1:.3f} | {t3 - t2:.3f} | {ids}")
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
