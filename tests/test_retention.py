"""The samples' lifecycle (cocaq.accounting.retention): old raw samples go, only once summarised; the
summaries, and what a later aggregate makes of them, stay. On PostgreSQL whole monthly partitions are
dropped; on SQLite rows are deleted. Real databases, samples shipped as the collector ships them."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.accounting.retention import run_retention
from cocaq.config import Config
from cocaq.db.partitions import ensure_sample_partitions, month_add
from tests.builders import config
from tests.builders import job as _job
from tests.conftest import run_cocaq

NOW = datetime.now(UTC)
THIS_MONTH = month_add(NOW, 0)
OLD = month_add(NOW, -4)  # two old months, each wholly older than 35 days
OLDER = month_add(NOW, -5)


def _cfg(tmp_path: Path, engine: Engine, **retention: Any) -> Config:
    url = engine.url.render_as_string(hide_password=False)
    return config(tmp_path, url, cluster={"carbon_zone": "FR"}, retention=retention or None)


def _q(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as c:
        return c.execute(text(sql), params).scalar()


def _ship(engine: Engine, batch: str, raw: int, start: datetime, minutes: int, node: str = "n1") -> None:
    """A job's GPU samples every 10 s (power, utilisation), shipped as the collector ships them."""
    from collector.ship import connect

    target = connect(engine.url.render_as_string(hide_password=False))
    try:
        cid = target.cluster_id("c")
        rows = []
        for i in range(minutes * 6):
            ts = (start + timedelta(seconds=10 * i)).timestamp()
            p, u = (300.0, 90.0) if i % 4 else (60.0, 2.0)
            rows += [(2 * i, ts, "nvml", "GPU-a", "power_w", str(raw), p)]
            rows += [(2 * i + 1, ts, "nvml", "GPU-a", "util_pct", str(raw), u)]
        assert target.ship_samples(cid, node, batch, rows) == len(rows)
    finally:
        target.close()


def _shipped_at(engine: Engine, batch: str, when: datetime) -> None:
    """The batch went in `when` (it was shipped then, minutes after its samples)."""
    with engine.begin() as c:
        c.execute(text("UPDATE node_shipments SET shipped_at = :t WHERE batch = :b"), {"t": when, "b": batch})


def _summaries(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Everything derived per job, hour and day: what must not change when raw samples go."""
    queries = {
        "jobs": "SELECT job_id_raw, energy_j, energy_measured_j, co2_g FROM jobs",
        "job_energy": "SELECT job_pk, component, source, energy_j FROM job_energy",
        "job_metrics": "SELECT job_pk, gpu_util_pct, gpu_samples_s, idle_gpu_s, idle_gpu_energy_j,"
        " gpu_samples_j FROM job_metrics",
        "job_gpu_hours": "SELECT job_id, hour, energy_j, util_energy, seconds, idle_s, idle_j FROM job_gpu_hours",
        "daily_rollups": "SELECT day, user_name, energy_gpu_j, energy_other_j, co2_g, gpu_util_energy_j,"
        " idle_gpu_energy_j FROM daily_rollups",
    }
    out = {}
    with engine.connect() as c:
        for name, sql in queries.items():
            rows = c.execute(text(sql)).all()
            out[name] = sorted(tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in rows)
    return out


def _site(engine: Engine, tmp_path: Path) -> Config:
    """Job 10 ran in an old month, job 20 a few hours ago; both node-measured (Slurm's energy, split by
    their GPU samples), both sampled and shipped, and aggregated once."""
    if engine.dialect.name == "postgresql":
        ensure_sample_partitions(engine, OLDER, months_ahead=1)  # (the months before `db upgrade`)
    cfg = _cfg(tmp_path, engine)
    old_start = OLD + timedelta(days=9, hours=10)
    recent_start = NOW - timedelta(hours=3)
    jobs = [
        replace(_job(10, old_start, 2.0), consumed_energy_j=3.0e6),
        replace(_job(20, recent_start, 1.0), consumed_energy_j=1.5e6),
    ]
    import_records(engine, jobs, cfg, source="sacct-json")
    _ship(engine, "old", 10, old_start, 120)
    _shipped_at(engine, "old", old_start + timedelta(hours=2, minutes=1))
    _ship(engine, "recent", 20, recent_start, 60)
    _shipped_at(engine, "recent", recent_start + timedelta(hours=1, minutes=1))
    run_aggregate(engine, cfg)
    return cfg


def _partition_exists(engine: Engine, month: datetime) -> bool:
    name = f"samples_p{month:%Y%m}"
    there = _q(engine, "SELECT to_regclass(:n) IS NOT NULL", n=name)
    attached = _q(
        engine,
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'samples'::regclass AND inhrelid = to_regclass(:n)",
        n=name,
    )
    assert bool(there) == bool(attached), name
    return bool(there)


def _samples_of(engine: Engine, raw: int) -> int:
    return int(_q(engine, "SELECT count(*) FROM samples WHERE job_id = :j", j=str(raw)))


def test_old_samples_go_once_summarised_and_the_summaries_stay(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    cfg = _site(engine, tmp_path)
    pg = engine.dialect.name == "postgresql"
    before = _summaries(engine)
    assert before["job_gpu_hours"] and any(r[2] == "nvml-samples" for r in before["job_energy"])
    assert _samples_of(engine, 10) == 1440 and _samples_of(engine, 20) == 720
    shipments = int(_q(engine, "SELECT count(*) FROM node_shipments"))

    # --dry-run lists what would go and changes nothing
    dry = run_retention(engine, cfg, dry_run=True)
    if pg:
        assert [(m.month, m.action) for m in dry.months] == [
            (f"{OLDER:%Y-%m}", "drop"),
            (f"{OLD:%Y-%m}", "drop"),
        ]
        assert _partition_exists(engine, OLD) and _partition_exists(engine, OLDER)
    else:
        assert dry.deleted == 1440 and dry.deleted_before is not None
    assert dry.shipments == 1  # the old batch's row in the shipping log
    assert _samples_of(engine, 10) == 1440 and _q(engine, "SELECT count(*) FROM node_shipments") == shipments
    assert _q(engine, "SELECT count(*) FROM aggregator_state WHERE name = 'samples_from'") == 0

    res = run_retention(engine, cfg)
    assert _samples_of(engine, 10) == 0 and _samples_of(engine, 20) == 720
    if pg:
        assert not _partition_exists(engine, OLD) and not _partition_exists(engine, OLDER)
        assert _partition_exists(engine, THIS_MONTH) and _partition_exists(engine, month_add(NOW, 2))
        assert [m.action for m in res.months] == ["dropped", "dropped"]
        assert _q(engine, "SELECT count(*) FROM samples_default") == 0
    else:
        assert res.deleted == 1440
    assert res.shipments == 1 and _q(engine, "SELECT count(*) FROM node_shipments") == shipments - 1
    assert _summaries(engine) == before
    assert run_retention(engine, cfg).line().count("no month" if pg else "deleted 0 rows") == 1  # idempotent

    # the aggregator after the drop, through the command line, even re-reading every sample: the
    # finished job's energy, its GPU hours and its days are what they were
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "c.toml"))
    for args in (["aggregate"], ["aggregate", "--full", "--rescan-samples"]):
        r = run_cocaq(args, env)
        assert r.code == 0, r.err
        assert _summaries(engine) == before, args


def test_a_month_with_samples_not_yet_aggregated_is_kept_and_says_why(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _site(engine, tmp_path)
    pg = engine.dialect.name == "postgresql"
    # a node that was down ships job 30's samples of the older month now, after the aggregator's run
    start = OLDER + timedelta(days=3, hours=5)
    import_records(engine, [replace(_job(30, start, 1.0), consumed_energy_j=1.0e6)], cfg, source="sacct-json")
    _ship(engine, "late", 30, start, 60, node="n7")
    with caplog.at_level("WARNING", logger="cocaq.accounting.retention"):
        res = run_retention(engine, cfg)
    assert "not aggregated yet" in res.line() and "job 30 on n7" in res.line()
    assert any("job 30 on n7" in r.getMessage() for r in caplog.records)
    assert _samples_of(engine, 30) == 720  # kept, and everything after it
    assert _samples_of(engine, 10) == 1440
    if pg:
        assert [m.action for m in res.months] == ["keep", "keep"]
        assert _partition_exists(engine, OLDER) and _partition_exists(engine, OLD)
    else:
        assert res.deleted == 0
    # once aggregated, they go
    run_aggregate(engine, cfg)
    _shipped_at(engine, "late", start + timedelta(hours=1, minutes=1))  # (outside the aggregator's margin)
    summaries = _summaries(engine)
    assert any(r[0] == "30" for r in summaries["job_gpu_hours"])
    res = run_retention(engine, cfg)
    assert _samples_of(engine, 30) == 0 and _samples_of(engine, 10) == 0
    if pg:
        assert not _partition_exists(engine, OLDER)
    assert _summaries(engine) == summaries


def test_nothing_goes_before_the_aggregator_first_ran(engine: Engine, tmp_path: Path) -> None:
    if engine.dialect.name == "postgresql":
        ensure_sample_partitions(engine, OLD, months_ahead=0)
    cfg = _cfg(tmp_path, engine)
    start = OLD + timedelta(days=2)
    import_records(engine, [_job(40, start, 1.0)], cfg, source="sacct-json")
    _ship(engine, "b", 40, start, 30)
    _shipped_at(engine, "b", start + timedelta(hours=1))
    res = run_retention(engine, cfg)
    assert "the aggregator has not summarised any samples yet" in res.line()
    assert _samples_of(engine, 40) == 360 and res.shipments == 0


def test_kept_for_ever_with_zero_and_a_bad_setting_is_one_line(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    cfg = _site(engine, tmp_path)
    cfg0 = _cfg(tmp_path, engine, samples_days=0)
    res = run_retention(engine, cfg0)
    assert res.cutoff is None and res.line().startswith(
        "samples kept for ever ([retention] samples_days = 0)"
    )
    assert _samples_of(engine, 10) == 1440
    # a setting that keeps the old month too: it stays
    res = run_retention(engine, _cfg(tmp_path, engine, samples_days=400))
    assert _samples_of(engine, 10) == 1440 and res.shipments == 0
    assert cfg.retention.samples_days == 35  # the default
    url = engine.url.render_as_string(hide_password=False)
    for bad in ("-1", "1.5", "soon", "99999"):
        r = run_cocaq(
            ["db", "retention", "--dry-run"],
            dict(cli_env, COCAQ_DATABASE_URL=url, COCAQ_RETENTION__SAMPLES_DAYS=bad),
        )
        assert r.code != 0 and "Traceback" not in r.err, r.err
        assert r.err.strip().count("\n") == 0 and "retention.samples_days" in r.err, r.err


def test_postgres_makes_the_coming_months_and_moves_what_went_to_the_default(
    engine: Engine, tmp_path: Path
) -> None:
    """Months nobody made in time: their rows went to samples_default; retention makes the partition and
    moves them into it (CREATE ... PARTITION OF would fail while the default holds them)."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no partitions")
    cfg = _site(engine, tmp_path)
    nxt = month_add(NOW, 1)
    with engine.begin() as c:
        c.execute(text(f"ALTER TABLE samples DETACH PARTITION samples_p{nxt:%Y%m}"))
        c.execute(text(f"DROP TABLE samples_p{nxt:%Y%m}"))
    _ship(engine, "ahead", 50, nxt + timedelta(days=1), 10)  # a node whose clock is a month ahead
    assert _q(engine, "SELECT count(*) FROM samples_default") == 120
    dry = run_retention(engine, cfg, dry_run=True)
    assert dry.created == [f"samples_p{nxt:%Y%m}"] and not _partition_exists(engine, nxt)
    res = run_retention(engine, cfg)
    assert res.created == [f"samples_p{nxt:%Y%m}"] and _partition_exists(engine, nxt)
    assert _q(engine, "SELECT count(*) FROM samples_default") == 0
    assert _q(engine, f"SELECT count(*) FROM samples_p{nxt:%Y%m}") == 120
    assert _q(engine, "SELECT count(*) FROM samples WHERE job_id = '50'") == 120


def test_the_scheduler_runs_it_daily_and_records_it(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cocaq.cli.scheduler import JOB_IDS as CLI_JOB_IDS
    from cocaq.scheduler import jobs as sch_jobs

    spec = {s.id: s for s in sch_jobs.job_specs(sch_jobs.Options(), UTC)}["retention"]
    assert str(spec.trigger) == "cron[hour='3', minute='40']" and spec.grace_s == 86400
    assert "retention" in sch_jobs.JOB_IDS and CLI_JOB_IDS == sch_jobs.JOB_IDS
    _site(engine, tmp_path)
    for k in list(os.environ):
        if k.startswith("COCAQ_") and not k.startswith("COCAQ_TEST_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("COCAQ_CONFIG", str(tmp_path / "c.toml"))
    res = sch_jobs.run_once("retention", sch_jobs.Options())
    assert res.status == "ok" and res.summary.startswith("retention: samples older than 35 days"), res.summary
    assert _samples_of(engine, 10) == 0 and _samples_of(engine, 20) == 720
    with engine.connect() as c:
        runs = c.execute(
            text("SELECT status, summary, via FROM scheduler_runs WHERE job_id = 'retention'")
        ).all()
    assert [(r.status, r.via) for r in runs] == [("ok", "once")] and runs[0].summary == res.summary


def test_db_status_shows_tables_months_and_the_setting_in_60_columns(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    _site(engine, tmp_path)
    pg = engine.dialect.name == "postgresql"
    if pg:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("ANALYZE"))
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "c.toml"), COLUMNS="60")
    r = run_cocaq(["db", "status"], env)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert max(len(line) for line in lines) <= 60, "\n".join(x for x in lines if len(x) > 60)
    lines = [line.replace("│", " ") for line in lines]  # (rich's column rules)
    hours = f"{_q(engine, 'SELECT count(*) FROM job_gpu_hours'):,}"
    assert any(line.split()[:2] == ["samples", "2,160"] for line in lines), r.out
    assert any(line.split()[:2] == ["job_gpu_hours", hours] for line in lines), r.out
    words = " ".join(r.out.split())
    assert "kept 35 days ([retention] samples_days)" in words and "No samples dropped yet." in words
    if pg:
        assert any(line.split()[:3] == [f"samples_p{OLD:%Y%m}", f"{OLD:%Y-%m}", "1,440"] for line in lines), (
            r.out
        )
    r = run_cocaq(["db", "status", "--format", "json"], env)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    tables = {t["name"]: t for t in doc["tables"]}
    assert tables["samples"]["rows"] == 2160 and tables["samples"]["estimated"] is pg
    assert doc["retention"]["samples_days"] == 35 and doc["retention"]["samples_from"] is None
    if pg:
        months = {p["month"]: p for p in doc["samples_partitions"]}
        assert months[f"{OLD:%Y-%m}"]["rows"] == 1440 and months[f"{OLD:%Y-%m}"]["due"] is True
        assert months[f"{THIS_MONTH:%Y-%m}"]["due"] is False and months["default"]["rows"] == 0
        assert all(t["bytes"] > 0 for t in doc["tables"] if t["name"] in ("samples", "jobs"))
    else:
        assert doc["file_bytes"] == doc["total_bytes"] > 0 and doc["samples_partitions"] == []
    # after retention: the old month gone, the horizon shown
    r = run_cocaq(["db", "retention"], env)
    assert r.code == 0, r.err
    doc = json.loads(run_cocaq(["db", "status", "--format", "json"], env).out)
    assert doc["retention"]["samples_from"] is not None
    assert f"{OLD:%Y-%m}" not in {p["month"] for p in doc["samples_partitions"]}
