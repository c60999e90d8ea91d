"""The test Slurm cluster (tests/slurm/cluster.sh) as tests drive it: bring it up with or without hooks,
submit as a user, read its config, queue and sacct, and take the lock that keeps two test modules from
reconfiguring the one slurm.conf under each other."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

CLUSTER_SH = ROOT / "tests" / "slurm" / "cluster.sh"
# The shims slurm.conf names live at a fixed path, not in a pytest tmp dir that is deleted later: a
# Prolog= naming a missing file fails every job's prolog and drains the node.
STATE_DIR = Path("/var/lib/cocaq-test")
NODE = socket.gethostname().split(".")[0]  # cluster.sh's NodeName: `hostname -s`
CLUSTER = "cocaqtest"


@contextmanager
def cluster_lock() -> Iterator[None]:
    """One module at a time per machine: two would reconfigure the same slurm.conf under each other."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "slurm-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def sh(*cmd: str, timeout: float = 60, check: bool = True) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {r.returncode}: {r.stdout}{r.stderr}")
    return r.stdout


def cluster_sh(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # the first `up` on a fresh machine installs slurm, munge and mariadb: allow for apt
    return subprocess.run(
        [str(CLUSTER_SH), action], env=env, capture_output=True, text=True, timeout=1200, check=False
    )


def hook_env(prolog: str = "", epilog: str = "") -> dict[str, str]:
    """The environment for cluster.sh: ours with the hook knobs set (empty: what the session had)."""
    env = dict(os.environ)
    if prolog:
        env["COCAQ_SLURM_PROLOG"], env["COCAQ_SLURM_EPILOG"] = prolog, epilog
    return env


def slurm_config(key: str) -> str:
    for line in sh("scontrol", "show", "config").splitlines():
        k, _, v = line.partition("=")
        if k.strip() == key:
            return v.strip()
    raise AssertionError(f"scontrol show config has no {key}")


def node_state() -> str:
    return sh("sinfo", "-h", "-n", NODE, "-o", "%T").strip()


def queue() -> dict[str, str]:
    """Job id -> state of every job slurmctld still holds (COMPLETING included)."""
    out = sh("squeue", "-h", "-a", "-o", "%i %T")
    return dict(line.split() for line in out.splitlines() if line.strip())


def sacct(since: float, ids: list[str], fields: str) -> list[list[str]]:
    """sacct's rows for these jobs, only those since `since`: Slurm 22.05 can hand out a job id again
    (a `scontrol reconfigure` right after a submission can roll the id counter back to what its state
    file last saved; MinJobAge=10 has purged the old job by then), and sacct then shows both jobs."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
    out = sh("sacct", "-n", "-P", "-X", "-S", start, "-j", ",".join(ids), "-o", fields)
    return [line.split("|") for line in out.splitlines() if "|" in line]


def sacct_states(since: float, ids: list[str]) -> dict[str, str]:
    return {j: s.split()[0] for j, s in sacct(since, ids, "JobID,State")}


def wait_until(what: str, timeout: float, cond: Any, step: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)


def slurm_installed() -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "slurm-wlm"], capture_output=True, text=True)
    return "install ok installed" in r.stdout and os.path.exists("/usr/sbin/slurmctld")


def sbatch(user: str, outdir: Path, *args: str) -> str:
    out = sh(
        "runuser", "-u", user, "--", "sbatch", "--parsable", f"--chdir={outdir}",
        f"--output={outdir}/%j.out", *args,
    )  # fmt: skip
    return out.strip().split(";")[0]
