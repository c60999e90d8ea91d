"""Splitting node CPU/DRAM energy between jobs: worked examples, invariants, the idle baseline."""

from __future__ import annotations

import json
import math
import random

import pytest

from cocaq.collector.attribution import DEFAULT_POLICY, POLICIES, Baseline, split


# The worked example: a 16-core node, 10 s, 1000 J, idle baseline 50 W (so B = 500 J of it).
# Job a holds 4 cores and used 30 CPU-seconds, job b holds 8 cores and used 10: C = 40 CPU-seconds.
def example(policy: str) -> tuple[dict[str, float], float]:
    return split(1000.0, 10.0, {"a": 30.0, "b": 10.0}, {"a": 4, "b": 8}, 16, 50.0, policy)


def test_policies() -> None:
    assert POLICIES == ("cputime", "allocated", "none") and DEFAULT_POLICY == "allocated"
    with pytest.raises(ValueError, match="unknown idle policy 'fair'"):
        example("fair")


def test_worked_example_cputime() -> None:
    # all 1000 J by CPU time: a 1000*30/40 = 750, b 1000*10/40 = 250
    jobs, un = example("cputime")
    assert jobs == pytest.approx({"a": 750.0, "b": 250.0}) and un == pytest.approx(0.0)


def test_worked_example_allocated() -> None:
    # above baseline, 500 J by CPU time: a 375, b 125; baseline 500 J by cores/16: a 125, b 250,
    # the 4 cores nobody holds: 125 J unattributed.  a = 500, b = 375, 500 + 375 + 125 = 1000.
    jobs, un = example("allocated")
    assert jobs == pytest.approx({"a": 500.0, "b": 375.0}) and un == pytest.approx(125.0)


def test_worked_example_none() -> None:
    # only the 500 J above baseline, by CPU time: a 375, b 125; the baseline's 500 J unattributed
    jobs, un = example("none")
    assert jobs == pytest.approx({"a": 375.0, "b": 125.0}) and un == pytest.approx(500.0)


def test_cpu_time_clamped_to_what_the_cores_allow() -> None:
    # a claims 100 CPU-s on 4 cores in 10 s: clamped to 40.  C = 40 + 10 = 50 -> a 800, b 200.
    jobs, un = split(1000.0, 10.0, {"a": 100.0, "b": 10.0}, {"a": 4, "b": 8}, 16, 0.0, "cputime")
    assert jobs == pytest.approx({"a": 800.0, "b": 200.0}) and un == 0.0
    # cores unknown: the node's 16 cores bound it (160 CPU-s), so 100 stays: a 1000*100/110
    jobs, _ = split(1000.0, 10.0, {"a": 100.0, "b": 10.0}, {}, 16, 0.0, "cputime")
    assert jobs["a"] == pytest.approx(1000 * 100 / 110)


def test_zero_jobs_all_unattributed() -> None:
    for policy in POLICIES:
        assert split(1000.0, 10.0, {}, {}, 16, 50.0, policy) == ({}, 1000.0)


def test_idle_jobs() -> None:
    # jobs hold cores but used no CPU: cputime leaves everything unattributed, allocated charges the
    # baseline by cores (a 4/16*500 = 125, b 8/16*500 = 250) and leaves the 500 J above it
    args = (1000.0, 10.0, {"a": 0.0, "b": 0.0}, {"a": 4, "b": 8}, 16, 50.0)
    assert split(*args, "cputime") == ({"a": 0.0, "b": 0.0}, 1000.0)
    jobs, un = split(*args, "allocated")
    assert jobs == pytest.approx({"a": 125.0, "b": 250.0}) and un == pytest.approx(625.0)
    assert split(*args, "none") == ({"a": 0.0, "b": 0.0}, 1000.0)


def test_baseline_above_the_energy_is_capped() -> None:
    # 200 W baseline * 10 s = 2000 J > 1000 J measured: all of it is baseline, split by cores
    jobs, un = split(1000.0, 10.0, {"a": 5.0}, {"a": 8}, 16, 200.0, "allocated")
    assert jobs == pytest.approx({"a": 500.0}) and un == pytest.approx(500.0)
    jobs, un = split(1000.0, 10.0, {"a": 5.0}, {"a": 8}, 16, 200.0, "none")
    assert jobs == {"a": 0.0} and un == 1000.0


def test_oversubscribed_cores_shared_by_claim() -> None:
    # 12 + 12 cores claimed on a 16-core node: the baseline is shared 12/24 each, none left over
    jobs, un = split(100.0, 1.0, {}, {"a": 12, "b": 12}, 16, 100.0, "allocated")
    assert jobs == pytest.approx({"a": 50.0, "b": 50.0}) and un == pytest.approx(0.0)


def test_bad_energy_rejected() -> None:
    for e in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            split(e, 10.0, {"a": 1.0}, {"a": 1}, 4, 0.0, "allocated")


def _random_case(rng: random.Random) -> tuple[float, float, dict[str, float], dict[str, int], int, float]:
    n = rng.randint(0, 8)
    node = rng.choice([0, 1, 4, 16, 64, 256])
    jobs = [str(rng.randint(1, 10**6)) for _ in range(n)]
    weird = [0.0, -5.0, math.nan, math.inf, 1e12]
    cpu = {
        j: (rng.choice(weird) if rng.random() < 0.15 else rng.uniform(0, 500))
        for j in jobs
        if rng.random() < 0.9
    }
    cores = {j: rng.choice([0, 1, 2, 4, 8, 32, 300, -3]) for j in jobs if rng.random() < 0.9}
    energy = rng.choice([0.0, rng.uniform(0, 1e-6), rng.uniform(0, 5000), rng.uniform(0, 1e7)])
    dt = rng.choice([0.0, -1.0, rng.uniform(0.01, 60), 3600.0])
    baseline = rng.choice([0.0, -10.0, math.nan, rng.uniform(0, 400), 1e6])
    return energy, dt, cpu, cores, node, baseline


@pytest.mark.parametrize("policy", POLICIES)
def test_invariants_on_random_inputs(policy: str) -> None:
    rng = random.Random(20261121)
    for _ in range(3000):
        energy, dt, cpu, cores, node, baseline = _random_case(rng)
        jobs, un = split(energy, dt, cpu, cores, node, baseline, policy)
        assert set(jobs) == set(cpu) | set(cores)
        assert all(math.isfinite(v) and v >= 0 for v in jobs.values()) and un >= 0
        assert math.fsum(jobs.values()) + un == pytest.approx(energy, rel=1e-9, abs=1e-9)
        if not jobs:
            assert un == energy
        # a job with neither CPU time nor cores gets nothing under any policy
        for j, v in jobs.items():
            if not (cpu.get(j, 0) > 0) and not (cores.get(j, 0) > 0):
                assert v == 0.0


def test_policies_order_on_random_inputs() -> None:
    """With the same inputs, 'none' never charges a job more than 'allocated' does."""
    rng = random.Random(7)
    for _ in range(2000):
        energy, dt, cpu, cores, node, baseline = _random_case(rng)
        alloc, _ = split(energy, dt, cpu, cores, node, baseline, "allocated")
        none, un_none = split(energy, dt, cpu, cores, node, baseline, "none")
        _, un_alloc = split(energy, dt, cpu, cores, node, baseline, "allocated")
        for j in alloc:
            assert none[j] <= alloc[j] + 1e-9 * max(1.0, energy)
        assert un_alloc <= un_none + 1e-9 * max(1.0, energy)


def test_cputime_is_proportional_on_random_inputs() -> None:
    rng = random.Random(11)
    for _ in range(1000):
        cpu = {str(i): rng.uniform(0.1, 10) for i in range(rng.randint(1, 6))}
        energy = rng.uniform(1, 1e4)
        jobs, un = split(energy, 10.0, cpu, dict.fromkeys(cpu, 1), 8, 0.0, "cputime")
        total = sum(cpu.values())
        assert un == pytest.approx(0.0, abs=1e-9)
        for j in cpu:
            assert jobs[j] == pytest.approx(energy * cpu[j] / total)


def test_baseline_percentile_window_and_override() -> None:
    b = Baseline(window_s=3600, percentile=10, bucket_s=60)
    assert b.power_w("package-0") == 0.0 and b.observed_w("package-0") is None
    for i in range(60):  # one interval a minute: 100 W ... 159 W
        b.observe("package-0", 1000.0 + 60 * i, (100 + i) * 60.0, 60.0)
    assert b.power_w("package-0") == pytest.approx(105.0)  # 10th percentile of 60 sorted: index 5
    b.observe("package-0", 1000.0 + 60 * 59, 1.0, -1.0)  # garbage ignored
    assert b.power_w("package-0") == pytest.approx(105.0)
    for i in range(60):  # an hour later the old buckets have left the window
        b.observe("package-0", 1000.0 + 3600 + 60 * i, 300.0 * 60, 60.0)
    assert b.power_w("package-0") == pytest.approx(300.0)
    assert Baseline(percentile=0, override_w=42.0).power_w("psys") == 42.0
    per_domain = Baseline(percentile=0, override_w={"package-0/dram": 7.5})
    per_domain.observe("package-0", 10.0, 1000.0, 10.0)
    assert per_domain.power_w("package-0/dram") == 7.5 and per_domain.power_w("package-0") == 100.0


def test_baseline_rolling_minimum_and_state() -> None:
    b = Baseline(percentile=0, bucket_s=300)
    for ts, watts in ((10.0, 250.0), (400.0, 80.0), (800.0, 120.0)):
        b.observe("package-1", ts, watts * 10, 10.0)
    assert b.power_w("package-1") == pytest.approx(80.0)
    again = Baseline.from_state(json.loads(json.dumps(b.to_state())))
    assert again.power_w("package-1") == pytest.approx(80.0) and again.percentile == 0.0
    assert Baseline.from_state(b.to_state(), override_w=5.0).power_w("package-1") == 5.0
    broken = Baseline.from_state({"domains": {"x": [[1, "a", 2], [2, -1.0, 3.0], "junk"], "y": 5}})
    assert broken.observed_w("x") is None and broken.bucket_s == 300.0
    with pytest.raises(ValueError):
        Baseline(percentile=150)
