#!/usr/bin/env python3
"""Benchmark: one chart and one user's e-mail rendered, in this process (the unit tests' old time budgets).

    .venv/bin/python bench/bench_render.py

A thousand user e-mails (one chart each) must render and send within a minute on two cores, so:

  (a) one 31-day bar chart with a utilisation line (reports/charts.py), as tests/test_render.py draws it.
      Target: < 30 ms.
  (b) one user's monthly e-mail (templates + chart, reports.render.render_user_month) of
      tests/test_report_data.py's March 2025 on SQLite, templates already compiled. Target: < 40 ms.

The unit tests check what keeps these cheap without a clock (charts import no plotting library; the
templates compile once per process); the whole batch is bench/bench_reports.py's (a).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHART_TARGET_S = 0.030
MAIL_TARGET_S = 0.040


def per_chart(n: int = 40) -> float:
    from cocaq.reports import charts

    days = [str(d) for d in range(1, 32)]
    values = [float(d % 7) * 3.5 for d in range(31)]
    util = [None if d % 7 == 6 else 40.0 + d for d in range(31)]
    line = charts.Series("GPU utilisation", util, charts.COLOURS["util"])
    bars = [charts.Series("energy", values, charts.COLOURS["energy"])]
    charts.bar_chart("Energy per day", days, bars, label_every=7, unit="kWh", line=line, line_max=100.0)
    t0 = time.perf_counter()
    for _ in range(n):
        charts.bar_chart("Energy per day", days, bars, label_every=7, unit="kWh", line=line, line_max=100.0)
    return (time.perf_counter() - t0) / n


def per_mail(n: int = 50) -> float:
    from cocaq.db import migrate
    from cocaq.db.engine import make_engine
    from cocaq.reports import render
    from cocaq.reports.suggest import suggest_for_user
    from cocaq.reports.user_report import users_month
    from tests.test_report_data import MONTH, build_month, config

    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 'cocaq.sqlite'}"
        engine = make_engine(url)
        migrate.upgrade(engine)
        cfg = config(Path(d), url)
        build_month(engine, cfg)
        with engine.connect() as c:
            m = users_month(c, cfg, MONTH, users=["alice"])["alice"]
        engine.dispose()
    s = suggest_for_user(m, cfg)
    render.render_user_month(m, s, cfg)  # templates compiled once per process
    t0 = time.perf_counter()
    for _ in range(n):
        render.render_user_month(m, s, cfg)
    return (time.perf_counter() - t0) / n


def main() -> int:
    chart, mail = per_chart(), per_mail()
    ok = chart < CHART_TARGET_S and mail < MAIL_TARGET_S
    print(f"(a) chart: {chart * 1000:.1f} ms (target < {CHART_TARGET_S * 1000:.0f} ms)")
    print(f"(b) user e-mail: {mail * 1000:.1f} ms (target < {MAIL_TARGET_S * 1000:.0f} ms)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
