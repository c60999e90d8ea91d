"""Quantiles the calibration needs: GPU-hour weighted ones for its cells, conformal ones for its ranges."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def weighted_quantile(values: Sequence[tuple[float, float]], q: float) -> float:
    """The q-quantile of (value, weight) pairs: the value where the cumulative weight reaches q of the
    total (interpolated between the midpoints of neighbouring values' weights)."""
    pts = sorted((v, w) for v, w in values if w > 0)
    if not pts:
        return math.nan
    total = sum(w for _, w in pts)
    cum, mids = 0.0, []
    for v, w in pts:
        mids.append(((cum + w / 2) / total, v))
        cum += w
    if q <= mids[0][0]:
        return mids[0][1]
    for (q0, v0), (q1, v1) in itertools.pairwise(mids):
        if q <= q1:
            return v0 + (v1 - v0) * (q - q0) / (q1 - q0) if q1 > q0 else v1
    return mids[-1][1]


def conformal_quantile(values: Sequence[float], q: float) -> float:
    """The split-conformal q-quantile: the ceil((n + 1) q)-th smallest (the floor's for q < 0.5), so that
    a new value exchangeable with these falls below it with probability at least q."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan
    k = math.ceil((n + 1) * q) if q >= 0.5 else math.floor((n + 1) * q)
    return xs[min(max(k, 1), n) - 1]
