"""pyslurm and sacct give the same jobs: real jobs on the Slurm 25.11 test cluster, read both ways.

pyslurm (`[slurm] backend = "pyslurm"`) reads slurmdbd through libslurm with no sacct process; it builds
only against Slurm 25.11, so this module runs on the 25.11 cluster that tests/slurm/cluster.sh builds
from source (COCAQ_SLURM_SOURCE), with pyslurm installed by tests/slurm/pyslurm.sh. It submits batch
jobs with steps, an array, a het job (which cannot start on one node: cancelled pending), comments (one
not ASCII), a failed, a signalled, a cancelled and an interactive job, then reads them through pyslurm,
`sacct --json` and `sacct --parsable2` and compares every field; then imports them through
`cocaq import sacct --backend ...` and compares the rows. Needs root. About a minute.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from cocaq.config_load import load_config
from cocaq.db.engine import make_engine
from cocaq.slurm.backend import read_accounting
from cocaq.slurm.record import JobRecord
from tests.conftest import ROOT, run_cocaq
from tests.slurmkit import (
    activate,
    cluster_lock,
    cluster_sh,
    hook_env,
    queue,
    sacct_states,
    sbatch,
    sh,
    up_or_skip,
    wait_until,
)

pytestmark = [pytest.mark.slow]

VERSION = "25.11"
COMMENT_ASCII = "cocaq: model=resnet50 precision=bf16"
COMMENT_UTF8 = "Übersetzung de→日本語, café ✓"
STEPS = (
    "#!/bin/bash\n#SBATCH -J multi_step\n#SBATCH -n 1\nsrun -n1 -J prep hostname\nsrun -n1 -J train sleep 2\n"
)
HET = (
    "#!/bin/bash\n#SBATCH -J het_pipeline\n#SBATCH -n 1 --mem=500M -p gpu --gres=gpu:1\n#SBATCH hetjob\n"
    "#SBATCH -n 1 --mem=300M -p cpu\nsrun --het-group=0 sleep 2 : --het-group=1 sleep 2\n"
)


@dataclass
class Submitted:
    t0: float
    ids: dict[str, str]  # role -> job id (an array's or het job's first id)
    outdir: Path


def _pyslurm_script() -> Path:
    return ROOT / "tests" / "slurm" / "pyslurm.sh"


@pytest.fixture(scope="module")
def jobs() -> Iterator[Submitted]:
    if os.geteuid() != 0:
        pytest.skip("needs root: runs real jobs on the Slurm 25.11 test cluster (tests/slurm/cluster.sh)")
    with cluster_lock():
        up = cluster_sh("up", hook_env(), VERSION)
        up_or_skip(up, VERSION)
        # pyslurm against that build (scripts/test.sh starts this early, in the background; this waits)
        r = subprocess.run(
            [str(_pyslurm_script())], capture_output=True, text=True, timeout=1800, check=False
        )
        assert r.returncode == 0, f"tests/slurm/pyslurm.sh failed:\n{r.stdout}{r.stderr[-3000:]}"
        with activate(VERSION):
            # not under pytest's root-only tmp dirs: alice and bob read their scripts and write here
            outdir = Path(tempfile.mkdtemp(prefix="cocaq-backends-", dir="/tmp"))
            os.chmod(outdir, 0o1777)
            (outdir / "steps.sh").write_text(STEPS)
            (outdir / "het.sh").write_text(HET)
            t0 = time.time() - 1
            ids: dict[str, str] = {}
            ids["steps"] = sbatch("alice", outdir, str(outdir / "steps.sh"))
            ids["gpu"] = sbatch(
                "alice", outdir, "--gres=gpu:1", "--comment", COMMENT_ASCII, "--wrap", "sleep 2"
            )
            ids["utf8"] = sbatch("bob", outdir, "-p", "cpu", "--comment", COMMENT_UTF8, "--wrap", "sleep 1")
            ids["array"] = sbatch("alice", outdir, "-p", "cpu", "--array=0-3", "--wrap", "sleep 1")
            ids["failed"] = sbatch("bob", outdir, "-p", "cpu", "--wrap", "sleep 1; exit 3")
            ids["exit200"] = sbatch("bob", outdir, "-p", "cpu", "--wrap", "exit 200")
            ids["signal"] = sbatch("alice", outdir, "-p", "cpu", "--wrap", "kill -9 $$")
            ids["mem"] = sbatch(
                "bob", outdir, "-p", "cpu", "-n", "2", "--mem-per-cpu=500M", "--wrap", "srun sleep 1"
            )
            ids["cancel"] = sbatch("alice", outdir, "--gres=gpu:2", "--wrap", "sleep 300")
            ids["het"] = sbatch("root", outdir, str(outdir / "het.sh"))
            srun = subprocess.run(
                ["runuser", "-u", "bob", "--", "srun", "-p", "cpu", "-J", "interactive", f"--chdir={outdir}",
                 "sh", "-c", "echo JOB=$SLURM_JOB_ID; sleep 1"],
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            assert srun.returncode == 0, srun.stderr
            m = re.search(r"^JOB=(\d+)$", srun.stdout, re.M)
            assert m, srun.stdout
            ids["srun"] = m.group(1)
            wait_until("the job to cancel to run", 120, lambda: queue().get(ids["cancel"]) == "RUNNING")
            sh("scancel", ids["cancel"], ids["het"])
            wait_until("every job to leave the queue", 180, lambda: not queue())  # ours alone: the lock
            top = [i for r, i in ids.items() if r not in ("array", "het")]
            wait_until("sacct's final states", 60, lambda: len(sacct_states(t0, top)) == len(top))
            time.sleep(2)  # the last steps' records reach slurmdbd after the job's
            try:
                yield Submitted(t0, ids, outdir)
            finally:
                shutil.rmtree(outdir, ignore_errors=True)


def _read(kind: str, t0: float, **kw: Any) -> dict[str, JobRecord]:
    cfg = load_config(None, environ={})
    start = datetime.fromtimestamp(t0, UTC)
    acct = read_accounting(cfg, start, datetime.now(UTC) + timedelta(seconds=5), all_users=True, **kw)
    assert acct.kind == kind, (acct.kind, acct.note)
    return {r.job_id: r for r in acct.records if r.submit_time.timestamp() >= t0}


def _mine(recs: dict[str, JobRecord], ids: dict[str, str]) -> dict[str, JobRecord]:
    arr = ids["array"]
    want = {i for r, i in ids.items() if r not in ("array", "het")} | {f"{arr}_{t}" for t in range(4)}
    return {k: v for k, v in recs.items() if k in want}


def test_pyslurm_gives_what_sacct_json_gives_field_by_field(jobs: Submitted) -> None:
    with activate(VERSION):
        py = _read("pyslurm", jobs.t0, backend="pyslurm")
        js = _read("json", jobs.t0, backend="cli")
    assert set(py) == set(js)
    mine = _mine(py, jobs.ids)
    assert len(mine) == 13, sorted(mine)  # 9 jobs and the array's 4 tasks (the het job never started)
    diffs = []
    for jid in sorted(py):
        a, b = py[jid], js[jid]
        for f in fields(JobRecord):
            va, vb = getattr(a, f.name), getattr(b, f.name)
            # pyslurm reads each step's tot_cpu_sec without its microseconds; sacct adds them
            if f.name == "total_cpu_s" and va is not None and vb is not None and 0 <= vb - va < 4.0:
                continue
            if f.name == "exit_code" and jid == jobs.ids["exit200"]:
                continue  # below
            if va != vb:
                diffs.append((jid, f.name, va, vb))
    assert not diffs, diffs
    # what the jobs were, to show the comparison covered them
    ids = jobs.ids
    assert py[ids["gpu"]].comment == COMMENT_ASCII and py[ids["utf8"]].comment == COMMENT_UTF8
    assert (py[ids["gpu"]].alloc_gpus, py[ids["gpu"]].gpu_type) == (1, "a100")
    assert py[ids["cancel"]].state == "CANCELLED" and py[ids["cancel"]].state_detail == "CANCELLED by root"
    assert py[ids["cancel"]].alloc_gpus == 2
    assert (py[ids["failed"]].state, py[ids["failed"]].exit_code) == ("FAILED", 3)
    assert (py[ids["signal"]].exit_code, py[ids["signal"]].exit_signal) == (0, 9)
    assert py[f"{ids['array']}_3"].array_job_id == int(ids["array"])
    assert py[ids["steps"]].state == "COMPLETED" and py[ids["srun"]].name == "interactive"
    assert py[ids["mem"]].alloc_cpus == 2 and py[ids["mem"]].req_mem_mb == 1000
    assert ids["het"] not in py  # cancelled before it could start: skipped by both, and counted
    # Slurm keeps 200; pyslurm takes 128 off exit codes from 128 up (pyslurm/utils/helpers.pyx)
    assert (js[ids["exit200"]].exit_code, py[ids["exit200"]].exit_code) == (200, 72)


def test_pyslurm_gives_what_sacct_parsable2_gives(jobs: Submitted) -> None:
    with activate(VERSION):
        py = _read("pyslurm", jobs.t0, backend="pyslurm")
        p2 = _read("parsable", jobs.t0, backend="cli", use_json=False)
    assert set(py) == set(p2)
    same = ("user_name", "account", "partition", "qos", "state", "alloc_gpus", "gpu_type", "alloc_cpus",
            "req_mem_mb", "start_time", "end_time", "submit_time", "elapsed_s", "time_limit_s", "node_list",
            "n_nodes", "job_id_raw", "array_job_id", "array_task_id", "comment", "cluster", "is_open", "name",
            "exit_signal", "max_rss_mb", "exit_code", "state_detail")  # fmt: skip
    diffs = [(j, f, getattr(py[j], f), getattr(p2[j], f)) for j in py for f in same
             if getattr(py[j], f) != getattr(p2[j], f)]  # fmt: skip
    cancel, exit200 = jobs.ids["cancel"], jobs.ids["exit200"]
    # the text output names who cancelled by uid, the JSON and pyslurm by name; pyslurm's exit code above
    assert sorted(diffs, key=str) == sorted([(cancel, "state_detail", "CANCELLED by root", "CANCELLED by 0"),
                                             (exit200, "exit_code", 72, 200)], key=str)  # fmt: skip


def _rows(db: Path) -> dict[str, dict[str, Any]]:
    engine = make_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as c:
            rows = c.execute(text("SELECT * FROM jobs")).mappings().all()
    finally:
        engine.dispose()
    return {r["job_id"]: dict(r) for r in rows}


def test_import_through_either_backend_stores_the_same_jobs(jobs: Submitted, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    start = datetime.fromtimestamp(jobs.t0, UTC).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    with activate(VERSION):
        env.update({k: os.environ[k] for k in ("PATH", "SLURM_CONF")})
        for backend in ("pyslurm", "cli", "auto"):
            db = tmp_path / f"{backend}.sqlite"
            env["COCAQ_DATABASE_URL"] = f"sqlite:///{db}"
            assert run_cocaq(["db", "upgrade"], env).code == 0
            r = run_cocaq(["import", "sacct", "-a", "-S", start, "--backend", backend], env)
            assert r.code == 0, r.err
            label = "sacct json" if backend == "cli" else "pyslurm slurmdbd"
            assert f"{label}: " in r.err, r.err
            if backend == "auto":  # says what it took, and why
                assert "auto: pyslurm 25.11." in r.err and "built for the Slurm 25.11 running here" in r.err
            out[backend] = _rows(db)
    a, b = out["pyslurm"], out["cli"]
    assert set(a) == set(b) and len(a) >= 13
    # the CPU estimate follows TotalCPU, which pyslurm has to the second: up to 4 s x 12 W apart
    skip = {"id", "imported_from", "record_hash", "updated_at", "total_cpu_s", "assumptions"}
    near = {"energy_j": 50.0, "co2_g": 0.01}
    diffs = [(j, k, a[j][k], b[j][k]) for j in a for k in a[j] if k not in skip and a[j][k] != b[j][k]
             and not (k in near and abs(a[j][k] - b[j][k]) <= near[k])]  # fmt: skip
    exit200 = jobs.ids["exit200"]
    assert all(j == exit200 and k == "exit_code" for j, k, _, _ in diffs), diffs
    assert {r["imported_from"] for r in a.values()} == {"slurmdb-pyslurm"}
    assert {r["imported_from"] for r in b.values()} == {"sacct-json"}


def test_a_pyslurm_for_another_slurm_is_one_line(jobs: Submitted, tmp_path: Path) -> None:
    """On the 22.05 tools (PATH) the same pyslurm is refused by name and passed over by auto."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env["COCAQ_DATABASE_URL"] = f"sqlite:///{tmp_path / 'x.sqlite'}"
    assert run_cocaq(["db", "upgrade"], env).code == 0
    with activate("22.05"):
        env.update({k: os.environ[k] for k in ("PATH", "SLURM_CONF")})
        r = run_cocaq(["import", "sacct", "-S", "10m", "--backend", "pyslurm"], env)
        assert r.code != 0 and "Traceback" not in r.err
        (line,) = r.err.strip().splitlines()
        assert "pyslurm 25.11." in line and "built for Slurm 25.11, but this host runs Slurm 22.05" in line
        r = run_cocaq(["import", "sacct", "-S", "10m", "--backend", "auto"], env)
        assert r.code == 0, r.err
        assert r.err.startswith("auto: sacct, as pyslurm 25.11."), r.err
