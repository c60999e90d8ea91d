"""The share of a job that counts in a window (cocaq.accounting.window) is the same number, to the bit,
wherever it is computed: the aggregator's daily rollups (Python on SQLite, SQL on PostgreSQL), the
footprint query of `cocaq user/lab` and the monthly reports' job query, on random jobs and windows (jobs
across the windows' edges, on them, without run time, still running, in every state)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, false, insert, select

from cocaq.accounting.aggregate import WATERMARK
from cocaq.accounting.rollups import rebuild_days
from cocaq.accounting.window import overlap, share
from cocaq.db.dbapi import connect
from cocaq.db.schema import AggregatorState, Cluster, DailyRollup, Job
from cocaq.footprint.totals import Window, query
from reports.queries import month_jobs

BASE = datetime(2026, 10, 5, tzinfo=UTC)  # a UTC midnight
DAY = 86400.0
STATES = ["COMPLETED", "FAILED", "CANCELLED by 5", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED"]


def _t(s: float) -> datetime:
    return BASE + timedelta(seconds=s)


def _jobs(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Start and run time (seconds from BASE) of random jobs, many on the days' and windows' edges."""
    edges = [k * DAY for k in range(-1, 7)] + [k * DAY + 3600 * h for k in range(6) for h in (6, 12)]
    out = []
    for i in range(n):
        kind = rng.random()
        t0 = rng.choice(edges) if kind < 0.3 else round(rng.uniform(-DAY, 5 * DAY), rng.choice([0, 3, 6]))
        r = rng.random()
        if r < 0.15:
            el = 0.0  # never ran
        elif r < 0.3:
            el = rng.choice(edges) - t0 if rng.random() < 0.5 else rng.choice([1e-6, 0.5, 1.0, 59.0])
            el = max(el, 0.0)  # to a day's or a window's edge
        elif r < 0.35:
            el = -5.0  # a damaged record
        else:
            el = round(rng.expovariate(1 / (8 * 3600)), rng.choice([0, 3, 6]))
        running = rng.random() < 0.15
        energy = rng.uniform(0, 5e7) * rng.choice([1.0, 1.0, 0.0])
        out.append(
            {
                "job_id": str(1000 + i), "user_name": f"u{i}", "account": "lab", "partition": "p",
                "submit_time": _t(t0 - 60), "start_time": _t(t0),
                "end_time": None if running else _t(t0 + max(el, 0.0)), "elapsed_s": el,
                "state": "RUNNING" if running else rng.choice(STATES), "is_open": running,
                "alloc_cpus": rng.randint(1, 64), "alloc_gpus": rng.randint(0, 8),
                "energy_j": energy, "energy_measured_j": energy, "co2_g": energy / 1e4, "pue": 1.0,
            }
        )  # fmt: skip
    return out


def _windows(rng: random.Random, n: int) -> list[tuple[float, float]]:
    grid = [k * DAY + 3600 * h for k in range(-1, 7) for h in (0, 6, 12)]
    out = [(0.0, DAY), (DAY, 4 * DAY), (-DAY, 7 * DAY)]
    while len(out) < n:
        a = rng.choice(grid) if rng.random() < 0.5 else round(rng.uniform(-DAY, 6 * DAY), 3)
        b = a + (rng.choice([1.0, 3600.0, DAY]) if rng.random() < 0.3 else round(rng.uniform(1, 3 * DAY), 3))
        out.append((a, b))
    return out


def _setup(engine: Engine, seed: int) -> tuple[list[dict[str, Any]], dict[str, tuple[float, float, dict]]]:
    rng = random.Random(seed)
    jobs = _jobs(rng, 120)
    with engine.begin() as c:
        cid = c.execute(insert(Cluster).values(name="c").returning(Cluster.id)).scalar_one()
        c.execute(insert(Job), [{**j, "cluster_id": cid} for j in jobs])
    by_user = {
        j["user_name"]: (j["start_time"].timestamp(), max(j["elapsed_s"], 0.0), j) for j in jobs
    }  # start and run time as the queries read them
    return jobs, by_user


SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_reports_and_footprint_agree_with_the_formula(engine: Engine, seed: int) -> None:
    _, by_user = _setup(engine, seed)
    url = engine.url.render_as_string(hide_password=False)
    db = connect(url)
    try:
        for lo, hi in _windows(random.Random(seed + 100), 15):
            want = {
                u: share(t0, el, BASE.timestamp() + lo, BASE.timestamp() + hi)
                for u, (t0, el, _) in by_user.items()
            }
            ov = {
                u: overlap(t0, el, BASE.timestamp() + lo, BASE.timestamp() + hi)
                for u, (t0, el, _) in by_user.items()
            }
            where = f"window [{lo}, {hi})"
            # the reports: f per job
            y = month_jobs(_t(lo), _t(hi), [], false())
            with engine.connect() as c:
                got = {r.user_name: (r.f, r.ov) for r in c.execute(select(y.c.user_name, y.c.f, y.c.ov))}
            for u, (f, o) in got.items():
                assert (f, o) == (want[u], ov[u]), (where, u, by_user[u])
            assert {u for u, (f, _) in got.items() if f > 0} == {u for u, s in want.items() if s > 0}, where
            # cocaq user/lab: per user (one job each), from jobs over the whole window
            res = query(db, Window(_t(lo), _t(hi)), group="user", top=len(by_user), from_jobs=True)
            for u, s in want.items():
                sums = res.sums.get(u)
                if s == 0:
                    assert sums is None or sums["jobs"] == 0, (where, u)
                    continue
                assert sums is not None, (where, u)
                e, cpus = by_user[u][2]["energy_j"], by_user[u][2]["alloc_cpus"]
                assert sums["jobs"] == 1, (where, u)
                assert sums["facility_j"] == e * s, (where, u, by_user[u])
                assert sums["energy_measured_j"] == e * s, (where, u, by_user[u])
                assert sums["cpu_hours"] == cpus * ov[u] / 3600.0, (where, u, by_user[u])
            tops = {t.user: t.share for t in res.top_jobs}
            # (a share a rounding ulp over 1 shows as 1)
            assert tops == {u: min(s, 1.0) for u, s in want.items() if s > 0}, where
    finally:
        db.close()


@pytest.mark.parametrize("in_sql", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_rollups_agree_with_the_formula(engine: Engine, seed: int, in_sql: bool) -> None:
    if in_sql and engine.dialect.name != "postgresql":
        pytest.skip("the aggregator's SQL is PostgreSQL's")
    _, by_user = _setup(engine, seed)
    first = BASE.timestamp() - DAY
    days = {first + k * DAY for k in range(8)}
    with engine.begin() as c:
        rebuild_days(c, days, in_sql=in_sql)
        rows = c.execute(
            select(DailyRollup.user_name, DailyRollup.day, DailyRollup.jobs, DailyRollup.energy_measured_j,
                   DailyRollup.cpu_hours)
        ).all()  # fmt: skip
    got = {
        (r.user_name, r.day.timestamp() if r.day.tzinfo else r.day.replace(tzinfo=UTC).timestamp()): r
        for r in rows
    }
    want = {}
    for u, (t0, el, j) in by_user.items():
        for d in sorted(days):
            s = share(t0, el, d, d + DAY)
            if s > 0:
                want[(u, d)] = (1, j["energy_j"] * s, j["alloc_cpus"] * overlap(t0, el, d, d + DAY) / 3600.0)
    assert set(got) == set(want)
    for k, (n, e, cpu) in want.items():
        r = got[k]
        assert (r.jobs, r.energy_measured_j, r.cpu_hours) == (n, e, cpu), (k, by_user[k[0]])


@pytest.mark.parametrize("seed", SEEDS[:1])
def test_rollups_and_edges_add_up_to_the_window(engine: Engine, seed: int) -> None:
    """`cocaq user/lab` reading whole days from the rollups and the partial days at both edges from jobs
    (two edge intervals in one share) counts each job by its share of the whole window."""
    _, by_user = _setup(engine, seed)
    first = BASE.timestamp() - DAY
    with engine.begin() as c:
        rebuild_days(c, {first + k * DAY for k in range(8)})
        c.execute(insert(AggregatorState).values(name=WATERMARK, watermark=_t(6 * DAY + 3600)))
    db = connect(engine.url.render_as_string(hide_password=False))
    try:
        for lo, hi in [(0.5 * DAY, 3.25 * DAY), (-0.75 * DAY, 5.5 * DAY + 7.0), (3600.0, 2 * DAY + 1e-3)]:
            res = query(db, Window(_t(lo), _t(hi)), group="user")
            assert len(res.plan.edges) == 2 and res.plan.rollup_since is not None
            for u, (t0, el, j) in by_user.items():
                s = share(t0, el, BASE.timestamp() + lo, BASE.timestamp() + hi)
                got = res.sums.get(u, {}).get("energy_measured_j", 0.0)
                assert got == pytest.approx(j["energy_j"] * s, rel=1e-12, abs=1e-6), (lo, hi, u, j)
    finally:
        db.close()
