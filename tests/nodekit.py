"""Helpers for node-side tests: a node's config, its hook shims, and running them as slurmd would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cocaq.prolog_epilog.shims import import_paths, write_shims

# Two A100s whose NVML order (PCI bus id) is the reverse of their minor numbers, the second without an
# energy counter: code that maps Slurm's indices by list position, or trusts the counter, shows it here.
FAKE_GPUS = """
epoch = 1700000000
[[gpu]]
uuid = "GPU-00000000-aaaa-4000-8000-000000000001"
minor = 1
pci_bus_id = "00000000:07:00.0"
name = "NVIDIA A100-SXM4-80GB"
trace = "training"
gone_flag = "{gone}"
[[gpu]]
uuid = "GPU-00000000-aaaa-4000-8000-000000000000"
minor = 0
pci_bus_id = "00000000:87:00.0"
name = "NVIDIA A100-SXM4-80GB"
trace = "inference"
energy_counter = {counter0}
"""
UUID_BY_MINOR = {0: "GPU-00000000-aaaa-4000-8000-000000000000", 1: "GPU-00000000-aaaa-4000-8000-000000000001"}


@dataclass
class Node:
    root: Path
    config: Path
    spool: Path
    log: Path
    shims: Path
    database_url: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu1_gone_flag(self) -> Path:
        """While this file exists the GPU with minor 1 has fallen off the bus (NVML: GPU is lost)."""
        return self.root / "gpu1-gone"

    def env(self, kind: str, job_id: int | str, **more: str) -> dict[str, str]:
        ctx = {
            "prolog": "prolog_slurmd",
            "epilog": "epilog_slurmd",
            "prologslurmctld": "prolog_slurmctld",
            "epilogslurmctld": "epilog_slurmctld",
        }[kind]
        env = {
            "SLURM_SCRIPT_CONTEXT": ctx,
            "SLURM_JOB_ID": str(job_id),
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_UID": "1001",
            "SLURM_JOB_GID": "1001",
            "SLURM_JOB_ACCOUNT": "lab_vision",
            "SLURM_JOB_PARTITION": "gpu",
            "SLURMD_NODENAME": "vm",
            "SLURM_CLUSTER_NAME": "cocaqtest",
            "COCAQ_TEST_HOOK_CACHE_DIR": str(self.root / "hookcache"),
        }
        env.update(more)
        return env

    def hook(self, kind: str, job_id: int | str, env: dict[str, Any] | None = None, **more: str) -> float:
        """Run the shim as slurmd does (no PATH, Slurm's variables only); returns seconds; asserts exit 0."""
        e = self.env(kind, job_id, **more)
        if env:
            e.update(env)
        bytes_env = {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in e.items()}
        t = time.perf_counter()
        r = subprocess.run(["/bin/sh", str(self.shims / f"cocaq-{kind}")], env=bytes_env, timeout=60)
        dt = time.perf_counter() - t
        assert r.returncode == 0
        return dt

    def hook_audit(self, kind: str, job_id: int | str, **more: str) -> HookAudit:
        """Run the hook as its shim does (`python -I -S`, the same paths, argv and environment) with an audit
        hook in front that records what the hook did besides its work: sleeps, processes, connections,
        file locks, and the modules it imported."""
        out = self.root / f"audit-{kind}-{job_id}.json"
        code = _AUDITED_HOOK.format(paths=import_paths(), out=str(out))
        argv = [sys.executable, "-I", "-S", "-c", code, "--config", str(self.config), kind]
        e = {k.encode(): str(v).encode() for k, v in self.env(kind, job_id, **more).items()}
        r = subprocess.run(argv, env=e, timeout=60, capture_output=True)
        assert r.returncode == 0, r.stderr
        return HookAudit(**json.loads(out.read_text()))

    def events(self) -> list[dict[str, Any]]:
        d = self.spool / "events"
        if not d.exists():
            return []
        return [json.loads(p.read_bytes()) for p in sorted(d.glob("*.json"))]

    def log_lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


# The shim's command with sys.addaudithook first: the events that would make a hook wait or reach out.
_AUDITED_HOOK = """\
import sys
sys.path[:0] = {paths!r}
seen = {{"sleeps": 0, "processes": [], "connects": [], "locks": []}}
def audit(event, args):
    if event == "time.sleep":
        seen["sleeps"] += 1
    elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.spawn"):
        seen["processes"].append(event)
    elif event == "socket.connect":
        seen["connects"].append(repr(args[1]))
    elif event in ("fcntl.flock", "fcntl.lockf"):
        seen["locks"].append(event)
sys.addaudithook(audit)
before = set(sys.modules)
from cocaq.prolog_epilog.hook import main
main(sys.argv[1:])
seen["modules"] = sorted(set(sys.modules) - before)
import json
with open({out!r}, "w") as fh:
    json.dump(seen, fh)
"""


@dataclass
class HookAudit:
    """What one hook process did besides its work (Node.hook_audit)."""

    sleeps: int
    processes: list[str]
    connects: list[str]
    locks: list[str]
    modules: list[str]

    def non_stdlib(self) -> list[str]:
        """The modules it imported that are neither the standard library's nor cocaq's."""
        ours = sys.stdlib_module_names | {"cocaq"}
        return [m for m in self.modules if m.split(".")[0] not in ours and not m.startswith("_sysconfigdata")]


def assert_fails_fast(failed: HookAudit, *healthy: HookAudit) -> None:
    """A hook that cannot write its record gives up at once: it sleeps, spawns, connects and locks nothing,
    and imports nothing but the standard library and what the `healthy` hooks (the same kinds, on a node
    whose spool works) import. The unit tests once bounded its wall-clock time instead; that time is
    bench/bench_hook_failures.py's."""
    assert (failed.sleeps, failed.processes, failed.connects, failed.locks) == (0, [], [], []), failed
    assert failed.non_stdlib() == [], failed.non_stdlib()
    usual = set().union(*(h.modules for h in healthy))
    assert sorted(m for m in failed.modules if m.startswith("cocaq") and m not in usual) == [], failed.modules


def make_node(
    tmp: Path,
    database_url: str = "sqlite:///nonexistent",
    *,
    counter0: bool = False,
    sources: tuple[str, ...] = ("nvml", "rapl", "cgroup"),
    sysfs_root: Path | None = None,
    spool: Path | None = None,
) -> Node:
    tmp.mkdir(parents=True, exist_ok=True)
    spec = tmp / "fake-gpus.toml"
    spec.write_text(FAKE_GPUS.format(counter0="true" if counter0 else "false", gone=tmp / "gpu1-gone"))
    spool = spool or tmp / "spool"
    log = tmp / "hook.log"
    cfg = tmp / "cocaq.toml"
    cfg.write_text(
        f'database_url = "{database_url}"\n'
        f'spool_dir = "{spool}"\n'
        '[cluster]\nname = "cocaqtest"\n'
        "[collector]\n"
        f'nvml = "fake:{spec}"\n'
        f'hook_log = "{log}"\n'
        f'annotate_dir = "{tmp / "annotations"}"\n'
        f'sysfs_root = "{sysfs_root or tmp / "sys"}"\n'
        f"sources = {json.dumps(list(sources))}\n"
        "interval_s = 1\n"
    )
    shims = tmp / "shims"
    write_shims(str(shims), str(cfg))
    return Node(tmp, cfg, spool, log, shims, database_url)


def cocaq_env(node: Node) -> dict[str, str]:
    env = dict(os.environ)
    env["COCAQ_CONFIG"] = str(node.config)
    for k in list(env):
        if k.startswith("COCAQ_") and k not in ("COCAQ_CONFIG",) and not k.startswith("COCAQ_TEST_"):
            del env[k]
    return env


class Clock:
    """Wall-clock time under a test's control: the collector, RAPL deltas and the fake GPUs read it
    (the `clock` fixture of tests/conftest.py puts it in place of time.time)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now
