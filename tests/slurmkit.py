"""The test Slurm clusters (tests/slurm/cluster.sh) as tests drive them: bring one up with or without
hooks, submit as a user, read its config, queue and sacct, and take the lock that keeps two test modules
from reconfiguring the one slurm.conf under each other.

Two versions: Debian's 22.05 and 25.11 built from its source (COCAQ_SLURM_SOURCE). `activate(version)`
points PATH and SLURM_CONF at one of them, for these helpers and for every process a test starts (cocaq's
reconcile runs `sacct` from PATH, as on a login node)."""

from __future__ import annotations

import fcntl
import os
import shlex
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
VERSIONS = ("22.05", "25.11")
NO_SOURCE = 3  # cluster.sh's exit status when 25.11's source is not there (it says where to put it)


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


_active = "22.05"


def active() -> str:
    return _active


def cluster_sh(
    action: str, env: dict[str, str], version: str | None = None
) -> subprocess.CompletedProcess[str]:
    # the first `up` on a fresh machine installs slurm, munge and mariadb, or builds 25.11: allow for it
    return subprocess.run(
        [str(CLUSTER_SH), action, version or _active],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


@contextmanager
def activate(version: str) -> Iterator[None]:
    """PATH and SLURM_CONF of this process (and so of every process it starts) for one Slurm version;
    the version must be built (cluster.sh up) first. Restored on exit."""
    global _active
    r = cluster_sh("env", dict(os.environ), version)
    if r.returncode != 0:
        raise AssertionError(f"cluster.sh env {version}: {r.stderr.strip()}")
    saved = {k: os.environ.get(k) for k in ("PATH", "SLURM_CONF")}
    before = _active
    for line in r.stdout.splitlines():  # export PATH=...:"$PATH" / export SLURM_CONF=...
        key, _, value = line.removeprefix("export ").partition("=")
        os.environ[key] = shlex.split(value.replace('"$PATH"', shlex.quote(saved["PATH"] or "")))[0]
    _active = version
    try:
        yield
    finally:
        _active = before
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def hook_env(prolog: str = "", epilog: str = "") -> dict[str, str]:
    """The environment for cluster.sh: ours with the hook knobs set (empty: what the session had)."""
    env = dict(os.environ)
    if prolog:
        env["COCAQ_SLURM_PROLOG"], env["COCAQ_SLURM_EPILOG"] = prolog, epilog
    return env


def slurm_config(key: str) -> str:
    """One value of `scontrol show config`. Slurm 24.05+ lists hooks as `Prolog[0] = ...` (one line each,
    comma-joined here) and leaves an unset one out, where 22.05 prints `Prolog = (null)`."""
    values = []
    for line in sh("scontrol", "show", "config").splitlines():
        k, _, v = line.partition("=")
        k = k.strip()
        if k == key or (k.startswith(f"{key}[") and k.endswith("]") and k[len(key) + 1 : -1].isdigit()):
            values.append(v.strip())
    if values:
        return ",".join(values)
    if key in ("Prolog", "Epilog", "TaskProlog", "TaskEpilog"):
        return "(null)"
    raise AssertionError(f"scontrol show config has no {key}")


def node_state() -> str:
    """The node's state as slurmctld holds it ("idle", "mixed", "idle+drain", ...), from scontrol: Slurm
    25.11's sinfo says "mixed" for an idle node whose allocated-TRES string a GPU job left empty rather
    than unset (api/node_info.c, _set_node_mixed_op), for as long as nothing else touches the node."""
    out = sh("scontrol", "show", "node", NODE)
    for word in out.split():
        if word.startswith("State="):
            return word.removeprefix("State=").lower()
    raise AssertionError(f"scontrol show node {NODE} has no State=: {out}")


def wait_node_idle(timeout: float) -> None:
    """The node back to idle (not drained by a hook); on a time-out, what it was and why."""
    seen: list[str] = []

    def idle() -> bool:
        seen.append(node_state())
        return seen[-1] == "idle"

    try:
        wait_until(f"node {NODE} idle, not drained", timeout, idle)
    except AssertionError as exc:
        node = sh("scontrol", "show", "node", NODE, check=False)
        states = sorted(set(seen))
        raise AssertionError(
            f"{exc}: states seen {states}; scontrol show node:\n{node}\nqueue: {queue()}"
        ) from None


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


def slurm_installed(version: str | None = None) -> bool:
    if (version or _active) == "25.11":
        check = ROOT / "tests" / "slurm" / "build.sh"
        return subprocess.run([str(check), "--check"], capture_output=True, check=False).returncode == 0
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "slurm-wlm"], capture_output=True, text=True)
    return "install ok installed" in r.stdout and os.path.exists("/usr/sbin/slurmctld")


def up_or_skip(up: subprocess.CompletedProcess[str], version: str) -> None:
    """After `cluster.sh up`: skip (one line) where 25.11's source is not provided, fail otherwise."""
    import pytest

    if up.returncode == NO_SOURCE and version == "25.11":
        pytest.skip(f"Slurm 25.11 tests skipped: {up.stderr.strip().splitlines()[-1]}")
    if up.returncode != 0 and not slurm_installed(version):
        pytest.skip(f"Slurm {version} could not be installed: {(up.stdout + up.stderr)[-800:]}")
    if up.returncode != 0:
        pytest.fail(f"tests/slurm/cluster.sh up {version} failed:\n{up.stdout}{up.stderr}")


def sbatch(user: str, outdir: Path, *args: str) -> str:
    out = sh(
        "runuser", "-u", user, "--", "sbatch", "--parsable", f"--chdir={outdir}",
        f"--output={outdir}/%j.out", *args,
    )  # fmt: skip
    return out.strip().split(";")[0]


# The fake GPUs, by minor number (= Slurm's gres index for File=/dev/...nvidia[01]). NVML enumerates by
# PCI bus id, so minor 1 (bus 07) is NVML index 0 and minor 0 (bus 87) is NVML index 1.
UUID = {0: "GPU-c0c0a000-0000-4000-8000-00000000a000", 1: "GPU-c0c0a001-0000-4000-8000-00000000a001"}
PCI = {0: "00000000:87:00.0", 1: "00000000:07:00.0"}
NVML_INDEX = {0: 1, 1: 0}
COUNTER, NO_COUNTER = 0, 1  # minor 1 has no energy counter (pre-Volta style): only power to integrate
# Where jobs' annotation files live: outside pytest's root-only tmp dirs, so that the job's user reaches it.
ANNOTATE_DIR = "/run/cocaq-test-annotations"


def write_inputs(tmp: Path, db_url: str, collector_extra: str = "") -> tuple[Path, Path, str]:
    """The fake node the real-Slurm tests run cocaq's node side on: the two fake GPUs above, a RAPL and
    cgroup tree, and a config (`collector_extra`: more [collector] lines). (config, spec, its text)."""
    from tests.sysfs_tree import make_cgroup_v2, make_rapl

    spec = tmp / "fake-gpus.toml"
    spec.write_text(
        f'[[gpu]]\nminor = 0\nuuid = "{UUID[0]}"\npci_bus_id = "{PCI[0]}"\ntrace = "inference"\n\n'
        f'[[gpu]]\nminor = 1\nuuid = "{UUID[1]}"\npci_bus_id = "{PCI[1]}"\ntrace = "light"\n'
        "energy_counter = false\n"
    )
    sysfs = tmp / "sys"
    make_rapl(sysfs, packages=1)
    make_cgroup_v2(sysfs / "fs" / "cgroup", node_cpus="0-1")
    config_text = (
        f'database_url = "{db_url}"\nspool_dir = "{tmp / "spool"}"\n\n[cluster]\nname = "{CLUSTER}"\n\n'
        f'[collector]\nnvml = "fake:{spec}"\nsysfs_root = "{sysfs}"\nhook_log = "{tmp / "log" / "hook.log"}"\n'
        f'interval_s = 1\nship_interval_s = 2\ndetect_interval_s = 1\nannotate_dir = "{ANNOTATE_DIR}"\n'
        f"{collector_extra}"
    )
    config = tmp / "cocaq.toml"
    config.write_text(config_text)
    return config, spec, config_text
