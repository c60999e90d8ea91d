"""Slurm's GPU use of jobs read through pyslurm (cocaq.slurm.gpu_usage): pyslurm's step statistics carry no
gres usage, so the GPU jobs' TRESUsageInAve/Max come from `sacct -j`. A stand-in sacct (a script on PATH)
answers as the real one does; pyslurm is a stand-in module on PYTHONPATH (as tests/test_slurm_backend_choice.py)."""

from __future__ import annotations

import os
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cocaq.slurm.gpu_usage import add_gpu_usage
from cocaq.slurm.sacct import ParseStats
from cocaq.slurm.slurmdb import iter_slurmdb
from tests.conftest import run_cocaq
from tests.test_slurm_backend_choice import fake_module, fake_pyslurm, job, tres

# What `sacct -j 10,11 --format=JobID,ElapsedRaw,NTasks,TRESUsageInAve,TRESUsageInMax` prints for a job
# whose batch script idled while a 2-task srun step kept its 2 GPUs 80% busy for half of its 60 s, and a
# second job whose GPUs Slurm saw idle (real spellings: tests/data/sacct/handmade_site_parsable2.txt)
STEPS = [
    ("10", "60", "", "", ""),
    ("10.batch", "60", "1", "cpu=00:00:01,gres/gpumem=0,gres/gpuutil=0,mem=1G", "gres/gpumem=0,gres/gpuutil=0"),
    ("10.0", "30", "2", "cpu=00:00:20,gres/gpumem=30G,gres/gpuutil=80,mem=9G", "gres/gpumem=40777023488,gres/gpuutil=100"),
    ("11", "60", "", "", ""),
    ("11.batch", "60", "1", "gres/gpumem=0,gres/gpuutil=0", "gres/gpumem=0,gres/gpuutil=0"),
    ("99.0", "60", "1", "gres/gpuutil=100", "gres/gpumem=1G"),  # not asked for: never folded in
]  # fmt: skip
SACCT = """#!{python}
import sys
args = sys.argv[1:]
if args[:1] == ["--version"]:
    print("slurm 25.11.7"); sys.exit(0)
open({log!r}, "a").write(" ".join(args) + "\\n")
if {fail!r}:
    sys.stderr.write("sacct: error: Problem talking to the database: Connection refused\\n"); sys.exit(1)
d = next(a.split("=", 1)[1] for a in args if a.startswith("--delimiter="))
f = next(a.split("=", 1)[1] for a in args if a.startswith("--format="))
assert f == "JobID,ElapsedRaw,NTasks,TRESUsageInAve,TRESUsageInMax", f
ids = args[args.index("-j") + 1].split(",")
print(d.join(f.split(",")))
for row in {steps!r}:
    if row[0].split(".")[0] in ids or row[0].startswith("99"):
        print(d.join(row))
"""


def fake_sacct(tmp_path: Path, fail: bool = False) -> tuple[Path, Path]:
    exe, log = tmp_path / "bin" / "sacct", tmp_path / "sacct.log"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(SACCT.format(python=sys.executable, log=str(log), fail=fail, steps=STEPS))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe, log


def records() -> list[object]:
    jobs = [
        job(id=10),
        job(id=11),
        job(id=12, allocated_tres=tres(cpu=4, mem=8000, node=1)),  # no GPU: not asked about
    ]
    start, end = datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC)
    return list(iter_slurmdb(start, end, all_users=True, stats=ParseStats(), pyslurm=fake_module(jobs)))


def test_pyslurm_records_get_slurms_gpu_use_from_sacct(tmp_path: Path) -> None:
    recs = {r.job_id: r for r in records()}  # type: ignore[attr-defined]
    assert all(r.slurm_gpu_util is None for r in recs.values())
    exe, log = fake_sacct(tmp_path)
    assert add_gpu_usage(list(recs.values()), str(exe), "c") is None  # type: ignore[arg-type]
    # 80% x 2 tasks x 30 s over the job's 60 s: one GPU's worth (80 of 200); the largest task's memory
    assert recs["10"].slurm_gpu_util == pytest.approx(80.0)
    assert recs["10"].slurm_gpu_mem_mb == pytest.approx(40777023488 / 1048576)
    assert (recs["11"].slurm_gpu_util, recs["11"].slurm_gpu_mem_mb) == (0.0, 0.0)
    assert recs["12"].slurm_gpu_util is None
    asked = log.read_text()
    assert "-j 10,11 " in asked and "12" not in asked.split("-j ")[1].split()[0]


def test_without_sacct_or_when_it_fails_the_records_stay_and_the_reason_is_one_line(tmp_path: Path) -> None:
    recs = records()
    assert add_gpu_usage(recs, None, "c") == (  # type: ignore[arg-type]
        "Slurm's GPU use (gres/gpuutil) not read: pyslurm does not carry it, and sacct is not here"
    )
    exe, _ = fake_sacct(tmp_path, fail=True)
    why = add_gpu_usage(recs, str(exe), "c")  # type: ignore[arg-type]
    assert why == (
        "Slurm's GPU use (gres/gpuutil) not read: sacct failed (sacct: error: Problem talking to the "
        "database: Connection refused)"
    )
    assert all(r.slurm_gpu_util is None for r in recs)  # type: ignore[attr-defined]
    assert add_gpu_usage(recs, str(exe), "another-cluster") is None  # type: ignore[arg-type]


PYSLURM = """__version__ = "25.11.2"
from types import SimpleNamespace as N
def _tres(**c):
    items = {}
    for k, v in c.items():
        if k == "gpu":
            items.setdefault("gres", {})["gpu"] = {"type_and_name": "gres/gpu", "count": v}
        else:
            items[k] = {"type_and_name": k, "count": v}
    return N(to_dict=lambda recursive=False: items)
def _job(i):
    return N(id=i, array_id=None, array_task_id=None, array_tasks_waiting=None, heterogeneous_id=None,
        heterogeneous_offset=None, state="COMPLETED", cancelled_by=None, submit_time=1_793_491_200,
        start_time=1_793_491_210, end_time=1_793_491_270, elapsed_time=60, time_limit=5, user_name="alice",
        cluster="cluster", account="lab", partition="gpu", qos="normal", name="train", nodelist="n1",
        num_nodes=1, allocated_tres=_tres(cpu=4, mem=8000, node=1, gpu=2), requested_tres=_tres(cpu=4),
        exit_code=0, exit_code_signal=0, comment=None, stats=N(total_cpu_time=30), steps={})
db = N(JobFilter=lambda **kw: kw, Jobs=N(load=lambda f: N(data={"cluster": {10: _job(10), 11: _job(11)}})))
"""


def test_the_pyslurm_backend_imports_them_through_the_cli(tmp_path: Path) -> None:
    """`cocaq import sacct --backend pyslurm`: the jobs from (stand-in) pyslurm, their GPU use from sacct,
    stored and used as a sacct import's would be."""
    import sqlite3

    exe, _ = fake_sacct(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COCAQ_", "SLURM_"))}
    env["COCAQ_DATABASE_URL"] = f"sqlite:///{tmp_path / 'c.sqlite'}"
    env["PYTHONPATH"] = str(fake_pyslurm(tmp_path / "py", PYSLURM))
    env["PATH"] = f"{exe.parent}:{env['PATH']}"
    assert run_cocaq(["db", "upgrade"], env).code == 0
    r = run_cocaq(
        ["import", "sacct", "--backend", "pyslurm", "-S", "2026-11-01", "-E", "2026-11-02", "--allusers"], env
    )
    assert r.code == 0, r.err
    con = sqlite3.connect(tmp_path / "c.sqlite")
    try:
        got = dict(con.execute("SELECT job_id, slurm_gpu_util FROM jobs").fetchall())
    finally:
        con.close()
    assert got == {"10": pytest.approx(80.0), "11": 0.0}
