"""The Slurm hooks as slurmd runs them: through the generated shim, no PATH, Slurm's variables only."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from cocaq.collector import fakenvml
from cocaq.collector.spool import read_job_state
from cocaq.prolog_epilog.shims import render
from cocaq.prolog_epilog.slurmenv import read_env
from tests.nodekit import UUID_BY_MINOR, assert_fails_fast, make_node


def test_shim_is_absolute_and_always_exits_zero(tmp_path: Path) -> None:
    text = render("epilog", "/etc/cocaq/cocaq.toml", python="/opt/cocaq/bin/python")
    cmd = next(line for line in text.splitlines() if "/opt/cocaq/bin/python" in line)
    assert cmd.startswith("/"), "Slurm gives hooks no PATH: the command must be absolute"
    assert " -I -S " in cmd and "--config /etc/cocaq/cocaq.toml epilog" in cmd
    assert text.rstrip().endswith("exit 0")
    # A shim whose interpreter is gone (cocaq uninstalled) still exits 0: the node is not drained.
    shim = tmp_path / "cocaq-epilog"
    shim.write_text(render("epilog", "/nonexistent.toml", python="/nonexistent/python"))
    assert subprocess.run(["/bin/sh", str(shim)], env={}).returncode == 0


def test_prolog_and_epilog_record_the_job_and_exact_gpu_energy(tmp_path: Path) -> None:
    node = make_node(tmp_path, counter0=True)
    node.hook("prolog", 101, SLURM_JOB_GPUS="0,1", SLURM_JOB_COMMENT="cocaq: model=resnet50")
    state = read_job_state(str(node.spool), "101")
    assert state is not None
    node.hook("epilog", 101, SLURM_JOB_GPUS="0,1")
    start, end = node.events()
    assert (start["event"], end["event"]) == ("start", "end")
    assert start["job"]["user"] == "alice" and start["job"]["account"] == "lab_vision"
    assert start["job"]["comment"] == "cocaq: model=resnet50"
    assert start["uid"].startswith("cocaqtest/vm/101/start/")
    # Slurm's indices are minor numbers; the fake enumerates in the opposite order.
    by_index = {g["slurm_index"]: g["uuid"] for g in start["gpus"]}
    assert by_index == UUID_BY_MINOR
    assert all(g["minor"] == g["slurm_index"] for g in start["gpus"])
    # Exact energy from the counters: what the fake's model integrates between the two readings.
    fakenvml.configure(str(tmp_path / "fake-gpus.toml"))
    energy = {e["device"]: e for e in end["energy"]}
    assert set(energy) == set(UUID_BY_MINOR.values())
    for g0 in start["gpus"]:
        g1 = next(g for g in end["gpus"] if g["uuid"] == g0["uuid"])
        e = energy[g0["uuid"]]
        assert e["source"] == "nvml" and e["method"] == "measured" and e["final"] is True
        assert e["energy_j"] == pytest.approx((g1["energy_mj"] - g0["energy_mj"]) / 1000)
        watts = e["energy_j"] / (e["t1"] - e["t0"])
        assert 40 < watts < 450, watts
    assert end["job_start"] == start["ts"]
    assert read_job_state(str(node.spool), "101") is None, "the epilog removes the prolog's state"
    assert all(" ok " in line for line in node.log_lines()), node.log_lines()


def test_gpu_without_energy_counter_is_left_to_the_collector(tmp_path: Path) -> None:
    node = make_node(tmp_path, counter0=False)
    node.hook("prolog", 102, SLURM_JOB_GPUS="0")
    node.hook("epilog", 102, SLURM_JOB_GPUS="0")
    start, end = node.events()
    g0, g1 = start["gpus"][0], end["gpus"][0]
    assert g0["uuid"] == UUID_BY_MINOR[0] and g0["energy_mj"] is None
    # no counter: no exact energy claimed; both hooks read power, for the collector's integral to
    # start and end on, and a job this short gets the trapezoid of the two readings (a fallback)
    assert g0["power_w"] > 0 and g1["power_w"] > 0
    (edges,) = end["energy"]
    assert edges["source"] == "nvml-power-edges" and edges["final"] is True
    assert edges["energy_j"] == pytest.approx((g0["power_w"] + g1["power_w"]) / 2 * (g1["ts"] - g0["ts"]))
    assert edges["job_start"] == start["ts"]
    assert any("NOT_SUPPORTED" in e for e in start["errors"]), start["errors"]


def test_cpu_job_and_kind_from_argument_or_context(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.hook("prolog", 103, SLURM_JOB_PARTITION="cpu")
    node.hook("epilog", 103)
    start, end = node.events()
    assert start["gpus"] == [] and end["energy"] == []
    env = {"SLURM_JOB_ID": "7", "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"}
    assert read_env(None, {k.encode(): v.encode() for k, v in env.items()}).kind == "prologslurmctld"
    assert read_env("Epilog", {b"SLURM_JOB_ID": b"7"}).kind == "epilog"
    with pytest.raises(ValueError, match="SLURM_SCRIPT_CONTEXT"):
        read_env(None, {b"SLURM_JOB_ID": b"7"})


def test_epilog_without_prolog_still_records_the_end(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.hook("epilog", 104, SLURM_JOB_GPUS="1")
    (end,) = node.events()
    assert end["event"] == "end" and "energy" not in end
    assert any("no prolog record" in e for e in end["errors"])


@pytest.mark.parametrize(
    ("var", "value", "expect"),
    [
        ("SLURM_JOB_COMMENT", b"caf\xe9 \xff\xfe model=x", "caf\ufffd \ufffd\ufffd model=x"),
        ("SLURM_JOB_NAME", b"line1\nline2\x1b[31m", "line1\nline2?[31m"),
        ("SLURM_JOB_COMMENT", b"x" * 100_000, "x" * 4096),
    ],
)
def test_user_controlled_values_are_bounded_and_decoded(
    tmp_path: Path, var: str, value: bytes, expect: str
) -> None:
    node = make_node(tmp_path)
    node.hook("prolog", 105, env={var: value})
    (start,) = node.events()
    key = {"SLURM_JOB_COMMENT": "comment", "SLURM_JOB_NAME": "name"}[var]
    assert start["job"][key] == expect
    if len(value) > 4096:
        assert any("truncated" in e for e in start["errors"])


def test_bad_identifiers_are_refused_or_dropped(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.hook("prolog", "12;rm -rf /")  # not a job id: nothing written, the failure is logged
    assert node.events() == []
    assert "FAILED" in node.log_lines()[-1] and "SLURM_JOB_ID" in node.log_lines()[-1]
    node.hook("prolog", 106, SLURM_JOB_USER="../../etc", SLURM_JOB_GPUS="0;reboot")
    (start,) = node.events()
    assert "user" not in start["job"] and "gpus" not in start["job"]
    assert sum("unexpected shape" in e for e in start["errors"]) == 2


def test_spool_that_a_user_could_swap_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil"
    evil.mkdir()
    link = tmp_path / "spool-link"
    link.symlink_to(evil)
    node = make_node(tmp_path / "n", spool=link)
    node.hook("prolog", 107)
    assert not any(evil.rglob("*.json")), "wrote through a symlink"
    assert "symlink" in node.log_lines()[-1] and "FAILED" in node.log_lines()[-1]
    other = tmp_path / "other"
    other.mkdir()
    os.chown(other, 1234, 1234)
    node2 = make_node(tmp_path / "n2", spool=other)
    node2.hook("prolog", 108)
    assert "owned by uid 1234" in node2.log_lines()[-1]


def test_planted_prolog_state_symlink_is_not_followed(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.hook("prolog", 109)
    state = node.spool / "jobs" / "109.state"
    state.unlink()
    state.symlink_to("/etc/shadow")
    node.hook("epilog", 109)
    end = node.events()[-1]
    assert any("prolog state unreadable" in e for e in end["errors"]), end["errors"]


def test_disk_full_hooks_exit_zero_fast_and_say_why(tmp_path: Path) -> None:
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (mnt / "spool").mkdir(mode=0o755)
        with open(mnt / "filler", "wb") as fh, contextlib.suppress(OSError):
            fh.write(b"\0" * 64 * 1024)
        node = make_node(tmp_path / "n", spool=mnt / "spool")
        healthy = make_node(tmp_path / "healthy")
        usual = [healthy.hook_audit("prolog", 110, SLURM_JOB_GPUS="0,1"), healthy.hook_audit("epilog", 110)]
        for failed in (node.hook_audit("prolog", 110, SLURM_JOB_GPUS="0,1"), node.hook_audit("epilog", 110)):
            assert_fails_fast(failed, *usual)
        lines = node.log_lines()
        assert len(lines) == 2 and all("FAILED" in x for x in lines), lines
        assert "No space left on device" in lines[0]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_slurmctld_hooks_record_without_touching_gpus(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.hook("prologslurmctld", 111, SLURM_JOB_GPUS="0,1")
    node.hook("epilogslurmctld", 111, SLURM_JOB_GPUS="0,1", SLURM_JOB_EXIT_CODE="256")
    start, end = node.events()
    assert (start["event"], end["event"]) == ("ctld-start", "ctld-end")
    assert "gpus" not in start and end["job"]["exit_code"] == "256"
    assert read_job_state(str(node.spool), "111") is None, "the controller keeps no per-node job state"
