"""Every input surface fuzzed (Hypothesis), with a bounded budget for CI: sacct's parsable and JSON
output, the annotation file and `cocaq tag` values, the hooks' environment, the address and opt-out
files, carbon intensity CSVs. (Config files: tests/test_config_fuzz.py; API query parameters:
tests/test_api_fuzz.py.)

The invariants: no exception but the documented one-line errors; nothing absurd kept (every record
that survives passes cocaq.slurm.plausible's rules as stored); good records next to bad ones all kept;
what root runs (the hooks' reading of their environment and of the user's file) never fails its record.
Examples Hypothesis found are kept in `test_found_examples` as regression cases.
"""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cocaq.errors import CocaqError
from cocaq.ml.meta import parse_comment, validate
from cocaq.slurm.plausible import check
from cocaq.slurm.sacct import SACCT_FIELDS, ParseStats, iter_json, iter_parsable
from tests.test_hostile_import import line

BUDGET = settings(
    max_examples=int(os.environ.get("COCAQ_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
COLS = SACCT_FIELDS.split(",")
NOW = datetime.now(UTC)

HOSTILE_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "", "\ud800", "\x00", "|", "||", "\n", "-1", "99999999999999999999", "1e400", "nan", "inf",
            "Unknown", "None", "0001-01-01T00:00:00", "2999-01-01T00:00:00", "99999999-00:00:00", "1:2:3:4",
            "cpu=1e20,gres/gpu=-4,node=-1", "CANCELLED by 99999999999999999999", "x" * 300, "00:00:-5",
            "2026-11-10T10:00:00+14:00", "4294967296", "-2147483649", "UNLIMITED", "18446744073709551615",
        ]
    ),
)  # fmt: skip


def _line(job_id: int, over: dict[str, str]) -> str:
    return line(job_id, **over)


def _stored_sane(rec: Any) -> None:
    """What survives the rules is what a column holds and a report can add up."""
    p = check(rec, NOW)
    assert p.skip is None and not p.clamped, (p.skip, p.clamped)  # idempotent: a second pass changes nothing
    for name in ("job_id", "user_name", "name", "comment", "account", "partition", "node_list"):
        v = getattr(rec, name)
        if isinstance(v, str):
            v.encode("utf-8")
            assert "\x00" not in v


@BUDGET
@given(
    st.lists(
        st.dictionaries(st.sampled_from(COLS[2:]), HOSTILE_TEXT, min_size=1, max_size=4),
        min_size=1,
        max_size=6,
    )
)
def test_sacct_parsable(bad: list[dict[str, str]]) -> None:
    lines = ["|".join(COLS)]
    for i, over in enumerate(bad):
        lines.append(_line(100 + i, {}))  # a good job before each hostile one
        lines.append(_line(500 + i, over))
    data = [(x + "\n").encode("utf-8", "surrogatepass") for x in lines]
    st_ = ParseStats()
    kept = {}
    for rec in iter_parsable(data, tz=UTC, stats=st_):
        p = check(rec, NOW)
        if p.skip is None:
            _stored_sane(rec)
            kept[rec.job_id] = rec
    assert all(str(100 + i) in kept for i in range(len(bad))), "every good job kept"


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(min_value=-(10**25), max_value=10**25),
        st.sampled_from([2**63, 2**64, -(2**63), 10**400]), st.floats(), HOSTILE_TEXT,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)  # fmt: skip
JSON_KEYS = (
    "job_id", "name", "user", "account", "partition", "nodes", "cluster", "state", "time", "tres",
    "exit_code", "steps", "array", "het", "comment", "association", "required", "allocation_nodes",
)  # fmt: skip


@BUDGET
@given(st.lists(st.dictionaries(st.sampled_from(JSON_KEYS), JSON_VALUES, max_size=5), max_size=5))
def test_sacct_json(bad: list[dict[str, Any]]) -> None:
    start = int(datetime(2026, 11, 10, 10, tzinfo=UTC).timestamp())
    good = [
        {
            "job_id": 7000 + i, "name": "ok", "user": "bob", "account": "lab", "partition": "gpu",
            "nodes": "n1", "cluster": "c1", "state": {"current": ["COMPLETED"]},
            "time": {"elapsed": 60, "start": start, "end": start + 60, "submission": start},
            "tres": {"allocated": [{"type": "cpu", "name": "", "id": 1, "count": 2}]}, "steps": [],
        }
        for i in range(2)
    ]  # fmt: skip
    jobs = [
        good[0],
        *({**good[1], **b, "job_id": b.get("job_id", 8000 + i)} for i, b in enumerate(bad)),
        good[1],
    ]
    try:
        blob = json.dumps({"jobs": jobs}).encode()
    except (ValueError, OverflowError):
        return
    kept = {}
    for rec in iter_json(blob, stats=ParseStats()):
        if check(rec, NOW).skip is None:
            _stored_sane(rec)
            kept[rec.job_id] = rec
    assert {"7000", "7001"} <= set(kept)


@BUDGET
@given(JSON_VALUES)
@example({"params": 10**400, "model": "gpt-\ud800", "x": 10**400})
def test_model_metadata_values(values: Any) -> None:
    problems: list[str] = []
    got = validate(values if isinstance(values, dict) else {"v": values}, problems)
    json.dumps(got).encode("utf-8")  # storable and sendable
    for v in got.values():
        assert isinstance(v, str | int | float | bool)
        if isinstance(v, str):
            v.encode("utf-8")
    assert all("\n" not in p for p in problems)


@BUDGET
@given(st.text(max_size=200))
def test_tag_and_comment_text(text: str) -> None:
    problems: list[str] = []
    got = parse_comment(f"cocaq: {text}", problems)
    json.dumps(got).encode("utf-8")


@BUDGET
@given(st.binary(max_size=400))
@example(b'{"values": {"params": 1' + b"0" * 400 + b"}}")
@example(b"[" * 5000)
@example(b'{"values": {"model": "\\ud800"}}')
def test_annotation_file(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    from cocaq.collector import annotation_files

    d = tmp_path_factory.mktemp("ann")
    (d / "42.json").write_bytes(data)
    values, _mtime, problems = annotation_files.read(str(d), "42", None)
    if values is not None:
        json.dumps(values).encode("utf-8")
    assert all(isinstance(p, str) for p in problems)


ENV_NAMES = (
    b"SLURM_JOB_ID", b"SLURM_JOBID", b"SLURM_JOB_USER", b"SLURM_JOB_UID", b"SLURM_JOB_GID",
    b"SLURM_JOB_GPUS", b"CUDA_VISIBLE_DEVICES", b"SLURM_JOB_PARTITION", b"SLURM_JOB_ACCOUNT",
    b"SLURM_JOB_NODELIST", b"SLURM_SCRIPT_CONTEXT", b"SLURM_JOB_COMMENT", b"SLURM_JOB_NAME",
)  # fmt: skip


@BUDGET
@given(
    st.dictionaries(st.sampled_from(ENV_NAMES), st.binary(max_size=40), max_size=10),
    st.sampled_from([None, "prolog", "epilog", "bogus"]),
)
def test_hook_environment(env: dict[bytes, bytes], kind: str | None) -> None:
    from cocaq.prolog_epilog.slurmenv import read_env

    try:
        job = read_env(kind, env)
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    json.dumps(job.fields).encode("utf-8")  # what goes into the spool record


@BUDGET
@given(st.binary(max_size=300))
@example(b"alice\x00,alice@example.org\n")
@example(b"\xff\xfe\n")
def test_address_and_opt_out_files(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    from cocaq.reports.recipients import load_address_map, load_opt_out

    d = tmp_path_factory.mktemp("addr")
    for name, loader in (("map.csv", load_address_map), ("optout.txt", load_opt_out)):
        p = d / name
        p.write_bytes(data)
        try:
            loaded, problems = loader(p)
        except CocaqError as exc:
            assert "\n" not in str(exc)
            continue
        assert all("\n" not in x for x in problems)
        json.dumps(sorted(loaded) if isinstance(loaded, set) else loaded).encode("utf-8")


@BUDGET
# (a `"` opens a quoted field that may run to the end of the file: CSV's syntax, not a bad record)
@given(st.lists(st.lists(HOSTILE_TEXT.filter(lambda x: '"' not in x), min_size=1, max_size=4), max_size=8))
def test_carbon_csv(rows: list[list[str]]) -> None:
    from cocaq.carbon.series_import import parse_csv

    text = (
        "zone,datetime,gco2_per_kwh\n"
        + "\n".join(",".join(r) for r in rows)
        + "\nFRA,2026-11-10T10:00:00Z,55\n"
    )
    try:
        parsed = parse_csv(text.encode("utf-8", "surrogatepass"), "fuzz.csv")
    except CocaqError as exc:
        assert "\n" not in str(exc)
        return
    good = [r for r in parsed.rows if r.zone == "FRA" and r.g_per_kwh == 55.0]
    assert good, "the good row next to the bad ones is kept"
    assert all(math.isfinite(r.g_per_kwh) and 0 <= r.g_per_kwh < 5000 for r in parsed.rows), (
        "no absurd intensity"
    )


def test_found_examples(tmp_path: Path) -> None:
    """Cases the fuzzing found (and the audit's), kept as regressions."""
    rec = next(
        iter_parsable(
            [("|".join(COLS) + "\n").encode(), (_line(1, {"ExitCode": "9" * 25}) + "\n").encode()], tz=UTC
        )
    )
    assert check(rec, NOW).skip is None and rec.exit_code is None
    problems: list[str] = []
    assert validate({"params": 10**400, "tokens": "1e400"}, problems) == {} and len(problems) == 2
    from cocaq.carbon.series_import import parse_csv

    p = parse_csv(
        b"zone,datetime,gco2_per_kwh\nFRA,2026-11-10T10:00:00Z,99999999999999999999\n", "absurd.csv"
    )
    assert p.rows == [] and list(p.skipped) == ["over 3000 g/kWh (no grid emits that much)"]
