"""The aggregator: carbon over a job's run, PUE by month, embodied CO2, GPU idling, daily rollups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, text

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.schema import CarbonIntensity, Cluster, DailyRollup, Sample
from tests.builders import config
from tests.builders import job as _job

DAY0 = datetime(2026, 10, 5, tzinfo=UTC)


# this file's cluster: France's grid, PUE 1.2 (its jobs: tests.builders.job's alice, in lab "lab", on n1)
_cfg = partial(config, cluster={"carbon_zone": "FR", "pue": 1.2})


def _series(engine: Engine, zone: str, start: datetime, values: list[float]) -> None:
    with engine.begin() as c:
        c.execute(
            insert(CarbonIntensity),
            [
                {"zone": zone, "ts_start": start + timedelta(hours=i), "ts_end": start + timedelta(hours=i + 1),
                 "g_per_kwh": v, "kind": "lifecycle", "source": "test series"}
                for i, v in enumerate(values)
            ],
        )  # fmt: skip


def _samples(engine: Engine, raw: int, start: datetime, per_10s: list[tuple[float, float]]) -> None:
    """GPU samples every 10 s: (power W, utilisation %)."""
    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "c")).scalar_one()
        rows = []
        for i, (p, u) in enumerate(per_10s):
            ts = start + timedelta(seconds=10 * i)
            base = {
                "ts": ts,
                "cluster_id": cid,
                "node": "n1",
                "source": "nvml",
                "device": "GPU-a",
                "job_id": str(raw),
            }
            rows += [{**base, "metric": "power_w", "value": p}, {**base, "metric": "util_pct", "value": u}]
        c.execute(insert(Sample), rows)


def _rollups(engine: Engine) -> list[tuple[Any, ...]]:
    cols = [c for c in DailyRollup.__table__.columns if c.name not in ("id", "computed_at")]
    with engine.connect() as c:
        rows = c.execute(select(*cols).order_by(*cols[:5])).all()
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in rows]


def _job_row(engine: Engine, raw: int) -> Any:
    with engine.connect() as c:
        return c.execute(
            text(
                "SELECT j.co2_g, j.carbon_g_per_kwh, j.carbon_source, j.carbon_flag, j.pue, j.energy_j,"
                " m.co2_embodied_g, m.gpu_util_pct, m.idle_gpu_s, m.idle_gpu_energy_j"
                " FROM jobs j JOIN job_metrics m ON m.job_pk = j.id WHERE j.job_id_raw = :r"
            ),
            {"r": raw},
        ).one()


def test_intensity_over_the_run_pue_by_month_and_embodied_apart(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url, "[cluster.pue_monthly]\n'2026-10' = 1.5\n[embodied]\ng_per_gpu_hour = 100\n")
    start = DAY0 + timedelta(hours=10)
    import_records(engine, [_job(1, start, 2.0)], cfg, source="sacct-json")
    _series(engine, "FR", DAY0, [50.0] * 10 + [40.0, 80.0] + [50.0] * 12)  # 10:00-12:00 -> 40 then 80
    run_aggregate(engine, cfg)
    co2, g, source, flag, pue, energy, embodied, util, _idle_s, _idle_j = _job_row(engine, 1)
    assert g == pytest.approx(60.0) and flag is None and "test series" in source
    assert pue == 1.5  # October's PUE, not the cluster's 1.2
    assert co2 == pytest.approx(energy / 3.6e6 * 1.5 * 60.0)
    assert embodied == pytest.approx(1 * 2.0 * 100)  # 1 GPU x 2 h, reported apart: not in co2_g
    assert util is None  # no samples: no utilisation claimed


def test_samples_weight_the_intensity_and_show_idle_gpus(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    start = DAY0 + timedelta(hours=10)
    import_records(engine, [_job(2, start, 2.0)], cfg, source="sacct-json")
    _series(engine, "FR", DAY0, [50.0] * 10 + [40.0, 80.0] + [50.0] * 12)
    # first hour idle at 60 W (util 0), second hour busy at 300 W (util 90): 360 samples each
    _samples(engine, 2, start, [(60.0, 0.0)] * 360 + [(300.0, 90.0)] * 360)
    run_aggregate(engine, cfg)
    _co2, g, _s, _f, _pue, _e, _emb, util, idle_s, idle_j = _job_row(engine, 2)
    assert g == pytest.approx((40 * 60 + 80 * 300) / 360)  # weighted by the GPU's energy per hour
    assert util == pytest.approx(90.0 * 300 / 360)  # energy-weighted: the busy hour dominates
    assert idle_s == pytest.approx(3600.0) and idle_j == pytest.approx(60.0 * 3600)
    (row,) = [r for r in _rollups(engine)]
    cols = [c.name for c in DailyRollup.__table__.columns if c.name not in ("id", "computed_at")]
    r = dict(zip(cols, row, strict=True))
    assert r["idle_gpu_hours"] == pytest.approx(1.0) and r["idle_gpu_energy_j"] == pytest.approx(216_000.0)


def test_gaps_fall_back_and_say_so(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url, "[carbon]\ngap_tolerance_s = 1800\n")
    import_records(engine, [_job(3, DAY0 + timedelta(days=3), 1.0)], cfg, source="sacct-json")
    _series(engine, "FR", DAY0, [50.0] * 24)  # the job is days after the series ends
    run_aggregate(engine, cfg)
    _co2, g, source, flag, *_ = _job_row(engine, 3)
    assert flag and "annual" in flag and source, (g, source, flag)


def _scenario(engine: Engine, cfg: Config) -> None:
    jobs = [
        _job(10, DAY0 + timedelta(hours=22), 5.0),  # across midnight: 2 h + 3 h
        _job(11, DAY0 + timedelta(hours=1), 1.0, user="bob", account="lab2", state="FAILED"),
        _job(12, DAY0 + timedelta(days=1, hours=3), 2.0, user="bob", account="lab2", state="CANCELLED by 5"),
        _job(13, DAY0 + timedelta(days=2), 0.0, state="TIMEOUT"),
        _job(14, DAY0 + timedelta(days=2, hours=5), 3.0, gpus=0),
    ]
    import_records(engine, jobs, cfg, source="sacct-json")


def test_days_add_up_to_the_jobs_and_states_are_counted(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    run_aggregate(engine, cfg)
    with engine.connect() as c:
        total = c.execute(text("SELECT sum(energy_j), sum(co2_g) FROM jobs")).one()
        days = c.execute(text("SELECT sum(energy_gpu_j + energy_cpu_j + energy_dram_j + energy_other_j),"
                              " sum(co2_g), sum(jobs_failed), sum(jobs_cancelled), sum(jobs_timeout),"
                              " sum(gpu_hours) FROM daily_rollups")).one()  # fmt: skip
        split = c.execute(
            text(
                "SELECT day, gpu_hours FROM daily_rollups WHERE user_name = 'alice' AND gpu_hours > 0 ORDER BY day"
            )
        ).all()
    assert days[0] == pytest.approx(total[0]) and days[1] == pytest.approx(total[1])
    assert tuple(days[2:5]) == (1, 1, 1)
    assert days[5] == pytest.approx(5.0 + 1 + 2)
    assert [round(h, 6) for _, h in split] == [2.0, 3.0]  # the midnight job, pro rata


@pytest.fixture
def no_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Incremental runs re-derive what changed up to MARGIN before the last run; tests that count say 0."""
    from cocaq.accounting import aggregate

    monkeypatch.setattr(aggregate, "MARGIN", timedelta(0))


def test_incremental_equals_full_recompute_and_reruns_change_nothing(
    engine: Engine, tmp_path: Path, no_margin: None
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url, "[embodied]\ng_per_node_hour = 10\n")
    _scenario(engine, cfg)
    _series(engine, "FR", DAY0, [float(30 + i % 7) for i in range(24 * 4)])
    run_aggregate(engine, cfg)
    first = _rollups(engine)
    assert run_aggregate(engine, cfg).jobs == 0 and _rollups(engine) == first
    # Later: a job's final record moves it (longer, another state), new jobs arrive, one in a new day.
    moved = _job(10, DAY0 + timedelta(hours=22), 30.0, state="FAILED")
    new = [
        _job(20, DAY0 + timedelta(days=3, hours=1), 2.0, user="carol"),
        _job(21, DAY0 + timedelta(hours=5), 1.0),
    ]
    import_records(engine, [moved, *new], cfg, source="sacct-json")
    res = run_aggregate(engine, cfg)
    assert res.jobs == 3
    incremental = _rollups(engine)
    assert incremental != first
    run_aggregate(engine, cfg, full=True)
    assert _rollups(engine) == incremental


def test_cocaq_aggregate_command(engine: Engine, tmp_path: Path, cli_env: dict[str, str]) -> None:
    from tests.conftest import run_cocaq

    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "c.toml"))
    r = run_cocaq(["aggregate"], env)
    assert r.code == 0 and "aggregated 5 jobs" in r.err, r.err
    r = run_cocaq(["aggregate", "--since", "2026-10-01"], env)
    assert r.code == 0 and "aggregated 5 jobs" in r.err and "rebuilt 3 days" in r.err, r.err
    r = run_cocaq(["aggregate", "--full", "--since", "3d"], env)
    assert r.code == 2 and "exclude each other" in r.err


def test_rollups_in_sql_equal_the_python_ones(engine: Engine, tmp_path: Path) -> None:
    """PostgreSQL rebuilds days in one SQL statement; it must give what the Python loop gives."""
    from cocaq.accounting import rollups

    if engine.dialect.name != "postgresql":
        pytest.skip("the SQL rollups are PostgreSQL's")
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url, "[embodied]\ng_per_node_hour = 10\ng_per_gpu_hour = 30\n")
    _scenario(engine, cfg)
    import_records(
        engine,
        [_job(30, DAY0 + timedelta(days=1, hours=20), 40.0, user="dave", gpus=2, state="OUT_OF_MEMORY"),
         _job(31, DAY0 + timedelta(days=1), 24.0, user="dave", account="lab2", state="NODE_FAIL")],
        cfg, source="sacct-json",
    )  # fmt: skip
    _series(engine, "FR", DAY0, [float(30 + i % 7) for i in range(24 * 5)])
    _samples(
        engine, 30, DAY0 + timedelta(days=1, hours=20), [(100.0 + i % 50, float(i % 30)) for i in range(900)]
    )
    run_aggregate(engine, cfg)
    in_sql = _rollups(engine)
    days = {DAY0.timestamp() + k * 86400.0 for k in range(-1, 6)}
    for pick in ({DAY0.timestamp() + 86400.0}, days):  # one day (jobs across its edges), then all
        with engine.begin() as c:
            rollups.rebuild_days(c, pick, in_sql=False)
        assert _rollups(engine) == in_sql
        for wide in (False, True):  # by index per job, and in one pass over job_energy
            with engine.begin() as c:
                rollups.rebuild_days(c, pick, in_sql=True, wide=wide)
            assert _rollups(engine) == in_sql
    assert len(in_sql) >= 8


def test_days_rebuilt_in_parallel_parts_equal_one_transaction(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full recompute rebuilds many days in parts on several connections at once (PostgreSQL): the
    rows must be those of one transaction, whatever the cut, and the watermark set after them."""
    import threading

    from cocaq.accounting import aggregate, rollups

    if engine.dialect.name != "postgresql":
        pytest.skip("the parallel rebuild is PostgreSQL's")
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    _series(engine, "FR", DAY0, [float(30 + i % 7) for i in range(24 * 5)])
    run_aggregate(engine, cfg, full=True)  # a few days: one transaction
    serial = _rollups(engine)
    assert len(serial) >= 5
    threads: list[str] = []
    real = rollups.rebuild_days

    def spy(conn: Any, days: set[float], **kw: Any) -> int:
        threads.append(threading.current_thread().name)
        return real(conn, days, **kw)

    monkeypatch.setattr(rollups, "rebuild_days", spy)
    monkeypatch.setattr(rollups, "PARALLEL_DAYS", 1)
    monkeypatch.setattr(aggregate, "PARALLEL_DAYS", 1)
    for workers in (2, 3):  # parts of two days and one, or one day each
        cfg = _cfg(tmp_path, url, f"[aggregate]\nworkers = {workers}\n")
        threads.clear()
        with engine.begin() as c:
            c.execute(text("UPDATE daily_rollups SET co2_g = -1"))  # stale rows the rebuild must fix
        res = run_aggregate(engine, cfg, full=True)
        assert _rollups(engine) == serial, workers
        assert res.rollup_rows == len(serial)
        assert res.days == 3 and len(threads) == workers, threads
        assert all(t.startswith("cocaq-rollups") for t in threads), threads
    with engine.connect() as c:
        wm = c.execute(text("SELECT watermark FROM aggregator_state WHERE name = 'jobs'")).scalar_one()
    assert wm is not None


def test_unchanged_metrics_are_not_rewritten_but_stale_ones_are(
    engine: Engine, tmp_path: Path, no_margin: None
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    _series(engine, "FR", DAY0, [40.0] * 96)
    run_aggregate(engine, cfg)
    q = text(
        "SELECT j.job_id_raw, m.computed_at FROM job_metrics m JOIN jobs j ON j.id = m.job_pk ORDER BY 1"
    )
    with engine.connect() as c:
        before = c.execute(q).all()
    assert len(before) == 5
    res = run_aggregate(engine, cfg, full=True)
    assert res.jobs == 5
    with engine.connect() as c:
        assert c.execute(q).all() == before  # same values, computed after the jobs' last change: kept
        # a job that changed after its metrics were computed gets them again even where they come out equal
        c.execute(
            text("UPDATE jobs SET updated_at = :t WHERE job_id_raw = 12"),
            {"t": datetime.now(UTC) + timedelta(seconds=1)},
        )
        c.commit()
    import time

    time.sleep(1.1)
    assert run_aggregate(engine, cfg).jobs == 1
    with engine.connect() as c:
        after = dict(c.execute(q).all())
    assert after[12] != dict(before)[12] and {k: v for k, v in after.items() if k != 12} == {
        k: v for k, v in before if k != 12
    }
    assert run_aggregate(engine, cfg).jobs == 0


def test_samples_in_one_pass_give_what_the_batches_give(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cocaq.accounting import aggregate

    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    _series(engine, "FR", DAY0, [float(30 + i % 7) for i in range(24 * 4)])
    _samples(engine, 10, DAY0 + timedelta(hours=22), [(100.0 + i % 50, float(i % 30)) for i in range(1500)])
    _samples(engine, 12, DAY0 + timedelta(days=1, hours=3), [(200.0, 50.0)] * 500)
    q = text(
        "SELECT j.job_id_raw, j.co2_g, j.carbon_g_per_kwh, m.gpu_util_pct, m.gpu_samples_s, m.idle_gpu_s,"
        " m.idle_gpu_energy_j FROM jobs j JOIN job_metrics m ON m.job_pk = j.id ORDER BY 1"
    )
    run_aggregate(engine, cfg)
    with engine.connect() as c:
        batched = c.execute(q).all()
    rollups = _rollups(engine)
    with engine.begin() as c:
        c.execute(text("DELETE FROM job_metrics"))
        c.execute(text("UPDATE jobs SET co2_g = 0"))
    monkeypatch.setattr(aggregate, "ONE_PASS", 0)
    run_aggregate(engine, cfg, full=True)
    with engine.connect() as c:
        assert c.execute(q).all() == batched
    assert _rollups(engine) == rollups
    assert any(r[3] is not None for r in batched)


def _ship(engine: Engine, batch: str, raw: int, start: datetime, per_10s: list[tuple[float, float]]) -> None:
    """GPU samples as the node collector ships them (collector.ship), with the batch's job ids recorded."""
    from collector.ship import connect

    target = connect(engine.url.render_as_string(hide_password=False))
    try:
        cid = target.cluster_id("c")
        rows = []
        for i, (p, u) in enumerate(per_10s):
            ts = (start + timedelta(seconds=10 * i)).timestamp()
            rows += [(2 * i, ts, "nvml", "GPU-a", "power_w", str(raw), p)]
            rows += [(2 * i + 1, ts, "nvml", "GPU-a", "util_pct", str(raw), u)]
        assert target.ship_samples(cid, "n1", batch, rows) == len(rows)
    finally:
        target.close()


def _metrics(engine: Engine) -> list[tuple[Any, ...]]:
    q = text(
        "SELECT j.job_id_raw, j.co2_g, j.carbon_g_per_kwh, m.gpu_util_pct, m.gpu_samples_s, m.idle_gpu_s,"
        " m.idle_gpu_energy_j FROM jobs j JOIN job_metrics m ON m.job_pk = j.id ORDER BY 1"
    )
    with engine.connect() as c:
        return [tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in c.execute(q)]


def test_late_samples_of_a_finished_job_are_picked_up(
    engine: Engine, tmp_path: Path, no_margin: None
) -> None:
    """A node that ships a finished job's samples late (it was down): the next hourly run uses them."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    _series(engine, "FR", DAY0, [float(30 + i % 7) for i in range(24 * 4)])
    run_aggregate(engine, cfg)
    assert dict((r[0], r[3]) for r in _metrics(engine))[10] is None  # no samples yet: no utilisation
    # job 10 (22:00 + 5 h) finished long ago; its node ships the first 2 h of samples now
    _ship(engine, "b1", 10, DAY0 + timedelta(hours=22), [(250.0, 80.0)] * 360 + [(50.0, 1.0)] * 360)
    res = run_aggregate(engine, cfg)
    assert res.jobs == 1 and res.gpu_hours_jobs == 1, res
    incremental, rollups = _metrics(engine), _rollups(engine)
    util = dict((r[0], r[3]) for r in incremental)[10]
    assert util == pytest.approx((80.0 * 250 + 1.0 * 50) / 300)
    assert run_aggregate(engine, cfg).jobs == 0  # seen once, not again
    # the same as deriving everything from the samples from scratch
    res = run_aggregate(engine, cfg, full=True, rescan_samples=True)
    assert res.gpu_hours_jobs == -1
    assert _metrics(engine) == incremental and _rollups(engine) == rollups


def test_full_recompute_keeps_gpu_hours_unless_their_parameters_change(
    engine: Engine, tmp_path: Path
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    _series(engine, "FR", DAY0, [float(30 + i % 7) for i in range(24 * 4)])
    _samples(engine, 10, DAY0 + timedelta(hours=22), [(100.0 + i % 50, float(i % 30)) for i in range(1500)])
    first = run_aggregate(engine, cfg)
    assert first.gpu_hours_jobs == -1 and first.gpu_hours_rows > 0  # never run: every job's samples
    metrics, rollups = _metrics(engine), _rollups(engine)
    res = run_aggregate(engine, cfg, full=True)
    assert res.gpu_hours_jobs == 0 and _metrics(engine) == metrics and _rollups(engine) == rollups
    # a new idle threshold changes what the samples say: every job's GPU hours are derived again
    cfg2 = _cfg(tmp_path, url, "[aggregate]\nidle_gpu_util_pct = 20\n")
    res = run_aggregate(engine, cfg2, full=True)
    assert res.gpu_hours_jobs == -1
    idle = {r[0]: r[5] for r in _metrics(engine)}
    assert idle[10] > {r[0]: r[5] for r in metrics}[10]
    assert _rollups(engine) != rollups
    with engine.connect() as c:
        params = c.execute(text("SELECT params FROM aggregator_state WHERE name = 'gpu_hours'")).scalar_one()
    assert "idle<20.0" in params


def test_a_change_committed_after_a_run_started_is_not_missed(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import whose transaction began before the last run (updated_at = its start) but committed
    after it: the next run looks MARGIN before the watermark and still derives it."""
    from cocaq.accounting import aggregate

    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    run_aggregate(engine, cfg)
    import_records(
        engine, [_job(10, DAY0 + timedelta(hours=22), 30.0, state="FAILED")], cfg, source="sacct-json"
    )
    with engine.begin() as c:
        wm = c.execute(text("SELECT watermark FROM aggregator_state WHERE name = 'jobs'")).scalar_one()
        wm = wm if isinstance(wm, datetime) else datetime.fromisoformat(wm)
        c.execute(
            text("UPDATE jobs SET updated_at = :t WHERE job_id_raw = 10"),
            {"t": (wm.replace(tzinfo=UTC) if wm.tzinfo is None else wm) - timedelta(minutes=3)},
        )
    with monkeypatch.context() as m:
        m.setattr(aggregate, "MARGIN", timedelta(0))
        assert run_aggregate(engine, cfg).jobs == 0  # without the margin it is missed
    stale = _rollups(engine)
    assert run_aggregate(engine, cfg).jobs >= 1
    caught_up = _rollups(engine)
    run_aggregate(engine, cfg, full=True)
    assert caught_up == _rollups(engine) != stale


def test_full_recompute_drops_rollups_of_deleted_jobs(engine: Engine, tmp_path: Path) -> None:
    """Rows only a deleted job made (in the middle of the range and at its end) go; the rest stay."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)
    import_records(engine, [_job(40, DAY0 + timedelta(days=9), 1.0, user="erin")], cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    before = _rollups(engine)
    with engine.begin() as c:
        c.execute(text("DELETE FROM jobs WHERE job_id_raw IN (12, 40)"))  # bob's day-1 job, erin's day 9
    run_aggregate(engine, cfg, full=True)
    after = _rollups(engine)
    assert {r[2] for r in before} == {"alice", "bob", "erin"} and {r[2] for r in after} == {"alice", "bob"}
    assert len(after) == len(before) - 2
    assert after == [r for r in before if r[2] != "erin" and not (r[2] == "bob" and r[1].day == 6)]


def test_many_jobs_derived_in_worker_processes_give_the_same(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL derives big runs in processes (spawned, each with its own connection): same rows."""
    from cocaq.accounting import aggregate

    if engine.dialect.name != "postgresql":
        pytest.skip("worker processes are for PostgreSQL")
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url, "[embodied]\ng_per_gpu_hour = 30\n[aggregate]\nworkers = 2\n")
    jobs = [
        _job(100 + i, DAY0 + timedelta(hours=i * 5), 1.0 + i % 7, user=f"u{i % 5}", gpus=i % 3)
        for i in range(60)
    ]
    import_records(engine, jobs, cfg, source="sacct-json")
    _series(engine, "FR", DAY0, [float(30 + i % 11) for i in range(24 * 20)])
    _samples(engine, 101, DAY0 + timedelta(hours=5), [(100.0 + i % 50, float(i % 30)) for i in range(700)])
    run_aggregate(engine, cfg)
    serial_metrics, serial_rollups = _metrics(engine), _rollups(engine)
    with engine.begin() as c:
        c.execute(text("DELETE FROM job_metrics"))
        c.execute(text("DELETE FROM daily_rollups"))
        c.execute(text("UPDATE jobs SET co2_g = 0"))
    monkeypatch.setattr(aggregate, "PARALLEL_MIN", 1)
    monkeypatch.setattr(aggregate, "BATCH", 7)  # 9 batches over 2 processes
    calls: list[int] = []
    real = aggregate._derive_in_processes

    def spy(*args: Any) -> Any:
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(aggregate, "_derive_in_processes", spy)
    res = run_aggregate(engine, cfg, full=True)
    assert calls == [2] and res.jobs == 60 and res.co2_changed == 60
    assert _metrics(engine) == serial_metrics and _rollups(engine) == serial_rollups


def test_new_samples_of_a_running_job_redo_only_the_hours_from_the_one_before(
    engine: Engine, tmp_path: Path, no_margin: None
) -> None:
    """Shipped hour by hour, a long job's older hours are not read again; the result is a full rescan's."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    _scenario(engine, cfg)  # job 10: 22:00 for 5 h
    _series(engine, "FR", DAY0, [float(30 + i % 7) for i in range(24 * 4)])
    start = DAY0 + timedelta(hours=22)
    run_aggregate(engine, cfg)
    _ship(engine, "b1", 10, start, [(200.0, 70.0)] * 720)  # 22:00-24:00
    run_aggregate(engine, cfg)
    h22 = int(start.timestamp() // 3600)
    with engine.begin() as c:  # mark the first hour: a run that reads it again would overwrite this
        c.execute(
            text("UPDATE job_gpu_hours SET energy_j = 1.0 WHERE job_id = '10' AND hour = :h"), {"h": h22}
        )
    _ship(engine, "b2", 10, start + timedelta(hours=2), [(100.0, 10.0)] * 720)  # 00:00-02:00
    res = run_aggregate(engine, cfg)
    assert res.gpu_hours_jobs == 1
    with engine.connect() as c:
        rows = dict(c.execute(text("SELECT hour, energy_j FROM job_gpu_hours WHERE job_id = '10'")).all())
    assert rows[h22] == 1.0  # not read again
    assert rows[h22 + 1] == pytest.approx(200.0 * 3600)  # the hour before the new samples: redone
    assert rows[h22 + 2] == pytest.approx(100.0 * 3600) and rows[h22 + 3] == pytest.approx(100.0 * 3600)
    run_aggregate(engine, cfg, full=True, rescan_samples=True)
    with engine.connect() as c:
        again = dict(c.execute(text("SELECT hour, energy_j FROM job_gpu_hours WHERE job_id = '10'")).all())
    assert again == {**rows, h22: pytest.approx(200.0 * 3600)}


def test_utilisation_of_a_node_measured_job_counts_in_the_days(engine: Engine, tmp_path: Path) -> None:
    """A job whose energy Slurm measured for the whole node still has GPU samples: the days average its
    utilisation, weighted by the GPU energy the samples saw, and its ledger takes the GPUs' share out of
    the node's measurement (cocaq.accounting.ledger.split_node)."""
    from dataclasses import replace as dc_replace

    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    start = DAY0 + timedelta(hours=10)
    measured = dc_replace(_job(50, start, 1.0), consumed_energy_j=2.0e6)
    estimated = _job(51, start, 1.0, user="alice")
    import_records(engine, [measured, estimated], cfg, source="sacct-json")
    _samples(engine, 50, start, [(300.0, 80.0)] * 360)  # 300 W at 80 % for the hour
    _samples(engine, 51, start + timedelta(seconds=5), [(100.0, 20.0)] * 360)  # 100 W at 20 % (its own GPU)
    run_aggregate(engine, cfg)
    with engine.connect() as c:
        comps = dict(c.execute(text("SELECT j.job_id_raw, count(*) FILTER (WHERE e.component = 'gpu') FROM jobs j"
                                    " JOIN job_energy e ON e.job_pk = j.id GROUP BY 1")).all())  # fmt: skip
        w, e = c.execute(
            text("SELECT sum(gpu_util_weighted), sum(gpu_util_energy_j) FROM daily_rollups")
        ).one()
        rows = dict(
            c.execute(
                text("SELECT e.source, e.energy_j FROM job_energy e JOIN jobs j ON j.id = e.job_pk"
                     " WHERE j.job_id_raw = 50")
            ).all()
        )  # fmt: skip
        total = c.execute(text("SELECT energy_j FROM jobs WHERE job_id_raw = 50")).scalar_one()
    assert comps[50] == 1 and comps[51] == 1  # node-measured: its GPU share from the samples
    # 300 W for the hour from the samples (less the last sample's spacing the collector step stands for)
    assert rows["nvml-samples"] == pytest.approx(300.0 * 3600, rel=0.01)
    assert rows["nvml-samples"] + rows["slurm-consumed-energy"] == pytest.approx(2.0e6) == total
    assert e == pytest.approx((300.0 + 100.0) * 3600)
    assert w / e == pytest.approx((80.0 * 300 + 20.0 * 100) / 400)  # 65 %, not 20 % (the estimated one alone)


def test_a_reimported_node_measurement_is_split_again_never_counted_twice(
    engine: Engine, tmp_path: Path
) -> None:
    """Slurm's figure for a job can change (a requeue, a late accounting update): the import replaces it
    and drops the GPU split derived from the old one, so the ledger never holds the old split beside the
    new total, and the next aggregation splits the new figure."""
    from dataclasses import replace as dc_replace

    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    start = DAY0 + timedelta(hours=10)
    job = dc_replace(_job(60, start, 1.0), consumed_energy_j=2.0e6)
    import_records(engine, [job], cfg, source="sacct-json")
    _samples(engine, 60, start, [(300.0, 80.0)] * 360)
    run_aggregate(engine, cfg)

    def ledger() -> tuple[dict[str, float], float]:
        with engine.connect() as c:
            rows = dict(
                c.execute(
                    text("SELECT e.source, sum(e.energy_j) FROM job_energy e JOIN jobs j ON j.id = e.job_pk"
                         " WHERE j.job_id_raw = 60 GROUP BY 1")
                ).all()
            )  # fmt: skip
            return rows, c.execute(text("SELECT energy_j FROM jobs WHERE job_id_raw = 60")).scalar_one()

    rows, _ = ledger()
    assert set(rows) == {"nvml-samples", "slurm-consumed-energy"}
    import_records(engine, [dc_replace(job, consumed_energy_j=3.0e6)], cfg, source="sacct-json")
    rows, total = ledger()
    assert sum(rows.values()) == pytest.approx(3.0e6) == total  # not 3.0e6 + the old 1.08e6 split
    run_aggregate(engine, cfg)
    rows, total = ledger()
    assert rows["nvml-samples"] == pytest.approx(300.0 * 3600, rel=0.01)
    assert sum(rows.values()) == pytest.approx(3.0e6) == total
    before = _rollups(engine)
    run_aggregate(engine, cfg)
    assert ledger()[0] == rows and _rollups(engine) == before


def test_a_split_whose_samples_are_gone_gives_the_node_its_whole_measurement_again(
    engine: Engine, tmp_path: Path
) -> None:
    """Samples expire (retention) or are deleted: a recompute that finds none for a split job puts the
    node's measurement back whole, as the import wrote it (the job's total never changes)."""
    from dataclasses import replace as dc_replace

    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    start = DAY0 + timedelta(hours=10)
    import_records(
        engine, [dc_replace(_job(70, start, 1.0), consumed_energy_j=2.0e6)], cfg, source="sacct-json"
    )
    _samples(engine, 70, start, [(300.0, 80.0)] * 360)
    run_aggregate(engine, cfg)

    def ledger() -> dict[str, float]:
        with engine.connect() as c:
            return dict(
                c.execute(
                    text("SELECT e.source, e.energy_j FROM job_energy e JOIN jobs j ON j.id = e.job_pk"
                         " WHERE j.job_id_raw = 70")
                ).all()
            )  # fmt: skip

    assert set(ledger()) == {"nvml-samples", "slurm-consumed-energy"}
    with engine.begin() as c:
        c.execute(text("DELETE FROM samples WHERE job_id = '70'"))
    run_aggregate(engine, cfg, full=True, rescan_samples=True)
    assert ledger() == {"slurm-consumed-energy": pytest.approx(2.0e6)}
