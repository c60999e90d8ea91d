"""The collector's `jobmeta` source: declared metadata while the job runs, and the detected framework."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from cocaq.collector.daemon import Collector
from cocaq.collector.ml_meta_source import pids_by_job
from cocaq.config_load import load_config
from cocaq.ml.annotation import update
from tests.nodekit import Node, make_node

SITE = "venv/lib/python3.11/site-packages"


def _proc(root: Path, pid: int, job: str, uid: int, maps: list[str], argv: list[str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n")
    (d / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "maps").write_text(
        "".join(f"7f2a4c000000-7f2a4e000000 r-xp 00000000 fd:01 1234 {m}\n" for m in maps)
    )
    (d / "root").symlink_to("/")


def _node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    node = make_node(tmp_path, sources=("nvml", "jobmeta"))
    with open(node.config, "a") as fh:
        fh.write("detect_interval_s = 1\n")
    site = tmp_path / SITE
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch-2.3.1.dist-info").mkdir()
    (site / "tensorflow").mkdir()
    (site / "tensorflow-2.16.1.dist-info").mkdir()
    proc = tmp_path / "proc"
    torch = [f"{site}/torch/lib/libtorch_cuda.so", f"{site}/torch/lib/libc10.so"]
    # pid 4097: what the fake NVML shows on the GPU with minor 1
    _proc(
        proc, 4097, "401", 1001, torch, ["/usr/bin/python3", "-m", "torch.distributed.run", "--token=SECRET"]
    )
    _proc(proc, 4098, "401", 1002, [f"{site}/tensorflow/libtensorflow_framework.so.2"], ["python"])
    _proc(proc, 5000, "402", 1001, [f"{site}/tensorflow/libtensorflow_framework.so.2"], ["python", "t.py"])
    _proc(proc, 5001, "999", 1001, torch, ["python"])  # no prolog: not a job we know
    monkeypatch.setenv("COCAQ_PROC_ROOT", str(proc))
    return node


def _meta_events(node: Node) -> list[dict[str, Any]]:
    return [e for e in node.events() if e["event"] == "meta"]


def test_pids_by_job_from_the_cgroup_of_each_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _node(tmp_path, monkeypatch)
    assert pids_by_job(str(tmp_path / "proc")) == {"401": [4097, 4098], "402": [5000], "999": [5001]}
    assert pids_by_job(str(tmp_path / "nonexistent")) == {}


def test_declared_values_while_running_and_the_detected_framework(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node(tmp_path, monkeypatch)
    node.hook("prolog", 401, SLURM_JOB_GPUS="1")
    node.hook("prolog", 402, SLURM_JOB_PARTITION="cpu")
    as_job = {"SLURM_JOB_ID": "401", "COCAQ_ANNOTATE_DIR": str(tmp_path / "annotations")}
    assert update({"model": "llama-3-8b", "epochs": 1}, as_job)
    c = Collector(load_config(node.config, {}))
    try:
        c.sample()
        got = {e["job_id"]: e["meta"] for e in _meta_events(node)}
        assert got["401"]["api"] == {"model": "llama-3-8b", "epochs": 1.0}
        assert got["401"]["detected"] == {
            "framework": "pytorch", "framework_version": "2.3.1", "launcher": "torchrun",
        }, "the other user's tensorflow process in the job's cgroup is not this job's"  # fmt: skip
        assert got["402"] == {"detected": {"framework": "tensorflow", "framework_version": "2.16.1",
                                           "launcher": "python"}}  # fmt: skip
        assert "999" not in got and "SECRET" not in json.dumps(node.events())
        # Nothing changed: nothing new. A counter updated: only what the job declared goes again.
        n = len(_meta_events(node))
        time.sleep(1.1)
        c.sample()
        assert len(_meta_events(node)) == n
        time.sleep(0.02)
        assert update({"epochs": 2}, as_job)
        os.utime(tmp_path / "annotations" / "401.json", (time.time() + 5, time.time() + 5))
        time.sleep(1.1)
        c.sample()
        new = _meta_events(node)[n:]
        assert [(e["job_id"], set(e["meta"])) for e in new] == [("401", {"api", "api_ts"})]
        assert new[0]["meta"]["api"] == {"model": "llama-3-8b", "epochs": 2.0}
    finally:
        c.close()


def test_one_jobs_hostile_file_does_not_stop_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A number of 400 digits once raised in the jobmeta source each cycle, and the jobs after it got no
    metadata; now it is refused with a reason, and a failure of any kind stays with its own job."""
    node = _node(tmp_path, monkeypatch)
    node.hook("prolog", 401, SLURM_JOB_GPUS="1")
    node.hook("prolog", 402, SLURM_JOB_PARTITION="cpu")
    ann = tmp_path / "annotations"
    (ann / "401.json").write_text('{"values": {"params": 1' + "0" * 400 + ', "model": "gpt-\\ud800"}}')
    assert update({"model": "resnet-50"}, {"SLURM_JOB_ID": "402", "COCAQ_ANNOTATE_DIR": str(ann)})
    c = Collector(load_config(node.config, {}))
    try:
        c.sample()
        got = {e["job_id"]: e["meta"] for e in _meta_events(node)}
        assert got["401"]["api"] == {"model": "gpt-\ufffd"} and got["402"]["api"] == {"model": "resnet-50"}
        # a failure this module does not foresee, in the first job read: the next still gets its metadata
        from cocaq.collector import ml_meta_source

        calls: list[str] = []
        real = ml_meta_source.annotation_files.read

        def boom(*a: Any, **k: Any) -> Any:
            calls.append(a[1])
            if len(calls) == 1:
                raise RuntimeError("unforeseen")
            return real(*a, **k)

        monkeypatch.setattr(ml_meta_source.annotation_files, "read", boom)
        for jid in ("401", "402"):
            assert update({"model": f"resnet-{jid}"}, {"SLURM_JOB_ID": jid, "COCAQ_ANNOTATE_DIR": str(ann)})
            os.utime(ann / f"{jid}.json", (time.time() + 5, time.time() + 5))
        time.sleep(1.1)
        c.sample()
        assert len(calls) == 2, calls
        last = [e for e in _meta_events(node) if e["job_id"] == calls[1]][-1]
        assert last["meta"]["api"]["model"] == f"resnet-{calls[1]}"
    finally:
        c.close()


def test_an_oversized_annotation_file_is_emptied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The annotation file is in RAM (/run) and its writer is the user: 50 MB once stayed there for the
    job's life. The collector empties one over the limit (the very file, never through a link)."""
    node = _node(tmp_path, monkeypatch)
    node.hook("prolog", 402, SLURM_JOB_PARTITION="cpu")
    f = tmp_path / "annotations" / "402.json"
    with open(f, "w") as fh:  # the prolog made it the user's; its content is theirs
        fh.write('{"model": "' + "x" * (2 << 20) + '"}')
    c = Collector(load_config(node.config, {}))
    try:
        c.sample()
    finally:
        c.close()
    assert f.stat().st_size == 0 and f.stat().st_uid == 1001
    assert "402" not in {e["job_id"] for e in _meta_events(node) if "api" in e["meta"]}
