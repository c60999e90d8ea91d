"""Memory use (sacct's MaxRSS) is imported with every job, on every write path and both databases."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select

from cocaq.accounting import importer
from cocaq.accounting.estimate import Estimator
from cocaq.accounting.importer import JOB_COLUMNS, ImportSummary, import_records
from cocaq.accounting.recompute import recompute_jobs
from cocaq.config import Config
from cocaq.db.schema import Job
from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import SACCT_FIELDS, ParseStats, iter_parsable
from tests.builders import default_config

T0 = datetime(2026, 11, 10, 10, tzinfo=UTC)
JOB = (
    "100|100|train|alice|1001|lab_nlp|gpu|normal|gpu[01-02]|2|16|cpu=16,gres/gpu=8,mem=512G,node=2|"
    "cpu=16,gres/gpu=8,mem=512G,node=2|512G|2026-11-10T10:00:00|2026-11-10T10:00:00|2026-11-10T20:00:00|"
    "10:00:00|36000|COMPLETED|0:0|2-00:00:00|||c1|1-00:00:00|||||||"
)
# The steps: JobID|MaxRSS|NTasks|NNodes, the rest as on the job line.
STEPS = (("100.extern", "1000K", "2", "2"), ("100.batch", "350M", "1", "1"), ("100.0", "{rss}", "8", "2"))


def cfg() -> Config:
    return default_config(name="c1", carbon_zone="FRA")


def dump(rss: str = "30G") -> list[bytes]:
    cols = SACCT_FIELDS.split(",")
    job = dict(zip(cols, JOB.split("|"), strict=True))
    lines = ["|".join(cols), JOB]
    for jid, step_rss, ntasks, nnodes in STEPS:
        step = {**job, "JobID": jid, "JobIDRaw": jid, "MaxRSS": step_rss.format(rss=rss)}
        step.update(NTasks=ntasks, NNodes=nnodes, User="", TotalCPU="01:00:00")
        lines.append("|".join(step[c] for c in cols))
    return [(x + "\n").encode() for x in lines]


def _generic(engine: Engine, records: Iterable[JobRecord], c: Config) -> ImportSummary:
    return importer._import_generic(
        engine, records, c, source="sacct-parsable", batch_size=100, on_batch=None
    )


def _default(engine: Engine, records: Iterable[JobRecord], c: Config) -> ImportSummary:
    return import_records(engine, records, c, source="sacct-parsable", batch_size=100)


@pytest.fixture(params=["default", "pg-slow-row", "generic"])
def write(request: pytest.FixtureRequest, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Callable:
    """Each write path: PostgreSQL's COPY with the fast row and with job_row(), and the portable one."""
    pg = engine.dialect.name == "postgresql"
    if request.param == "pg-slow-row":
        if not pg:
            pytest.skip("SQLite has no COPY path")
        monkeypatch.setattr(importer, "_PG_FAST", False)
    if request.param == "generic" and not pg:
        pytest.skip("SQLite's default path is the generic one")
    return _generic if request.param == "generic" else _default


def rows(engine: Engine) -> dict[str, tuple[float | None, int | None]]:
    with engine.connect() as conn:
        q = select(Job.job_id, Job.max_rss_mb, Job.rss_tasks_per_node)
        return {jid: (rss, tpn) for jid, rss, tpn in conn.execute(q)}


def parsed(lines: list[bytes]) -> Iterable[JobRecord]:
    return iter_parsable(lines, tz=UTC, stats=ParseStats())


def test_the_fast_row_knows_every_column() -> None:
    assert importer._PG_FAST
    assert {"max_rss_mb", "rss_tasks_per_node"} <= set(importer._PG_COLS)


def test_fast_row_and_job_row_agree() -> None:
    rec = record(1, max_rss_mb=1234.5, rss_tasks_per_node=4)
    est = Estimator(cfg())
    v = est.values(rec)
    fast = dict(
        zip(importer._PG_COLS, importer._pg_row(rec, v, "sacct", est.assumptions_json, 0), strict=True)
    )
    slow = dict(zip(JOB_COLUMNS, importer._slow_row(rec, v, "sacct", est.assumptions_json, 0), strict=True))
    assert fast.pop("cluster_id") is None and slow.pop("cluster_id") == 0
    assert fast == slow
    assert (fast["max_rss_mb"], fast["rss_tasks_per_node"]) == (1234.5, 4)
    other = importer._pg_row(replace(rec, max_rss_mb=1234.0), v, "sacct", est.assumptions_json, 0)
    assert other[-1] != fast["record_hash"]  # the hash sees MaxRSS


def test_written_on_insert_and_updated_when_max_rss_changes(engine: Engine, write: Callable) -> None:
    s = write(engine, parsed(dump("30G")), cfg())
    assert (s.inserted, s.updated) == (1, 0)
    assert rows(engine) == {"100": (30720.0, 4)}  # 30 GB per task, 8 tasks on 2 nodes
    s = write(engine, parsed(dump("30G")), cfg())
    assert (s.inserted, s.updated, s.unchanged) == (0, 0, 1)
    s = write(engine, parsed(dump("40G")), cfg())  # a later capture: the job used more
    assert (s.inserted, s.updated, s.unchanged) == (0, 1, 0)
    assert rows(engine) == {"100": (40960.0, 4)}
    s = write(engine, parsed(dump("")), cfg())  # the .0 step lost its value: the batch step's is next
    assert s.updated == 1
    assert rows(engine) == {"100": (350.0, 1)}


def record(i: int, **kw: object) -> JobRecord:
    rec = JobRecord(
        job_id=str(1000 + i),
        user_name="bob",
        submit_time=T0,
        state="COMPLETED",
        cluster="c1",
        partition="cpu",
        node_list="cpu01",
        n_nodes=1,
        alloc_cpus=4,
        req_mem_mb=8192.0,
        start_time=T0,
        end_time=T0 + timedelta(hours=1),
        elapsed_s=3600.0,
        total_cpu_s=7200.0,
    )
    return replace(rec, **kw)  # type: ignore[arg-type]


# (max_rss_mb, rss_tasks_per_node) as some record carries them -> what the columns get
BAD = [
    ((float("inf"), 2), (None, 2)),
    ((float("nan"), 2), (None, 2)),
    ((-1.0, 2), (None, 2)),
    ((10**400, 2), (None, 2)),
    ((100.0, 2**40), (100.0, None)),  # beyond PostgreSQL's int4
    ((100.0, 2**31), (100.0, None)),
    ((100.0, -3), (100.0, None)),
    ((100.0, 0), (100.0, None)),
    ((100.0, 2.0), (100.0, None)),
    (("12G", "4"), (None, None)),
]


def test_out_of_range_values_never_abort_the_batch(engine: Engine, write: Callable) -> None:
    good = record(0, max_rss_mb=2048.0, rss_tasks_per_node=2**31 - 1)
    bad = [record(i, max_rss_mb=rss, rss_tasks_per_node=tpn) for i, ((rss, tpn), _) in enumerate(BAD, 1)]
    batch = [good, *bad]
    s = write(engine, [replace(r) for r in batch], cfg())
    assert s.inserted == len(batch)
    got = rows(engine)
    assert got["1000"] == (2048.0, 2**31 - 1)
    assert [got[str(1000 + i)] for i in range(1, len(BAD) + 1)] == [want for _, want in BAD]
    # What was dropped was dropped before hashing: the same records again change nothing.
    s = write(engine, [replace(r) for r in batch], cfg())
    assert (s.inserted, s.updated, s.unchanged) == (0, 0, len(batch))


def test_recompute_keeps_the_memory_columns(engine: Engine) -> None:
    import_records(engine, parsed(dump("30G")), cfg(), source="sacct-parsable")
    c = cfg()
    n, changed = recompute_jobs(engine, replace(c, cluster=replace(c.cluster, pue=2.0)))
    assert (n, changed) == (1, 1)
    assert rows(engine) == {"100": (30720.0, 4)}
    assert recompute_jobs(engine, replace(c, cluster=replace(c.cluster, pue=2.0))) == (1, 0)


def test_json_steps_import(engine: Engine) -> None:
    from cocaq.slurm.sacct import iter_json

    start = int(T0.timestamp())
    step = {
        "step": {"name": "0"},
        "tasks": {"count": 4},
        "nodes": {"count": 1, "list": ["gpu01"]},
        "tres": {"requested": {"max": [{"type": "mem", "name": "", "id": 2, "count": 5 * 1024**3}]}},
    }
    job = {
        "job_id": 77,
        "user": "alice",
        "nodes": "gpu01",
        "state": {"current": ["COMPLETED"]},
        "time": {"elapsed": 60, "start": start, "end": start + 60, "submission": start},
        "tres": {"allocated": [{"type": "cpu", "name": "", "id": 1, "count": 4}]},
        "steps": [step],
    }
    s = import_records(engine, iter_json(json.dumps({"jobs": [job]})), cfg(), source="sacct-json")
    assert s.inserted == 1
    assert rows(engine) == {"77": (5120.0, 4)}
