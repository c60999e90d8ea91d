"""Energy per ML model, framework and run (cocaq/footprint/by_model.py) on SQLite and PostgreSQL.

Jobs are inserted with round energies (CO2 = 0.2 kg per kWh) so that every expected figure below is
worked out by hand: kWh per epoch and per 1,000 tokens, the None cases (no epochs, zero tokens), the
energy-weighted comparison and its ratio, the user/lab/cluster filters and the window's edges.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pytest import approx
from sqlalchemy import Connection, Engine, insert, select

from cocaq.db.engine import make_engine
from cocaq.db.schema import Cluster, Job, JobMetrics, ModelMetadata
from cocaq.footprint.by_model import Comparison, Scope, comparisons, model_stats, runs
from tests.conftest import migrated_database

SINCE = datetime(2026, 11, 1, tzinfo=UTC)
UNTIL = datetime(2026, 12, 1, tzinfo=UTC)
KG_PER_KWH = 0.2


@dataclass(frozen=True)
class J:
    """A job to insert: who, where, when it ended, its energy, and its model metadata (None: none)."""

    job_id: str
    user: str
    account: str
    end: datetime | None
    kwh: float
    meta: dict[str, Any] | None
    cluster: str = "hal"
    gpus: int = 1
    hours: float = 1.0
    embodied_g: float | None = None


def d(day: int, hour: int = 12) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


LLAMA = {"model_name": "llama-3-8b", "framework": "pytorch"}
JOBS = [
    # alice's llama runs: fp32 at 2.5 kWh/epoch; bf16 at 1.5 and 2.0 (energy-weighted 1.7, not 10/6)
    J("1", "alice", "lab_a", d(5), 10.0, {**LLAMA, "precision": "fp32", "batch_size": 32, "epochs": 4.0,
      "tokens": 2_000_000, "sources": {"model": "comment", "precision": "api", "epochs": "detected"}},
      gpus=2, hours=5.0, embodied_g=500.0),
    J("2", "alice", "lab_a", d(6), 6.0, {**LLAMA, "precision": "bf16", "batch_size": 32, "epochs": 4.0}),
    J("3", "alice", "lab_a", d(7), 4.0, {**LLAMA, "precision": "bf16", "batch_size": 32, "epochs": 2.0}),
    # no precision and no batch size: a run, with kWh/epoch, but in no comparison group
    J("4", "alice", "lab_a", d(8), 3.0, {**LLAMA, "epochs": 3.0}),
    # zero epochs and zero tokens: per-epoch and per-token figures unknown, never a division by zero
    J("5", "alice", "lab_a", d(9), 2.0, {**LLAMA, "precision": "fp16", "epochs": 0.0, "tokens": 0}),
    # bob: one setting only, so no comparison; and a job whose metadata names only a framework
    J("6", "bob", "lab_a", d(10), 5.0, {**LLAMA, "precision": "fp32", "batch_size": 64, "epochs": 1.0}),
    J("7", "bob", "lab_a", d(11), 2.0, {"framework": "jax"}),
    # carol, on the other cluster: a row of the first shape (precision in extra) against a bf16 one
    J("8", "carol", "lab_b", d(12), 1.0, {"model_name": "resnet50", "framework": "pytorch", "epochs": 10.0,
      "extra": {"dtype": "torch.float32", "lr": 0.1}}, cluster="other"),
    J("9", "carol", "lab_b", d(13), 0.5, {"model_name": "resnet50", "framework": "pytorch", "epochs": 10.0,
      "precision": "bf16"}, cluster="other"),
    # the window's edges: ending exactly at `since` counts, exactly at `until` does not
    J("11", "alice", "lab_a", SINCE, 1.0, {"model_name": "gpt2", "tokens": 1000}),
    J("10", "alice", "lab_a", UNTIL, 7.0, {**LLAMA, "precision": "fp32", "epochs": 1.0}),
    J("12", "alice", "lab_a", None, 9.0, {**LLAMA, "precision": "fp32", "epochs": 1.0}),  # still running
    J("13", "alice", "lab_a", d(14), 8.0, None),  # no metadata: not an ML job as far as anyone said
]  # fmt: skip


def populate(engine: Engine, jobs: list[J] = JOBS) -> dict[str, int]:
    """Insert the jobs (and metadata, embodied CO2); job_id -> jobs.id."""
    pks: dict[str, int] = {}
    with engine.begin() as c:
        clusters = {}
        for name in sorted({j.cluster for j in jobs}):
            clusters[name] = c.execute(insert(Cluster).values(name=name).returning(Cluster.id)).scalar_one()
        for j in jobs:
            start = (j.end or UNTIL) - timedelta(hours=j.hours)
            pks[j.job_id] = c.execute(
                insert(Job)
                .values(
                    cluster_id=clusters[j.cluster], job_id=j.job_id, job_id_raw=int(j.job_id),
                    user_name=j.user, account=j.account, partition="gpu", submit_time=start, start_time=start,
                    end_time=j.end, elapsed_s=j.hours * 3600, state="COMPLETED" if j.end else "RUNNING",
                    is_open=j.end is None, alloc_gpus=j.gpus, alloc_cpus=4, energy_j=j.kwh * 3.6e6,
                    co2_g=j.kwh * KG_PER_KWH * 1000, pue=1.0,
                )
                .returning(Job.id)
            ).scalar_one()  # fmt: skip
            if j.meta is not None:
                c.execute(insert(ModelMetadata).values(job_pk=pks[j.job_id], **j.meta))
            if j.embodied_g is not None:
                c.execute(insert(JobMetrics).values(job_pk=pks[j.job_id], co2_embodied_g=j.embodied_g))
    return pks


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def conn(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Connection]:
    """The jobs above, inserted once per database kind for the module's read-only tests."""
    tmp = tmp_path_factory.mktemp(f"models-{request.param}")
    engine = make_engine(migrated_database(request.param, tmp, request))
    populate(engine)
    with engine.connect() as c:
        yield c
    engine.dispose()


def test_by_model_and_by_framework(conn: Connection) -> None:
    s = model_stats(conn, SINCE, UNTIL)
    models = {g.key: g for g in s.by_model}
    assert list(models) == ["llama-3-8b", "(unnamed)", "resnet50", "gpt2"]  # most energy first
    llama = models["llama-3-8b"]
    assert (llama.jobs, llama.users) == (6, 2)  # jobs 1-6; not 10 (ended at `until`) nor 12 (running)
    assert llama.energy_kwh == approx(10 + 6 + 4 + 3 + 2 + 5)
    assert llama.co2_kg == approx(30 * KG_PER_KWH)
    assert llama.gpu_hours == approx(2 * 5 + 5 * 1)
    assert llama.co2_embodied_kg == approx(0.5)  # apart, not in co2_kg
    assert (models["(unnamed)"].jobs, models["(unnamed)"].energy_kwh) == (1, approx(2.0))
    assert models["gpt2"].energy_kwh == approx(1.0)  # ended exactly at `since`: in
    fw = {g.key: g for g in s.by_framework}
    assert fw["pytorch"].energy_kwh == approx(30 + 1.5) and fw["pytorch"].users == 3
    assert fw["jax"].energy_kwh == approx(2.0) and fw["(unknown)"].jobs == 1


def test_runs_per_epoch_and_per_1k_tokens(conn: Connection) -> None:
    by_id = {r.job_id: r for r in runs(conn, SINCE, UNTIL)}
    assert set(by_id) == {"1", "2", "3", "4", "5", "6", "7", "8", "9", "11"}
    r1 = by_id["1"]
    assert (r1.model, r1.user, r1.precision, r1.batch_size, r1.epochs, r1.tokens) == (
        "llama-3-8b", "alice", "fp32", 32, 4.0, 2_000_000,
    )  # fmt: skip
    assert r1.energy_kwh == approx(10.0) and r1.kwh_per_epoch == approx(2.5)
    assert r1.wh_per_1m_tokens == approx(10_000 / 2)  # 10 kWh for 2M tokens: readable, not 0.005 kWh/1k
    assert r1.co2_kg_per_epoch == approx(2.0 / 4) and r1.co2_g_per_1m_tokens == approx(2000 / 2)
    assert r1.gpu_hours == approx(10.0) and r1.co2_embodied_kg == approx(0.5)
    assert by_id["2"].co2_embodied_kg is None  # the aggregator has not derived it
    # zero epochs and zero tokens: unknown, not infinite
    r5 = by_id["5"]
    unknown = (r5.kwh_per_epoch, r5.wh_per_1m_tokens, r5.co2_kg_per_epoch, r5.co2_g_per_1m_tokens)
    assert unknown == (None, None, None, None)
    # no epochs recorded, only tokens; nothing at all
    assert by_id["11"].kwh_per_epoch is None and by_id["11"].wh_per_1m_tokens == approx(1e6)
    assert by_id["7"].model == "(unnamed)" and by_id["7"].kwh_per_epoch is None
    # a row of the first shape: its precision read from extra, normalised
    assert by_id["8"].precision == "fp32" and by_id["8"].kwh_per_epoch == approx(0.1)  # torch.float32
    # most energy first
    assert [r.job_id for r in runs(conn, SINCE, UNTIL)][:3] == ["1", "2", "6"]


def test_comparison_is_energy_weighted_with_ratio_to_best(conn: Connection) -> None:
    cs = {(c.user, c.model): c for c in comparisons(conn, SINCE, UNTIL)}
    assert set(cs) == {("alice", "llama-3-8b"), ("carol", "resnet50")}  # bob: one setting only
    c = cs[("alice", "llama-3-8b")]
    assert [(g.precision, g.batch_size, g.runs) for g in c.groups] == [("bf16", 32, 2), ("fp32", 32, 1)]
    bf16, fp32 = c.groups
    assert c.unit == "epoch"  # (only run 1 counts tokens: no comparison per token)
    assert bf16.kwh_per_unit == approx((6 * 1.5 + 4 * 2.0) / 10)  # 1.7: energy-weighted, not 10/6
    assert bf16.units == approx(6.0) and bf16.energy_kwh == approx(10.0)
    assert fp32.kwh_per_unit == approx(2.5)
    assert bf16.ratio_to_best == approx(1.0) and fp32.ratio_to_best == approx(2.5 / 1.7)
    assert c.saving == approx(0.8 / 2.5)
    assert c.sentence() == (
        "Your llama-3-8b runs in bf16 at batch size 32 used 1.70 kWh per epoch, 32% less than in fp32."
    )
    carol = cs[("carol", "resnet50")]
    assert [g.precision for g in carol.groups] == ["bf16", "fp32"]
    assert carol.groups[1].ratio_to_best == approx(2.0)
    # the larger possible saving first: alice's 4 fp32 epochs at 0.8 kWh more (3.2), carol's 10 x 0.05
    assert [x.user for x in comparisons(conn, SINCE, UNTIL)] == ["alice", "carol"]
    assert cs[("alice", "llama-3-8b")].saving_kwh == approx(4 * 0.8)


def test_filters_by_user_lab_and_cluster(conn: Connection) -> None:
    alice = model_stats(conn, SINCE, UNTIL, user="alice")
    assert {r.job_id for r in alice.runs} == {"1", "2", "3", "4", "5", "11"}
    assert {g.key for g in alice.by_model} == {"llama-3-8b", "gpt2"}
    assert next(g for g in alice.by_model if g.key == "llama-3-8b").users == 1
    assert [(c.user, c.model) for c in alice.comparisons] == [("alice", "llama-3-8b")]
    lab_b = model_stats(conn, SINCE, UNTIL, account="lab_b")
    assert {r.job_id for r in lab_b.runs} == {"8", "9"}
    other = model_stats(conn, SINCE, UNTIL, cluster="other")
    assert {r.job_id for r in other.runs} == {"8", "9"}
    assert model_stats(conn, SINCE, UNTIL, cluster="nope").runs == ()
    assert runs(conn, SINCE, UNTIL, Scope(users=("bob", "carol"), cluster="hal"))[0].job_id == "6"
    assert runs(conn, SINCE, UNTIL, Scope(users=())) == ()  # nobody asked for: nothing


def test_window_edges(conn: Connection) -> None:
    # [since, until): a job ending at `until` belongs to the next window, exactly once
    nxt = runs(conn, UNTIL, UNTIL + timedelta(days=30))
    assert [r.job_id for r in nxt] == ["10"]
    before = runs(conn, SINCE - timedelta(days=30), SINCE)
    assert before == ()
    # a day's window holds the runs that ended in it
    assert [r.job_id for r in runs(conn, d(5, 0), d(6, 0))] == ["1"]


def test_comparison_per_token_where_runs_count_tokens() -> None:
    from cocaq.footprint.by_model import Run, compare

    def run(pk: int, prec: str, kwh: float, tokens: int | None, epochs: float | None) -> Run:
        return Run(pk, str(pk), "c", "u", "a", "COMPLETED", None, "llm", "pytorch", None, prec, 8, epochs,
                   tokens, 8, 10.0, kwh, kwh / 2, None, None, None, None, None)  # fmt: skip

    # bf16: 50 kWh for 100M tokens (0.5 Wh per 1k); fp32: 90 kWh for 100M (0.9): 44% less in bf16
    cs = compare([run(1, "bf16", 50.0, 100_000_000, None), run(2, "fp32", 90.0, 100_000_000, None)])
    (c,) = cs
    assert c.unit == "1M tokens" and c.saving == approx(1 - 50 / 90)
    assert c.best.kwh_per_unit == approx(0.5) and c.best.units == approx(100.0)
    assert (
        c.sentence()
        == "Your llm runs in bf16 at batch size 8 used 500 Wh per 1M tokens, 44% less than in fp32."
    )
    # counting both: a comparison per unit
    both = compare([run(1, "bf16", 50.0, 100_000_000, 5.0), run(2, "fp32", 90.0, 100_000_000, 5.0)])
    assert sorted(c.unit for c in both) == ["1M tokens", "epoch"]


def test_comparison_edge_cases() -> None:
    from cocaq.footprint.by_model import SettingGroup

    def g(p: str | None, bs: int | None, kpe: float, ratio: float | None) -> SettingGroup:
        return SettingGroup(p, bs, 1, 1.0, kpe, 0.0, kpe, ratio)

    # only the batch size differs: the sentence names it, not the (equal) precision
    c = Comparison("u", "m", (g("bf16", 128, 1.0, 1.0), g("bf16", 16, 2.0, 2.0)))
    assert c.sentence() == (
        "Your m runs in bf16 with batch size 128 used 1.00 kWh per epoch, 50% less than with batch size 16."
    )
    # both differ: no evidence for either (issue 32), so no sentence and no saving
    c = Comparison("u", "m", (g("bf16", 128, 1.0, 1.0), g("fp32", 16, 4.0, 4.0)))
    assert c.sentence() is None and c.saving is None
    # both differ from the worst, but one group differs in precision only: that one is compared
    c = Comparison("u", "m", (g("bf16", 16, 1.0, 1.0), g("fp32", 16, 2.0, 2.0), g("fp32", 8, 4.0, 4.0)))
    assert c.sentence() == (
        "Your m runs in bf16 at batch size 16 used 1.00 kWh per epoch, 50% less than in fp32."
    )
    # nothing saved, or nothing used: no sentence, no division by zero
    assert Comparison("u", "m", (g("bf16", 1, 1.0, 1.0), g("fp32", 1, 1.0, 1.0))).sentence() is None
    zero = Comparison("u", "m", (g("bf16", 1, 0.0, 1.0), g("fp32", 1, 0.0, None)))
    assert zero.saving is None and zero.sentence() is None
    d = zero.as_dict()
    assert d["groups"][1]["ratio_to_best"] is None and d["basis"].startswith("energy-weighted")


def test_empty_database(engine: Engine) -> None:
    with engine.connect() as c:
        s = model_stats(c, SINCE, UNTIL)
    assert (s.by_model, s.by_framework, s.runs, s.comparisons) == ((), (), (), ())
    assert s.as_dict()["window"].startswith("jobs that ended")


def test_a_run_that_used_no_energy_is_zero_per_epoch(engine: Engine) -> None:
    """Zero energy over known epochs is 0 kWh per epoch (known), not None (unknown)."""
    populate(engine, [J("1", "u", "a", d(3), 0.0, {**LLAMA, "precision": "bf16", "epochs": 2.0})])
    with engine.connect() as c:
        (r,) = runs(c, SINCE, UNTIL)
        assert r.kwh_per_epoch == 0.0 and r.co2_kg_per_epoch == 0.0
        assert c.execute(select(ModelMetadata.precision)).scalar_one() == "bf16"
