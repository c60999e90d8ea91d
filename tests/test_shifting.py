"""When to run (cocaq.carbon.shifting): exact small cases, and the fast paths against brute force."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import numpy as np
import pytest

from cocaq.carbon.shifting import HOUR, Series, batch

T0 = datetime(2023, 3, 26, 0, 0, tzinfo=UTC).timestamp()  # Europe's spring DST change: UTC knows none


def flat(n: int, value: float = 100.0, outside: float = 300.0, **cheap: float) -> Series:
    """n hours of `value`, with hour k set by `h<k>=v`."""
    vals = [value] * n
    for k, v in cheap.items():
        vals[int(k[1:])] = v
    return Series(T0, vals, outside)


def test_one_cheap_hour_is_found_and_is_the_saving() -> None:
    s = flat(48, h5=10.0)
    sh = s.shift(T0, HOUR, 24 * HOUR)
    assert (sh.now_g, sh.contiguous_g, sh.interruptible_g) == (100.0, 10.0, 10.0)
    assert sh.contiguous_start == T0 + 5 * HOUR
    assert sh.saving() == pytest.approx(0.9) and sh.saving("interruptible") == pytest.approx(0.9)
    # two hours: every start from 4:00 to 5:00 covers the cheap hour and 100 g beside it; the earliest wins
    sh = s.shift(T0, 2 * HOUR, 24 * HOUR)
    assert sh.contiguous_g == pytest.approx(55.0) and sh.contiguous_start == T0 + 4 * HOUR
    assert sh.interruptible_g == pytest.approx(55.0)


def test_no_slack_is_now_and_the_cheap_hour_out_of_reach_is_not_taken() -> None:
    s = flat(48, h30=10.0)
    sh = s.shift(T0 + 0.5 * HOUR, 2 * HOUR, 0.0)
    assert sh.contiguous_g == sh.now_g == sh.interruptible_g == 100.0
    assert sh.contiguous_start == T0 + 0.5 * HOUR
    sh = s.shift(T0, 2 * HOUR, 24 * HOUR)  # 30:00 is past 24 h of slack + 2 h: out of reach
    assert sh.contiguous_g == 100.0 and sh.saving() == 0.0


def test_a_job_longer_than_the_series_is_priced_with_the_value_outside() -> None:
    s = Series(T0, [50.0] * 24, outside=200.0)
    sh = s.shift(T0, 48 * HOUR, 24 * HOUR)
    assert sh.now_g == pytest.approx((24 * 50 + 24 * 200) / 48)
    assert sh.contiguous_start == T0 and sh.contiguous_g == sh.now_g  # any later start costs more
    assert sh.interruptible_g == pytest.approx(sh.now_g)  # the window's cheapest 48 h: the same


def test_a_job_longer_than_its_slack_and_a_pause_that_pays() -> None:
    # 10 h job, 3 h of slack: the free hours at 0 and 12 cannot both be in one run (13 h apart), a
    # pausing job takes both (its window is [0, 13 h])
    s = flat(24, h0=0.0, h12=0.0)
    sh = s.shift(T0, 10 * HOUR, 3 * HOUR)
    assert sh.contiguous_g == pytest.approx(90.0)  # [0, 10] or [3, 13]: one free hour; the earliest
    assert sh.contiguous_start == T0
    assert sh.interruptible_g == pytest.approx(80.0)  # both free hours and 8 of 100 g


def test_utc_arithmetic_through_a_dst_change() -> None:
    s = flat(72, h25=1.0)  # 2023-03-27 01:00 UTC, a day after Europe's clocks moved
    sh = s.shift(T0 + 0.25 * HOUR, HOUR, 48 * HOUR)
    start = datetime.fromtimestamp(sh.contiguous_start, UTC)
    assert (start.day, start.hour, start.minute) == (27, 1, 0)


def test_a_gap_in_the_series_is_priced_with_the_value_outside() -> None:
    s = Series(T0, [100.0, math.nan, 100.0, -5.0, 100.0], outside=20.0)
    assert s.values == [100.0, 20.0, 100.0, 20.0, 100.0]  # a gap and a negative value: not measurements
    sh = s.shift(T0, HOUR, 4 * HOUR)
    assert sh.contiguous_start == T0 + HOUR and sh.contiguous_g == 20.0


def test_bad_series_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="not a time"):
        Series(math.nan, [1.0], 1.0)
    with pytest.raises(ValueError, match="non-negative number"):
        Series(T0, [1.0], -1.0)


def _brute(s: Series, a: float, length: float, slack: float, step: float = 60.0) -> tuple[float, float]:
    """Brute force on a one-minute grid (times are whole minutes here): every start for the contiguous
    run; every minute of the window, cheapest first, for the pausing one."""
    starts = [a + k * step for k in range(int(slack // step) + 1)]
    contiguous = min((s.integral(t + length) - s.integral(t)) / length for t in starts)
    n = round((slack + length) / step)
    minutes = sorted(s.at(a + k * step + step / 2) for k in range(n))
    inter = sum(minutes[: round(length / step)]) * step / length
    return contiguous, inter


@pytest.mark.parametrize("seed", range(25))
def test_the_exact_path_equals_brute_force_on_random_series(seed: int) -> None:
    rng = random.Random(seed)
    vals = [
        rng.choice([rng.uniform(20, 600), rng.uniform(20, 60), math.nan]) for _ in range(rng.randint(1, 60))
    ]
    s = Series(T0 + rng.randint(-30, 30) * 60.0, vals, outside=rng.uniform(50, 400))
    for _ in range(20):
        a = T0 + rng.randint(-120, 70 * 60) * 60.0
        length = rng.randint(1, 30 * 60) * 60.0
        slack = rng.randint(0, 30 * 60) * 60.0
        sh = s.shift(a, length, slack)
        contiguous, inter = _brute(s, a, length, slack)
        assert sh.contiguous_g == pytest.approx(contiguous, rel=1e-9, abs=1e-9)
        assert sh.interruptible_g == pytest.approx(inter, rel=1e-9, abs=1e-9)
        assert a <= sh.contiguous_start <= a + slack
        at_start = s.average(sh.contiguous_start, sh.contiguous_start + length)
        assert at_start == pytest.approx(sh.contiguous_g, rel=1e-9)
        assert sh.interruptible_g <= sh.contiguous_g + 1e-9 <= sh.now_g + 2e-9


@pytest.mark.parametrize("seed", range(10))
def test_the_batch_path_equals_the_exact_one(seed: int) -> None:
    rng = random.Random(1000 + seed)
    vals = [rng.uniform(10, 700) if rng.random() > 0.05 else math.nan for _ in range(rng.randint(1, 400))]
    s = Series(T0 + rng.uniform(-3600, 3600), vals, outside=rng.uniform(50, 400))
    n = 300
    a = np.array([T0 + rng.uniform(-20 * HOUR, 420 * HOUR) for _ in range(n)])
    ln = np.array([rng.choice([0.0, rng.uniform(1, 600), rng.uniform(60, 60 * HOUR)]) for _ in range(n)])
    sl = np.array([rng.choice([0.0, 24 * HOUR, rng.uniform(0, 168 * HOUR)]) for _ in range(n)])
    got = batch(s, a, ln, sl, chunk=rng.choice([7, 64, 1000]))
    for i in range(n):
        want = s.shift(float(a[i]), float(ln[i]), float(sl[i]))
        # (the same arithmetic in another order: integrals of ~1e9 g x s differenced over seconds-long
        # jobs round differently in the last digits)
        assert got["now_g"][i] == pytest.approx(want.now_g, rel=1e-6)
        assert got["contiguous_g"][i] == pytest.approx(want.contiguous_g, rel=1e-6)
        assert got["interruptible_g"][i] == pytest.approx(want.interruptible_g, rel=1e-6)
        assert got["contiguous_start"][i] == pytest.approx(want.contiguous_start, abs=1e-6)
