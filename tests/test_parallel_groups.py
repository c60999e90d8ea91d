"""tests/parallel.py: under pytest-xdist each real Slurm cluster's tests run on one worker, 25.11's last,
and the other modules are shared out between the workers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.parallel import CLUSTERS, group_of

# names a module imports from tests/slurmkit.py to drive a cluster (cluster_lock alone only waits for one)
_DRIVES = re.compile(r"from tests\.slurmkit import \(?([^)]*?)\)?\n\n", re.S)


def test_cluster_ids_map_to_their_group_and_the_rest_to_their_module() -> None:
    assert group_of("tests/test_slurm_jobs.py::test_jobs_from_sacct[22.05]") == "slurm-22.05"
    assert group_of("tests/test_slurm_jobs.py::test_jobs_from_sacct[25.11]") == "slurm-25.11"
    assert group_of("tests/test_live_slurm.py::test_watch_a_real_running_job_and_scrape_it") == "slurm-22.05"
    assert group_of("tests/test_ansible_converge.py::test_x") == "slurm-22.05"
    assert group_of("tests/test_slurm_backends.py::test_y") == "slurm-25.11"
    assert group_of("tests/test_ledger.py::test_z[sqlite]") == "tests/test_ledger.py"


def test_every_module_that_drives_a_cluster_is_in_a_group() -> None:
    """A new module that brings up, reconfigures or submits to a cluster must join its cluster's group."""
    grouped = {m for modules, _ in CLUSTERS.values() for m in modules} | {"tests/test_slurm_jobs.py"}
    drivers = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        for m in _DRIVES.finditer(text):
            names = {n.strip() for n in m.group(1).replace("\n", ",").split(",") if n.strip()}
            if names - {"cluster_lock"}:
                drivers.add(f"tests/{path.name}")
    assert drivers, "found no module that drives a cluster: the pattern no longer matches the imports"
    assert drivers <= grouped, (
        f"drive a Slurm cluster but are in no group of tests/parallel.py: {drivers - grouped}"
    )


_CONFTEST = f"""
import importlib.util, pytest
spec = importlib.util.spec_from_file_location("cocaq_parallel", {str(ROOT / "tests" / "parallel.py")!r})
parallel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parallel)

def pytest_configure(config):
    config.pluginmanager.register(parallel.Plugin(), "cocaq-parallel")
"""
_RECORD = """
import os, time, pytest
def record(request):
    with open(os.environ["RECORD"], "a") as f:
        f.write(f"{time.monotonic()} {os.environ['PYTEST_XDIST_WORKER']} {request.node.nodeid}\\n")
    time.sleep(0.05)
"""


def test_under_xdist_each_clusters_tests_run_on_one_worker_and_25_11s_last(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    (tmp_path / "tests").mkdir()
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "record.py").write_text(_RECORD)
    body = "from tests.record import record\n"
    (tmp_path / "tests" / "test_slurm_jobs.py").write_text(
        body
        + "import pytest\n"
        + "".join(
            f"@pytest.mark.parametrize('v', ['22.05', '25.11'])\ndef test_j{i}(v, request): record(request)\n"
            for i in range(4)
        )
    )
    for name in ("test_live_slurm", "test_ansible_converge", "test_slurm_backends"):
        (tmp_path / "tests" / f"{name}.py").write_text(body + "def test_a(request): record(request)\n")
    for k in range(8):
        (tmp_path / "tests" / f"test_other{k}.py").write_text(
            body + "".join(f"def test_{i}(request): record(request)\n" for i in range(3))
        )
    record = tmp_path / "record.txt"
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, RECORD=str(record), PYTHONPATH=path)  # its tests/ before ours
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "load", "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "35 passed" in r.stdout  # 8 + 3 + 8 x 3
    rows = [line.split(" ", 2) for line in record.read_text().splitlines()]
    ran = sorted((float(t), worker, nodeid) for t, worker, nodeid in rows)
    workers = {g: {w for _, w, n in ran if group_of(n) == g} for g in CLUSTERS}
    assert all(len(ws) == 1 for ws in workers.values()), workers
    others = {w for _, w, n in ran if group_of(n) not in CLUSTERS}
    assert len(others) == 2, "the other modules ran on one worker only"
    last_other = max(t for t, _, n in ran if group_of(n) not in CLUSTERS)
    first_2511 = min(t for t, _, n in ran if group_of(n) == "slurm-25.11")
    first_2205 = min(t for t, _, n in ran if group_of(n) == "slurm-22.05")
    assert first_2205 == ran[0][0] or first_2205 < ran[2][0], "22.05's group is given out first"
    assert first_2511 > ran[len(ran) // 2][0] and first_2511 > last_other - 1.0, (
        "25.11's group is given out last"
    )
