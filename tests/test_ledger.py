"""The energy ledger (cocaq.accounting.ledger): disjoint parts that never exceed the whole, the same in Python and in
the SQL the queries embed, and the GPU share of a node-level measurement."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from cocaq.accounting import ledger
from cocaq.db.engine import make_engine

STATES = [*ledger.OUTCOME, "COMPLETED", "RUNNING", "CANCELLED by 1234", "PREEMPTED", "", "weird state"]
finite = st.floats(min_value=-1e3, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(STATES), finite, finite, finite, st.booleans())
def test_parts_are_disjoint_and_never_exceed_the_energy(
    state: str, energy: float, idle: float, gpu: float, interactive: bool
) -> None:
    idle_c = ledger.clamp_idle(idle, energy, gpu)
    w = ledger.waste(state, energy, idle_c, interactive)
    parts = (w.idle, w.failed, w.oom, w.timeout, w.cancelled)
    assert all(p >= 0 for p in parts)
    assert w.total + w.timeout <= max(energy, 0.0) * (1 + 1e-12) + 1e-9
    # at most the idle part and one outcome part
    assert sum(1 for p in parts[1:] if p > 0) <= 1
    o = ledger.outcome_of(state)
    if o == "timeout":  # did no work: only its idle GPUs; the rest is possibly lost (a session: nothing)
        assert w.total == w.idle
        rest = 0.0 if interactive else max(energy, 0.0) - w.idle
        assert w.timeout == pytest.approx(rest, rel=1e-12, abs=1e-9)
    elif o is not None:
        assert w.total == pytest.approx(max(energy, 0.0), rel=1e-12, abs=1e-9) and w.timeout == 0.0
    else:
        assert w.total == w.idle and w.timeout == 0.0
    if gpu > 0:
        assert w.idle <= gpu + 1e-9


def test_outcomes_by_state() -> None:
    assert ledger.outcome_of("TIMEOUT") == ledger.outcome_of("DEADLINE") == "timeout"
    assert ledger.outcome_of("CANCELLED by 5") == "cancelled"
    assert ledger.outcome_of("OUT_OF_MEMORY") == "oom"
    assert ledger.outcome_of("NODE_FAIL") == ledger.outcome_of("FAILED") == "failed"
    assert ledger.outcome_of("COMPLETED") is None and ledger.outcome_of(None) is None
    # a timed-out training job that idled: idle first, the rest possibly lost, never both; only the idle
    # part did no work for certain
    w = ledger.waste("TIMEOUT", 25.0, 14.5)
    assert (w.idle, w.timeout, w.failed, w.total) == (14.5, 10.5, 0.0, 14.5)
    # a notebook that ended at its limit ended normally: its idle GPUs still count, nothing is lost
    w = ledger.waste("TIMEOUT", 25.0, 14.5, interactive=True)
    assert (w.idle, w.timeout, w.total) == (14.5, 0.0, 14.5)
    # a failed job's energy did no work, whether or not it is a session
    w = ledger.waste("FAILED", 25.0, 4.5, interactive=True)
    assert (w.idle, w.failed, w.timeout, w.total) == (4.5, 20.5, 0.0, 25.0)


@pytest.mark.parametrize("state", STATES)
def test_sql_says_what_python_says(db_url: str, state: str) -> None:
    engine = make_engine(db_url)
    dialect = engine.dialect.name
    cases = [(10.0, 3.0), (10.0, 12.0), (0.0, 5.0), (-1.0, 0.5), (7.5, 0.0)]
    with engine.connect() as conn:
        for (energy, idle), inter in ((c, i) for c in cases for i in (False, True)):
            want = ledger.waste(state, energy, idle, inter)
            st_expr = (
                "split_part(:s, ' ', 1)"
                if dialect == "postgresql"
                else ("CASE WHEN instr(:s, ' ') > 0 THEN substr(:s, 1, instr(:s, ' ') - 1) ELSE :s END")
            )
            flag = "(1 = 1)" if inter else "(1 = 0)"
            for part in ("idle", *ledger.OUTCOMES):
                sql = ledger.outcome_sql(
                    part, "st", "CAST(:e AS FLOAT)", "CAST(:i AS FLOAT)", dialect, interactive=flag
                )
                got = conn.execute(
                    text(f"SELECT {sql} FROM (SELECT {st_expr} AS st) q"),
                    {"s": state, "e": energy, "i": idle},
                ).scalar_one()
                assert float(got) == pytest.approx(getattr(want, part)), (state, energy, idle, inter, part)
            for o in ledger.OUTCOMES:
                sql = ledger.count_sql(o, "st", interactive=flag)
                n = conn.execute(
                    text(f"SELECT {sql} FROM (SELECT {st_expr} AS st) q"), {"s": state}
                ).scalar_one()
                assert n == (1 if ledger.counts_as(ledger.outcome_of(state), inter) == o else 0)
    engine.dispose()


def test_split_of_a_node_measurement() -> None:
    # 4 GPUs for 10 h, samples over all of it: their energy is the GPUs', the rest the node's
    s = ledger.split_node(100e6, 40e6, 4 * 36000.0, 4, 36000.0)
    assert s is not None and s.gpu_j == 40e6 and s.node_j == 60e6 and s.coverage == 1.0 and not s.extrapolated
    # samples over 80% of it: their mean power stands for the rest
    s = ledger.split_node(100e6, 40e6, 0.8 * 4 * 36000.0, 4, 36000.0)
    assert s is not None and s.gpu_j == pytest.approx(50e6) and s.extrapolated
    # samples over 20%: only what they saw (a lower bound)
    s = ledger.split_node(100e6, 10e6, 0.2 * 4 * 36000.0, 4, 36000.0)
    assert s is not None and s.gpu_j == 10e6 and not s.extrapolated
    # the GPUs never take more than the node measured
    s = ledger.split_node(10e6, 40e6, 4 * 36000.0, 4, 36000.0)
    assert s is not None and s.gpu_j == 10e6 and s.node_j == 0.0
    for args in (
        (0.0, 1.0, 1.0, 1, 1.0),
        (1.0, 0.0, 1.0, 1, 1.0),
        (1.0, 1.0, 0.0, 1, 1.0),
        (1.0, 1.0, 1.0, 0, 1.0),
    ):
        assert ledger.split_node(*args) is None


@settings(max_examples=300, deadline=None)
@given(finite, finite, st.floats(0, 1e9), st.integers(0, 64), st.floats(0, 1e7))
def test_split_never_exceeds_the_node(node: float, samples: float, secs: float, gpus: int, el: float) -> None:
    s = ledger.split_node(node, samples, secs, gpus, el)
    if s is None:
        return
    assert 0 <= s.gpu_j <= node and s.node_j >= 0
    assert math.isclose(s.gpu_j + s.node_j, node, rel_tol=1e-12, abs_tol=1e-6)
