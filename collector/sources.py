"""The collector's energy sources: one small class per source behind one interface, registered by name.

As in Prometheus' node_exporter, each source is enabled by configuration (`[collector] sources`), and
a source that cannot work on this node (no GPU, no RAPL, no cgroups) says why once and stays off while
the others go on. Every cycle the daemon hands the sources a `Cycle` in a fixed order (cgroup first,
since RAPL's split needs each job's CPU time); they add samples and per-job energy to it.
"""

from __future__ import annotations

import logging
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeGuard

from cocaq.collector.records import EnergyRow
from cocaq.config import Collector
from cocaq.units import MILLIJOULES_PER_J

log = logging.getLogger("cocaq.collector")

Sample = tuple[float, str, str, str, "str | None", float]  # ts, source, device, metric, job_id, value


class SourceUnavailable(Exception):
    """This source cannot run on this node; the message says why (logged once, not an error)."""


@dataclass
class RunningJob:
    job_id: str
    start: float  # when the job started on this node: the prolog's time, else when first seen
    gpus: list[str] = field(default_factory=list)  # UUIDs the prolog recorded
    gpu_start_mj: dict[str, int] = field(default_factory=dict)  # their energy counters at start
    gpu_start_power: dict[str, tuple[float, float]] = field(default_factory=dict)  # (ts, W) at start
    cores: int | None = None
    uid: int | None = None  # the job's user, from the prolog


@dataclass
class Cycle:
    ts: float
    dt: float | None  # seconds since the previous cycle; None on the first
    jobs: dict[str, RunningJob]
    samples: list[Sample] = field(default_factory=list)
    energy: list[EnergyRow] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per job this interval (cgroup)
    node_cores: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)  # records for the spool (`meta`)

    def sample(
        self, source: str, device: str, metric: str, value: float | None, job: str | None = None
    ) -> None:
        if value is not None:
            self.samples.append((self.ts, source, device, metric, job, float(value)))


class Source(ABC):
    """One energy source: made once (raising SourceUnavailable if it cannot run here), then `collect`."""

    name: ClassVar[str]
    order: ClassVar[int] = 50

    def __init__(self, cfg: Collector) -> None:
        self.cfg = cfg
        self.peers: dict[str, Source] = {}  # the other sources on this node, by name

    @abstractmethod
    def collect(self, cycle: Cycle) -> None:
        """Add this cycle's samples and per-job energy to `cycle`."""

    def end_job(self, rec: dict[str, Any]) -> list[EnergyRow]:
        """Final energy of the job an epilog record (`event` "end") ends, where this source closes it."""
        return []

    def waiting_jobs(self) -> set[str]:
        """Job ids whose epilog record this source waits for (to close an integral)."""
        return set()

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional: stateless sources keep it
        """Pick up where the previous process left off (counters, accumulators)."""

    def close(self) -> None:  # noqa: B027 - optional: most sources hold nothing open
        """Release what the source holds (NVML)."""


REGISTRY: dict[str, type[Source]] = {}


def register(cls: type[Source]) -> type[Source]:
    REGISTRY[cls.name] = cls
    return cls


# --- cgroup ---------------------------------------------------------------------------------------


@register
class CgroupSource(Source):
    """CPU time, cores and memory of each job from Slurm's cgroups (v1 or v2)."""

    name = "cgroup"
    order = 10

    def __init__(self, cfg: Collector) -> None:
        super().__init__(cfg)
        from cocaq.collector.cgroup import Cgroups, CgroupUnavailable, CpuCounter

        try:
            self.cgroups = Cgroups(os.path.join(cfg.sysfs_root, "fs", "cgroup"))
        except CgroupUnavailable as exc:
            raise SourceUnavailable(str(exc)) from None
        self.counter = CpuCounter()
        self._counter_cls = CpuCounter

    def collect(self, cycle: Cycle) -> None:
        jobs = self.cgroups.jobs()
        cycle.node_cores = self.cgroups.node_cpus()
        # With the previous cycle known, a job first seen now started since then: all its CPU time is
        # this interval's (else its first partial interval went to the other jobs or to nobody). On a
        # first cycle (dt None) nothing is split, and what jobs used before is not this interval's.
        deltas = self.counter.update(jobs, first_seen_full=cycle.dt is not None)
        for jid, cg in jobs.items():
            rj = cycle.jobs.get(jid)
            if rj is None:
                rj = cycle.jobs[jid] = RunningJob(jid, cycle.ts)  # a job no prolog told us about
            if cg.cpus:
                rj.cores = cg.cpus
            d = deltas.get(jid)
            if d is not None:
                cycle.cpu_s[jid] = d
                if cycle.dt:
                    cycle.sample("cgroup", f"job_{jid}", "cpu_cores", d / cycle.dt, jid)
            if cg.mem_bytes is not None:
                cycle.sample("cgroup", f"job_{jid}", "mem_mb", cg.mem_bytes / 1048576, jid)

    def state(self) -> dict[str, Any]:
        return {"cpu": self.counter.to_state()}

    def restore(self, state: dict[str, Any]) -> None:
        if "cpu" in state:
            self.counter = self._counter_cls.from_state(state["cpu"])


# --- nvml -----------------------------------------------------------------------------------------


@register
class NvmlSource(Source):
    """Per GPU power, utilisation, memory and energy; per job the energy of the GPUs it owns.

    A job's GPU energy is the counter's difference since the prolog's snapshot (exact), or, where the
    GPU has no energy counter (or it reset mid-job), power integrated over the job (labelled
    "nvml-power-integral"): a trapezoid from the prolog's power reading to the first sample, the
    samples' trapezoids, and, once the epilog's record is here (`end_job`), a trapezoid from the last
    sample to the epilog's reading, so the integral spans the job whatever the sampling phase.
    """

    name = "nvml"
    order = 20
    ENDED_KEEP_S = 7 * 86400.0  # how long an ended job waits for its epilog record (collector down, ...)
    ENDED_MAX = 10_000

    def __init__(self, cfg: Collector) -> None:
        super().__init__(cfg)
        from cocaq.collector.nvml import GpuEnergyTracker, Nvml, NvmlUnavailable

        try:
            self.nvml = Nvml.open(cfg.nvml)
            self.devices = self.nvml.devices()
        except NvmlUnavailable as exc:
            raise SourceUnavailable(str(exc)) from None
        if not self.devices:
            raise SourceUnavailable("nvml: no GPU on this node")
        self.tracker = GpuEnergyTracker()
        self._tracker_cls = GpuEnergyTracker
        self.limits = {d.uuid: self.nvml.power_limit_w(d) for d in self.devices}
        for d in self.devices:
            self.tracker.set_power_limit(d.uuid, self.limits[d.uuid])
        # "job/start/uuid" -> [tracker energy at the job's first sample, energy before it (the head),
        # integral so far (-1: the counter covers it), last sample's time, last sample's power (-1: none)]
        self.baselines: dict[str, list[float]] = {}
        self.ended: dict[str, list[float]] = {}  # the same, for jobs gone from the node (+ when they went)
        self.closed: dict[str, float] = {}  # keys closed by their epilog record -> the epilog's time

    def _cap_w(self, uuid: str) -> float:
        from cocaq.collector.nvml import MAX_PLAUSIBLE_POWER_W

        limit = self.limits.get(uuid)
        return min(2.0 * limit, MAX_PLAUSIBLE_POWER_W) if limit else MAX_PLAUSIBLE_POWER_W

    def _head(self, rj: RunningJob, uuid: str, ts: float, power: float | None) -> float:
        """Energy from the job's start to its first sample: a trapezoid from the prolog's power reading,
        else (an older prolog, no power) the first sample's power over at most one interval."""
        gap = max(ts - rj.start, 0.0)
        start = rj.gpu_start_power.get(uuid)
        if start is not None and power is not None and start[0] <= ts:
            e = (start[1] + power) * 0.5 * max(ts - start[0], 0.0)
        else:
            e = (power or 0.0) * min(gap, self.cfg.interval_s)
        return min(max(e, 0.0), self._cap_w(uuid) * max(gap, 1.0))

    def collect(self, cycle: Cycle) -> None:
        owner: dict[str, RunningJob] = {}
        for rj in cycle.jobs.values():
            for u in rj.gpus:
                owner[u] = rj
        readings: dict[str, Any] = {}
        for d in self.devices:
            r = self.nvml.read(d)
            readings[d.uuid] = r
            self.tracker.update(r)
            j = owner.get(d.uuid)
            jid = j.job_id if j else None
            dev = d.uuid
            if r.gone:
                cycle.sample("nvml", dev, "gone", 1.0, jid)
                continue
            cycle.sample("nvml", dev, "power_w", r.power_w, jid)
            cycle.sample("nvml", dev, "util_pct", r.util_pct, jid)
            cycle.sample("nvml", dev, "mem_used_mb", r.mem_used_mb, jid)
            if r.energy_mj is not None:
                cycle.sample("nvml", dev, "energy_j", r.energy_mj / MILLIJOULES_PER_J, jid)
        live = set()
        for u, rj in owner.items():
            rr = readings.get(u)
            if rr is None or rr.gone:
                continue
            r = rr
            if r.ts <= rj.start:
                continue  # read before the prolog's snapshot (clock steps, a race at job start)
            key = f"{rj.job_id}/{rj.start}/{u}"
            if key in self.closed:
                continue  # the epilog has been and gone; its state file is about to go too
            live.add(key)
            base = self.baselines.get(key)
            if base is None:
                # First sight of this job: the tracker's count so far, and the energy since the job began.
                base = self.baselines[key] = [
                    self.tracker.energy_j(u),
                    self._head(rj, u, r.ts, r.power_w),
                    -1.0,
                    r.ts,
                    -1.0,
                ]
            start_mj = rj.gpu_start_mj.get(u)
            if r.energy_mj is not None and start_mj is not None and r.energy_mj >= start_mj:
                e = (r.energy_mj - start_mj) / MILLIJOULES_PER_J
                if e <= (r.ts - rj.start + 1.0) * 3000.0:  # exact: the counter since the prolog's snapshot
                    cycle.energy.append(
                        EnergyRow(rj.job_id, rj.start, "gpu", u, "nvml", "measured", e, rj.start, r.ts, False)
                    )
                    base[2], base[3], base[4] = -1.0, r.ts, -1.0
                    continue
            # No counter, or it was reset since the prolog: the tracker integrates through it.
            e = max(self.tracker.energy_j(u) - base[0] + base[1], 0.0)
            base[2], base[3], base[4] = e, r.ts, r.power_w if r.power_w is not None else -1.0
            src = "nvml-power-integral"
            cycle.energy.append(
                EnergyRow(rj.job_id, rj.start, "gpu", u, src, "measured", e, rj.start, r.ts, False)
            )
        self._forget(live, cycle.ts)

    def _forget(self, live: set[str], ts: float) -> None:
        """Move the jobs not sampled this cycle out of `baselines` (an integral to `ended`, where it waits
        for its epilog record), and drop what waited longer than ENDED_KEEP_S or past ENDED_MAX."""
        for k in list(self.baselines):
            if k not in live:
                b = self.baselines.pop(k)
                if b[2] >= 0:  # an integral waits for its epilog record to close it
                    self.ended[k] = [*b[:5], ts]
        for k, b in list(self.ended.items()):
            if ts - b[5] > self.ENDED_KEEP_S:
                del self.ended[k]
        for k, t in list(self.closed.items()):
            if ts - t > self.ENDED_KEEP_S:
                del self.closed[k]
        for store in (self.ended, self.closed):
            while len(store) > self.ENDED_MAX:
                store.pop(next(iter(store)))

    def end_job(self, rec: dict[str, Any]) -> list[EnergyRow]:
        """Final integrals of the job an epilog record ends: the last sample's trapezoid to the epilog's
        power reading. Idempotent: a key is closed once (a repeat finds nothing to close)."""
        job_id, start = rec.get("job_id"), rec.get("job_start")
        if not isinstance(job_id, str) or not isinstance(start, int | float) or isinstance(start, bool):
            return []
        out: list[EnergyRow] = []
        gpus = rec.get("gpus")
        readings = [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []
        # a GPU of the job the record does not mention (the epilog could not find it, a damaged
        # record): closed without a reading, at its last sample
        prefix = f"{job_id}/{float(start)}/"
        named = {f"{prefix}{g.get('uuid')}" for g in readings}
        readings += [
            {"uuid": k[len(prefix) :]}
            for d in (self.baselines, self.ended)
            for k in d
            if k.startswith(prefix) and k not in named
        ]
        for g in readings:
            u, p_raw, t_raw = g.get("uuid"), g.get("power_w"), g.get("ts")
            key = f"{job_id}/{float(start)}/{u}"
            b = self.baselines.get(key) or self.ended.get(key)
            if b is None or b[2] < 0 or key in self.closed:
                continue  # never sampled, counted by the counter, or closed already
            e, t_last = b[2], b[3]
            if not finite_number(t_raw) or not finite_number(p_raw) or p_raw < 0 or g.get("gone"):
                # no reading at the end (a GPU lost, an older hook): the integral stays at the last
                # sample, final; the job is no longer waited for
                t_end = t_row = t_last
            else:
                p1, t_end = float(p_raw), float(t_raw)
                p_last = b[4] if b[4] >= 0 else p1
                # trapezoid to the epilog's reading (or back to it, when a sample came after it)
                e += (p_last + p1) * 0.5 * (t_end - t_last)
                e = min(max(e, 0.0), b[2] + self._cap_w(str(u)) * max(t_end - t_last, 0.0))
                # t1: the later of the epilog's reading and the last sample, so that this row replaces
                # the running ones (it holds the job's energy to its end, and so to any later time)
                t_row = max(t_end, t_last)
            src = "nvml-power-integral"
            out.append(
                EnergyRow(job_id, float(start), "gpu", str(u), src, "measured", e, float(start), t_row, True)
            )
            self.closed[key] = t_end
            self.baselines.pop(key, None)
            self.ended.pop(key, None)
        return out

    def waiting_jobs(self) -> set[str]:
        return {k.split("/", 1)[0] for d in (self.baselines, self.ended) for k, b in d.items() if b[2] >= 0}

    def state(self) -> dict[str, Any]:
        return {
            "tracker": self.tracker.to_state(),
            "baselines": self.baselines,
            "ended": self.ended,
            "closed": self.closed,
        }

    def restore(self, state: dict[str, Any]) -> None:
        if "tracker" in state:
            self.tracker = self._tracker_cls.from_state(state["tracker"])
        b = state.get("baselines")
        if isinstance(b, dict):
            # an older collector kept [base, head]: no integral so far, no last sample
            self.baselines = {
                str(k): ([*(float(x) for x in v), -1.0, 0.0, -1.0] if len(v) == 2 else [float(x) for x in v])
                for k, v in b.items()
            }
        ended = state.get("ended")
        if isinstance(ended, dict):
            self.ended = {str(k): [float(x) for x in v] for k, v in ended.items()}
        closed = state.get("closed")
        if isinstance(closed, dict):
            self.closed = {str(k): float(v) for k, v in closed.items()}

    def close(self) -> None:
        self.nvml.close()


def finite_number(v: object) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# --- rapl -----------------------------------------------------------------------------------------


@register
class RaplSource(Source):
    """RAPL package and DRAM energy, split between the node's jobs by the configured idle policy."""

    name = "rapl"
    order = 30

    def __init__(self, cfg: Collector) -> None:
        super().__init__(cfg)
        from cocaq.collector.attribution import Baseline
        from cocaq.collector.rapl import Rapl, RaplCounter, RaplUnavailable

        try:
            self.rapl = Rapl(cfg.sysfs_root)
        except RaplUnavailable as exc:
            raise SourceUnavailable(str(exc)) from None
        self.domains = {d.id: d for d in self.rapl.counted()}
        self.counter = RaplCounter.for_domains(self.domains.values())
        self.baseline = Baseline(override_w=cfg.idle_baseline_w)
        self._classes = (RaplCounter, Baseline)
        self.acc: dict[str, float] = {}  # "job/start/component" -> joules so far
        self.unattributed_j = 0.0

    def collect(self, cycle: Cycle) -> None:
        from cocaq.collector.attribution import split

        values = self.rapl.read()
        before = self.counter.anomaly_count
        joules = self.counter.update(cycle.ts, {k: v for k, v in values.items() if k in self.domains})
        if self.counter.anomaly_count > before:
            log.warning("rapl: %s", self.counter.anomalies[-1].reason)
        if not cycle.dt:
            return
        # Only jobs the cgroups told us about (cores, CPU time): one known from its prolog alone was not
        # measured, and a 0 J share here would replace its CPU/DRAM estimate with nothing.
        cores = {j: rj.cores for j, rj in cycle.jobs.items() if rj.cores}
        for dom_id, e in joules.items():
            dom = self.domains[dom_id]
            comp = "dram" if dom.kind == "dram" else "cpu"
            cycle.sample("rapl", dom_id, "power_w", e / cycle.dt)
            self.baseline.observe(dom_id, cycle.ts, e, cycle.dt)
            per_job, rest = split(
                e,
                cycle.dt,
                cycle.cpu_s,
                cores,
                cycle.node_cores or os.cpu_count() or 1,
                self.baseline.power_w(dom_id),
                self.cfg.idle_policy,
            )
            self.unattributed_j += rest
            for jid, ej in per_job.items():
                rj = cycle.jobs.get(jid)
                if rj is None:
                    continue
                key = f"{jid}/{rj.start}/{comp}"
                self.acc[key] = self.acc.get(key, 0.0) + ej
        live = {f"{j}/{rj.start}/{c}" for j, rj in cycle.jobs.items() for c in ("cpu", "dram")}
        for key, total in list(self.acc.items()):
            if key not in live:
                del self.acc[key]
                continue
            jid, start, comp = key.split("/")
            cycle.energy.append(
                EnergyRow(
                    jid, float(start), comp, "", "rapl", "measured", total, float(start), cycle.ts, False
                )
            )
        cycle.sample("rapl", "node", "unattributed_j", self.unattributed_j)

    def state(self) -> dict[str, Any]:
        return {
            "counter": self.counter.to_state(),
            "baseline": self.baseline.to_state(),
            "acc": self.acc,
            "unattributed_j": self.unattributed_j,
        }

    def restore(self, state: dict[str, Any]) -> None:
        counter_cls, baseline_cls = self._classes
        if "counter" in state:
            self.counter = counter_cls.from_state(
                state["counter"], {d.id: d.max_energy_uj for d in self.domains.values()}
            )
        if "baseline" in state:
            self.baseline = baseline_cls.from_state(state["baseline"], override_w=self.cfg.idle_baseline_w)
        if isinstance(state.get("acc"), dict):
            self.acc = {str(k): float(v) for k, v in state["acc"].items()}
        self.unattributed_j = float(state.get("unattributed_j", 0.0))


# --- Slurm/HPE pm_counters (optional) -------------------------------------------------------------


@register
class PmCountersSource(Source):
    """Node power/energy from HPE Cray's /sys/cray/pm_counters, where the hardware provides it."""

    name = "pm_counters"
    order = 40
    FILES: ClassVar[dict[str, str]] = {
        "power": "power_w",
        "energy": "energy_j",
        "cpu_power": "cpu_power_w",
        "memory_power": "mem_power_w",
        "accel0_power": "accel0_power_w",
    }

    def __init__(self, cfg: Collector) -> None:
        super().__init__(cfg)
        self.base = os.path.join(cfg.sysfs_root, "cray", "pm_counters")
        if not os.path.isdir(self.base):
            raise SourceUnavailable(f"pm_counters: {self.base} does not exist")

    def collect(self, cycle: Cycle) -> None:
        from cocaq.collector.rapl import read_bounded

        for fname, metric in self.FILES.items():
            try:
                raw = read_bounded(os.path.join(self.base, fname))
                cycle.sample("pm_counters", "node", metric, float(raw.split()[0]))
            except Exception:  # absent on this model, or garbage
                continue


def build(cfg: Collector, on_off: Callable[[str, str | None], None]) -> list[Source]:
    """The enabled sources that can run here, in collection order; `on_off(name, why_off)` for each.

    A source in its own module (`daemon.SOURCE_MODULES`) must have been imported, so registered, first."""
    out = []
    for name in cfg.sources:
        cls = REGISTRY.get(name)
        if cls is None:
            on_off(name, "unknown source")
            continue
        try:
            out.append(cls(cfg))
            on_off(name, None)
        except SourceUnavailable as exc:
            on_off(name, str(exc))
    for s in out:
        s.peers = {p.name: p for p in out if p is not s}
    return sorted(out, key=lambda s: s.order)
