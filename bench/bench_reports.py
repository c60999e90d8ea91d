#!/usr/bin/env python3
"""Benchmark: a month's user e-mails rendered and sent, and the admin report, as whole processes.

    .venv/bin/python bench/bench_reports.py            # reuses cocaq_bench_reports, or builds it (~2 min)
    .venv/bin/python bench/bench_reports.py --runs 3 --profile

The database is bench/bench_report_data.py's `cocaq_bench_reports` (a month of 100,000 jobs, 1,000 users,
50 labs; built here with its `build` when missing), migrated to the current head. The SMTP server is
aiosmtpd in a separate process on 127.0.0.1 (so that it does not share the sender's interpreter), which
accepts and counts every message.

Timed, each as a whole process (start-up, imports, database, rendering, SMTP):

  (a) `cocaq report send --month M --only users`: every user with jobs in the month gets the e-mail
      with its charts; the month's user-monthly ledger rows are deleted before each run. Target: < 60 s.
  (b) the same command again: nothing to send (every report in the ledger).
  (c) `cocaq report admin --month M --out DIR`: the admin report (e-mail parts and interactive HTML).
      Target: < 30 s.

With --profile, the parts of (a) in this process: users_month, suggestions, rendering all messages,
building the MIME messages, and sending them through deliver (ledger writes + SMTP).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

SERVER = textwrap.dedent(
    """
    import sys, threading
    from aiosmtpd.controller import Controller

    class Count:
        def __init__(self):
            self.n, self.bytes, self.lock = 0, 0, threading.Lock()
        async def handle_DATA(self, server, session, envelope):
            with self.lock:
                self.n += 1
                self.bytes += len(envelope.content)
            return "250 2.0.0 Ok: queued"

    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    h = Count()
    ctl = Controller(h, hostname="127.0.0.1", port=port)
    ctl.start()
    print(port, flush=True)
    for line in sys.stdin:
        print(h.n, h.bytes, flush=True)
    ctl.stop()
    """
)


class SmtpProcess:
    """aiosmtpd in a child process; `counts()` asks it how many messages and bytes it took."""

    def __init__(self) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.p.stdout is not None
        self.port = int(self.p.stdout.readline())

    def counts(self) -> tuple[int, int]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("?\n")
        self.p.stdin.flush()
        n, b = self.p.stdout.readline().split()
        return int(n), int(b)

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(10)


def write_config(path: Path, port: int) -> None:
    path.write_text(
        c.CONFIG.read_text()
        + textwrap.dedent(
            f"""
            [mail]
            smtp_host = "127.0.0.1"
            smtp_port = {port}
            from_address = "HPC reports <hpc@bench.example.org>"
            address_template = "{{user}}@bench.example.org"
            max_per_user_per_day = 0
            """
        )
    )


def clear_ledger(dbname: str, month_start: Any) -> int:
    import psycopg

    with psycopg.connect(c.pg_url(dbname, sqlalchemy=False), autocommit=True) as pc:
        cur = pc.execute(
            "DELETE FROM sent_reports WHERE kind = 'user-monthly' AND period_start = %s", (month_start,)
        )
        return cur.rowcount


def profile(cfg: Any, month: Any, port: int) -> list[tuple[str, float]]:
    """The parts of a send, in this process (the ledger cleared first)."""
    from cocaq.db.engine import make_engine
    from cocaq.reports.deliver import Outgoing, deliver
    from cocaq.reports.message import build_message, new_message_id, parse_sender
    from cocaq.reports.render import render_user_month
    from cocaq.reports.suggest import suggest_for_user
    from cocaq.reports.user_report import users_month

    engine = make_engine(cfg.database_url)
    out: list[tuple[str, float]] = []

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        r = fn()
        out.append((name, time.perf_counter() - t0))
        return r

    with engine.connect() as conn:
        months = timed("users_month (all users)", lambda: users_month(conn, cfg, month))
    names = sorted(u for u, m in months.items() if m.totals.jobs > 0)
    sugg = timed("suggest_for_user (all)", lambda: {u: suggest_for_user(months[u], cfg) for u in names})
    rendered = timed(
        "render_user_month (all: templates + charts)",
        lambda: {u: render_user_month(months[u], sugg[u], cfg) for u in names},
    )
    sender = parse_sender(cfg.mail.from_address)
    timed(
        "build_message (all: MIME)",
        lambda: [
            build_message(
                sender=sender, to=f"{u}@bench.example.org", subject=r.subject, text=r.text, html=r.html,
                images=r.images, message_id=new_message_id(sender),
            ).as_bytes()
            for u, r in rendered.items()
        ],
    )  # fmt: skip
    items = [
        Outgoing(
            kind="bench-profile", period_start=month, period_end=month, subject=r.subject, text=r.text,
            html=r.html, images=r.images, user=u,
        )
        for u, r in rendered.items()
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM sent_reports WHERE kind = 'bench-profile'")
    s = timed("deliver (all: MIME + ledger + SMTP)", lambda: deliver(engine, cfg, items))
    print(f"  profile deliver: {s.line()}")
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM sent_reports WHERE kind = 'bench-profile'")
    engine.dispose()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--month", default="2026-10")
    p.add_argument("--db", default="cocaq_bench_reports")
    p.add_argument("--runs", type=int, default=1, help="runs of each timed command")
    p.add_argument("--profile", action="store_true", help="time the parts of a send in this process")
    a = p.parse_args(argv)

    import bench_report_data as brd

    from cocaq.config_load import load_config
    from cocaq.db import migrate
    from cocaq.db.engine import make_engine

    m = c.machine()
    c.print_machine(m)
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]))
    if not c.database_exists(a.db):
        brd.build(a.db, 100_000, a.month, 300, 20261121)
    engine = make_engine(c.pg_url(a.db))
    migrate.upgrade(engine)
    engine.dispose()
    _prev, lo, _hi = brd.month_bounds(a.month)

    server = SmtpProcess()
    tmp = Path(tempfile.mkdtemp(prefix="cocaq-bench-reports-"))
    cfg_path = tmp / "cocaq.toml"
    write_config(cfg_path, server.port)
    env = c.cocaq_env(a.db)
    env["COCAQ_CONFIG"] = str(cfg_path)
    results: dict[str, list[float]] = {}
    rss: dict[str, float] = {}
    try:
        send = [c.COCAQ, "report", "send", "--month", a.month, "--only", "users"]
        admin = [c.COCAQ, "report", "admin", "--month", a.month, "--out", str(tmp / "admin")]
        for i in range(a.runs):
            cleared = clear_ledger(a.db, lo)
            n0, b0 = server.counts()
            r = c.run_process(send, env, rss=True)
            n1, b1 = server.counts()
            print(f"(a) run {i + 1}: {r.wall_s:.1f} s, {n1 - n0} messages, {(b1 - b0) / 2**20:.1f} MiB "
                  f"(ledger rows cleared before: {cleared}); {r.stderr.strip()}")  # fmt: skip
            results.setdefault("(a) " + " ".join(send[1:]), []).append(r.wall_s)
            rss["(a)"] = max(rss.get("(a)", 0.0), r.max_rss_mb or 0.0)
            r = c.run_process(send, env, rss=True)
            n2, _ = server.counts()
            print(f"(b) run {i + 1}: {r.wall_s:.1f} s, {n2 - n1} messages; {r.stderr.strip()}")
            results.setdefault("(b) the same again (nothing to send)", []).append(r.wall_s)
            r = c.run_process(admin, env, rss=True)
            sizes = {f.name: f.stat().st_size for f in (tmp / "admin").iterdir()}
            print(f"(c) run {i + 1}: {r.wall_s:.1f} s, files {sizes}")
            results.setdefault("(c) " + " ".join(admin[1:]).replace(str(tmp), "$TMP"), []).append(r.wall_s)
            rss["(c)"] = max(rss.get("(c)", 0.0), r.max_rss_mb or 0.0)
        if a.profile:
            cfg = load_config(cfg_path, {"COCAQ_DATABASE_URL": c.pg_url(a.db)})
            parts = profile(cfg, lo, server.port)
    finally:
        server.close()

    print(f"\nwhole processes, {a.runs} run(s) each (median / max), peak RSS:")
    for name, ts in results.items():
        key = name[:3]
        mem = f", {rss[key]:.0f} MiB" if key in rss else ""
        print(f"  {statistics.median(ts):7.1f} s / {max(ts):7.1f} s{mem}  {name}")
    if a.profile:
        print("\nin this process (one run each):")
        for name, t in parts:
            print(f"  {t:7.2f} s  {name}")
    print(f"\nfiles under {tmp}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
