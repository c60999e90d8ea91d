"""Fake sysfs/cgroupfs trees shaped like the real ones, for tests and benchmarks.

RAPL trees copy the kernel's layout: zones live under `devices/virtual/powercap/intel-rapl/` (subzones
nested in their package) and `class/powercap/<zone>` are relative symlinks to them.  Cgroup trees copy
Slurm's cgroup/v2 and cgroup/v1 layouts (v1 with systemd's `cpuacct -> cpu,cpuacct` link).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MAX_UJ = 262143328850


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@dataclass
class RaplTree:
    """A fake powercap tree; domain ids are the collector's ("package-0", "package-0/dram", "psys")."""

    root: Path
    max_range_uj: int
    zones: dict[str, Path] = field(default_factory=dict)  # domain id -> zone directory

    def add_zone(
        self, zone: str, name: str, domain_id: str, parent: str | None = None, energy_uj: int = 0
    ) -> Path:
        """A zone (`intel-rapl:0`, or subzone `intel-rapl:0:1` of `parent`'s zone) plus its class link."""
        control = zone.split(":")[0]
        control_dir = self.root / "devices/virtual/powercap" / control
        zdir = (self.zones[parent] if parent else control_dir) / zone
        zdir.mkdir(parents=True, exist_ok=True)
        _write(zdir / "name", name + "\n")
        _write(zdir / "max_energy_range_uj", f"{self.max_range_uj}\n")
        _write(zdir / "enabled", "1\n")
        _write(zdir / "constraint_0_name", "long_term\n")
        _write(zdir / "constraint_0_power_limit_uw", "150000000\n")
        _write(zdir / "energy_uj", f"{energy_uj}\n")
        cls = self.root / "class/powercap"
        cls.mkdir(parents=True, exist_ok=True)
        if not (cls / control).is_symlink():
            os.symlink(os.path.relpath(control_dir, cls), cls / control)
        os.symlink(os.path.relpath(zdir, cls), cls / zone)
        self.zones[domain_id] = zdir
        return zdir

    def path(self, domain_id: str) -> Path:
        return self.zones[domain_id]

    def get(self, domain_id: str) -> int:
        return int((self.zones[domain_id] / "energy_uj").read_text())

    def set(self, domain_id: str, energy_uj: int) -> None:
        (self.zones[domain_id] / "energy_uj").write_text(f"{energy_uj}\n")

    def add_joules(self, domain_id: str, joules: float) -> int:
        """Advance the counter, wrapping at the max range as `cur + max - prev` expects; returns it."""
        value = (self.get(domain_id) + round(joules * 1e6)) % self.max_range_uj
        self.set(domain_id, value)
        return value


def make_rapl(
    root: str | os.PathLike[str],
    packages: int = 2,
    dram: bool = True,
    psys: bool = False,
    core: bool = False,
    max_range_uj: int = DEFAULT_MAX_UJ,
    *,
    uncore: bool = False,
    mmio: bool = False,
    prefix: str = "intel-rapl",
) -> RaplTree:
    """A node's RAPL tree.  `mmio` adds the `intel-rapl-mmio:0` copy of package-0 (must be ignored)."""
    tree = RaplTree(Path(root), max_range_uj)
    for p in range(packages):
        pkg = f"package-{p}"
        tree.add_zone(f"{prefix}:{p}", pkg, pkg, energy_uj=1_000_000 * (p + 1))
        subs = [k for k, on in (("core", core), ("uncore", uncore), ("dram", dram)) if on]
        for m, kind in enumerate(subs):
            tree.add_zone(f"{prefix}:{p}:{m}", kind, f"{pkg}/{kind}", parent=pkg, energy_uj=100_000 * (m + 1))
    if psys:
        tree.add_zone(f"{prefix}:{packages}", "psys", "psys", energy_uj=5_000_000)
    if mmio and packages:
        tree.add_zone("intel-rapl-mmio:0", "package-0", "mmio/package-0", energy_uj=7_000_000)
    return tree


@dataclass
class CgroupTree:
    """A fake cgroup hierarchy with Slurm job cgroups; cpu times are given in microseconds."""

    root: Path
    version: int
    scope: Path | None = None  # v2: the slurmstepd.scope directory
    cpuacct: str = "cpu,cpuacct"  # v1: the real cpuacct directory name
    uids: dict[str, int] = field(default_factory=dict)

    def job_dir(self, job_id: str) -> Path:
        """The directory the collector reads CPU time from (v1: the cpuacct one)."""
        if self.version == 2:
            assert self.scope is not None
            return self.scope / f"job_{job_id}"
        return self.root / self.cpuacct / "slurm" / f"uid_{self.uids[job_id]}" / f"job_{job_id}"

    def _v1_dir(self, controller: str, job_id: str) -> Path:
        return self.root / controller / "slurm" / f"uid_{self.uids[job_id]}" / f"job_{job_id}"

    def add_job(
        self, job_id: str, uid: int = 1000, cpus: str = "0-3", cpu_usec: int = 0, mem_bytes: int = 0
    ) -> Path:
        self.uids[job_id] = uid
        d = self.job_dir(job_id)
        if self.version == 2:
            for sub in ("", "step_extern", "step_batch", "step_batch/user/task_0"):
                s = d / sub
                s.mkdir(parents=True, exist_ok=True)
                _write(s / "cgroup.controllers", "cpuset cpu io memory pids\n")
                _write(s / "cgroup.procs", "")
            _write(d / "cpuset.cpus", cpus + "\n")
            _write(d / "cpuset.cpus.effective", cpus + "\n")
            _write(d / "memory.current", f"{mem_bytes}\n")
            _write(d / "memory.max", "max\n")
        else:
            for sub in ("", "step_batch"):
                (d / sub).mkdir(parents=True, exist_ok=True)
            _write(d / "cpuacct.stat", "user 0\nsystem 0\n")
            cs = self._v1_dir("cpuset", job_id)
            _write(cs / "cpuset.cpus", cpus + "\n")
            _write(cs / "cpuset.mems", "0\n")
            _write(self._v1_dir("memory", job_id) / "memory.usage_in_bytes", f"{mem_bytes}\n")
        self.set_cpu(job_id, cpu_usec)
        return d

    def set_cpu(self, job_id: str, usec: int) -> None:
        d = self.job_dir(job_id)
        if self.version == 2:
            _write(
                d / "cpu.stat",
                f"usage_usec {usec}\nuser_usec {usec * 9 // 10}\nsystem_usec {usec - usec * 9 // 10}\n"
                "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n",
            )
        else:
            _write(d / "cpuacct.usage", f"{usec * 1000}\n")

    def set_mem(self, job_id: str, mem_bytes: int) -> None:
        if self.version == 2:
            _write(self.job_dir(job_id) / "memory.current", f"{mem_bytes}\n")
        else:
            _write(self._v1_dir("memory", job_id) / "memory.usage_in_bytes", f"{mem_bytes}\n")

    def remove_job(self, job_id: str) -> None:
        shutil.rmtree(self.job_dir(job_id))
        if self.version == 1:
            for controller in ("cpuset", "memory"):
                shutil.rmtree(self._v1_dir(controller, job_id), ignore_errors=True)
        self.uids.pop(job_id, None)

    def set_node_cpus(self, cpus: str) -> None:
        if self.version == 2:
            _write(self.root / "cpuset.cpus.effective", cpus + "\n")
        else:
            _write(self.root / "cpuset" / "cpuset.cpus", cpus + "\n")
            _write(self.root / "cpuset" / "cpuset.effective_cpus", cpus + "\n")


def make_cgroup_v2(
    root: str | os.PathLike[str], node_cpus: str = "0-15", scope_parent: str = "system.slice"
) -> CgroupTree:
    """Slurm's cgroup/v2 layout; `scope_parent` other than system.slice mimics slurmd without systemd."""
    r = Path(root)
    r.mkdir(parents=True, exist_ok=True)
    _write(r / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
    _write(r / "cgroup.subtree_control", "cpuset cpu io memory pids\n")
    for d in (
        "system.slice/slurmd.service",
        "system.slice/sshd.service",
        "user.slice/user-0.slice",
        "init.scope",
    ):
        _write(r / d / "cgroup.controllers", "cpu memory pids\n")
    scope = r / scope_parent / "slurmstepd.scope"
    _write(scope / "system" / "cgroup.procs", "")
    _write(scope / "cgroup.controllers", "cpuset cpu io memory pids\n")
    tree = CgroupTree(r, 2, scope=scope)
    tree.set_node_cpus(node_cpus)
    return tree


def make_cgroup_v1(
    root: str | os.PathLike[str], node_cpus: str = "0-15", combined: bool = True
) -> CgroupTree:
    """Slurm's cgroup/v1 layout; `combined` mounts cpu and cpuacct together with systemd's links."""
    r = Path(root)
    r.mkdir(parents=True, exist_ok=True)
    name = "cpu,cpuacct" if combined else "cpuacct"
    for controller in (name, "cpuset", "memory", "devices", "freezer"):
        _write(r / controller / "cgroup.procs", "")
        (r / controller / "slurm").mkdir(exist_ok=True)
    _write(r / name / "cpuacct.usage", "0\n")
    if combined:
        os.symlink("cpu,cpuacct", r / "cpu")
        os.symlink("cpu,cpuacct", r / "cpuacct")
    os.makedirs(r / "unified", exist_ok=True)  # systemd's hybrid mode; v1 controllers still rule
    tree = CgroupTree(r, 1, cpuacct=name)
    tree.set_node_cpus(node_cpus)
    return tree
