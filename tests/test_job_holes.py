"""Holes in real sacct output (issue 31), read by `cocaq job`, `cocaq user` and the job e-mail: a running
job's TotalCPU and MaxRSS are partial (Slurm adds a step's when it ends), a TotalCPU Slurm did not gather is
unknown (not 0% busy), and a job without GPUs has no GPU power.

Hand-written sacct lines (parsable2 with a header), imported with `cocaq import sacct --file` and read
back through the real CLI on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import run_cocaq

CONFIG = """
[cluster]
name = "hal"
carbon_zone = "FRA"
pue = 1.2
timezone = "UTC"
[partitions.cpu]
cpu_tdp_w_per_core = 10
gpu_tdp_w = 400
"""

HEADER = (
    "JobID|JobIDRaw|JobName|User|UID|Account|Partition|QOS|NodeList|NNodes|AllocCPUS|AllocTRES|ReqMem|Submit|"
    "Start|End|ElapsedRaw|State|ExitCode|TotalCPU|Comment|ConsumedEnergyRaw|Cluster|Timelimit|MaxRSS|NTasks"
)


def _t(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%S")


def dump(now: datetime) -> str:
    """500: dave's job, running 20 h of 48 h on 32 cores and 512 GB, its first step ended (5 min of CPU,
    2 GB). 600: erin's 448 cores (4 nodes) for 120 h, COMPLETED with TotalCPU 00:00:00 that Slurm did
    not gather (the import stores it as unknown, None). 700: gus's CPU-only job, 8 cores for 2 h,
    estimated."""
    r0 = now - timedelta(hours=20)
    b0, b1 = now - timedelta(days=6), now - timedelta(days=1)
    c0, c1 = now - timedelta(days=2, hours=2), now - timedelta(days=2)
    rows = [
        f"500|500|train|dave|1001|lab_a|cpu|normal|c01|1|32|cpu=32,mem=512G,node=1|512G|{_t(r0)}|{_t(r0)}|"
        f"Unknown|72000|RUNNING|0:0|00:05:00|||hal|2-00:00:00||",
        f"500.batch|500.batch|batch||1001|lab_a||||1|32|cpu=32,mem=512G,node=1||{_t(r0)}|{_t(r0)}|Unknown|"
        "72000|RUNNING|0:0|00:00:00||||||1",
        f"500.0|500.0|prep||1001|lab_a||||1|32|cpu=32,mem=512G,node=1||{_t(r0)}|{_t(r0)}|"
        f"{_t(r0 + timedelta(hours=1))}|3600|COMPLETED|0:0|00:05:00|||||2G|1",
        f"600|600|sim|erin|1002|lab_b|cpu|normal|c[01-04]|4|448|cpu=448,mem=2000G,node=4|2000G|{_t(b0)}|"
        f"{_t(b0)}|{_t(b1)}|432000|COMPLETED|0:0|00:00:00|||hal|5-00:00:00||",
        f"600.batch|600.batch|batch||1002|lab_b||||1|112|cpu=112,mem=500G,node=1||{_t(b0)}|{_t(b0)}|"
        f"{_t(b1)}|432000|COMPLETED|0:0|00:00:00||||||1",
        f"700|700|post|gus|1003|lab_b|cpu|normal|c05|1|8|cpu=8,mem=16G,node=1|16G|{_t(c0)}|{_t(c0)}|"
        f"{_t(c1)}|7200|COMPLETED|0:0|10:00:00|||hal|04:00:00||",
    ]
    return HEADER + "\n" + "\n".join(rows) + "\n"


@pytest.fixture
def env(cli_env: dict[str, str], migrated_db_url: str, tmp_path: Path) -> dict[str, str]:
    cfg = tmp_path / "cocaq.toml"
    cfg.write_text(CONFIG)
    e = dict(cli_env, COCAQ_DATABASE_URL=migrated_db_url, COCAQ_CONFIG=str(cfg), COLUMNS="200")
    f = tmp_path / "sacct.txt"
    f.write_text(dump(datetime.now(UTC).replace(microsecond=0)))
    r = run_cocaq(["import", "sacct", "--file", str(f)], e)
    assert r.code == 0, r.err
    return e


def job_json(env: dict[str, str], job_id: str) -> dict[str, object]:
    r = run_cocaq(["job", job_id, "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert isinstance(d, dict)
    return d


def note_ids(d: dict[str, object]) -> set[str]:
    notes = d["notes"]
    assert isinstance(notes, list)
    return {n["id"] for n in notes}


def test_running_job_gets_no_cpu_memory_or_time_note(env: dict[str, str]) -> None:
    d = job_json(env, "500")
    assert d["is_open"] is True and d["total_cpu_s"] == 300  # 5 minutes of 640 core-hours so far
    assert d["cpu_usage"] is None  # not "0% busy": the running batch step's CPU time is not in it yet
    assert not note_ids(d) & {"cpus", "memory", "time-limits", "dataloader", "gpu-memory"}
    r = run_cocaq(["job", "500"], env)
    assert r.code == 0, r.err
    assert "Ask for fewer CPU cores" not in r.out and "Ask for less memory" not in r.out
    assert "busy" not in r.out  # the CPUs line says no share of cores busy
    cpu_line = next(x for x in r.out.splitlines() if x.startswith("CPU time"))
    assert "5 min" in cpu_line and "when the step ends" in cpu_line  # not "0.0833 h"
    mem_line = next(x for x in r.out.splitlines() if x.startswith("memory"))
    assert "at most 2 GB used (MaxRSS) by the steps that ended so far" in mem_line


def test_running_job_is_no_evidence_in_users_suggestions(env: dict[str, str], db_url: str) -> None:
    # 512 GB asked, 2 GB used so far: were it evidence, "ask for less memory" would clear the floor (its
    # memory is nearly all of dave's estimated energy)
    r = run_cocaq(["user", "dave", "--since", "30d", "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["jobs"] == 1 and not {a["id"] for a in d["advice"]} & {"memory", "cpus", "time-limits"}
    # every suggestion the window's jobs support, not only those above the floor: none sizes a running job
    # or one whose CPU time is unknown
    from cocaq.config_load import load_config
    from cocaq.db.dbapi import connect
    from cocaq.footprint import advice, jobfacts

    cfg = load_config(Path(env["COCAQ_CONFIG"]))
    now = datetime.now(UTC)
    with connect(db_url) as db:
        jobs = jobfacts.load(db, cfg, now - timedelta(days=30), now)
    assert {j.job_id for j in jobs} == {"500", "600", "700"}
    found = {
        a.id: a for a in advice.candidates(jobs, advice.site_context(cfg, now - timedelta(days=30), now))
    }
    for rule in ("memory", "cpus", "time-limits", "dataloader"):
        assert rule not in found or not {"500", "600"} & set(found[rule].job_ids), rule


def test_unrecorded_cpu_time_gives_no_cpu_advice(env: dict[str, str]) -> None:
    d = job_json(env, "600")
    assert d["is_open"] is False and d["total_cpu_s"] is None and d["cpu_usage"] is None
    assert "cpus" not in note_ids(d) and "dataloader" not in note_ids(d)
    r = run_cocaq(["job", "600"], env)
    assert r.code == 0, r.err
    assert "cores per node would do" not in r.out and "busy" not in r.out
    cpu_line = next(x for x in r.out.splitlines() if x.startswith("CPU time"))
    assert "not recorded by Slurm" in cpu_line
    assert "CPU time not recorded" in str(d["assumptions"])  # the importer's: estimated from allocated cores
    r = run_cocaq(["user", "erin", "--since", "30d", "-o", "json"], env)
    assert r.code == 0, r.err
    assert "cpus" not in {a["id"] for a in json.loads(r.out)["advice"]}


def test_cpu_only_job_has_no_gpu_power(env: dict[str, str]) -> None:
    r = run_cocaq(["job", "700"], env)
    assert r.code == 0, r.err
    line = next(x for x in r.out.splitlines() if x.startswith("Estimated:"))
    assert "CPU" in line and "memory" in line and "GPU" not in line and "400" not in line
    d = job_json(env, "700")
    a = d["assumptions"]
    assert isinstance(a, dict) and a["cpu_tdp_w_per_core"] == 10
    assert not [k for k in a if k.startswith("gpu")]  # the profile's 400 W GPU is not this job's
    assert d["cpu_usage"] == pytest.approx(10 / 16)  # a finished job's share of cores busy stays


def test_job_email_says_the_same(env: dict[str, str], db_url: str) -> None:
    """The job e-mail reads the same facts: no share of cores busy or sizing note while a job runs (its
    memory use said to be the ended steps'), none on an unknown CPU time, no GPU on a CPU-only job."""
    from cocaq.config_load import load_config
    from cocaq.reports.job_report import job_footprint
    from cocaq.reports.render import render_jobs

    cfg = load_config(Path(env["COCAQ_CONFIG"]))
    eng = create_engine(db_url)
    try:
        with eng.connect() as conn:
            pks = {str(r[0]): int(r[1]) for r in conn.execute(text("SELECT job_id, id FROM jobs"))}
            reps = {jid: job_footprint(conn, cfg, pk) for jid, pk in pks.items()}
    finally:
        eng.dispose()
    running = reps["500"]
    assert running.cpu_usage is None and not {n.id for n in running.notes} & {"cpus", "memory"}
    mail = render_jobs([running], cfg)
    for part in (mail.text, mail.html):
        assert "busy" not in part and "Ask for less memory" not in part and "CPU cores" not in part
        assert "by the steps that ended so far" in part
    unknown = reps["600"]
    assert unknown.cpu_usage is None and "cpus" not in {n.id for n in unknown.notes}
    cpu_only = render_jobs([reps["700"]], cfg)
    assert "CPUs 62% busy" in cpu_only.html  # a finished job's share of cores busy stays
    for part in (cpu_only.text, cpu_only.html):
        assert "GPU" not in part.split("CO2 = energy x PUE x the grid")[0]  # (the footer says how GPUs are)


def test_running_jobs_idle_gpus_are_said_so_far() -> None:
    """GPU samples are measured as a job runs: its idle-GPU note stays, said to be so far; the same job
    ended gets the CPU and memory notes its figures then support (the control)."""
    from cocaq.footprint.advice import candidates
    from cocaq.footprint.job_advice import job_notes
    from tests.test_advice import CTX, fact

    figures = dict(
        gpus=4, cpus=32, gpu_util_pct=10.0, sampled_share=1.0, idle_gpu_hours=30.0, idle_kwh=3.0,
        total_cpu_s=600.0, max_rss_mb=1024.0, req_mem_mb=512 * 1024.0, time_limit_h=48.0,
    )  # fmt: skip
    running = fact(is_open=True, state="RUNNING", end=None, **figures)
    notes = {a.id: a for a in job_notes(running, CTX)}
    assert set(notes) == {"fewer-gpus"} and "of the sampled time so far" in notes["fewer-gpus"].body
    found = {a.id: a for a in candidates([running], CTX)}
    assert "so far" in found["fewer-gpus"].body and not set(found) & {"cpus", "memory", "dataloader"}
    ended = {a.id: a for a in job_notes(fact(**figures), CTX)}
    assert {"fewer-gpus", "cpus", "memory"} <= set(ended) and "so far" not in ended["fewer-gpus"].body
