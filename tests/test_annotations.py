"""`cocaq.annotate` / `cocaq tag` from inside a job, read by the real hooks; hostile files refused, job kept."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.nodekit import Node, make_node

PY = sys.executable


def _as_job(node: Node, job_id: int, **more: str) -> dict[str, str]:
    """The environment a job's processes have (what the user-side API reads)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "COCAQ_"))}
    env.update(SLURM_JOB_ID=str(job_id), COCAQ_ANNOTATE_DIR=str(node.root / "annotations"), **more)
    return env


def _tag(node: Node, job_id: int, *pairs: str, strict: bool = False) -> subprocess.CompletedProcess[str]:
    args = [PY, "-m", "cocaq", "tag", *(["--strict"] if strict else []), *pairs]
    return subprocess.run(args, env=_as_job(node, job_id), capture_output=True, text=True, timeout=60)


def _annotate(node: Node, job_id: int | None, code: str) -> subprocess.CompletedProcess[str]:
    env = _as_job(node, job_id or 0)
    if job_id is None:
        del env["SLURM_JOB_ID"]
    return subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def _meta(node: Node) -> list[dict[str, Any]]:
    return [e for e in node.events() if e["event"] == "meta"]


def test_prolog_makes_a_private_file_the_job_user_owns(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.hook("prolog", 201)
    d = node.root / "annotations"
    st = os.lstat(d / "201.json")
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o711 and os.lstat(d).st_uid == 0
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_size) == (1001, 1001, 0o600, 0)
    node.hook("epilog", 201)
    assert not (d / "201.json").exists(), "the epilog removes it"
    assert _meta(node) == [], "nothing declared: no meta record"


def test_tag_and_annotate_any_number_of_times_reach_the_epilog_record(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.hook("prolog", 202)
    r = _tag(node, 202, "model=llama-3-8b", "precision=bf16", "epochs=1", "bs=32", "lr=3e-4")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = _annotate(node, 202, "import cocaq; print(cocaq.annotate(epochs=2, tokens=2_000_000, params='8B'))")
    assert r.stdout.strip() == "True" and r.stderr == "", r.stderr
    r = _tag(node, 202, "epochs=3", "lr=")  # a later value wins; `key=` removes
    assert r.returncode == 0
    node.hook("epilog", 202)
    (meta,) = _meta(node)
    assert meta["meta"]["api"] == {
        "model": "llama-3-8b", "precision": "bf16", "epochs": 3.0, "batch_size": 32,
        "tokens": 2_000_000, "params": 8_000_000_000,
    }  # fmt: skip
    assert meta["uid"].startswith("cocaqtest/vm/202/meta/") and meta["node"] == "vm"
    assert any(e["event"] == "end" for e in node.events())


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.hook("prolog", 203)
    procs = [
        subprocess.Popen([PY, "-c", f"import cocaq; cocaq.annotate(k{i}={i})"], env=_as_job(node, 203))
        for i in range(8)
    ]
    assert all(p.wait(60) == 0 for p in procs)
    node.hook("epilog", 203)
    (meta,) = _meta(node)
    assert meta["meta"]["api"] == {f"k{i}": i for i in range(8)}


def test_outside_a_job_or_without_the_prolog_it_warns_and_the_program_goes_on(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    code = (
        "import sys, cocaq\n"
        "r = cocaq.annotate(model='x')\n"
        "heavy = sorted(m for m in ('sqlalchemy', 'click', 'rich', 'cocaq.config', 'tomllib') if m in sys.modules)\n"
        "print(r, heavy)\n"
    )
    r = _annotate(node, None, code)
    assert r.returncode == 0 and r.stdout.strip() == "False []", r.stdout
    assert "not in a Slurm job" in r.stderr
    r = _annotate(node, 204, code)  # no prolog ran: no file
    assert r.stdout.strip().startswith("False") and "is the cocaq prolog installed" in r.stderr
    r = _annotate(node, 204, "import cocaq; print(cocaq.annotate(params=object(), epochs='many'))")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    r = _tag(node, 204, "notapair")
    assert r.returncode == 0 and "'notapair' is not key=value" in r.stderr
    assert _tag(node, 204, "model=x", strict=True).returncode == 1


def _hostile(node: Node, job_id: int, make: Any) -> tuple[list[dict[str, Any]], str]:
    node.hook("prolog", job_id)
    path = node.root / "annotations" / f"{job_id}.json"
    make(path)
    node.hook("epilog", job_id)
    log = "\n".join(line for line in node.log_lines() if f"job={job_id} " in line and line.startswith(""))
    return [e for e in node.events() if e["job_id"] == str(job_id)], log


def test_hostile_annotation_files_are_refused_with_a_reason_and_the_job_still_recorded(
    tmp_path: Path,
) -> None:
    node = make_node(tmp_path)
    secret = tmp_path / "shadow"
    secret.write_text('{"model": "root:$6$secret"}')

    def symlink(p: Path) -> None:  # the real /etc/shadow where there is one (root reads it; we must not)
        p.unlink()
        p.symlink_to("/etc/shadow" if os.path.exists("/etc/shadow") else secret)
        os.lchown(p, 1001, 1001)

    def huge(p: Path) -> None:
        p.write_bytes(b'{"model": "' + b"x" * (10 << 20) + b'"}')

    def not_theirs(p: Path) -> None:
        p.write_text('{"values": {"model": "planted"}}')
        os.chown(p, 1002, 1002)

    def not_json(p: Path) -> None:
        p.write_bytes(b'{"values": {"model": \xff\xfe')

    def deep(p: Path) -> None:
        p.write_text("[" * 30000 + "]" * 30000)

    def script(p: Path) -> None:
        p.write_text('{"values": {"model": "<script>alert(1)</script>", "params": "1e400", "x": [1, 2]}}')

    def huge_int(p: Path) -> None:  # float(int) overflows: it once lost the job's end record
        p.write_text('{"values": {"params": 1' + "0" * 400 + ', "x": 1' + "0" * 400 + "}}")

    def surrogate(p: Path) -> None:  # a lone surrogate cannot be encoded: it once failed the import
        p.write_text('{"values": {"model": "gpt-\\ud800", "params": "7e9"}}')

    cases = [
        (301, symlink, "annotation file refused"),
        (302, huge, "annotation file refused: 10485"),
        (303, not_theirs, "owned by uid 1002, the job's user is 1001"),
        (304, not_json, "not valid JSON"),
        (305, deep, "not valid JSON"),
        (306, script, "params: must be a number"),
        (307, huge_int, "params: must be a number, got a number of over 40 digits"),
        (308, surrogate, ""),
    ]
    for job_id, make, reason in cases:
        events, log = _hostile(node, job_id, make)
        kinds = sorted(e["event"] for e in events)
        assert "end" in kinds and "start" in kinds, (job_id, kinds)
        end = next(e for e in events if e["event"] == "end")
        assert "energy" in end and "job_start" in end, "the energy record comes before the user's file"
        assert f"epilog job={job_id} ok" in log and reason in log, log
        assert not (node.root / "annotations" / f"{job_id}.json").exists()
        if job_id not in (306, 308):
            assert kinds == ["end", "start"], "nothing of a refused file is kept"
    (meta,) = [e for e in _meta(node) if e["job_id"] == "306"]
    assert meta["meta"]["api"] == {"model": "<script>alert(1)</script>"}, "kept as text, escaped on output"
    (meta,) = [e for e in _meta(node) if e["job_id"] == "308"]
    assert meta["meta"]["api"] == {"model": "gpt-\ufffd", "params": 7_000_000_000}
    assert not (node.root / "spool" / "jobs" / "308.json").exists(), "the job's state file is gone"
    events = repr(node.events())
    assert "secret" not in events and "planted" not in events and "root:" not in events
    assert secret.read_text() == '{"model": "root:$6$secret"}', "the symlink's target is untouched"
