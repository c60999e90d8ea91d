"""`cocaq user`/`lab` totals from the daily rollups plus the window's edges from jobs equal the totals
computed from jobs alone, on SQLite and PostgreSQL; and the rollups are what is read where they answer."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select, text, update

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.dbapi import connect
from cocaq.db.schema import AggregatorState, CarbonIntensity, Cluster, DailyRollup, Sample
from cocaq.footprint.totals import Footprint, Window, lab_footprint, plan_window, user_footprint
from cocaq.slurm.record import JobRecord
from tests.builders import config, job

DAY0 = datetime(2026, 10, 5, tzinfo=UTC)
H = timedelta(hours=1)
D = timedelta(days=1)


def _cfg(tmp_path: Path, url: str) -> Config:
    return config(
        tmp_path, url, cluster={"carbon_zone": "FRA", "pue": 1.3}, estimate={"gpu_utilisation": 0.8},
        embodied={"g_per_gpu_hour": 25, "g_per_node_hour": 10},
    )  # fmt: skip


def _job(raw: int, start: datetime, hours: float, *, consumed_j: float | None = None, **kw: Any) -> JobRecord:
    """A job of lab_a's (alice's unless `user`) asking for 16,000 + `raw` MB, measured at `consumed_j`."""
    kw.setdefault("account", "lab_a")
    return job(raw, start, hours, mem_mb=16_000 + raw, consumed_energy_j=consumed_j, **kw)


JOBS = [
    _job(1, DAY0 + 22 * H, 5.0),  # across midnight, with GPU samples (utilisation, idle)
    _job(2, DAY0 + D + 3 * H, 2.0, state="FAILED"),
    _job(3, DAY0 + D + 23.5 * H, 26.0, gpus=2, state="TIMEOUT"),  # across two midnights
    _job(4, DAY0 + 2 * D + 10 * H, 0.0, state="CANCELLED by 5"),  # no run time
    _job(5, DAY0 + 5 * H, 3.0, user="bob", gpus=0, state="OUT_OF_MEMORY", consumed_j=5e6),  # measured
    _job(6, DAY0 + 2 * D + 20 * H, 30.0, user="bob", state="RUNNING", running=True),  # still running
    _job(7, DAY0 + D + 12 * H, 4.0, user="carol", account="lab_b", gpus=2),
    _job(8, DAY0 + 3 * D, 1.0),  # starts at midnight
    _job(9, DAY0 + D, 24.0, user="bob", gpus=4),  # exactly one whole day
    _job(10, DAY0 - D + 20 * H, 50.0, user="carol", account="lab_b", state="NODE_FAIL"),
]

WINDOWS = [
    (DAY0 + 5 * H, DAY0 + 3 * D + 7 * H),  # partial days at both ends
    (DAY0 + D + 1 * H, DAY0 + D + 20 * H),  # inside one day
    (DAY0, DAY0 + 5 * D),  # whole days only
    (DAY0 - 2 * D + 12 * H, DAY0 + 6 * D + 1 * H),  # all of it
    (DAY0 + D, DAY0 + 2 * D),  # one day: a job ends at its end, another runs all of it
    (DAY0 + 3 * D, DAY0 + 3 * D + 30 * timedelta(minutes=1)),  # a job starts at its start
    (DAY0 + 2 * D + 10 * H, DAY0 + 2 * D + 10 * H + timedelta(seconds=1)),  # the job with no run time
]
USERS = ["alice", "bob", "carol", "nobody"]
LABS = ["lab_a", "lab_b", "no_such_lab"]


def _scenario(engine: Engine, tmp_path: Path) -> str:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    import_records(engine, JOBS, cfg, source="sacct-json")
    with engine.begin() as c:  # job 1's GPU: an idle hour at 60 W, then a busy one at 300 W, 10 s apart
        cid = c.execute(select(Cluster.id).where(Cluster.name == "c")).scalar_one()
        rows = []
        for i in range(720):
            ts = DAY0 + 22 * H + timedelta(seconds=10 * i)
            power, util = (60.0, 0.0) if i < 360 else (300.0, 90.0)
            base = {
                "ts": ts,
                "cluster_id": cid,
                "node": "n1",
                "source": "nvml",
                "device": "GPU-a",
                "job_id": "1",
            }
            rows += [
                {**base, "metric": "power_w", "value": power},
                {**base, "metric": "util_pct", "value": util},
            ]
        c.execute(insert(Sample), rows)
        # an hourly series for the zone, so that jobs have when-to-run figures (cheap nights, dear evenings)
        t0 = DAY0 - 3 * D
        c.execute(
            insert(CarbonIntensity),
            [
                {"zone": "FRA", "ts_start": t0 + i * H, "ts_end": t0 + (i + 1) * H, "kind": "lifecycle",
                 "g_per_kwh": 40.0 + 8.0 * abs(((i + 5) % 24) - 12), "source": "test series"}
                for i in range(24 * 12)
            ],
        )  # fmt: skip
    run_aggregate(engine, cfg)
    return url


def _approx(a: Any, b: Any, where: str) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9), where
    else:
        assert a == b, where


def _assert_same(a: Footprint, b: Footprint, where: str) -> None:
    ta, tb = asdict(a.totals), asdict(b.totals)
    for k in ta:
        _approx(ta[k], tb[k], f"{where}: {k}")
    assert [j.job_id for j in a.top_jobs] == [j.job_id for j in b.top_jobs], where
    for ja, jb in zip(a.top_jobs, b.top_jobs, strict=True):
        _approx(ja.energy_kwh, jb.energy_kwh, f"{where}: top job {ja.job_id}")
        _approx(ja.co2_kg, jb.co2_kg, f"{where}: top job {ja.job_id}")
    assert [m["user"] for m in a.members] == [m["user"] for m in b.members], where
    for ma, mb in zip(a.members, b.members, strict=True):
        for k in ma:
            _approx(ma[k], mb[k], f"{where}: member {ma['user']} {k}")


def _check_all(url: str) -> dict[str, int]:
    """Every user and lab in every window: rollups + edges == jobs alone; returns rollup days used."""
    used: dict[str, int] = {}
    with connect(url) as db:
        for since, until in WINDOWS:
            w = Window(since, until)
            for u in USERS:
                fp = user_footprint(db, u, w, top=10)
                _assert_same(fp, user_footprint(db, u, w, top=10, from_jobs=True), f"{u} {since}..{until}")
                used[f"{since}..{until}"] = fp.plan.rollup_days if fp.plan else 0
            for lab in LABS:
                fp = lab_footprint(db, lab, w, top=10)
                _assert_same(fp, lab_footprint(db, lab, w, top=10, from_jobs=True), f"{lab} {since}..{until}")
    return used


@pytest.fixture(autouse=True, params=["psycopg2", "psycopg"])
def pg_driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The login-node path reads PostgreSQL through psycopg2 where installed, else psycopg 3: both."""
    monkeypatch.setenv("COCAQ_TEST_PG_DRIVER", request.param)
    return str(request.param)


def test_rollups_plus_edges_equal_the_jobs_alone(engine: Engine, tmp_path: Path) -> None:
    url = _scenario(engine, tmp_path)
    used = _check_all(url)
    # (the aggregator ran now, long after these days: every whole day in a window came from rollups)
    assert list(used.values()) == [2, 0, 5, 7, 1, 0, 0]

    with connect(url) as db:
        w = Window(*WINDOWS[3])
        alice, bob = user_footprint(db, "alice", w), user_footprint(db, "bob", w)
        assert alice.plan and alice.plan.rollups_through is not None
        # the jobs path itself: everything ran inside this window, so it holds the jobs' whole totals
        q = "SELECT user_name, sum(energy_j), sum(co2_g) FROM jobs GROUP BY user_name"
        whole = {r[0]: (r[1], r[2]) for r in db.rows(q)}
        assert alice.totals.energy_kwh == pytest.approx(whole["alice"][0] / 3.6e6)
        assert alice.totals.co2_kg == pytest.approx(whole["alice"][1] / 1000)  # operational: no embodied
        assert (alice.totals.jobs, bob.totals.jobs) == (5, 3)
        # what the rollups add is there: outcomes, components, methods, GPU use, embodied apart
        t, b = alice.totals, bob.totals
        assert (t.jobs_failed, t.jobs_cancelled, t.jobs_timeout, b.jobs_failed, b.jobs_oom) == (1, 1, 1, 0, 1)
        # the ledger's parts (cocaq.accounting.ledger): disjoint, so they add up to at most the energy; the
        # time-limit part (possibly lost) is never in the certain total
        parts = (t.idle_gpu_energy_kwh, t.failed_energy_kwh, t.oom_energy_kwh, t.cancelled_energy_kwh)
        assert t.wasted_energy_kwh == pytest.approx(sum(parts)) and t.timeout_energy_kwh > 0
        assert t.wasted_energy_kwh + t.timeout_energy_kwh <= t.energy_kwh
        assert b.oom_energy_kwh == pytest.approx(5e6 / 3.6e6) and b.failed_energy_kwh == 0
        assert t.energy_gpu_kwh > 0 and t.energy_cpu_kwh > 0 and t.energy_dram_kwh > 0
        assert b.energy_other_kwh == pytest.approx(5e6 / 3.6e6) and b.energy_measured_kwh > 0
        assert t.energy_estimated_kwh + t.energy_measured_kwh == pytest.approx(t.energy_kwh)
        assert t.gpu_util_pct is not None and 0 < t.gpu_util_pct < 90
        assert t.idle_gpu_hours == pytest.approx(1.0) and t.idle_gpu_energy_kwh == pytest.approx(0.06)
        assert t.co2_embodied_kg > 0 and t.failed_energy_kwh > 0
        assert t.energy_kwh_with_pue == pytest.approx(t.energy_kwh * 1.3)
        # when to run: the finished batch jobs have figures (the running one and the one that never ran
        # do not), parts of their CO2; pausing saves at least what the best start does
        assert t.shift_co2_kg == pytest.approx(t.co2_kg) and b.shift_co2_kg < b.co2_kg
        assert 0 < t.shift_saved_kg <= t.shift_pause_saved_kg < t.shift_co2_kg


def test_days_after_the_watermark_and_no_watermark_come_from_jobs(engine: Engine, tmp_path: Path) -> None:
    url = _scenario(engine, tmp_path)
    with engine.begin() as c:  # as if the last aggregator run had started on day 2 at 06:00
        stmt = update(AggregatorState).where(AggregatorState.name == "jobs")
        c.execute(stmt.values(watermark=DAY0 + 2 * D + 6 * H))
    assert list(_check_all(url).values()) == [1, 0, 2, 3, 1, 0, 0]
    with connect(url) as db:
        fp = user_footprint(db, "alice", Window(*WINDOWS[0]))
        assert fp.source()["rollups_through"] == (DAY0 + 2 * D).isoformat()
        assert fp.source()["rollup_days"] == {
            "since": (DAY0 + D).isoformat(),
            "until": (DAY0 + 2 * D).isoformat(),
        }
    with engine.begin() as c:  # the aggregator never ran
        c.execute(text("DELETE FROM aggregator_state"))
    assert set(_check_all(url).values()) == {0}
    with connect(url) as db:
        assert user_footprint(db, "alice", Window(*WINDOWS[0])).source()["rollups_through"] is None


def test_which_source_is_read_rollups_for_covered_days_jobs_for_edges_and_from_jobs(
    engine: Engine, tmp_path: Path
) -> None:
    """Tamper with one rollup row: the rollup path moves by exactly that, the jobs path does not."""
    url = _scenario(engine, tmp_path)
    whole, inside = Window(*WINDOWS[2]), Window(*WINDOWS[1])  # day DAY0+1: whole in one, partial in other
    with connect(url) as db:
        before = {k: user_footprint(db, "alice", w) for k, w in (("whole", whole), ("inside", inside))}
        jobs_only = user_footprint(db, "alice", whole, from_jobs=True)
    with engine.begin() as c:
        rid = c.execute(
            select(func.min(DailyRollup.id)).where(
                DailyRollup.user_name == "alice", DailyRollup.day == DAY0 + D
            )
        ).scalar_one()
        assert rid is not None
        c.execute(
            text(
                "UPDATE daily_rollups SET energy_gpu_j = energy_gpu_j + 3.6e6,"
                " energy_estimated_j = energy_estimated_j + 3.6e6, co2_g = co2_g + 1000,"
                " co2_embodied_g = co2_embodied_g + 2000, jobs = jobs + 100 WHERE id = :i"
            ),
            {"i": rid},
        )
    with connect(url) as db:
        after = user_footprint(db, "alice", whole)
        b = before["whole"].totals
        assert after.totals.energy_kwh == pytest.approx(b.energy_kwh + 1.0)
        assert after.totals.energy_gpu_kwh == pytest.approx(b.energy_gpu_kwh + 1.0)
        assert after.totals.co2_kg == pytest.approx(b.co2_kg + 1.0)
        assert after.totals.co2_embodied_kg == pytest.approx(b.co2_embodied_kg + 2.0)
        assert after.totals.jobs == b.jobs  # distinct jobs always come from jobs (rollups count job-days)
        # a partial day is computed from jobs: the tampered row is not read
        assert asdict(user_footprint(db, "alice", inside).totals) == asdict(before["inside"].totals)
        # --from-jobs ignores the rollups
        assert asdict(user_footprint(db, "alice", whole, from_jobs=True).totals) == asdict(jobs_only.totals)


def test_plan_splits_whole_covered_days_from_the_edges() -> None:
    wm = DAY0 + 3 * D + 7 * H
    p = plan_window(Window(DAY0 + 5 * H, DAY0 + 5 * D + 2 * H), wm)
    assert (p.rollups_through, p.rollup_since, p.rollup_until) == (DAY0 + 3 * D, DAY0 + D, DAY0 + 3 * D)
    assert p.edges == [((DAY0 + 5 * H).timestamp(), (DAY0 + D).timestamp()),
                       ((DAY0 + 3 * D).timestamp(), (DAY0 + 5 * D + 2 * H).timestamp())]  # fmt: skip
    p = plan_window(Window(DAY0, DAY0 + 2 * D), wm)  # midnights at both ends: no edges
    assert p.rollup_days == 2 and p.edges == []
    p = plan_window(Window(DAY0 + H, DAY0 + 20 * H), wm)  # inside one day: all from jobs
    assert p.rollup_days == 0 and p.edges == [((DAY0 + H).timestamp(), (DAY0 + 20 * H).timestamp())]
    for p in (
        plan_window(Window(DAY0, DAY0 + 2 * D), None),
        plan_window(Window(DAY0, DAY0 + 2 * D), wm, from_jobs=True),
    ):
        assert (
            p.rollup_days == 0
            and p.rollups_through is None
            and p.edges == [(DAY0.timestamp(), (DAY0 + 2 * D).timestamp())]
        )
