"""The fake NVML's power traces: synthetic A100 workloads and CSV recordings, with their exact energy.

`cocaq.collector.fakenvml` answers pynvml calls from these: a trace is a piecewise-linear power curve
(knots of time, power, utilisation and memory in use) with a one-off head and a periodic body, and
carries the cumulative energy at every knot so that the energy counter at any time is an exact integral
(whole periods plus the partial one), the same in every process. They live apart from the pynvml
surface because they are a model of workloads, not of the library: what a GPU draws while a job trains,
serves, idles or runs a notebook.

The built-in traces are SYNTHETIC, generated procedurally at 1 s resolution from ``random.Random`` with
fixed seeds (identical in every process and Python run).  Their shapes follow publicly documented
characteristics of an A100 SXM4 80GB (TDP 400 W), not a recording:

* ``training``: a non-repeating 90 s start (idle at ~55-62 W while the job starts, ~65-80 W during data
  loading / model init with memory filling up, a warm-up ramp), then a 30 min periodic body: 280-390 W
  plateaus that shift every few minutes with per-second noise (~10 W), 2-4 s data-loader stalls down to
  110-180 W every 45-150 s, a 45 s evaluation pass at ~210-260 W and a 15 s checkpoint write at
  ~85-100 W with the GPU waiting on I/O.  Utilisation ~95-100 % on the plateaus; ~62 GB memory held.
* ``inference``: a served model (~72 GB held, as a KV-cache pre-allocating server does) idling at
  ~68-76 W, Poisson request bursts of 2-15 s at 170-330 W, and a busier spell mid-period (15 min period).
* ``idle``: allocated but unused, 55-70 W slowly wandering, utilisation 0, no memory, no process (10 min).
* ``light``: an interactive notebook: ~62-68 W with ~12 GB held, short cell executions of 5-60 s at
  150-320 W every 1.5-5 min and rare 1-2 s spikes (20 min).

Import is stdlib-only and cheap; each trace is built once per process on first use (~1-3 ms).
"""

from __future__ import annotations

import bisect
import math
import os
import random

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~3 ms of a prolog's budget
if TYPE_CHECKING:
    from collections.abc import Callable

# Traces: knots (t_s, power_w, util_pct, mem_used_mb); [0, head_s) plays once, [head_s, head_s + period_s)
# repeats.  cum[k] is the energy in J from knot 0 to knot k (trapezoids: power is linear between knots).

A100_TDP_W = 400.0
BUILTIN_TRACES = ("training", "inference", "idle", "light")


class Trace:
    """A piecewise-linear power trace with a one-off head and a periodic body, plus its cumulative energy."""

    __slots__ = (
        "cum",
        "e_head",
        "e_period",
        "head_s",
        "mem",
        "name",
        "period_s",
        "ps",
        "ts",
        "uniform",
        "util",
    )

    def __init__(
        self,
        name: str,
        ts: list[float],
        ps: list[float],
        util: list[int],
        mem: list[float],
        head_s: float,
        uniform: bool,
    ) -> None:
        self.name = name
        self.ts = ts
        self.ps = ps
        self.util = util
        self.mem = mem
        self.head_s = head_s
        self.period_s = ts[-1] - head_s
        self.uniform = uniform
        cum = [0.0] * len(ts)
        acc = 0.0
        for k in range(1, len(ts)):
            acc += (ps[k - 1] + ps[k]) * 0.5 * (ts[k] - ts[k - 1])
            cum[k] = acc
        self.cum = cum
        self.e_head = self._c(head_s)[0] if head_s > 0 else 0.0
        self.e_period = acc - self.e_head

    def _seg(self, x: float) -> int:
        """Index k of the segment [ts[k], ts[k+1]) holding x (0 <= x < ts[-1])."""
        n = len(self.ts)
        k = int(x) if self.uniform else bisect.bisect_right(self.ts, x) - 1
        return min(max(k, 0), n - 2)

    def _c(self, x: float) -> tuple[float, float, int]:
        """(energy J from knot 0 to x, power W at x, segment) for x within the knots."""
        k = self._seg(x)
        t0 = self.ts[k]
        w = self.ts[k + 1] - t0
        p0 = self.ps[k]
        slope = (self.ps[k + 1] - p0) / w
        f = x - t0
        return self.cum[k] + p0 * f + slope * f * f * 0.5, p0 + slope * f, k

    def local(self, x: float, phase: float) -> float:
        """Trace time for x seconds after the epoch: the head once, then the phase-shifted periodic body."""
        if x < self.head_s:
            return x
        return self.head_s + (x - self.head_s + phase) % self.period_s

    def energy_j(self, x: float, phase: float) -> float:
        """Energy from the epoch (x=0) to x seconds after it: head + whole periods + partial periods."""
        if x <= 0:
            return 0.0
        if x < self.head_s:
            return self._c(x)[0]
        return self.e_head + self._body_integral(x - self.head_s + phase) - self._body_integral(phase)

    def _body_integral(self, y: float) -> float:
        q, r = divmod(y, self.period_s)
        return q * self.e_period + self._c(self.head_s + r)[0] - self.e_head

    def sample(self, x: float, phase: float) -> tuple[float, int, float]:
        """(power W, util %, memory MB) at x seconds after the epoch."""
        _, p, k = self._c(self.local(max(x, 0.0), phase))
        return p, self.util[k], self.mem[k]


def _util_from_power(p: float, tdp: float = A100_TDP_W) -> float:
    """SM utilisation loosely tracking power: 0 % up to ~80 W (idle, context held), 100 % from 75 % of TDP."""
    return min(100.0, max(0.0, (p - 80.0) / (0.75 * tdp - 80.0) * 100.0))


def _finish(
    name: str, head: list[float], body: list[float], mem: list[float], rng: random.Random, util_noise: float
) -> Trace:
    """1 s knots head + body + a closing knot equal to the body's first (so the period is continuous)."""
    ps = [max(1.0, p) for p in head + body]
    ps.append(ps[len(head)])
    util: list[int] = []
    for p in ps:
        u = _util_from_power(p)
        if u > 0:
            u += rng.uniform(-util_noise, util_noise)
        util.append(int(min(100.0, max(0.0, u)) + 0.5))
    mem = [*mem, mem[len(head)]]
    return Trace(name, [float(i) for i in range(len(ps))], ps, util, mem, float(len(head)), True)


def _gen_training() -> Trace:
    rng = random.Random(20231114)
    r = rng.random

    def g(mu: float, sigma: float) -> float:  # ~normal (sum of 3 uniforms), 4x cheaper than rng.gauss
        return mu + (r() + r() + r() - 1.5) * 2.0 * sigma

    head: list[float] = []
    hmem: list[float] = []
    for _ in range(30):  # job starting, GPU allocated and idle
        head.append(58.0 + g(0, 1.2))
        hmem.append(0.0)
    for i in range(30):  # data loading, model init, weights copied to the GPU
        head.append(70.0 + 5.0 * math.sin(i / 4.0) + g(0, 2.0))
        hmem.append(62000.0 * (i + 1) / 30.0)
    for i in range(30):  # warm-up: compilation, first (slower) steps
        head.append(80.0 + (320.0 - 80.0) * (i + 1) / 30.0 + g(0, 10.0))
        hmem.append(62000.0 + 1500.0 * (i + 1) / 30.0)
    n = 1800
    body = [0.0] * n
    mem = [63500.0] * n
    t = 0
    while t < n:  # plateaus (batch size / sequence-length mix shifting)
        length = rng.randint(120, 400)
        level = rng.uniform(300.0, 360.0)
        for i in range(t, min(n, t + length)):
            body[i] = min(390.0, max(280.0, level + g(0, 10.0)))
        t += length
    t = rng.randint(20, 60)
    while t < n:  # data-loader / collective stalls
        depth = rng.uniform(110.0, 180.0)
        for i in range(t, min(n, t + rng.randint(2, 4))):
            body[i] = depth + g(0, 8.0)
        t += rng.randint(45, 150)
    for i in range(840, 885):  # evaluation pass: no backward, lower power
        body[i] = rng.uniform(210.0, 260.0)
        mem[i] = 64800.0
    for i in range(1650, 1665):  # checkpoint write: GPU waiting on I/O
        body[i] = 85.0 + rng.uniform(0.0, 15.0)
    return _finish("training", head, body, hmem + mem, rng, 3.0)


def _gen_inference() -> Trace:
    rng = random.Random(20231115)
    n = 900
    body = [72.0 + 4.0 * math.sin(i / 37.0) + rng.uniform(-1.5, 1.5) for i in range(n)]
    t = rng.expovariate(1 / 25.0)
    while t < n:
        start = int(t)
        length = rng.randint(2, 15)
        level = rng.uniform(170.0, 330.0)
        for i in range(start, min(n, start + length)):
            body[i] = max(body[i], level + rng.uniform(-20.0, 20.0))
        busy = 300 <= start < 480  # a busier spell: requests arrive 5x as often
        t += rng.expovariate(1 / (5.0 if busy else 25.0))
    return _finish("inference", [], body, [72000.0] * n, rng, 8.0)


def _gen_idle() -> Trace:
    rng = random.Random(20231116)
    n = 600
    p = 60.0
    body: list[float] = []
    for _ in range(n):
        p = min(68.0, max(56.0, p + rng.uniform(-0.6, 0.6)))
        body.append(p + rng.uniform(-0.8, 0.8))
    return _finish("idle", [], body, [0.0] * n, rng, 0.0)


def _gen_light() -> Trace:
    rng = random.Random(20231117)
    n = 1200
    body = [65.0 + rng.uniform(-2.5, 2.5) for _ in range(n)]
    mem = [12288.0] * n
    t = rng.randint(30, 90)
    while t < n:  # cell executions
        length = rng.randint(5, 60)
        level = rng.uniform(150.0, 320.0)
        for i in range(t, min(n, t + length)):
            body[i] = level + rng.uniform(-15.0, 15.0)
            mem[i] = 16384.0
        t += length + rng.randint(90, 300)
    for _ in range(4):  # tiny interactive spikes
        i = rng.randrange(n - 2)
        body[i] = body[i + 1] = rng.uniform(120.0, 200.0)
    return _finish("light", [], body, mem, rng, 5.0)


GENERATORS: dict[str, Callable[[], Trace]] = {
    "training": _gen_training,
    "inference": _gen_inference,
    "idle": _gen_idle,
    "light": _gen_light,
}
_TRACE_CACHE: dict[str, Trace] = {}
_CSV_CACHE: dict[str, tuple[float, int, Trace]] = {}
_CSV_MAX_BYTES = 32 * 1024 * 1024


def builtin_trace(name: str) -> Trace:
    tr = _TRACE_CACHE.get(name)
    if tr is None:
        tr = _TRACE_CACHE[name] = GENERATORS[name]()
    return tr


def csv_trace(path: str) -> Trace:
    """A trace from ``t_s,power_w[,util_pct,mem_used_mb]`` rows; cached per process while unchanged."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"fakenvml: trace CSV {path!r}: {exc.strerror}") from None
    cached = _CSV_CACHE.get(path)
    if cached is not None and cached[0] == st.st_mtime and cached[1] == st.st_size:
        return cached[2]
    if st.st_size > _CSV_MAX_BYTES:
        raise ValueError(f"fakenvml: trace CSV {path!r} is larger than {_CSV_MAX_BYTES} bytes")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    ts: list[float] = []
    ps: list[float] = []
    util: list[int] = []
    mem: list[float] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cols = [c.strip() for c in line.split(",")]
        try:
            vals = [float(c) for c in cols]
        except ValueError:
            if not ts:
                continue  # a header line before the data
            raise ValueError(
                f"fakenvml: trace CSV {path!r} line {lineno}: not numbers: {line[:80]!r}"
            ) from None
        if not 2 <= len(vals) <= 4 or not all(math.isfinite(v) for v in vals):
            raise ValueError(
                f"fakenvml: trace CSV {path!r} line {lineno}: want t_s,power_w[,util_pct,mem_used_mb]"
            )
        t, p = vals[0], vals[1]
        if p < 0:
            raise ValueError(f"fakenvml: trace CSV {path!r} line {lineno}: negative power {p}")
        if ts and t <= ts[-1]:
            raise ValueError(f"fakenvml: trace CSV {path!r} line {lineno}: t_s must increase")
        ts.append(t)
        ps.append(p)
        u = vals[2] if len(vals) > 2 else _util_from_power(p)
        util.append(int(min(100.0, max(0.0, u)) + 0.5))
        mem.append(max(0.0, vals[3]) if len(vals) > 3 else 0.0)
    if len(ts) < 2:
        raise ValueError(f"fakenvml: trace CSV {path!r} needs at least two samples")
    t0 = ts[0]
    ts = [t - t0 for t in ts]
    tr = Trace(os.path.basename(path), ts, ps, util, mem, 0.0, False)
    _CSV_CACHE[path] = (st.st_mtime, st.st_size, tr)
    return tr
