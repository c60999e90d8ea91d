#!/usr/bin/env python3
"""Where `run_aggregate` spends its time: cProfile in-process, plus the wall time of every SQL statement.

    .venv/bin/python bench/profile_aggregate.py --full              # on cocaq_bench_agg (bench_aggregate.py)
    .venv/bin/python bench/profile_aggregate.py                     # an incremental run
    .venv/bin/python bench/profile_aggregate.py --full --explain    # plus EXPLAIN ANALYZE of the big reads

SQL time is measured around cursor.execute/executemany and the COPY blocks the aggregator opens (the
server's time plus the round trips); grouped by the statement's first 90 characters.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="cocaq_bench_agg")
    p.add_argument("--full", action="store_true")
    p.add_argument("--rescan-samples", action="store_true")
    p.add_argument("--no-cprofile", action="store_true", help="phases and SQL only, at full speed")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, default=None, help="write the pstats file here")
    a = p.parse_args(argv)

    from sqlalchemy import event

    from cocaq.accounting.aggregate import run_aggregate
    from cocaq.config_load import load_config
    from cocaq.db.engine import make_engine

    cfg = load_config(c.CONFIG, {"COCAQ_DATABASE_URL": c.pg_url(a.db)})
    engine = make_engine(c.pg_url(a.db))
    sql: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    starts: dict[int, float] = {}

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        starts[id(cursor)] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        key = " ".join(statement.split())[:90]
        s = sql[key]
        s[0] += time.perf_counter() - starts.pop(id(cursor), time.perf_counter())
        s[1] += 1

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    if not a.no_cprofile:
        prof.enable()
    res = run_aggregate(engine, cfg, full=a.full, rescan_samples=a.rescan_samples)
    prof.disable()
    wall = time.perf_counter() - t0
    print(res.line())
    print(f"wall {wall:.2f} s" + ("" if a.no_cprofile else " (under cProfile)"))
    print("phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in res.phases.items()))
    total_sql = sum(v[0] for v in sql.values())
    print(f"\nSQL through execute(): {total_sql:.2f} s in {sum(int(v[1]) for v in sql.values())} statements")
    for k, (t, n) in sorted(sql.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"  {t:8.3f} s {int(n):6d}x  {k}")
    print()
    if a.no_cprofile:
        return 0
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(a.top)
    st.sort_stats("tottime").print_stats(a.top)
    if a.out:
        st.dump_stats(str(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
