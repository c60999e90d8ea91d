"""Slurm job cgroups (v2 and v1 layouts) on fake trees, and the per-job CPU time counter."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from sysfs_tree import make_cgroup_v1, make_cgroup_v2

from cocaq.collector import cgroup as cgroup_mod
from cocaq.collector.cgroup import Cgroups, CgroupUnavailable, CpuCounter, JobCgroup, count_cpus


def test_v2_layout(tmp_path: Path) -> None:
    tree = make_cgroup_v2(tmp_path, node_cpus="0-31")
    tree.add_job("123", cpus="0-3", cpu_usec=5_000_000, mem_bytes=1 << 30)
    tree.add_job("456", cpus="0-3,8", cpu_usec=7)
    cg = Cgroups(str(tmp_path))
    assert cg.version == 2
    jobs = cg.jobs()
    assert set(jobs) == {"123", "456"}
    j = jobs["123"]
    assert (j.job_id, j.uid, j.cpu_usec, j.cpus, j.mem_bytes) == ("123", None, 5_000_000, 4, 1 << 30)
    assert j.path == str(tmp_path / "system.slice/slurmstepd.scope/job_123") and j.inode > 0
    assert (jobs["456"].cpus, jobs["456"].cpu_usec, jobs["456"].mem_bytes) == (5, 7, 0)
    assert cg.node_cpus() == 32


def test_v2_without_systemd_found_by_bounded_search(tmp_path: Path) -> None:
    tree = make_cgroup_v2(tmp_path, scope_parent="slurm-node/extra")  # depth 3
    tree.add_job("77", cpu_usec=1)
    cg = Cgroups(str(tmp_path))
    assert list(cg.jobs()) == ["77"]
    tree.add_job("78")
    assert set(cg.jobs()) == {"77", "78"}  # the cached scope is reused


def test_v2_scope_deeper_than_the_bound_is_not_found(tmp_path: Path) -> None:
    tree = make_cgroup_v2(tmp_path, scope_parent="a/b/c")  # depth 4
    tree.add_job("77")
    assert Cgroups(str(tmp_path)).jobs() == {}


def test_v2_scope_owned_by_a_user_is_ignored(tmp_path: Path) -> None:
    tree = make_cgroup_v2(tmp_path, scope_parent="user.slice/user-1000.slice")
    tree.add_job("77")
    assert tree.scope is not None
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    os.chown(tree.scope, os.geteuid() + 1000, -1)  # as a delegated cgroup would be
    assert Cgroups(str(tmp_path)).jobs() == {}


def test_v2_scope_search_bound_and_research(tmp_path: Path) -> None:
    tree = make_cgroup_v2(tmp_path, scope_parent="system.slice")
    tree.add_job("1")
    cg = Cgroups(str(tmp_path), research_s=3600)
    assert list(cg.jobs()) == ["1"]
    shutil.rmtree(tmp_path / "system.slice/slurmstepd.scope")  # slurmd restarted elsewhere
    moved = make_cgroup_v2(tmp_path, scope_parent="other.slice")
    moved.add_job("2")
    assert list(cg.jobs()) == ["2"]  # a vanished cached scope triggers a new search at once


@pytest.mark.parametrize("combined", [True, False])
def test_v1_layout(tmp_path: Path, combined: bool) -> None:
    tree = make_cgroup_v1(tmp_path, node_cpus="0-7", combined=combined)
    tree.add_job("100", uid=1001, cpus="2-5", cpu_usec=3_000_000, mem_bytes=4096)
    tree.add_job("200", uid=1002, cpus="6", cpu_usec=1)
    (tree.root / tree.cpuacct / "slurm/uid_1001/job_100/cpuacct.usage").write_text("3000000999\n")  # ns
    cg = Cgroups(str(tmp_path))
    assert cg.version == 1
    jobs = cg.jobs()
    assert set(jobs) == {"100", "200"}
    j = jobs["100"]
    assert (j.uid, j.cpu_usec, j.cpus, j.mem_bytes) == (1001, 3_000_000, 4, 4096)
    assert (jobs["200"].uid, jobs["200"].cpus) == (1002, 1)
    assert cg.node_cpus() == 8


def test_v1_missing_cpuset_and_memory_give_none(tmp_path: Path) -> None:
    tree = make_cgroup_v1(tmp_path)
    tree.add_job("5", uid=1000)
    shutil.rmtree(tmp_path / "cpuset/slurm/uid_1000")
    (tmp_path / "memory/slurm/uid_1000/job_5/memory.usage_in_bytes").write_text("lots\n")
    j = Cgroups(str(tmp_path)).jobs()["5"]
    assert (j.cpus, j.mem_bytes) == (None, None)


def test_no_cgroup_hierarchy(tmp_path: Path) -> None:
    with pytest.raises(CgroupUnavailable, match="neither"):
        Cgroups(str(tmp_path))


@pytest.mark.parametrize("version", [1, 2])
def test_non_digit_job_dirs_ignored(tmp_path: Path, version: int) -> None:
    tree = make_cgroup_v2(tmp_path) if version == 2 else make_cgroup_v1(tmp_path)
    tree.add_job("42", uid=1000)
    parent = tree.job_dir("42").parent
    for name in ("job_abc", "job_12x", "job_", "job_7.bak", "JOB_8", "job_-1", "job_ 9", "alice", "job_9\n"):
        shutil.copytree(tree.job_dir("42"), parent / name)
    if version == 1:
        shutil.copytree(parent, parent.parent / "uid_bob")  # not a uid either
    assert list(Cgroups(str(tmp_path)).jobs()) == ["42"]


@pytest.mark.parametrize("version", [1, 2])
def test_job_symlink_to_user_directory_not_followed(tmp_path: Path, version: int) -> None:
    cgroot = tmp_path / "cg"
    tree = make_cgroup_v2(cgroot) if version == 2 else make_cgroup_v1(cgroot)
    tree.add_job("1", uid=1000, cpu_usec=10)
    # A directory the "user" controls, shaped like a job cgroup claiming a lot of CPU time.
    evil = tmp_path / "home/alice/fake"
    evil.mkdir(parents=True)
    (evil / "cpu.stat").write_text("usage_usec 999999999999\n")
    (evil / "cpuacct.usage").write_text("999999999999000\n")
    (evil / "cpuset.cpus.effective").write_text("0-1023\n")
    (tree.job_dir("1").parent / "job_666").symlink_to(evil)
    # and a real job whose counter file is a symlink to it
    tree.add_job("2", uid=1000)
    counter_file = tree.job_dir("2") / ("cpu.stat" if version == 2 else "cpuacct.usage")
    counter_file.unlink()
    counter_file.symlink_to(evil / counter_file.name)
    jobs = Cgroups(str(cgroot)).jobs()
    assert list(jobs) == ["1"] and jobs["1"].cpu_usec == 10


def test_uid_dir_symlink_not_followed_v1(tmp_path: Path) -> None:
    tree = make_cgroup_v1(tmp_path / "cg")
    tree.add_job("1", uid=1000)
    evil = tmp_path / "home/bob"
    (evil / "job_9").mkdir(parents=True)
    (evil / "job_9/cpuacct.usage").write_text("1000\n")
    (tmp_path / "cg" / tree.cpuacct / "slurm/uid_1001").symlink_to(evil)
    assert list(Cgroups(str(tmp_path / "cg")).jobs()) == ["1"]


@pytest.mark.parametrize("version", [1, 2])
def test_garbage_counters_skip_the_job(tmp_path: Path, version: int) -> None:
    tree = make_cgroup_v2(tmp_path) if version == 2 else make_cgroup_v1(tmp_path)
    tree.add_job("1", cpu_usec=5)
    tree.add_job("2")
    tree.add_job("3")
    name = "cpu.stat" if version == 2 else "cpuacct.usage"
    (tree.job_dir("2") / name).write_text("usage_usec twelve\n" if version == 2 else "-12\n")
    (tree.job_dir("3") / name).write_text("9" * 5000)  # over the read bound
    cg = Cgroups(str(tmp_path))
    assert list(cg.jobs()) == ["1"]
    assert len(cg.errors) == 2


@pytest.mark.parametrize("version", [1, 2])
def test_job_vanishing_mid_scan_is_skipped(
    tmp_path: Path, version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = make_cgroup_v2(tmp_path) if version == 2 else make_cgroup_v1(tmp_path)
    for j in ("1", "2", "3"):
        tree.add_job(j, cpu_usec=int(j))
    real_open = os.open

    def racing_open(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "job_2" and tree.job_dir("2").exists():  # listed, then gone before it is opened
            shutil.rmtree(tree.job_dir("2"))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(cgroup_mod.os, "open", racing_open)
    cg = Cgroups(str(tmp_path))
    assert set(cg.jobs()) == {"1", "3"} and cg.errors == []


def test_job_vanishing_between_dir_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_cgroup_v2(tmp_path)
    tree.add_job("1")
    tree.add_job("2")
    real_open = os.open

    def racing_open(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "cpu.stat" and tree.job_dir("2").exists():
            shutil.rmtree(tree.job_dir("2"))  # the job ends after its directory was opened
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(cgroup_mod.os, "open", racing_open)
    cg = Cgroups(str(tmp_path))
    assert len(cg.jobs()) == 1 and cg.errors == []


def test_node_cpus_falls_back_to_cpu_count(tmp_path: Path) -> None:
    make_cgroup_v2(tmp_path)
    (tmp_path / "cpuset.cpus.effective").write_text("garbage\n")
    assert Cgroups(str(tmp_path)).node_cpus() == (os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("0-3,8", 5),
        ("0-3,8\n", 5),
        ("7", 1),
        ("0-127", 128),
        ("0-3,2-5", 6),
        ("", None),
        ("a-b", None),
        ("3-1", None),
        ("0-99999999", None),
        ("1,,2", None),
        ("0-", None),
    ],
)
def test_count_cpus(text: str, n: int | None) -> None:
    assert count_cpus(text) == n


def job(jid: str, usec: int, inode: int = 1) -> JobCgroup:
    return JobCgroup(jid, None, usec, 4, None, f"/x/job_{jid}", inode)


def test_cpu_counter_deltas_first_sight_and_reuse() -> None:
    c = CpuCounter()
    assert c.update({"1": job("1", 50_000_000)}) == {"1": 0.0}  # already running: its past is not ours
    assert c.update({"1": job("1", 62_500_000), "2": job("2", 3_000_000)}) == {"1": 12.5, "2": 0.0}
    assert c.update({"1": job("1", 62_500_000), "2": job("2", 4_000_000)}) == {"1": 0.0, "2": 1.0}
    out = c.update({"1": job("1", 1_000_000), "2": job("2", 4_000_000)})  # id 1 reused: went backwards
    assert out == {"1": 1.0, "2": 0.0} and c.resets == 1
    out = c.update({"1": job("1", 9_000_000, inode=99), "2": job("2", 4_000_000)})  # re-created cgroup
    assert out == {"1": 9.0, "2": 0.0} and c.resets == 2
    assert all(v >= 0 for v in out.values())


def test_cpu_counter_first_seen_full_and_grace() -> None:
    c = CpuCounter(first_seen_full=True, grace=1)
    assert c.update({"1": job("1", 2_000_000)}) == {"1": 2.0}
    assert c.update({}) == {}
    assert c.update({"1": job("1", 3_000_000)}) == {"1": 1.0}  # one missed scan: still known
    c.update({})
    c.update({})
    assert c.update({"1": job("1", 4_000_000)}) == {"1": 4.0}  # forgotten after the grace


def test_cpu_counter_state_round_trip() -> None:
    c = CpuCounter()
    c.update({"1": job("1", 1_000_000)})
    again = CpuCounter.from_state(json.loads(json.dumps(c.to_state())))
    assert again.update({"1": job("1", 3_500_000)}) == {"1": 2.5}
    bad = CpuCounter.from_state({"prev": {"../x": [1, 2, 3], "2": [1, "a", 3], "3": [-1, 1, 1]}, "n": "x"})
    assert bad.to_state()["prev"] == {}
