"""Choosing how Slurm is read ([slurm] backend, --backend), without a cluster: stand-ins for pyslurm on
PYTHONPATH (missing, built for another Slurm, a libslurm that exits the process) and for sacct on PATH.
The real pyslurm against a real Slurm 25.11: tests/test_slurm_backends.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cocaq.config_load import load_config
from cocaq.errors import ConfigError, InputError
from cocaq.slurm.sacct import ParseStats
from cocaq.slurm.slurmdb import iter_slurmdb, job_dict
from tests.conftest import run_cocaq

SACCT = '#!/bin/sh\nif [ "$1" = --version ]; then {version}; exit 0; fi\ncat {data}/slurm2511_sacct.json\n'
DATA = Path(__file__).parent / "data" / "sacct"


def fake_pyslurm(root: Path, body: str) -> Path:
    pkg = root / "pyslurm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return root


def fake_sacct(bin_dir: Path, version: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "sacct"
    exe.write_text(SACCT.format(version=version, data=DATA))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("COCAQ_", "SLURM_"))}
    e["COCAQ_DATABASE_URL"] = f"sqlite:///{tmp_path / 'c.sqlite'}"
    assert run_cocaq(["db", "upgrade"], e).code == 0
    return e


def with_paths(env: dict[str, str], tmp_path: Path, pyslurm_body: str | None, version: str) -> dict[str, str]:
    e = dict(env)
    fake_sacct(tmp_path / "bin", version)
    e["PATH"] = f"{tmp_path / 'bin'}:{e['PATH']}"
    if pyslurm_body is not None:
        e["PYTHONPATH"] = str(fake_pyslurm(tmp_path / "py", pyslurm_body))
    return e


NOT_INSTALLED = "raise ModuleNotFoundError(\"No module named 'pyslurm'\", name='pyslurm')\n"
FATAL = (  # what libslurm does on import without a slurm.conf: print, and end the process
    "import os, sys\nsys.stderr.write('python: error: ClusterName needs to be specified\\n'"
    " 'python: fatal: Unable to process configuration file\\n')\nos._exit(1)\n"
)
OLD = "__version__ = '24.05.3'\n"


def test_pyslurm_by_name_missing_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    e = with_paths(env, tmp_path, NOT_INSTALLED, 'echo "slurm 25.11.7"')
    r = run_cocaq(["import", "sacct", "-S", "1h", "--backend", "pyslurm"], e)
    assert r.code == 4 and "Traceback" not in r.err, r.err
    assert r.err.strip().splitlines() == [
        "cocaq: error: pyslurm is not installed: pip install 'cocaq[pyslurm]' against the site's Slurm"
        ' (README: Slurm and pyslurm), or use [slurm] backend = "cli"'
    ]


def test_a_libslurm_that_ends_the_process_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    e = with_paths(env, tmp_path, FATAL, 'echo "slurm 25.11.7"')
    r = run_cocaq(["reconcile", "-S", "1h", "--backend", "pyslurm"], e)
    assert r.code == 4 and "Traceback" not in r.err, r.err
    assert r.err.strip() == (
        "cocaq: error: pyslurm does not load (python: fatal: Unable to process configuration file)"
    )


def test_a_pyslurm_for_another_slurm(env: dict[str, str], tmp_path: Path) -> None:
    e = with_paths(env, tmp_path, OLD, 'echo "slurm 25.11.7"')
    r = run_cocaq(["import", "sacct", "-S", "1h", "--backend", "pyslurm"], e)
    assert r.code == 4 and len(r.err.strip().splitlines()) == 1, r.err
    assert "pyslurm 24.05.3 is built for Slurm 24.05, but this host runs Slurm 25.11" in r.err
    # auto passes it over, says so, and reads sacct (its --json: the real 25.11 capture)
    r = run_cocaq(["import", "sacct", "-S", "1h", "-a"], e)
    assert r.code == 0, r.err
    lines = r.err.splitlines()
    assert lines[0].startswith("auto: sacct, as pyslurm 24.05.3 is built for Slurm 24.05"), r.err
    assert lines[1].startswith("sacct json: 29 records read") and "imported 27" in lines[1], r.err


@pytest.mark.parametrize(
    ("body", "version", "why"),
    [
        (NOT_INSTALLED, 'echo "slurm 25.11.7"', ""),  # the usual case: nothing more to say
        (FATAL, 'echo "slurm 25.11.7"', "auto: sacct, as pyslurm does not load (python: fatal: Unable"),
        # a sacct that does not say its version: pyslurm cannot be shown to fit, sacct it is
        ("__version__ = '25.11.2'\n", "true", "auto: sacct, as `"),
    ],
)
def test_auto_falls_back_to_sacct_and_says_why(
    env: dict[str, str], tmp_path: Path, body: str, version: str, why: str
) -> None:
    e = with_paths(env, tmp_path, body, version)
    r = run_cocaq(["reconcile", "-S", "1h"], e)
    assert r.code == 0, r.err
    assert r.err.startswith("sacct (json): ") or r.err.startswith("sacct (parsable): "), r.err
    assert why in r.err, r.err
    assert ("auto:" in r.err) == bool(why), r.err


def test_config_and_flags() -> None:
    cfg = load_config(None, environ={"COCAQ_SLURM__BACKEND": "PySlurm", "COCAQ_SLURM__SACCT": "/opt/s/sacct"})
    assert (cfg.slurm.backend, cfg.slurm.sacct) == ("pyslurm", "/opt/s/sacct")
    assert load_config(None, environ={}).slurm.backend == "auto"
    with pytest.raises(ConfigError, match=r"slurm.backend: expected one of auto, cli, pyslurm, got 'rest'"):
        load_config(None, environ={"COCAQ_SLURM__BACKEND": "rest"})
    with pytest.raises(ConfigError, match=r"slurm.nope: unknown key"):
        load_config(None, environ={"COCAQ_SLURM__NOPE": "1"})


def test_backend_does_not_go_with_a_file(env: dict[str, str]) -> None:
    r = run_cocaq(["import", "sacct", "--file", str(DATA / "slurm2511_sacct.json"), "--backend", "cli"], env)
    assert r.code == 2 and "--backend reads Slurm itself: it does not go with --file" in r.err, r.err


# --- pyslurm's objects -> records, with pyslurm's own quirks --------------------------------------------


class Stats(SimpleNamespace):
    pass


def tres(**counts: Any) -> Any:
    items: dict[str, Any] = {}
    for k, v in counts.items():
        if k.startswith("gpu"):
            name = k.replace("_", ":")
            items.setdefault("gres", {})[name] = {"type_and_name": f"gres/{name}", "count": v}
        else:
            items[k] = {"type_and_name": k, "count": v}
    return SimpleNamespace(to_dict=lambda recursive=False: items)


def job(**kw: Any) -> Any:
    base = dict(
        id=10, array_id=None, array_task_id=None, array_tasks_waiting=None, heterogeneous_id=None,
        heterogeneous_offset=None, state="COMPLETED", cancelled_by=None, submit_time=1_800_000_000,
        start_time=1_800_000_010, end_time=1_800_000_070, elapsed_time=60, time_limit=5, user_name="alice",
        cluster="c", account="lab", partition="gpu", qos="normal", name="train", nodelist="n1", num_nodes=1,
        allocated_tres=tres(cpu=4, mem=8000, node=1, gpu=2, gpu_a100=2), requested_tres=tres(cpu=4),
        exit_code=0, exit_code_signal=0, comment="cocaq: model=x",
        stats=Stats(total_cpu_time=30), steps={},
    )  # fmt: skip
    base.update(kw)
    return SimpleNamespace(**base)


def step(cpu: int, rss: int, energy: int = 0) -> Any:
    stats = Stats(total_cpu_time=cpu, max_resident_memory=rss, consumed_energy=energy)
    return SimpleNamespace(stats=stats, num_nodes=1, ntasks=2)


def fake_module(jobs: list[Any]) -> Any:
    loaded: dict[str, Any] = {}

    def load(flt: Any) -> Any:
        loaded["filter"] = flt
        return SimpleNamespace(data={"c": {j.id: j for j in jobs}})

    db = SimpleNamespace(Jobs=SimpleNamespace(load=load), JobFilter=lambda **kw: kw)
    return SimpleNamespace(db=db, loaded=loaded)


def test_pyslurm_jobs_become_records_as_sacct_json_would() -> None:
    from datetime import UTC, datetime

    jobs = [
        job(steps={0: step(20, 2 * 1048576, 9000), 1: step(10, 4 * 1048576, 12000)}),
        # task 0 of array 11 and the leader of het job 20: pyslurm reads their 0 as unset
        job(id=12, array_id=11, array_task_id=None),
        job(id=13, array_id=11, array_task_id=1),
        job(id=20, heterogeneous_id=20, heterogeneous_offset=None),
        job(id=21, heterogeneous_id=20, heterogeneous_offset=1),
        job(id=30, state="CANCELLED", cancelled_by="root", exit_code=0, exit_code_signal=9),
        job(id=31, state="FAILED", exit_code=3, time_limit="PartitionLimit"),
        job(id=32, state="PENDING", start_time=None, end_time=None, elapsed_time=None, nodelist=None),
    ]
    mod = fake_module(jobs)
    st = ParseStats()
    start, end = datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC)
    recs = {r.job_id: r for r in iter_slurmdb(start, end, all_users=True, stats=st, pyslurm=mod)}
    assert mod.loaded["filter"] == {"start_time": int(start.timestamp()), "end_time": int(end.timestamp())}
    assert sorted(recs) == ["10", "11_0", "11_1", "20+0", "20+1", "30", "31"]
    assert st.skipped == {"pending (not started yet)": 1} and st.steps == 2
    r = recs["10"]
    assert (r.alloc_cpus, r.alloc_gpus, r.gpu_type, r.req_mem_mb, r.n_nodes) == (4, 2, "a100", 8000.0, 1)
    assert (r.total_cpu_s, r.consumed_energy_j, r.max_rss_mb, r.rss_tasks_per_node) == (30.0, 12000.0, 4.0, 2)
    assert (r.elapsed_s, r.time_limit_s, r.comment, r.exit_code, r.exit_signal) == (
        60.0,
        300.0,
        "cocaq: model=x",
        0,
        0,
    )
    assert recs["11_0"].array_task_id == 0 and recs["11_0"].job_id_raw == 12
    assert recs["20+0"].het_job_offset == 0
    assert (recs["30"].state_detail, recs["30"].exit_code, recs["30"].exit_signal) == (
        "CANCELLED by root",
        0,
        9,
    )
    assert (recs["31"].exit_code, recs["31"].time_limit_s) == (3, None)
    # the same dict the JSON reader gets: sacct --json's shape
    d = job_dict(jobs[0])
    assert d["tres"]["allocated"][-1] == {"type": "gres", "name": "gpu:a100", "count": 2}


def test_a_slurmdbd_that_refuses_is_one_line() -> None:
    from datetime import UTC, datetime

    def load(flt: Any) -> Any:
        raise RuntimeError("Failed to get Jobs from slurmdbd")

    mod = SimpleNamespace(db=SimpleNamespace(Jobs=SimpleNamespace(load=load), JobFilter=lambda **kw: kw))
    now = datetime.now(UTC)
    with pytest.raises(InputError, match=r"^pyslurm: reading jobs from slurmdbd failed: Failed to get Jobs"):
        list(iter_slurmdb(now, now, all_users=True, pyslurm=mod))


WORKS = (  # a pyslurm that loads and answers with no jobs, as one on a site with an empty slurmdbd
    "__version__ = '25.11.2'\nfrom types import SimpleNamespace as _N\n"
    "db = _N(JobFilter=lambda **kw: kw, Jobs=_N(load=lambda f: _N(data={})))\n"
)


@pytest.mark.parametrize(
    ("backend", "body", "status", "said"),
    [
        ("auto", WORKS, "ok", "pyslurm (slurmdbd): 0 new jobs"),  # no sacct: pyslurm, which loads
        ("auto", NOT_INSTALLED, "skipped", "sacct is not installed on this host"),
        ("cli", WORKS, "skipped", "sacct is not installed on this host"),
        ("pyslurm", WORKS, "ok", "pyslurm (slurmdbd): 0 new jobs"),
        ("pyslurm", NOT_INSTALLED, "error", "pyslurm is not installed"),  # asked for by name: an error
    ],
)
def test_the_scheduler_without_sacct(
    env: dict[str, str], tmp_path: Path, backend: str, body: str, status: str, said: str
) -> None:
    e = dict(env, COCAQ_SLURM__BACKEND=backend, PYTHONPATH=str(fake_pyslurm(tmp_path / "py", body)))
    r = run_cocaq(["scheduler", "--once", "reconcile", "--sacct", str(tmp_path / "no-sacct")], e)
    assert f"reconcile: {status}: " in r.err.splitlines()[0], r.err
    assert said in r.err and "Traceback" not in r.err, r.err
