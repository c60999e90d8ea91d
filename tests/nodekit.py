"""Helpers for node-side tests: a node's config, its hook shims, and running them as slurmd would."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cocaq.prolog_epilog.shims import write_shims

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

    def events(self) -> list[dict[str, Any]]:
        d = self.spool / "events"
        if not d.exists():
            return []
        return [json.loads(p.read_bytes()) for p in sorted(d.glob("*.json"))]

    def log_lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


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
