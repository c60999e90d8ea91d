"""Model metadata: the comment's grammar, validation of any source, merging by source, and the stored row."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.accounting.importer import import_records
from cocaq.collector.ship import connect
from cocaq.config import Config
from cocaq.ml import store as modelmeta_store
from cocaq.ml.meta import merge, parse_comment, parse_number, to_row, validate
from cocaq.slurm.record import JobRecord
from tests.builders import config, job

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
ISSUE_COMMENT = "cocaq: model=llama-3-8b task=finetune params=8e9 framework=pytorch precision=bf16 batch_size=32 dataset=alpaca"


def test_the_issue_comment_gives_typed_values() -> None:
    problems: list[str] = []
    got = parse_comment(ISSUE_COMMENT, problems)
    assert got == {
        "model": "llama-3-8b",
        "task": "finetune",
        "params": 8_000_000_000,
        "framework": "pytorch",
        "precision": "bf16",
        "batch_size": 32,
        "dataset": "alpaca",
    }
    assert problems == []


def test_other_text_in_the_comment_is_left_alone() -> None:
    c = 'nightly run, ask bob; cocaq: model="llama 3 8b" bs=16 epochs=3 tokens=1.5B my notes; ticket=HR-12'
    got = parse_comment(c)
    # ticket= is after the `;` that ends the cocaq part: not ours
    assert got == {"model": "llama 3 8b", "batch_size": 16, "epochs": 3.0, "tokens": 1_500_000_000}
    assert parse_comment("cocaq:notify") == {}
    assert parse_comment("cocaq:notify cocaq: model=x") == {"model": "x"}
    assert parse_comment("just a comment with model=x") == {}, "only what follows cocaq: counts"
    assert parse_comment(None) == {} and parse_comment("") == {}


def test_bad_values_are_refused_with_a_reason_and_the_rest_kept() -> None:
    problems: list[str] = []
    got = parse_comment("cocaq: model=ok params=lots batch_size=-3 epochs=inf precision=BFLOAT16", problems)
    assert got == {"model": "ok", "precision": "bf16"}
    assert any(p.startswith("params: must be a number") for p in problems), problems
    assert any(p.startswith("batch_size: -3 is out of range") for p in problems), problems
    assert any(p.startswith("epochs:") for p in problems), problems


def test_validate_caps_strings_strips_controls_and_keeps_unknown_keys_as_extra() -> None:
    problems: list[str] = []
    got = validate(
        {
            "model": "<script>alert(1)</script>\x1b[31m" + "x" * 400,
            "lr": 3e-4,
            "optimizer": "adamw",
            "amp": True,
            "nested": {"a": 1},
            "bad key!": 1,
            "params": True,
            "tokens": "2e18",
        },
        problems,
    )
    assert got["model"].startswith("<script>alert(1)</script>[31m"), "text is kept; escaping is on output"
    assert "\x1b" not in got["model"] and len(got["model"]) == 256
    assert got["lr"] == 3e-4 and got["optimizer"] == "adamw" and got["amp"] is True
    assert "nested" not in got and "bad key!" not in got and "params" not in got and "tokens" not in got
    assert len(problems) == 5, problems
    many = {f"k{i}": i for i in range(40)}
    problems = []
    got = validate(many, problems)
    assert len(got) == 32 and any("more than 32 extra keys" in p for p in problems)
    problems = []
    assert validate({f"k{i}": i for i in range(100)}, problems) == {} and problems
    problems = []
    assert validate(["not", "a", "dict"], problems) == {} and problems


@pytest.mark.parametrize(
    ("raw", "want"),
    [("8e9", 8e9), ("8B", 8e9), ("7b", 7e9), ("175M", 175e6), ("1.5k", 1500), ("7_000", 7000), (3, 3.0)],
)
def test_numbers_in_the_forms_people_write(raw: object, want: float) -> None:
    assert parse_number(raw) == pytest.approx(want)


def test_declared_values_win_over_detected_and_the_api_over_the_comment() -> None:
    values, sources = merge(
        [
            ("api", {"epochs": 1, "tokens": 100}),
            ("detected", {"framework": "pytorch", "framework_version": "2.3.1", "precision": "fp32"}),
            ("comment", {"model": "m", "precision": "bf16", "framework": "jax"}),
            ("api", {"epochs": 2}),  # a later update of the counter
        ]
    )
    assert values == {
        "framework": "jax",
        "framework_version": "2.3.1",
        "precision": "bf16",
        "model": "m",
        "epochs": 2,
        "tokens": 100,
    }
    assert sources == {
        "framework": "comment",
        "framework_version": "detected",
        "precision": "comment",
        "model": "comment",
        "epochs": "api",
        "tokens": "api",
    }
    row = to_row({**values, "lr": 0.1}, sources)
    assert row["model_name"] == "m" and row["extra"] == {"lr": 0.1} and row["parameters"] is None


# --- stored -------------------------------------------------------------------------------------------


def _cfg(tmp_path: Path, url: str) -> Config:
    return config(tmp_path, url, defaults={"cpu_tdp_w_per_core": None})


def _job(raw: int, comment: str | None = None) -> JobRecord:
    """Alice's one-hour job on node "vm" from T0, with its Slurm comment."""
    return job(raw, T0, node_list="vm", queued=timedelta(minutes=1), cpu_s=3600, comment=comment)


def _meta_event(raw: int, ts: float, meta: dict[str, object]) -> dict[str, object]:
    return {"uid": f"c/vm/{raw}/meta/{ts}", "event": "meta", "cluster": "c", "node": "vm", "job_id": str(raw),
            "ts": ts, "meta": meta}  # fmt: skip


def _rows(engine: Engine) -> dict[str, dict[str, object]]:
    with engine.connect() as c:
        rs = c.execute(
            text(
                "SELECT j.job_id, m.model_name, m.precision, m.epochs, m.tokens, m.framework,"
                " m.framework_version, m.batch_size, m.parameters, m.sources, m.extra"
                " FROM model_metadata m JOIN jobs j ON j.id = m.job_pk"
            )
        ).mappings()
        out = {}
        for r in rs:
            d = dict(r)
            for k in ("sources", "extra"):
                if isinstance(d[k], str):
                    d[k] = json.loads(d[k])
            out[d.pop("job_id")] = d
        return out


def test_comment_api_and_detected_end_up_in_one_row_with_their_sources(
    engine: Engine, tmp_path: Path
) -> None:
    cfg = _cfg(tmp_path, engine.url.render_as_string(hide_password=False))
    s = import_records(engine, [_job(1, ISSUE_COMMENT), _job(2, "no metadata"), _job(3)], cfg, source="t")
    assert s.models == 1, "the comment's metadata is written by the import"
    t = T0.timestamp()
    target = connect(engine.url.render_as_string(hide_password=False))
    try:
        cid = target.cluster_id("c")
        target.ship_events(
            cid,
            [
                _meta_event(1, t + 60, {"detected": {"framework": "pytorch", "framework_version": "2.3.1"}}),
                _meta_event(1, t + 600, {"api": {"epochs": 1, "tokens": 1000, "precision": "fp32"}}),
                _meta_event(1, t + 3500, {"api": {"epochs": 3, "tokens": "3k"}}),
                _meta_event(3, t + 60, {"detected": {"framework": "jax"}}),
                _meta_event(3, t + 70, {"api": "not a mapping"}),
            ],
        )
    finally:
        target.close()
    from cocaq.accounting import measured

    res = measured.refresh(engine, cfg, since=T0 - timedelta(days=1))
    assert res.events_linked == 5 and res.models == 2
    rows = _rows(engine)
    assert set(rows) == {"1", "3"}
    one = rows["1"]
    assert (one["model_name"], one["precision"], one["epochs"], one["tokens"]) == (
        "llama-3-8b",
        "fp32",
        3.0,
        3000,
    )
    assert (one["framework"], one["framework_version"], one["batch_size"]) == ("pytorch", "2.3.1", 32)
    assert one["parameters"] == 8_000_000_000
    assert one["sources"] == {
        "model": "comment", "task": "comment", "params": "comment", "framework": "comment",
        "precision": "api", "batch_size": "comment", "dataset": "comment", "epochs": "api",
        "tokens": "api", "framework_version": "detected",
    }  # fmt: skip
    assert rows["3"]["framework"] == "jax" and rows["3"]["model_name"] is None
    # Again: nothing changes, nothing is written.
    with engine.begin() as c:
        assert modelmeta_store.refresh_since(c, None) == 0
    # A later import that changes the comment changes the row; one that drops it keeps what the job declared.
    import_records(engine, [replace(_job(1, "cocaq: model=llama-3-70b"), state="FAILED")], cfg, source="t")
    assert _rows(engine)["1"]["model_name"] == "llama-3-70b"
    import_records(engine, [replace(_job(3, "cocaq: model=gemma"), state="FAILED")], cfg, source="t")
    assert _rows(engine)["3"]["model_name"] == "gemma" and _rows(engine)["3"]["framework"] == "jax"


def test_one_jobs_bad_metadata_never_takes_the_others_with_it(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone surrogate declared from inside a job once failed the whole refresh (one transaction) and
    every other job's metadata in the window with it: it is replaced now, and any failure of one job's
    row is logged and leaves the others written."""
    cfg = _cfg(tmp_path, engine.url.render_as_string(hide_password=False))
    import_records(engine, [_job(11), _job(12), _job(13)], cfg, source="t")
    t = T0.timestamp()
    target = connect(engine.url.render_as_string(hide_password=False))
    try:
        cid = target.cluster_id("c")
        target.ship_events(
            cid,
            [
                _meta_event(11, t + 60, {"api": {"model": "gpt-\ud800", "params": 10**400}}),
                _meta_event(12, t + 60, {"api": {"model": "resnet-50"}}),
                _meta_event(13, t + 60, {"api": {"model": "vit-b"}}),
            ],
        )
    finally:
        target.close()
    from cocaq.accounting import measured

    real = modelmeta_store.to_row

    def fails_for_vit(values: Any, sources: Any) -> Any:
        if values.get("model") == "vit-b":
            raise ValueError("unforeseen")
        return real(values, sources)

    monkeypatch.setattr(modelmeta_store, "to_row", fails_for_vit)
    res = measured.refresh(engine, cfg, since=T0 - timedelta(days=1))
    rows = _rows(engine)
    assert rows["11"]["model_name"] == "gpt-\ufffd" and rows["11"]["parameters"] is None
    assert rows["12"]["model_name"] == "resnet-50" and "13" not in rows
    assert res.models == 2
