"""Energy of a job that nothing measured, from what Slurm accounted, and the CO2 of a job's energy.

Every assumption is returned with the estimate and stored on the job, so `cocaq recompute` can redo
it when the configuration changes and a reader can see exactly what a number rests on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cocaq.accounting import power_bases as pb
from cocaq.accounting.calibrate import BASIS_TDP, Calibration, GpuPower, job_gpu_model, tdp_power

# The sources' names live in cocaq.accounting.sources (read without the estimating); here as they were.
from cocaq.accounting.sources import SOURCE_CALIBRATED as SOURCE_CALIBRATED
from cocaq.accounting.sources import SOURCE_SAMPLES as SOURCE_SAMPLES
from cocaq.accounting.sources import SOURCE_SLURM as SOURCE_SLURM
from cocaq.accounting.sources import SOURCE_SLURM_GPU as SOURCE_SLURM_GPU
from cocaq.accounting.sources import SOURCE_SLURM_UTIL as SOURCE_SLURM_UTIL
from cocaq.accounting.sources import SOURCE_TDP as SOURCE_TDP
from cocaq.carbon.zones import zone_intensity
from cocaq.config import Config, Estimate, Hardware
from cocaq.hostlist import expand_hostlist
from cocaq.slurm.record import JobRecord
from cocaq.units import co2_grams

# Rows an import writes or derives from what it wrote, and so may replace; rows from the node-side hooks
# are never touched by it. A re-imported node measurement drops its old GPU split with it (else the old
# split and the new total would add up to more than the job used); the aggregator splits it again.
IMPORT_SOURCES = (
    SOURCE_TDP, SOURCE_CALIBRATED, SOURCE_SLURM, SOURCE_SAMPLES, SOURCE_SLURM_GPU, SOURCE_SLURM_UTIL,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class EnergyRow:
    node: str
    component: str  # gpu, cpu, dram, node
    method: str  # measured, estimated
    source: str
    energy_j: float


@dataclass(frozen=True, slots=True)
class JobFootprint:
    energies: tuple[EnergyRow, ...]
    energy_j: float
    energy_measured_j: float
    hw_profile: str
    assumptions: dict[str, Any]
    pue: float
    carbon_zone: str
    carbon_g_per_kwh: float
    carbon_source: str
    carbon_year: int | None
    carbon_flag: str | None
    co2_g: float
    # The range of the estimated part where the GPUs' power was calibrated; None: no range known.
    energy_est_low_j: float | None = None
    energy_est_high_j: float | None = None


_NO_GPU_MODEL = Hardware().gpu_model


def has_gpus(hw: Hardware) -> bool:
    """Whether a profile's nodes have GPUs: it names their model and gives them a rated power."""
    return hw.gpu_tdp_w > 0 and hw.gpu_model != _NO_GPU_MODEL


def job_nodes(rec: JobRecord) -> list[str]:
    try:
        return expand_hostlist(rec.node_list or "")
    except ValueError:
        return []


_MEASURED_BASIS = "Slurm ConsumedEnergyRaw (node energy measured by acct_gather_energy)"
BASIS_TDP_TEXT = "estimated from TDP"
BASIS_CALIBRATED = "estimated: GPUs from the site's measured jobs, CPU and memory from TDP"
BASIS_SLURM_UTIL = "estimated: GPUs from Slurm's gres/gpuutil, CPU and memory from TDP"
BASIS_SLURM_GPU = (
    "GPUs measured by Slurm (ConsumedEnergy, acct_gather_energy/gpu); CPU and memory estimated from TDP"
)
ESTIMATED_BASES = (BASIS_TDP_TEXT, BASIS_CALIBRATED, BASIS_SLURM_UTIL, BASIS_SLURM_GPU)
# The GPU basis of an estimate from Slurm's gres/gpuutil at rated power (assumptions["gpu_basis"])
GPU_BASIS_SLURM_RATED = "slurm-gpuutil-rated"
CPU_BASIS_TOTALCPU = "TotalCPU"
CPU_BASIS_ALLOCATED = "allocated cores x elapsed"
CPU_BASIS_UNRECORDED = "allocated cores x elapsed (CPU time not recorded by Slurm)"
# A running job's TotalCPU holds only the steps that ended (Slurm adds a step's when it ends)
CPU_BASIS_RUNNING = "allocated cores x elapsed (running: Slurm adds CPU time as its steps end)"

# What Estimator works out, as a plain tuple (the importer's fast path skips the dataclasses):
# (energies as (node, component, method, source, energy_j) tuples, energy_j, energy_measured_j,
#  hw_profile, assumptions, pue, carbon_zone, carbon_g_per_kwh, carbon_source, carbon_year, carbon_flag,
#  co2_g, energy_est_low_j, energy_est_high_j) -- JobFootprint's fields, in its order.
FootprintValues = tuple[Any, ...]
# (pue, carbon zone, g/kWh, source, year, flag) of a hardware profile
_Site = tuple[float, str, float, str, "int | None", "str | None"]


def _site(cfg: Config, hw: Hardware) -> _Site:
    zone, pue = cfg.zone_and_pue(hw)
    ci = zone_intensity(zone)
    return pue, ci.zone, ci.g_per_kwh, ci.source, ci.year, ci.flag


def tdp_components(
    elapsed: float,
    total_cpu_s: float | None,
    alloc_cpus: int,
    alloc_gpus: int,
    req_mem_mb: float | None,
    est: Estimate,
    hw: Hardware,
    running: bool = False,
) -> tuple[float, float, float, float, float, str]:
    """(cpu_j, gpu_j, dram_j, core-seconds, memory GB, CPU basis): the TDP estimate of each component.
    A running job's partial TotalCPU is not its use: it is estimated from its allocated cores."""
    if est.cpu_usage == "totalcpu" and total_cpu_s is not None and not running:
        core_s = total_cpu_s
        if alloc_cpus:
            core_s = min(core_s, alloc_cpus * elapsed)  # TotalCPU cannot exceed the allocation
        basis = CPU_BASIS_TOTALCPU
    else:
        core_s = alloc_cpus * elapsed
        basis = CPU_BASIS_ALLOCATED
        if est.cpu_usage == "totalcpu":
            basis = CPU_BASIS_RUNNING if running else CPU_BASIS_UNRECORDED
    mem_gb = (req_mem_mb or 0.0) / 1024.0
    return (
        core_s * hw.cpu_tdp_w_per_core,
        alloc_gpus * elapsed * hw.gpu_tdp_w * est.gpu_utilisation,
        mem_gb * elapsed * est.mem_w_per_gb,
        core_s,
        mem_gb,
        basis,
    )


def _values(
    rec: JobRecord,
    est: Estimate,
    hw: Hardware,
    profile: str,
    site: _Site,
    gpu: GpuPower | None = None,
    gpu_said: dict[str, Any] | None = None,
    gpu_energy: bool = False,
) -> FootprintValues:
    """The estimate and CO2 arithmetic, on a profile, site and calibrated GPU power already looked up.

    The ledger's order where no node hook measured the job: Slurm's ConsumedEnergy (the node's, or with
    `gpu_energy` the GPUs' alone), then its GPUs at the power of their Slurm gres/gpuutil (`gpu` with a
    SOURCE_SLURM_UTIL basis), then the calibrated or rated power; CPU and memory from TDP.
    """
    elapsed = max(rec.elapsed_s, 0.0)
    rows: list[tuple[str, str, str, str, float]]
    low = high = None
    # acct_gather_energy/gpu measures the GPUs a job's cgroup holds: none for a job without GPUs (and, on
    # a node without ConstrainDevices, all of the node's: others' GPUs, never this job's energy)
    measured_gpus = gpu_energy and rec.alloc_gpus > 0
    if rec.consumed_energy_j and rec.consumed_energy_j > 0 and not gpu_energy:
        rows = [("", "node", "measured", SOURCE_SLURM, rec.consumed_energy_j)]
        assumptions: dict[str, Any] = {"profile": profile, "basis": _MEASURED_BASIS}
    else:
        cpu_j, gpu_j, mem_j, core_s, mem_gb, basis = tdp_components(
            elapsed, rec.total_cpu_s, rec.alloc_cpus, rec.alloc_gpus, rec.req_mem_mb, est, hw, rec.is_open
        )
        rows = []
        gpu_source = SOURCE_TDP
        gpu_method = "estimated"
        if measured_gpus and rec.consumed_energy_j and rec.consumed_energy_j > 0:
            gpu_j, gpu_source, gpu_method = rec.consumed_energy_j, SOURCE_SLURM_GPU, "measured"
        elif gpu is not None and rec.alloc_gpus > 0 and gpu.basis != BASIS_TDP:
            gpu_s = rec.alloc_gpus * elapsed
            gpu_j = gpu_s * gpu.w
            from_slurm = gpu_said is not None and "gpu_util_slurm_pct" in gpu_said
            gpu_source = SOURCE_SLURM_UTIL if from_slurm else SOURCE_CALIBRATED
            if gpu.basis != GPU_BASIS_SLURM_RATED:  # a calibrated cell: its range
                rest = cpu_j + mem_j
                low, high = rest + gpu_s * gpu.w_low, rest + gpu_s * gpu.w_high
        if cpu_j > 0 or not (gpu_j or mem_j):
            rows.append(("", "cpu", "estimated", SOURCE_TDP, cpu_j))
        if gpu_j > 0:
            rows.append(("", "gpu", gpu_method, gpu_source, gpu_j))
        if mem_j > 0:
            rows.append(("", "dram", "estimated", SOURCE_TDP, mem_j))
        # The same keys in the same order as before: the stored JSON text does not change.
        assumptions = {
            "profile": profile,
            "basis": _BASIS_OF.get(gpu_source, BASIS_TDP_TEXT),
            "cpu_basis": basis,
            "cpu_core_seconds": round(core_s, 3),
            "cpu_model": hw.cpu_model,
            "cpu_tdp_w_per_core": hw.cpu_tdp_w_per_core,
            "gpu_model": hw.gpu_model,
            "gpu_tdp_w": hw.gpu_tdp_w,
            "gpu_utilisation": est.gpu_utilisation,
            "mem_gb": round(mem_gb, 3),
            "mem_w_per_gb": est.mem_w_per_gb,
        }
        if gpu is not None and rec.alloc_gpus > 0 and gpu_source != SOURCE_SLURM_GPU:
            assumptions.update(gpu.assumptions() if gpu_said is None else gpu_said)
    energy = sum([r[4] for r in rows])
    measured = sum([r[4] for r in rows if r[2] == "measured"])
    pue, zone, g_per_kwh, source, year, flag = site
    return (
        tuple(rows),
        energy,
        measured,
        profile,
        assumptions,
        pue,
        zone,
        g_per_kwh,
        source,
        year,
        flag,
        co2_grams(energy, pue, g_per_kwh),
        low,
        high,
    )


_BASIS_OF = {
    SOURCE_CALIBRATED: BASIS_CALIBRATED,
    SOURCE_SLURM_UTIL: BASIS_SLURM_UTIL,
    SOURCE_SLURM_GPU: BASIS_SLURM_GPU,
}


def footprint_from_values(v: FootprintValues) -> JobFootprint:
    """The JobFootprint of Estimator.values()."""
    return JobFootprint(tuple(EnergyRow(*r) for r in v[0]), *v[1:])


class Estimator:
    """Footprints of jobs under one configuration, with the per-job lookups cached.

    The hardware profile depends only on the partition (and, when node groups are configured, on the
    node list), and the PUE and carbon intensity only on the profile, so a bulk import looks each up
    once rather than once per job.
    """

    def __init__(self, cfg: Config, calibration: Calibration | None = None) -> None:
        self.cfg = cfg
        self._est = cfg.estimate
        self._by_nodes = bool(cfg.node_groups)
        self._hw: dict[Any, tuple[Hardware, str, _Site]] = {}
        self._json: dict[tuple[Any, ...], Any] = {}
        self.calibration = calibration if cfg.estimate.calibrate else None
        self._gpu: dict[tuple[Any, ...], tuple[GpuPower, dict[str, Any]]] = {}

    def _profile(self, rec: JobRecord) -> tuple[Hardware, str, _Site]:
        key = (rec.partition, rec.node_list) if self._by_nodes else rec.partition
        hit = self._hw.get(key)
        if hit is None:
            # Without node groups hardware_for() ignores the nodes: no need to expand the host list.
            nodes = job_nodes(rec) if self._by_nodes else []
            hw, profile = self.cfg.hardware_for(rec.partition, nodes)
            hit = (hw, profile, _site(self.cfg, hw))
            if len(self._hw) > 100_000:  # distinct node lists are unbounded in principle
                self._hw.clear()
            self._hw[key] = hit
        return hit

    def gpu_hardware(self, rec: JobRecord) -> bool:
        """Whether the job ran on a profile with GPUs (a GPU model named and a power above 0)."""
        return has_gpus(self._profile(rec)[0])

    def gpu_power(self, rec: JobRecord, hw: Hardware, profile: str) -> tuple[GpuPower, dict[str, Any]]:
        """What the estimate of the job's GPUs rests on (the user's own measured jobs where they help, the
        learnt table, else TDP x utilisation), and its assumptions (made once per profile, partition and
        gres type, and per user, name and GPU count where the user's own cells are used)."""
        cal = self.calibration
        key: tuple[Any, ...] = (profile, rec.partition, rec.gpu_type)
        facts = None
        if cal is not None and cal.keyed_used:
            facts = pb.Facts(
                rec.user_name, rec.name, rec.alloc_gpus, rec.alloc_cpus, rec.slurm_gpu_mem_mb,
                pb.meta_of(rec.comment),
            )  # fmt: skip
            key += (facts,)
        hit = self._gpu.get(key)
        if hit is None:
            power = gpu_power(cal, self.cfg, rec.gpu_type, rec.partition, hw, None, facts)
            hit = (power, power.assumptions())
            if len(self._gpu) > 100_000:
                self._gpu.clear()
            self._gpu[key] = hit
        return hit

    def slurm_gpu_power(self, rec: JobRecord, hw: Hardware, profile: str) -> tuple[GpuPower, dict[str, Any]]:
        """The power of the job's GPUs at the use Slurm's gres/gpuutil recorded: the calibrated cell of
        that utilisation bucket where the site has one, else TDP x (idle + (1 - idle) x utilisation)."""
        util = min(max(rec.slurm_gpu_util or 0.0, 0.0) / rec.alloc_gpus, 100.0)
        power: GpuPower | None = None
        # (the user's own cells are judged against the table without utilisation: where Slurm recorded
        # it, its bucket's cell is used as before)
        if self.calibration is not None:
            hit = self.calibration.lookup(job_gpu_model(rec.gpu_type, hw), rec.partition, util)
            if isinstance(hit, GpuPower) and "any utilisation" not in hit.cell:  # that bucket's own cell
                power = hit
        if power is None:
            idle = self._est.gpu_idle_share
            w = hw.gpu_tdp_w * (idle + (1.0 - idle) * util / 100.0)
            why = f"rated power at Slurm's gres/gpuutil: {hw.gpu_tdp_w:g} W x ({idle:g} + {1 - idle:g} x use)"
            power = GpuPower(w, w, w, GPU_BASIS_SLURM_RATED, why)
        return power, {**power.assumptions(), "gpu_util_slurm_pct": round(util, 1)}

    def values(self, rec: JobRecord) -> FootprintValues:
        hw, profile, site = self._profile(rec)
        gpu_energy = self.cfg.slurm.consumed_energy == "gpus"
        if rec.alloc_gpus > 0:
            if rec.slurm_gpu_util is not None:
                gpu, said = self.slurm_gpu_power(rec, hw, profile)
            else:
                gpu, said = self.gpu_power(rec, hw, profile)
            return _values(rec, self._est, hw, profile, site, gpu, said, gpu_energy)
        return _values(rec, self._est, hw, profile, site, gpu_energy=gpu_energy)

    def footprint(self, rec: JobRecord) -> JobFootprint:
        return footprint_from_values(self.values(rec))

    def assumptions_json(self, a: dict[str, Any]) -> str:
        """json.dumps(a) for the assumptions of values(): the same text, from a per-profile template.

        Only the core-seconds and memory of an estimate vary from job to job under one configuration,
        so the rest of the text is made once per profile by json.dumps itself.
        """
        if len(self._json) > 20_000:  # per-user cells make the labels unbounded in principle
            self._json.clear()
        if len(a) == 2:  # measured: {"profile", "basis"}, the same for every job of a profile
            key: tuple[Any, ...] = (a.get("profile"), a.get("basis"))
            text = self._json.get(key)
            if text is None:
                text = self._json[key] = json.dumps(a)
            return text
        # the GPU basis is the same for every job of a profile, partition and gres type: its cell names it
        g = a.get
        key = (g("profile"), g("cpu_basis"), len(a), g("gpu_basis"), g("gpu_w"), g("gpu_cell"))
        tpl = self._json.get(key)
        if tpl is None:
            tpl = self._json[key] = _json_template(a)
        if not tpl or len(a) != key[2]:
            return json.dumps(a)
        core_s, mem_gb = a["cpu_core_seconds"], a["mem_gb"]
        if core_s.__class__ is not float or mem_gb.__class__ is not float:
            return json.dumps(a)
        if not (_FINITE_MIN <= core_s <= _FINITE_MAX and _FINITE_MIN <= mem_gb <= _FINITE_MAX):
            return json.dumps(a)  # nan and infinities: json's own spelling
        return tpl[0] + _float_repr(core_s) + tpl[1] + _float_repr(mem_gb) + tpl[2]


_FINITE_MAX = 1.7976931348623157e308
_FINITE_MIN = -_FINITE_MAX
_float_repr = float.__repr__  # what json.dumps writes for a finite float


def _json_template(a: dict[str, Any]) -> tuple[str, str, str] | tuple[()]:
    """json.dumps(a) split around its two per-job numbers; () when it cannot be split unambiguously."""
    if len(a) not in (11, 15) or "cpu_core_seconds" not in a or "mem_gb" not in a:
        return ()
    mark_cpu, mark_mem = "\x00cocaq:cpu\x00", "\x00cocaq:mem\x00"
    text = json.dumps({**a, "cpu_core_seconds": mark_cpu, "mem_gb": mark_mem})
    q_cpu, q_mem = json.dumps(mark_cpu), json.dumps(mark_mem)
    if text.count(q_cpu) != 1 or text.count(q_mem) != 1:
        return ()
    head, _, rest = text.partition(q_cpu)
    mid, _, tail = rest.partition(q_mem)
    if q_mem in head:
        return ()
    return head, mid, tail


def gpu_power(
    cal: Calibration | None,
    cfg: Config,
    gpu_type: str | None,
    partition: str | None,
    hw: Hardware,
    util: float | None = None,
    facts: pb.Facts | None = None,
) -> GpuPower:
    """W per GPU for the estimate of a job's GPUs: calibrated where the table (or the user's own
    measured jobs) has a cell, else TDP."""
    util_share = cfg.estimate.gpu_utilisation
    if not cfg.estimate.calibrate:
        return tdp_power(hw, util_share, "calibration off ([estimate] calibrate = false)")
    if cal is None:
        return tdp_power(hw, util_share, "no measured GPU jobs learnt yet (cocaq calibrate)")
    hit = cal.lookup_job(job_gpu_model(gpu_type, hw), partition, util, facts)
    return tdp_power(hw, util_share, hit) if isinstance(hit, str) else hit
