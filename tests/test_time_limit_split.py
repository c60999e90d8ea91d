"""Issue 32, point 3: the energy of a job that hit its time limit is "possibly lost", apart from the energy
that certainly did no work (idle GPUs, failures, out of memory, cancelled), and an interactive session
(a notebook, a shell, srun --pty, salloc) that ends at its limit ended normally: none of its energy is lost.

What an interactive session is, is defined once (cocaq.accounting.sessions) as Python and as SQL: by job
name, by partition (configured, or "interactive" in its name), by QOS, and by its steps: sbatch runs the
script in a `JOBID.batch` step, which an `srun` or `salloc` job never has. The import records that from
sacct's step lines (text and JSON) and from pyslurm's steps, and says nothing where it saw none (`-X`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from cocaq.accounting import ledger
from cocaq.accounting.sessions import Sessions
from cocaq.config import Advice
from cocaq.db.engine import make_engine
from cocaq.slurm.sacct import ParseStats, iter_json, iter_parsable
from tests.conftest import new_database, run_cocaq

DATA = Path(__file__).parent / "data" / "sacct"

# --- one definition, in Python and SQL ------------------------------------------------------------------

SITE = Sessions.of(
    Advice(
        interactive_names=("jupyter", "bash", "50%: it's"),
        interactive_partitions=("ondemand-gpu", "x:y"),
        interactive_qos=("interact",),
    )
)
CASES: list[tuple[str | None, str | None, str | None, bool | None]] = [
    ("train", "gpu", "normal", True),  # a batch job
    ("train", "gpu", "normal", None),  # steps not read: not known, so not a session
    ("train", "gpu", "normal", False),  # steps and no batch step: srun --pty, salloc
    (" Jupyter ", "gpu", "normal", True),  # by name, case and spaces aside
    ("50%: it's", "gpu", None, True),  # a name SQL must quote
    ("train", "ondemand-gpu", "normal", True),  # by configured partition
    ("train", "X:Y", "normal", True),
    ("train", "gpu-interactive", "normal", True),  # "interactive" in the partition's name
    ("train", "gpu", "interact", True),  # by configured QOS
    ("train", "gpu", "interactive-ish", True),
    (None, None, None, None),
    ("", "", "", False),
]


def test_sessions_python_and_sql_say_the_same(db_url: str) -> None:
    engine = make_engine(db_url)
    d = engine.dialect.name
    for s in (SITE, Sessions(), Sessions.of(Advice())):
        sql = s.sql(":n", ":p", ":q", "CAST(:b AS BOOLEAN)" if d == "postgresql" else ":b", d)
        with engine.connect() as conn:
            for name, part, qos, batch in CASES:
                got = conn.execute(
                    text(f"SELECT CASE WHEN {sql} THEN 1 ELSE 0 END"),
                    {"n": name, "p": part, "q": qos, "b": batch},
                ).scalar_one()
                assert bool(got) == s.holds(name, part, qos, batch), (s, name, part, qos, batch)
    assert [SITE.holds(*c) for c in CASES] == [
        False, False, True, True, True, True, True, True, True, False, False, True,
    ]  # fmt: skip
    engine.dispose()


# --- what the import records --------------------------------------------------------------------------


def _by_id(recs: Any) -> dict[str, Any]:
    return {r.job_id: r for r in recs}


def test_the_real_captures_tell_batch_jobs_from_srun_and_salloc() -> None:
    """tests/data/sacct/README.md: 22.05's job 17 and 25.11's job 40 are `srun -J interactive` (step `.0`,
    no `.batch`); every sbatch job has its `.batch`; `salloc --no-shell` (shapes' job 1) ran no step at all,
    and `-X` prints none: both say nothing."""
    for name in ("slurm2205_parsable2.txt", "slurm2511_parsable2.txt"):
        with open(DATA / name, "rb") as fh:
            recs = _by_id(iter_parsable(fh, tz=UTC, stats=ParseStats()))
        srun = "17" if "2205" in name else "40"
        assert recs[srun].batch_step is False and recs[srun].name == "interactive"
        others = [r for k, r in recs.items() if k != srun and r.state != "CANCELLED"]
        assert others and all(r.batch_step is True for r in others if r.total_cpu_s is not None), name
    for name in ("slurm2205_sacct.json", "slurm2511_sacct.json"):
        with open(DATA / name, "rb") as fh:
            recs = _by_id(iter_json(fh, stats=ParseStats()))
        srun = "17" if "2205" in name else "40"
        assert recs[srun].batch_step is False
        assert recs["1" if "2205" in name else "24"].batch_step is True  # will_timeout: sbatch
    with open(DATA / "slurm2205_shapes_parsable2.txt", "rb") as fh:
        shapes = _by_id(iter_parsable(fh, tz=UTC, stats=ParseStats()))
    assert shapes["1"].batch_step is None  # salloc --no-shell: no step line at all
    assert shapes["3"].batch_step is True
    with open(DATA / "slurm2205_shapes_X_parsable2.txt", "rb") as fh:
        x = _by_id(iter_parsable(fh, tz=UTC, stats=ParseStats()))
    assert x and all(r.batch_step is None for r in x.values())  # -X: no step lines, nothing known


def test_pyslurm_steps_say_the_same() -> None:
    from cocaq.slurm.slurmdb import iter_slurmdb
    from tests.test_slurm_backend_choice import fake_module, job, step

    jobs = [
        job(id=10, steps={"batch": step(5, 1024), "extern": step(0, 0)}),  # sbatch
        job(id=11, steps={0: step(5, 1024), "extern": step(0, 0)}),  # srun --pty
        job(id=12, steps={"interactive": step(5, 1024)}),  # salloc with use_interactive_step
        job(id=13, steps={}),  # no step read
    ]
    start, end = datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC)
    recs = _by_id(iter_slurmdb(start, end, all_users=True, pyslurm=fake_module(jobs)))
    assert [recs[k].batch_step for k in ("10", "11", "12", "13")] == [True, False, False, None]


def test_a_het_jobs_components_take_the_leaders_batch_step() -> None:
    """sbatch runs a het job's script in its first component (`12+0.batch`); `12+1` has only srun steps."""
    lines = [
        "JobID|JobIDRaw|JobName|User|Partition|QOS|State|Submit|Start|End|Elapsed|AllocTRES|TotalCPU|NodeList",
        "12+0|12|het|al|gpu|normal|COMPLETED|2027-01-01T10:00:00|2027-01-01T10:00:00|2027-01-01T11:00:00|"
        "01:00:00|cpu=1,mem=1G,node=1|00:01:00|n1",
        "12+0.batch|12.batch|batch||||COMPLETED|2027-01-01T10:00:00|2027-01-01T10:00:00|2027-01-01T11:00:00|"
        "01:00:00|cpu=1,mem=1G,node=1|00:01:00|n1",
        "12+1|13|het|al|cpu|normal|COMPLETED|2027-01-01T10:00:00|2027-01-01T10:00:00|2027-01-01T11:00:00|"
        "01:00:00|cpu=1,mem=1G,node=1|00:01:00|n2",
        "12+1.0|13.0|sleep||||COMPLETED|2027-01-01T10:00:00|2027-01-01T10:00:00|2027-01-01T11:00:00|"
        "01:00:00|cpu=1,mem=1G,node=1|00:01:00|n2",
    ]
    recs = _by_id(iter_parsable([ln.encode() for ln in lines], tz=UTC, stats=ParseStats()))
    assert recs["12+0"].batch_step is True and recs["12+1"].batch_step is True


# --- every surface: through the real CLI, both databases ---------------------------------------------

HEADER = (
    "JobID|JobIDRaw|JobName|User|UID|Account|Partition|QOS|NodeList|NNodes|AllocCPUS|AllocTRES|ReqTRES|"
    "ReqMem|Submit|Start|End|Elapsed|ElapsedRaw|State|ExitCode|TotalCPU|Comment|ConsumedEnergyRaw|Cluster|"
    "Timelimit"
)
NOW = datetime.now(UTC).replace(microsecond=0, second=0, minute=0)


def _lines(
    i: int, name: str, part: str, qos: str, state: str, steps: tuple[str, ...], hours: float
) -> list[str]:
    t = lambda d: d.strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731
    start = NOW - timedelta(days=10) + timedelta(hours=3 * i)
    end = start + timedelta(hours=hours)
    el = int(hours * 3600)
    clock = f"{el // 3600:02d}:{el % 3600 // 60:02d}:00"
    tres = "billing=8,cpu=8,gres/gpu=1,mem=32G,node=1"
    jid = 5000 + i
    out = [
        f"{jid}|{jid}|{name}|tim|2001|lab_tim|{part}|{qos}|n01|1|8|{tres}|{tres}|32G|{t(start)}|{t(start)}|"
        f"{t(end)}|{clock}|{el}|{state}|0:0|{clock}|||hal|{clock}"
    ]
    for s in steps:
        out.append(
            f"{jid}.{s}|{jid}.{s}|{s}|||lab_tim|||n01|1|8|{tres}|||{t(start)}|{t(start)}|{t(end)}|{clock}|{el}|"
            f"{state if s != 'extern' else 'COMPLETED'}|0:0|{clock}||||"
        )
    return out


BATCH = ("batch", "extern")
JOBS = {  # id: (name, partition, qos, state, steps, hours), and what the ledger counts it as
    "5000": ("train", "gpu", "normal", "TIMEOUT", BATCH, 4.0),  # a batch job at its limit: possibly lost
    "5001": ("jupyter", "gpu", "normal", "TIMEOUT", BATCH, 3.0),  # a session by name
    "5002": ("train", "ondemand-gpu", "normal", "TIMEOUT", BATCH, 2.0),  # by configured partition
    "5003": ("train", "gpu", "interact", "TIMEOUT", BATCH, 5.0),  # by configured QOS
    "5004": ("train", "gpu", "normal", "TIMEOUT", ("0", "extern"), 6.0),  # srun --pty: no batch step
    "5005": ("train", "gpu", "normal", "FAILED", BATCH, 1.0),  # did no work
    "5006": ("train", "gpu", "normal", "COMPLETED", BATCH, 7.0),
}
CONFIG = """
database_url = "{url}"
[cluster]
name = "hal"
carbon_zone = "FRA"
pue = 1.2
timezone = "UTC"
[defaults]
cpu_tdp_w_per_core = 10
gpu_tdp_w = 300
[partitions.ondemand-gpu]
gpu_tdp_w = 300
cpu_tdp_w_per_core = 10
[advice]
interactive_partitions = ["ondemand-gpu"]
interactive_qos = ["interact"]
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def site(
    request: pytest.FixtureRequest, tmp_path: Path, cli_env: dict[str, str]
) -> tuple[Path, dict[str, str]]:
    url = new_database(request.param, tmp_path, request)
    cfg = tmp_path / "cocaq.toml"
    cfg.write_text(CONFIG.format(url=url))
    dump = tmp_path / "sacct.txt"
    rows = [HEADER]
    for i, (jid, spec) in enumerate(JOBS.items()):
        assert jid == str(5000 + i)
        rows += _lines(i, *spec)
    dump.write_text("\n".join(rows) + "\n")
    env = {**cli_env, "COLUMNS": "60"}
    for args in (["db", "upgrade"], ["import", "sacct", "--file", str(dump)], ["aggregate"]):
        r = run_cocaq(["--config", str(cfg), *args], env)
        assert r.code == 0, (args, r.err)
    return cfg, env


def _cocaq(site: tuple[Path, dict[str, str]], *args: str) -> str:
    cfg, env = site
    r = run_cocaq(["--config", str(cfg), *args], env)
    assert r.code == 0, (args, r.err)
    return r.out


def test_time_limit_energy_is_apart_and_sessions_lose_none(site: tuple[Path, dict[str, str]]) -> None:
    from cocaq.cli.terminal import _kwh

    jobs = {jid: json.loads(_cocaq(site, "job", jid, "--format", "json")) for jid in JOBS}
    kwh = {jid: j["energy_kwh"] for jid, j in jobs.items()}
    assert all(v > 0 for v in kwh.values())
    # each job as the ledger counts it, in Python: the batch job's time-limit energy is possibly lost,
    # the four sessions' none, the failed job's did no work
    for jid, j in jobs.items():
        w = j["waste"]
        lost = kwh[jid] if jid == "5000" else 0.0
        assert w["timeout_kwh"] == pytest.approx(lost, rel=1e-9, abs=1e-12), jid
        assert w["wasted_kwh"] == pytest.approx(kwh[jid] if jid == "5005" else 0.0, rel=1e-9, abs=1e-12), jid
        assert w["interactive"] is (jid in ("5001", "5002", "5003", "5004")), jid
        py = ledger.waste(jobs[jid]["state"], kwh[jid], 0.0, w["interactive"])
        assert (py.timeout, py.total) == pytest.approx((w["timeout_kwh"], w["wasted_kwh"]))
    since = ["--since", (NOW - timedelta(days=30)).strftime("%Y-%m-%d")]
    for how in ([], ["--from-jobs"]):  # the rollups (the SQL twin on PostgreSQL) and the jobs alone
        for scope in (["user", "tim"], ["lab", "lab_tim"]):
            t = json.loads(_cocaq(site, *scope, *since, *how, "--format", "json"))
            assert t["timeout_energy_kwh"] == pytest.approx(kwh["5000"], rel=1e-6), (scope, how)
            assert t["wasted_energy_kwh"] == pytest.approx(kwh["5005"], rel=1e-6), (scope, how)
            assert t["failed_energy_kwh"] == pytest.approx(kwh["5005"], rel=1e-6)
            assert (t["jobs_timeout"], t["jobs_failed"], t["jobs"]) == (1, 1, 7)
    # the tables say the two figures apart, with their words
    table = _cocaq(site, "user", "tim", *since)
    lines = table.splitlines()
    no_work = next(ln for ln in lines if ln.startswith("did no work"))
    lost = next(ln for ln in lines if ln.startswith("possibly lost"))
    assert _kwh(kwh["5005"]) in no_work and _kwh(kwh["5000"]) in lost
    assert "hit its time limit" in " ".join(table.split()) and "checkpoint" in table
    one = " ".join(_cocaq(site, "job", "5000").split())
    assert (
        f"Possibly lost: {_kwh(kwh['5000'])} (hit its time limit: lost unless it saved a checkpoint)" in one
    )
    assert "Did no work" not in one
    for jid in ("5001", "5004"):  # sessions: in neither figure
        out = " ".join(_cocaq(site, "job", jid).split())
        assert "Possibly lost" not in out and "Did no work" not in out
        assert "an interactive session, so nothing was lost" in out
    assert f"Did no work: {_kwh(kwh['5005'])}" in " ".join(_cocaq(site, "job", "5005").split())


def test_the_sessions_sql_reads_the_stored_jobs_as_python_does(site: tuple[Path, dict[str, str]]) -> None:
    from cocaq.config_load import load_config

    cfg = load_config(site[0], {})
    s = Sessions.of(cfg.advice)
    engine = make_engine(cfg.database_url)
    sql = s.sql("name", "partition", "qos", "batch_step", engine.dialect.name)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT job_id, name, partition, qos, batch_step, CASE WHEN {sql} THEN 1 ELSE 0 END FROM jobs"
            )
        ).all()
    engine.dispose()
    assert len(rows) == len(JOBS)
    for jid, name, part, qos, batch, got in rows:
        assert bool(got) == s.holds(name, part, qos, None if batch is None else bool(batch)), jid
    assert {r[0] for r in rows if r[5]} == {"5001", "5002", "5003", "5004"}
    assert {r[0]: r[4] for r in rows}["5004"] in (False, 0)
