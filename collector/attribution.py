"""Splitting a node's CPU/DRAM energy (one RAPL domain, one interval) between the jobs running on it.

Policies (`idle_policy`, docs/node-side.md "CPU/DRAM attribution"), with E the interval's energy,
B = min(E, baseline_w * dt) the idle share, c_j a job's CPU seconds, C their sum, k_j a job's cores
and N = max(node_cores, sum k_j):
- "cputime":   job_j = E * c_j / C                         (C = 0: all of E unattributed)
- "allocated": job_j = (E - B) * c_j / C + B * k_j / N     (cores no job holds: unattributed)
- "none":      job_j = (E - B) * c_j / C                   (B is never charged)
Whatever no job receives is returned as unattributed, so the jobs plus it add up to E exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

POLICIES = ("cputime", "allocated", "none")
DEFAULT_POLICY = "allocated"


def _nonneg(x: object) -> float:
    """A usable non-negative number; garbage, NaN and negatives count as 0 (never a negative share)."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x <= 0:
        return 0.0
    return float(x)


def split(
    energy_j: float,
    dt_s: float,
    cpu_s: Mapping[str, float],
    cores: Mapping[str, int],
    node_cores: int,
    baseline_w: float,
    policy: str,
) -> tuple[dict[str, float], float]:
    """(joules per job, unattributed joules) for one domain and interval; see the module docstring.

    Jobs are the union of `cpu_s` and `cores` keys.  A job's CPU time is clamped to `dt_s` times its
    cores (or the node's, when its cores are unknown): cgroup and clock readings taken at slightly
    different moments must not let one job outweigh what it could have used.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown idle policy {policy!r}: use one of {', '.join(POLICIES)}")
    if not math.isfinite(energy_j) or energy_j < 0:
        raise ValueError(f"energy must be a finite non-negative number of joules, not {energy_j!r}")
    jobs = list(dict.fromkeys([*cpu_s, *cores]))
    if not jobs or energy_j == 0:
        return dict.fromkeys(jobs, 0.0), energy_j
    dt = _nonneg(dt_s)
    node = int(_nonneg(node_cores))
    held = {j: int(_nonneg(cores.get(j))) for j in jobs}
    cpu = {j: min(_nonneg(cpu_s.get(j)), dt * (held[j] or max(node, 1))) for j in jobs}
    total_cpu = math.fsum(cpu.values())

    base = 0.0 if policy == "cputime" else min(energy_j, _nonneg(baseline_w) * dt)
    dynamic = energy_j - base
    out = dict.fromkeys(jobs, 0.0)
    if total_cpu > 0:
        for j in jobs:
            out[j] = dynamic * (cpu[j] / total_cpu)
    if policy == "allocated" and base > 0:
        denom = max(node, sum(held.values()))  # jobs claiming more cores than the node: share by claim
        if denom > 0:
            for j in jobs:
                out[j] += base * (held[j] / denom)
    unattributed = max(0.0, energy_j - math.fsum(out.values()))
    return out, unattributed


class Baseline:
    """Idle power per RAPL domain: a low percentile of recent interval powers, or a configured value.

    Powers are kept as per-bucket means (`bucket_s`, default 5 min) over a rolling `window_s` (24 h),
    so the state stays small (288 numbers a domain) and one odd interval cannot set the baseline;
    `percentile=0` is the rolling minimum.  Until a domain has been observed its baseline is 0 W
    (then "allocated" charges everything by CPU time).  `override_w` (one value for every domain, or
    per domain id) wins over what was observed.
    """

    def __init__(
        self,
        window_s: float = 86400.0,
        percentile: float = 5.0,
        bucket_s: float = 300.0,
        override_w: float | Mapping[str, float] | None = None,
    ) -> None:
        if not (window_s > 0 and bucket_s > 0 and 0 <= percentile <= 100):
            raise ValueError("baseline: window_s and bucket_s must be > 0 and percentile in 0..100")
        self.window_s = float(window_s)
        self.percentile = float(percentile)
        self.bucket_s = float(bucket_s)
        self.override_w = override_w
        self._buckets: dict[str, dict[int, list[float]]] = {}  # domain -> bucket -> [joules, seconds]

    def observe(self, domain: str, ts: float, energy_j: float, dt_s: float) -> None:
        """Record one interval's energy (ending at `ts`); garbage and empty intervals are ignored."""
        if not (math.isfinite(ts) and math.isfinite(energy_j) and math.isfinite(dt_s)):
            return
        if energy_j < 0 or dt_s <= 0:
            return
        key = math.floor(ts / self.bucket_s)
        buckets = self._buckets.setdefault(domain, {})
        slot = buckets.setdefault(key, [0.0, 0.0])
        slot[0] += energy_j
        slot[1] += dt_s
        oldest = key - math.ceil(self.window_s / self.bucket_s)
        if min(buckets) <= oldest:
            for k in [k for k in buckets if k <= oldest]:
                del buckets[k]

    def observed_w(self, domain: str) -> float | None:
        """The percentile of the domain's bucket powers, or None when nothing was observed."""
        buckets = self._buckets.get(domain)
        if not buckets:
            return None
        powers = sorted(e / t for e, t in buckets.values() if t > 0)
        if not powers:
            return None
        return powers[math.floor(self.percentile / 100 * (len(powers) - 1))]

    def power_w(self, domain: str) -> float:
        """The idle power to use for the domain now (W)."""
        if isinstance(self.override_w, Mapping):
            if domain in self.override_w:
                return _nonneg(self.override_w[domain])
        elif self.override_w is not None:
            return _nonneg(self.override_w)
        return self.observed_w(domain) or 0.0

    def to_state(self) -> dict[str, Any]:
        """JSON-able state (the override is configuration, not state)."""
        return {
            "v": 1,
            "window_s": self.window_s,
            "percentile": self.percentile,
            "bucket_s": self.bucket_s,
            "domains": {d: [[k, e, t] for k, (e, t) in b.items()] for d, b in self._buckets.items()},
        }

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        *,
        window_s: float | None = None,
        percentile: float | None = None,
        override_w: float | Mapping[str, float] | None = None,
    ) -> Baseline:
        """Restore `to_state()`; configuration given here wins, malformed entries are dropped."""

        def num(key: str, default: float) -> float:
            v = state.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
                return float(v)
            return default

        bucket_s = num("bucket_s", 300.0) or 300.0
        b = cls(
            window_s if window_s is not None else (num("window_s", 86400.0) or 86400.0),
            percentile if percentile is not None else min(100.0, num("percentile", 5.0)),
            bucket_s,
            override_w,
        )
        domains = state.get("domains")
        if isinstance(domains, Mapping):
            for d, rows in domains.items():
                if not isinstance(rows, list):
                    continue
                for row in rows:
                    if (
                        isinstance(row, list)
                        and len(row) == 3
                        and isinstance(row[0], int)
                        and all(isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in row[1:])
                    ):
                        b._buckets.setdefault(str(d), {})[row[0]] = [float(row[1]), float(row[2])]
        return b
