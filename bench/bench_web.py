#!/usr/bin/env python3
"""Benchmark: the web app's pages (issue 38) for the heavy user of the 1,000,000-job database, server side.

    .venv/bin/python bench/bench_web.py --runs 5 --json /tmp/bench_web.json

Needs the database `cocaq_bench_agg` (1,000,491 jobs with daily rollups) that `bench/bench_aggregate.py
--reuse` builds and keeps; stops with exit 2 if it is not there. The heavy user is served as `cocaq web
--user NAME` serves one (the in-process API vouching by name: the bench's users are no Unix accounts).

Server side means what the WSGI application spends on a request, called in this process as a WSGI
server would call it (cocaq.web.wsgi.own_user_app: the read API's app in this process over the
database, as a site with direct reads and `cocaq web` run it): every API request the page makes, the
rendering, the headers.
Each page is asked --runs times after one first view, every time asking the API anew (the median is what
a page costs when shown for the first time; the very first view, with templates compiled, apart); then
as served, where a page seen again within the minute reuses the API's answers
(cocaq.web.reader.Remembered). Target: each page under 300 ms for the heavy user. The floor in
the same run: GET /v1/whoami through the same in-process API (a request that reads nothing); the peer,
interleaved with the runs of `/`: the answer `/` shows, as `cocaq user HEAVY --since 30d -o json` computes it
on the database (in this process, on one connection, no start-up), so that the page's cost reads as a ratio
on a machine whose speed varies. A whole month's page (last month) is served from its kept answer, as the
scheduler's hourly month-answers job leaves it (built first, its build and the next hour's check timed),
and measured once more with none kept (computed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import database_exists, machine, pg_url, print_machine, users_by_jobs


def call(app: Any, path: str, user: str) -> tuple[int, float]:
    q = path.split("?", 1)
    e: dict[str, Any] = {"PATH_INFO": q[0], "QUERY_STRING": q[1] if len(q) > 1 else "", "REMOTE_USER": user}
    setup_testing_defaults(e)
    got: dict[str, int] = {}
    t0 = time.perf_counter()
    b"".join(app(e, lambda s, h: got.update(status=int(s.split()[0]))))
    return got["status"], (time.perf_counter() - t0) * 1000


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--db", default="cocaq_bench_agg")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    if not database_exists(a.db):
        print(f"bench_web: no database {a.db}: run bench/bench_aggregate.py --reuse first", file=sys.stderr)
        return 2
    from cocaq.config_load import load_config
    from cocaq.web.app import WebApp
    from cocaq.web.reader import LocalReader, Remembered, local_app
    from cocaq.web.wsgi import own_user_app

    m = machine()
    print_machine(m)
    since = datetime.now(UTC) - timedelta(days=30)
    ranked, _ = users_by_jobs(a.db, since)
    heavy, n_jobs = ranked[0]
    cfg_path = Path("/tmp/bench_web.toml")
    cfg_path.write_text(f'database_url = "{pg_url(a.db)}"\n')
    cfg = load_config(cfg_path, {})
    api = local_app(cfg)
    reader = LocalReader(cfg, heavy, app=api)
    # every view asks the API again (nothing remembered): what a page costs the first time it is shown
    fresh = WebApp(cfg, lambda environ: Remembered(reader, ttl_s=0.0))
    app = own_user_app(cfg, heavy)  # as served: answers remembered for a minute
    top = reader.get(("users", heavy), {"since": "30d", "top": 1})["top_jobs"]
    labs = reader.get(("users", heavy, "jobs"), {"since": "30d", "limit": 1})["rows"]
    month = f"{datetime.now(UTC):%Y-%m}"
    last = f"{datetime.now(UTC).replace(day=1) - timedelta(days=1):%Y-%m}"  # a whole month: its e-mail
    job = f"/jobs/{top[0]['job_id']}" if top else "/jobs/1"
    paths = ["/", f"/month/{month}", f"/month/{last}", "/jobs", "/jobs?sort=kwh&order=desc",
             "/when?hours=6&within=24", job, "/help"]  # fmt: skip
    if labs:
        paths.append(f"/labs/{labs[0]['account']}")
    print(f"heavy user {heavy}: {n_jobs:,} jobs in the last 30 days")
    out: dict[str, Any] = {"machine": m, "user": heavy, "jobs_in_window": n_jobs, "pages": {}}
    out["kept"] = keep_last_month(cfg, last)
    floor = [reader_time(reader) for _ in range(a.runs)]
    from cocaq.db import dbapi

    direct = dbapi.connect(cfg.database_url)
    peer: list[float] = []
    for path in paths:
        status, first = call(fresh, path, heavy)
        times = []
        for _ in range(a.runs):
            times.append(call(fresh, path, heavy)[1])
            if path == "/":  # the peer, interleaved with the page that shows its answer
                peer.append(cli_answer_time(direct, cfg, heavy))
        call(app, path, heavy)
        again = [call(app, path, heavy)[1] for _ in range(a.runs)]
        out["pages"][path] = {"status": status, "first_ms": first, "median_ms": statistics.median(times),
                              "max_ms": max(times), "runs_ms": times,
                              "remembered_median_ms": statistics.median(again)}  # fmt: skip
        print(f"  {path:<34} {status}  first {first:7.1f} ms  median {statistics.median(times):7.1f} ms"
              f"  max {max(times):7.1f} ms  seen again {statistics.median(again):6.1f} ms")  # fmt: skip
    # the whole month's page where no answer is kept (the month changed since the hourly job): computed
    path = f"/month/{last}"
    out["month_not_kept"] = not_kept_times(cfg, fresh, path, heavy, last, a.runs)
    print(f"  {path} not kept (computed)     median {statistics.median(out['month_not_kept']):7.1f} ms")
    out["floor_whoami_ms"] = statistics.median(floor)
    print(f"  floor: GET /v1/whoami in-process {statistics.median(floor):.1f} ms")
    out["peer_cli_answer_ms"] = statistics.median(peer)
    out["page_over_peer"] = out["pages"]["/"]["median_ms"] / out["peer_cli_answer_ms"]
    print(f"  peer: `cocaq user {heavy} --since 30d -o json`'s answer in-process, one connection (the CLI on "
          f"the database, no start-up) {out['peer_cli_answer_ms']:.1f} ms; / against it "
          f"{out['page_over_peer']:.2f}x")  # fmt: skip
    direct.close()
    worst = max(v["median_ms"] for v in out["pages"].values())
    out["worst_median_ms"] = worst
    print(f"worst page median {worst:.0f} ms against the 300 ms target: {'met' if worst < 300 else 'missed'}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


def keep_last_month(cfg: Any, last: str) -> dict[str, Any]:
    """What the scheduler's hourly month-answers job does for last month: build every user's answer (as
    after a change), then find them current (every later hour while nothing changes)."""
    from cocaq.db.engine import make_engine
    from cocaq.reports.month_answer import keep
    from cocaq.reports.month_store import forget_before

    engine = make_engine(cfg.database_url)
    start = datetime.strptime(last, "%Y-%m").replace(tzinfo=UTC)
    forget_before(engine, start.replace(year=start.year + 1))  # none kept: the build from scratch
    t0 = time.perf_counter()
    built = keep(engine, cfg, start)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = keep(engine, cfg, start)
    check_ms = (time.perf_counter() - t0) * 1000
    engine.dispose()
    print(f"  kept {last}: {built.line()} in {build_s:.1f} s; the next hour's run: {again.line()} "
          f"in {check_ms:.0f} ms")  # fmt: skip
    return {"line": built.line(), "build_s": build_s, "users": built.users, "check_ms": check_ms}


def not_kept_times(cfg: Any, app: Any, path: str, user: str, last: str, runs: int) -> list[float]:
    """The page's times with no kept answer, then the answers kept again."""
    from cocaq.db.engine import make_engine
    from cocaq.reports.month_answer import keep
    from cocaq.reports.month_store import forget_before

    engine = make_engine(cfg.database_url)
    start = datetime.strptime(last, "%Y-%m").replace(tzinfo=UTC)
    forget_before(engine, start.replace(year=start.year + 1))
    call(app, path, user)
    times = [call(app, path, user)[1] for _ in range(runs)]
    keep(engine, cfg, start)
    engine.dispose()
    return times


def cli_answer_time(db: Any, cfg: Any, user: str) -> float:
    """What `cocaq user USER --since 30d -o json` computes on the database, on its one connection."""
    from cocaq.footprint.lookup import parse_window, user_answer

    db.renew()
    t0 = time.perf_counter()
    user_answer(db, cfg, user, parse_window("30d", None))
    return (time.perf_counter() - t0) * 1000


def reader_time(reader: Any) -> float:
    t0 = time.perf_counter()
    reader.get(("whoami",))
    return (time.perf_counter() - t0) * 1000


if __name__ == "__main__":
    sys.exit(main())
