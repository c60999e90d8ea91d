#!/usr/bin/env python3
"""Benchmark: the read API (`cocaq serve`, issue 7) on the 1,000,000-job database of bench_aggregate.py.

    .venv/bin/python bench/bench_api.py --json /tmp/bench_api.json   # ~1 minute on 2 cores

Needs the database `cocaq_bench_agg` (1,000,491 jobs with daily rollups) that
`bench/bench_aggregate.py --reuse` builds (~15 min) and keeps; this script only reads it, and stops with
exit 2 if it is not there.  munged must run here: every request carries a fresh MUNGE credential.

The server is `python -m cocaq --config CFG serve --port PORT` as a subprocess (uvicorn, one process),
CFG a temporary file with the database URL and `[api] admin_users = ["root"]` (this script runs as root
and reads other users' footprints as an admin).  Measured:

  (a) GET /v1/users/U?since=<30 days ago>&until=<now> (absolute ISO times, as `cocaq user` sends them),
      --runs sequential requests per user after --warmup, on one keep-alive connection (httpx.Client),
      for the heavy user (most jobs in the window), a median user and a user without jobs, round-robin.
      Server side: the response's `Server-Timing: app;dur=MS` (credential decode, permission check,
      query, serialisation).  Client side: a fresh credential (cocaq.api.munge.encode) + the request + the
      JSON parse.  Interleaved with each, the floor: the same query in this process without HTTP
      (cocaq.footprint.totals.user_footprint(...).as_dict() on a warm cocaq.db.dbapi connection, then a
      rollback, as the server's pool does).  Target: heavy user's server-side median < 50 ms.
  (b) --clients concurrent clients (asyncio, one httpx.AsyncClient and TCP connection each, all released
      at once), each making --per-client requests in a row for one of the users with jobs in the window,
      each with its own fresh credential.  Every non-200 answer and every exception counts as an error
      (target: 0).  Reports throughput, client latency, the server's Server-Timing, the server's threads
      and its PostgreSQL connections (sampled every 50 ms from /proc and pg_stat_activity).
  (c) `cocaq user HEAVY --since 30d --format json` as a whole process with COCAQ_API_URL set and no
      database URL or config (the login-node path: urllib, no driver), --cli-runs times, interleaved
      with the floor `python -m cocaq --version` and, for reference, the same command reading the
      database directly (COCAQ_DATABASE_URL, the pre-API path).  Target: median < 0.5 s.
  Profile: one heavy request in this process, the app (cocaq.api.server.create_app, real MUNGE decode) called
      through httpx.ASGITransport with the thread pool replaced by inline calls so that cProfile sees
      the whole request in one thread (no uvicorn/h11: that part is client latency minus Server-Timing).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
from bench_aggregate import heavy_user, job_count

FLOOR = "floor: python -m cocaq --version"


def pct(xs: list[float], q: float) -> float:
    """q-th percentile, nearest rank."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-int(q * len(s)) // 100) - 1))]


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "p90": pct(xs, 90),
        "p99": pct(xs, 99),
        "max": max(xs),
        "mean": statistics.fmean(xs),
    }


# --- the server --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(cfg: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    import httpx

    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    argv = [sys.executable, "-m", "cocaq", "--config", str(cfg), "serve", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=c.ROOT)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 60:
        if proc.poll() is not None:
            raise SystemExit(f"cocaq serve exited ({proc.returncode}):\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2).status_code == 200:
                print(f"cocaq serve (pid {proc.pid}) answers after {time.perf_counter() - t0:.1f} s")
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"cocaq serve did not answer in 60 s:\n{log.read_text()}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # uvicorn shuts down gracefully (lifespan closes the pool)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


class Monitor:
    """Samples the server's thread count and its PostgreSQL connections while a phase runs, and counts
    the sessions PostgreSQL opened for the database meanwhile (pg_stat_database.sessions)."""

    def __init__(self, pid: int, dbname: str, every_s: float = 0.05) -> None:
        self.pid, self.dbname, self.every_s = pid, dbname, every_s
        self.samples: list[tuple[float, int, int, int]] = []  # (time, threads, connections, active)
        self.pids: set[int] = set()
        self.sessions = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(c.pg_url(self.dbname, sqlalchemy=False), autocommit=True) as conn:
            me = conn.info.backend_pid
            count = "SELECT sessions FROM pg_stat_database WHERE datname = %s"
            s0 = conn.execute(count, (self.dbname,)).fetchone()[0]  # type: ignore[index]
            while not self._stop.is_set():
                threads = proc_threads(self.pid)
                rows = conn.execute(
                    "SELECT pid, state FROM pg_stat_activity WHERE datname = %s AND pid <> %s "
                    "AND backend_type = 'client backend'",
                    (self.dbname, me),
                ).fetchall()
                active = sum(1 for _, st in rows if st == "active")
                self.samples.append((time.perf_counter(), threads, len(rows), active))
                self.pids.update(int(p) for p, _ in rows)
                self._stop.wait(self.every_s)
            conn.execute("SELECT pg_stat_clear_snapshot()")
            self.sessions = conn.execute(count, (self.dbname,)).fetchone()[0] - s0  # type: ignore[index]

    def __enter__(self) -> Monitor:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def as_dict(self, t0: float = 0.0, t1: float = float("inf")) -> dict[str, Any]:
        """What was seen between t0 and t1 (perf_counter), and the sessions opened over the whole phase."""
        s = [x for x in self.samples if t0 <= x[0] <= t1] or self.samples
        return {
            "samples": len(s),
            "server_threads_max": max((x[1] for x in s), default=0),
            "db_connections_max": max((x[2] for x in s), default=0),
            "db_connections_median": statistics.median(x[2] for x in s) if s else 0,
            "db_active_max": max((x[3] for x in s), default=0),
            "db_active_median": statistics.median(x[3] for x in s) if s else 0,
            "db_backends_seen": len(self.pids),
            "db_sessions_opened": self.sessions,
        }


def server_ms(headers: Any) -> float:
    v = headers.get("server-timing", "")
    return float(v.split("dur=", 1)[1].split(";")[0]) if "dur=" in v else float("nan")


# --- (a) sequential ----------------------------------------------------------------------------------


def sequential(
    base: str, dbname: str, users: dict[str, str], params: dict[str, str], w: Any, runs: int, warmup: int
) -> dict[str, Any]:
    import httpx

    from cocaq.api import munge
    from cocaq.api.client import payload_for
    from cocaq.db.dbapi import connect
    from cocaq.footprint.totals import user_footprint

    out: dict[str, dict[str, list[float]]] = {k: {"server": [], "client": [], "floor": []} for k in users}
    jobs: dict[str, int] = {}
    with httpx.Client(base_url=base, timeout=30) as cl, connect(c.pg_url(dbname)) as db:
        for i in range(warmup + runs):
            for kind, u in users.items():
                path = f"/v1/users/{u}"
                t0 = time.perf_counter()
                cred = munge.encode(payload_for("GET", path))
                r = cl.get(path, params=params, headers={"Authorization": f"MUNGE {cred}"})
                body = r.json()
                t1 = time.perf_counter()
                if r.status_code != 200:
                    raise SystemExit(f"GET {path}: {r.status_code} {r.text[:300]}")
                t2 = time.perf_counter()
                d = user_footprint(db, u, w).as_dict()
                db.raw.rollback()
                t3 = time.perf_counter()
                if d["jobs"] != body["jobs"]:
                    raise SystemExit(f"{u}: the API says {body['jobs']} jobs, the query {d['jobs']}")
                jobs[kind] = int(body["jobs"])
                if i >= warmup:
                    out[kind]["server"].append(server_ms(r.headers))
                    out[kind]["client"].append((t1 - t0) * 1000)
                    out[kind]["floor"].append((t3 - t2) * 1000)
    return {
        k: {"user": users[k], "jobs": jobs[k], **{m: summary(v) for m, v in ms.items()}}
        for k, ms in out.items()
    }


def encode_decode_ms(n: int = 200) -> dict[str, float]:
    """munge.encode and munge.decode alone, in this process (what each request adds on either side)."""
    from cocaq.api import munge

    enc: list[float] = []
    dec: list[float] = []
    for i in range(n):
        t0 = time.perf_counter()
        cred = munge.encode(f"cocaq-api GET /v1/users/bench{i}".encode())
        t1 = time.perf_counter()
        munge.decode(cred)
        t2 = time.perf_counter()
        enc.append((t1 - t0) * 1000)
        dec.append((t2 - t1) * 1000)
    return {"encode_ms": statistics.median(enc), "decode_ms": statistics.median(dec)}


# --- (b) concurrent ----------------------------------------------------------------------------------


async def _concurrent(
    base: str, users: list[str], params: dict[str, str], clients: int, per_client: int
) -> dict[str, Any]:
    import httpx

    from cocaq.api import munge
    from cocaq.api.client import payload_for

    go = asyncio.Event()
    lat: list[float] = []
    srv: list[float] = []
    status: dict[int, int] = {}
    errors: list[str] = []

    async def client(i: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as cl:
            await go.wait()
            for j in range(per_client):
                u = users[(i * per_client + j) % len(users)]
                path = f"/v1/users/{u}"
                t0 = time.perf_counter()
                try:
                    cred = munge.encode(payload_for("GET", path))
                    r = await cl.get(path, params=params, headers={"Authorization": f"MUNGE {cred}"})
                    body = r.json()
                except Exception as exc:  # every failure is counted and shown
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                lat.append((time.perf_counter() - t0) * 1000)
                status[r.status_code] = status.get(r.status_code, 0) + 1
                if r.status_code == 200 and body.get("user") == u:
                    srv.append(server_ms(r.headers))
                else:
                    errors.append(f"{r.status_code}: {r.text[:200]}")

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    await asyncio.sleep(0.2)  # every client set up before any request
    t0 = time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    t1 = time.perf_counter()
    wall = t1 - t0
    n_ok = len(srv)
    return {
        "clients": clients,
        "per_client": per_client,
        "requests": clients * per_client,
        "ok": n_ok,
        "status": status,
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:10],
        "wall_s": wall,
        "t_go": t0,
        "t_end": t1,
        "throughput_rps": (clients * per_client) / wall,
        "client_ms": summary(lat) if lat else {},
        "server_ms": summary(srv) if srv else {},
    }


def concurrent(base: str, users: list[str], params: dict[str, str], clients: int, per_client: int) -> Any:
    return asyncio.run(_concurrent(base, users, params, clients, per_client))


# --- profile -----------------------------------------------------------------------------------------


def profile(cfg_path: Path, user: str, params: dict[str, str], n: int) -> dict[str, Any]:
    """n heavy requests through the app in this process, under cProfile, sync work run inline."""
    import anyio.to_thread
    import httpx

    from cocaq.api import munge
    from cocaq.api.client import payload_for
    from cocaq.api.server import create_app
    from cocaq.config_load import load_config

    cfg = load_config(cfg_path, environ={})
    app = create_app(cfg)

    async def inline(func: Any, *args: Any, **kw: Any) -> Any:
        return func(*args)

    saved = anyio.to_thread.run_sync
    anyio.to_thread.run_sync = inline  # type: ignore[assignment]
    path = f"/v1/users/{user}"
    prof = cProfile.Profile()
    walls: list[float] = []

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as cl:
            for i in range(n + 3):
                cred = munge.encode(payload_for("GET", path))
                if i >= 3:
                    prof.enable()
                t0 = time.perf_counter()
                r = await cl.get(path, params=params, headers={"Authorization": f"MUNGE {cred}"})
                walls.append((time.perf_counter() - t0) * 1000)
                if i >= 3:
                    prof.disable()
                assert r.status_code == 200, r.text

    try:
        asyncio.run(go())
    finally:
        anyio.to_thread.run_sync = saved  # type: ignore[assignment]
    st = pstats.Stats(prof)
    total = st.total_tt  # type: ignore[attr-defined]
    cum: dict[str, float] = {}
    statements = 0.0
    wanted = {
        "user_footprint": "cocaq.footprint.totals.user_footprint (SQL + rows)",
        "rows": "cocaq.db.dbapi.Db.rows (the statements)",
        "decode": "cocaq.api.munge.decode",
        "caller": "cocaq.api.server caller() (decode + pwd + checks)",
        "as_dict": "Footprint.as_dict",
        "serialize_response": "fastapi serialize_response",
        "jsonable_encoder": "fastapi jsonable_encoder",
        "render": "JSONResponse.render",
        "rollback": "rollback (pool)",
    }
    for (file, _line, fn), (_cc, nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if fn in wanted and ("cocaq" in file or "fastapi" in file or "starlette" in file or fn == "rollback"):
            key = wanted[fn]
            cum[key] = max(cum.get(key, 0.0), ct * 1000 / n)
        if fn == "rows" and file.endswith("dbapi.py"):
            statements = nc / n
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:15]  # type: ignore[attr-defined]
    tottime = [
        {"function": f"{Path(f).name}:{ln}({fn})", "tottime_ms_per_request": v[2] * 1000 / n}
        for (f, ln, fn), v in top
    ]
    return {
        "requests": n,
        "wall_ms_per_request_profiled": statistics.median(walls),
        "profiled_total_ms_per_request": total * 1000 / n,
        "statements_per_request": statements,
        "cumulative_ms_per_request": dict(sorted(cum.items(), key=lambda kv: -kv[1])),
        "top_tottime": tottime,
    }


# --- (c) the CLI ---------------------------------------------------------------------------------------


def cli(port: int, dbname: str, heavy: str, runs: int, expect_jobs: int) -> dict[str, Any]:
    api_env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    api_env["COCAQ_API_URL"] = f"http://127.0.0.1:{port}"
    db_env = c.cocaq_env(dbname)
    user_argv = [c.COCAQ, "user", heavy, "--since", "30d", "--format", "json"]
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        FLOOR: ([sys.executable, "-m", "cocaq", "--version"], api_env),
        f"cocaq user {heavy} --since 30d --format json, through the API": (user_argv, api_env),
        f"cocaq user {heavy} --since 30d --format json, database directly (reference)": (
            [c.COCAQ, "--config", str(c.CONFIG), *user_argv[1:]],
            db_env,
        ),
    }
    for argv_, env in commands.values():  # warm the page cache and .pyc files
        c.run_process(argv_, env)
    times: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(runs):
        for k, (argv_, env) in commands.items():
            r = c.run_process(argv_, env)
            times[k].append(r.wall_s)
            if k.startswith("cocaq user"):
                got = json.loads(r.stdout)["jobs"]
                if abs(got - expect_jobs) > max(50, expect_jobs // 100):  # the window moves with `now`
                    raise SystemExit(f"{k}: {got} jobs, expected about {expect_jobs}")
    return {k: {"median": statistics.median(v), "p90": c.p90(v), "runs": v} for k, v in times.items()}


# --- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="cocaq_bench_agg")
    p.add_argument("--port", type=int, default=0, help="0: a free one")
    p.add_argument("--runs", type=int, default=300, help="(a) sequential requests per user")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--clients", type=int, default=200, help="(b) concurrent clients")
    p.add_argument("--per-client", type=int, default=5, help="(b) requests per client")
    p.add_argument("--cli-runs", type=int, default=15, help="(c) runs of each command")
    p.add_argument("--profile-requests", type=int, default=30, help="0: no profile")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    a = p.parse_args(argv)

    if not c.database_exists(a.db) or job_count(a.db) < 990_000:
        print(
            f"database {a.db} is missing or has fewer than 1,000,000 jobs: build it with "
            f"`.venv/bin/python bench/bench_aggregate.py --reuse --skip-full --runs 1` (~15 min)",
            file=sys.stderr,
        )
        return 2
    m = c.machine()
    c.print_machine(m)
    n_jobs = job_count(a.db)
    now = datetime.now(UTC)
    since = now - timedelta(days=30)
    ranked, nobody = c.users_by_jobs(a.db, since)
    heavy, heavy_n = heavy_user(a.db)
    median_u, median_n = ranked[len(ranked) // 2]
    users = {"heavy": heavy, "median": median_u, "none": nobody}
    print(
        f"{n_jobs:,} jobs; {len(ranked)} users with jobs in the last 30 days: "
        f"heavy {heavy} ({heavy_n:,} jobs), "
        f"median {median_u} ({median_n:,}), {nobody} (none)",
        flush=True,
    )
    from cocaq.footprint.totals import Window

    w = Window(since, now)
    params = {"since": since.isoformat(), "until": now.isoformat()}
    res: dict[str, Any] = {"machine": m, "jobs": n_jobs, "users": users}

    with tempfile.TemporaryDirectory(prefix="cocaq-bench-api-") as tmp:
        cfg = Path(tmp) / "cocaq.toml"
        cfg.write_text(
            f'database_url = "{c.pg_url(a.db, sqlalchemy=False)}"\n\n[api]\nadmin_users = ["root"]\n',
            encoding="utf-8",
        )
        port = a.port or free_port()
        base = f"http://127.0.0.1:{port}"
        log = Path(tmp) / "serve.log"
        t_start = time.perf_counter()
        server = start_server(cfg, port, log)
        try:
            cpu0 = proc_cpu_s(server.pid)
            t0 = time.perf_counter()
            with Monitor(server.pid, a.db) as mon_a:
                res["sequential"] = sequential(base, a.db, users, params, w, a.runs, a.warmup)
            n_a = len(users) * (a.runs + a.warmup)
            res["sequential_server_cpu_ms_per_request"] = (proc_cpu_s(server.pid) - cpu0) * 1000 / n_a
            res["sequential_monitor"] = mon_a.as_dict()
            print(f"(a) done in {time.perf_counter() - t0:.1f} s", flush=True)
            res["munge"] = encode_decode_ms()

            cpu0 = proc_cpu_s(server.pid)
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            with Monitor(server.pid, a.db) as mon_b:
                conc = concurrent(base, [u for u, _ in ranked], params, a.clients, a.per_client)
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            conc["server_cpu_s"] = proc_cpu_s(server.pid) - cpu0
            conc["client_cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            conc["monitor"] = mon_b.as_dict(conc.pop("t_go"), conc.pop("t_end"))
            conc["server_threads_after"] = proc_threads(server.pid)
            res["concurrent"] = conc
            print(f"(b) done in {conc['wall_s']:.1f} s", flush=True)

            res["cli"] = cli(port, a.db, heavy, a.cli_runs, res["sequential"]["heavy"]["jobs"])
            print("(c) done", flush=True)
            alive = server.poll() is None
        finally:
            stop_server(server)
            res["server_log_tail"] = log.read_text(errors="replace")[-2000:]
        res["server_alive_to_the_end"] = alive
        print(f"server up {time.perf_counter() - t_start:.1f} s", flush=True)
        if a.profile_requests:
            res["profile"] = profile(cfg, heavy, params, a.profile_requests)

    report(res, a)
    if a.json:
        a.json.write_text(json.dumps(res, indent=2, default=str))
    s = res["sequential"]["heavy"]["server"]["median"]
    ok = s < 50 and res["concurrent"]["errors"] == 0 and res["cli"][_api_key(res)]["median"] < 0.5
    return 0 if ok else 1


def _api_key(res: dict[str, Any]) -> str:
    return next(k for k in res["cli"] if k.endswith("through the API"))


def report(res: dict[str, Any], a: argparse.Namespace) -> None:
    seq = res["sequential"]
    print()
    print(
        f"(a) {a.runs} sequential requests per user after {a.warmup} warm-ups, one keep-alive connection; "
        "ms; floor = user_footprint().as_dict() in-process on a warm connection, interleaved"
    )
    print(
        "| user | jobs in window | server median | p90 | p99 | client median | p90 | p99 | floor median "
        "| server / floor |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, r in seq.items():
        sv, cl, fl = r["server"], r["client"], r["floor"]
        print(
            f"| {kind} ({r['user']}) | {r['jobs']:,} | "
            f"{sv['median']:.1f} | {sv['p90']:.1f} | {sv['p99']:.1f} | "
            f"{cl['median']:.1f} | {cl['p90']:.1f} | {cl['p99']:.1f} | {fl['median']:.1f} | "
            f"{sv['median'] / fl['median']:.2f} |"
        )
    mg = res["munge"]
    print(
        f"server CPU {res['sequential_server_cpu_ms_per_request']:.1f} ms a request (all three users); "
        f"munge.encode {mg['encode_ms']:.3f} ms, munge.decode {mg['decode_ms']:.3f} ms in-process; "
        f"server threads {res['sequential_monitor']['server_threads_max']}, "
        f"its DB connections {res['sequential_monitor']['db_connections_max']} "
        f"({res['sequential_monitor']['db_sessions_opened']} sessions opened, this process's included)"
    )
    b = res["concurrent"]
    print()
    print(
        f"(b) {b['clients']} concurrent clients x {b['per_client']} requests = {b['requests']}: "
        f"{b['ok']} x 200, status {b['status']}, errors {b['errors']}, in {b['wall_s']:.2f} s = "
        f"{b['throughput_rps']:.1f} requests/s"
    )
    for name in ("client_ms", "server_ms"):
        s = b[name]
        if s:
            print(
                f"    {name}: median {s['median']:.0f}, p90 {s['p90']:.0f}, p99 {s['p99']:.0f}, "
                f"max {s['max']:.0f}"
            )
    mon = b["monitor"]
    print(
        f"    server CPU {b['server_cpu_s']:.1f} s "
        f"({b['server_cpu_s'] * 1000 / b['requests']:.1f} ms a request), "
        f"client CPU {b['client_cpu_s']:.1f} s; server threads max {mon['server_threads_max']} "
        f"(after: {b['server_threads_after']}); its DB connections max {mon['db_connections_max']} "
        f"(median {mon['db_connections_median']}, active max {mon['db_active_max']}), "
        f"{mon['db_backends_seen']} distinct backends seen, "
        f"{mon['db_sessions_opened']} sessions opened (pg_stat_database.sessions)"
    )
    for e in b["error_samples"]:
        print(f"    error: {e}")
    print()
    print(f"(c) whole processes, {a.cli_runs} runs each, interleaved")
    print("| command | median s | p90 s | x floor |")
    print("|---|---:|---:|---:|")
    floor = res["cli"][FLOOR]["median"]
    for k, v in res["cli"].items():
        print(f"| {k} | {v['median']:.3f} | {v['p90']:.3f} | {v['median'] / floor:.2f} |")
    if "profile" in res:
        pr = res["profile"]
        print()
        print(
            f"profile: {pr['requests']} heavy requests in-process (ASGI, no uvicorn), "
            f"{pr['wall_ms_per_request_profiled']:.1f} ms a request under cProfile, "
            f"{pr['statements_per_request']:.0f} SQL statements a request"
        )
        for k, v in pr["cumulative_ms_per_request"].items():
            print(f"    {v:7.2f} ms  {k}")
        print("  most own time:")
        for t in pr["top_tottime"][:10]:
            print(f"    {t['tottime_ms_per_request']:7.2f} ms  {t['function']}")
    print()
    heavy = seq["heavy"]["server"]["median"]
    api_cli = res["cli"][_api_key(res)]["median"]
    print(
        f"target (a) heavy user server-side median < 50 ms: "
        f"{'MET' if heavy < 50 else 'MISSED'} ({heavy:.1f} ms)"
    )
    print(
        f"target (b) {b['clients']} concurrent clients without errors: "
        f"{'MET' if b['errors'] == 0 else 'MISSED'} ({b['errors']} errors)"
    )
    print(
        f"target (c) cocaq user through the API < 0.5 s: "
        f"{'MET' if api_cli < 0.5 else 'MISSED'} ({api_cli:.3f} s)"
    )


if __name__ == "__main__":
    sys.exit(main())
