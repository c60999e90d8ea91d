"""When to run: the CO2 of a job at its best start, against starting at once (issue 21's model).

A job of length L seconds, submitted at `a`, may start any time in [a, a + S] (S: its slack) and must
then run L without a break: the *contiguous* best start is the t in [a, a + S] with the lowest integral
of the intensity over [t, t + L]. If it could pause and resume, it would run in the cheapest L seconds
of [a, a + S + L] (the same deadline): the *interruptible* best. Both against *now*: [a, a + L].

The intensity is an hourly series (piecewise constant, `Series`), the job's power constant over its run
(the aggregator's uniform weighting when nothing finer is known), so a job's CO2 is proportional to the
average intensity over the hours it runs, and the shifted CO2 is the job's CO2 times the ratio of the
averages. Times are UTC epoch seconds: no daylight-saving arithmetic anywhere.

Exact for any times, not only whole hours: the integral over [t, t + L] is piecewise linear in t, with
its corners where t or t + L crosses an hour boundary, so its minimum over [a, a + S] is at one of
those corners or at an end; the cheapest L seconds of a window take whole hours from the cheapest up,
and a part of the last one. `Series.best_*` are the plain versions; `batch` computes the same for many
jobs at once with numpy (the aggregator's path: a month's jobs in seconds, bench/bench_shifting.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from cocaq.units import S_PER_HOUR

if TYPE_CHECKING:
    import numpy as np

HOUR = float(S_PER_HOUR)
TIE = 1e-9  # costs this close (relatively) are a tie: the earlier start wins


@dataclass(frozen=True)
class Shift:
    """One job's three averages (g/kWh) and the best contiguous start (epoch seconds)."""

    now_g: float
    contiguous_g: float
    contiguous_start: float
    interruptible_g: float

    def saving(self, which: str = "contiguous") -> float:
        """The share of the job's CO2 that the best start (or pausing) would have saved, 0..1."""
        best = self.contiguous_g if which == "contiguous" else self.interruptible_g
        return 0.0 if self.now_g <= 0 else max(1.0 - best / self.now_g, 0.0)


class Series:
    """An hourly intensity series from `t0` (epoch seconds, any alignment): value i holds for
    [t0 + i h, t0 + (i + 1) h). Outside it, and for a value that is not finite (a gap), `outside`
    holds (the zone's annual figure): a window running past the series is priced, not refused."""

    def __init__(self, t0: float, values: Sequence[float], outside: float) -> None:
        if not math.isfinite(t0):
            raise ValueError(f"the series' start is not a time: {t0!r}")
        if not math.isfinite(outside) or outside < 0:
            raise ValueError(f"the value outside the series must be a non-negative number, not {outside!r}")
        self.t0 = float(t0)
        self.outside = float(outside)
        self.values = [float(v) if math.isfinite(v) and v >= 0 else self.outside for v in values]
        self.prefix = [0.0]  # integral from t0 to each hour boundary, g/kWh x s
        for v in self.values:
            self.prefix.append(self.prefix[-1] + v * HOUR)

    @property
    def t1(self) -> float:
        return self.t0 + len(self.values) * HOUR

    def integral(self, t: float) -> float:
        """The integral of the intensity from t0 to t (negative before t0)."""
        if t <= self.t0:
            return (t - self.t0) * self.outside
        if t >= self.t1:
            return self.prefix[-1] + (t - self.t1) * self.outside
        u = (t - self.t0) / HOUR
        i = min(int(u), len(self.values) - 1)
        return self.prefix[i] + (t - (self.t0 + i * HOUR)) * self.values[i]

    def average(self, a: float, b: float) -> float:
        """The average intensity over [a, b] (the value at a when b == a)."""
        if b <= a:
            return self.at(a)
        return (self.integral(b) - self.integral(a)) / (b - a)

    def at(self, t: float) -> float:
        if t < self.t0 or t >= self.t1:
            return self.outside
        return self.values[min(int((t - self.t0) / HOUR), len(self.values) - 1)]

    def _boundaries(self, a: float, b: float) -> list[float]:
        """The hour boundaries of the series within [a, b] (the series' own grid, and its two ends)."""
        lo = max(math.ceil((a - self.t0) / HOUR), 0)
        hi = min(math.floor((b - self.t0) / HOUR), len(self.values))
        return [self.t0 + k * HOUR for k in range(lo, hi + 1)]

    def best_contiguous(self, a: float, length_s: float, slack_s: float) -> tuple[float, float]:
        """(start, average g/kWh) of the cheapest run of `length_s` starting in [a, a + slack_s]; the
        earliest such start where several tie."""
        if length_s <= 0:
            return a, self.at(a)
        end = a + max(slack_s, 0.0)
        cands = {a, end}
        cands.update(self._boundaries(a, end))
        cands.update(b - length_s for b in self._boundaries(a + length_s, end + length_s))
        costs = [(t, self.integral(t + length_s) - self.integral(t)) for t in sorted(cands)]
        best = min(c for _, c in costs)
        start = next(t for t, c in costs if c <= best + TIE * max(abs(best), 1.0))
        return start, best / length_s

    def best_interruptible(self, a: float, length_s: float, slack_s: float) -> float:
        """The average g/kWh of the cheapest `length_s` seconds within [a, a + slack_s + length_s]."""
        if length_s <= 0:
            return self.at(a)
        b = a + max(slack_s, 0.0) + length_s
        edges = [a, *self._boundaries(a, b), b]
        pieces = sorted(
            (self.at(x), y - x) for x, y in pairwise(edges) if y > x
        )  # (value, duration), cheapest first
        left, cost = length_s, 0.0
        for v, d in pieces:
            take = min(d, left)
            cost += v * take
            left -= take
            if left <= 0:
                break
        return cost / length_s

    def shift(self, a: float, length_s: float, slack_s: float) -> Shift:
        start, contiguous = self.best_contiguous(a, length_s, slack_s)
        return Shift(
            self.average(a, a + length_s), contiguous, start, self.best_interruptible(a, length_s, slack_s)
        )


def averages(series: Series, a: Any, b: Any) -> np.ndarray:
    """The series' average over each [a, b] (numpy arrays; its value at a where b <= a)."""
    import numpy as np

    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    vals = np.asarray(series.values, dtype=float)
    prefix = np.asarray(series.prefix, dtype=float)
    t0, t1, outside, m = series.t0, series.t1, series.outside, len(series.values)

    def integral(t: np.ndarray) -> np.ndarray:
        i = np.clip(np.floor((t - t0) / HOUR).astype(np.int64), 0, max(m - 1, 0))
        inside = prefix[i] + (t - (t0 + i * HOUR)) * (vals[i] if m else outside)
        return np.where(
            t <= t0, (t - t0) * outside, np.where(t >= t1, prefix[-1] + (t - t1) * outside, inside)
        )

    span = b - a
    i = np.clip(np.floor((a - t0) / HOUR).astype(np.int64), 0, max(m - 1, 0))
    at = np.where((a < t0) | (a >= t1), outside, vals[i] if m else outside)
    return np.where(span > 0, (integral(b) - integral(a)) / np.where(span > 0, span, 1.0), at)


def batch(
    series: Series, submit: Any, length_s: Any, slack_s: Any, chunk: int = 1_000
) -> dict[str, np.ndarray]:
    """`Series.shift` for many jobs of one zone at once (numpy arrays of equal length in, arrays out:
    now_g, contiguous_g, contiguous_start, interruptible_g), equal to it to float rounding."""
    import numpy as np

    a_all = np.asarray(submit, dtype=float)
    l_all = np.asarray(length_s, dtype=float)
    s_all = np.maximum(np.broadcast_to(np.asarray(slack_s, dtype=float), a_all.shape), 0.0)
    n = a_all.shape[0]
    out = {k: np.empty(n) for k in ("now_g", "contiguous_g", "contiguous_start", "interruptible_g")}
    vals = np.asarray(series.values, dtype=float)
    prefix = np.asarray(series.prefix, dtype=float)
    t0, t1, outside, m = series.t0, series.t1, series.outside, len(series.values)

    def integral(t: np.ndarray) -> np.ndarray:
        u = (t - t0) / HOUR
        i = np.clip(np.floor(u).astype(np.int64), 0, max(m - 1, 0))
        inside = prefix[i] + (t - (t0 + i * HOUR)) * (vals[i] if m else outside)
        return np.where(
            t <= t0, (t - t0) * outside, np.where(t >= t1, prefix[-1] + (t - t1) * outside, inside)
        )

    def value_at(t: np.ndarray) -> np.ndarray:
        i = np.clip(np.floor((t - t0) / HOUR).astype(np.int64), 0, max(m - 1, 0))
        return np.where((t < t0) | (t >= t1), outside, vals[i] if m else outside)

    # Chunks of similar windows: a chunk's arrays are as wide as its longest window, so one week-long job
    # among 20,000 short ones would make every row of its chunk a week wide. Small chunks keep the few
    # long windows (log-normal run times: the last percent of the sort) from widening the rest: 1,000 jobs
    # a chunk is twice as fast as 20,000 for a year of jobs (docs/benchmarks/when-to-run.md).
    order = np.argsort(s_all + np.maximum(l_all, 0.0), kind="stable")
    for lo in range(0, n, chunk):
        rows = order[lo : lo + chunk]
        a, ln, sl = a_all[rows], l_all[rows], s_all[rows]
        pos = ln > 0
        safe = np.where(pos, ln, 1.0)
        now = np.where(pos, (integral(a + ln) - integral(a)) / safe, value_at(a))
        # contiguous: the ends, the boundaries in [a, a + S], and boundary - L for the boundaries in
        # [a + L, a + S + L]; padded with `a` to one width per chunk
        kmax = int(np.ceil(sl.max() / HOUR)) + 2 if len(sl) else 2
        k = np.arange(kmax)
        first = np.ceil((a - t0) / HOUR)[:, None] + k
        starts = t0 + first * HOUR
        starts = np.where(
            (starts <= a[:, None] + sl[:, None]) & (first >= 0) & (first <= m), starts, a[:, None]
        )
        first_e = np.ceil((a + ln - t0) / HOUR)[:, None] + k
        ends = t0 + first_e * HOUR - ln[:, None]
        ends = np.where(
            (ends <= a[:, None] + sl[:, None]) & (first_e >= 0) & (first_e <= m), ends, a[:, None]
        )
        cands = np.concatenate([a[:, None], (a + sl)[:, None], starts, ends], axis=1)
        cands = np.maximum(cands, a[:, None])
        cost = integral(cands + ln[:, None]) - integral(cands)
        # the earliest of the cheapest (as Series.best_contiguous)
        best_cost = cost.min(axis=1)
        tie = cost <= (best_cost + TIE * np.maximum(np.abs(best_cost), 1.0))[:, None]
        best_start = np.where(tie, cands, np.inf).min(axis=1)
        contiguous = np.where(pos, best_cost / safe, now)
        # interruptible: the window's pieces (whole hours, the two partial ones), cheapest first
        b = a + sl + ln
        w = int(np.ceil(((b - a).max() if len(a) else 0.0) / HOUR)) + 2
        j = np.arange(w)
        edge0 = t0 + np.floor((a - t0) / HOUR)[:, None] * HOUR + j * HOUR  # hour starts from a's hour
        x = np.maximum(edge0, a[:, None])
        y = np.minimum(edge0 + HOUR, b[:, None])
        dur = np.clip(y - x, 0.0, None)
        v = value_at(np.where(dur > 0, x, a[:, None]))
        # outside the series the grid is still hours from t0: the same pieces as Series' boundaries
        idx = np.argsort(v, axis=1, kind="stable")
        vs = np.take_along_axis(v, idx, axis=1)
        ds = np.take_along_axis(dur, idx, axis=1)
        before = np.cumsum(ds, axis=1) - ds
        take = np.clip(ln[:, None] - before, 0.0, ds)
        inter = np.where(pos, (vs * take).sum(axis=1) / safe, now)
        out["now_g"][rows] = now
        out["contiguous_g"][rows] = contiguous
        out["contiguous_start"][rows] = np.where(pos, best_start, a)
        out["interruptible_g"][rows] = inter
    return out
