"""Energy of a job that nothing measured, from what Slurm accounted, and the CO2 of a job's energy.

Every assumption is returned with the estimate and stored on the job, so `cocaq recompute` can redo
it when the configuration changes and a reader can see exactly what a number rests on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cocaq.carbon import co2_grams, zone_intensity
from cocaq.config import Config
from cocaq.hostlist import expand_hostlist
from cocaq.slurm.record import JobRecord

SOURCE_TDP = "tdp-estimate"
SOURCE_SLURM = "slurm-consumed-energy"
# Rows an import writes, and so may replace; rows from the node-side hooks are never touched by it.
IMPORT_SOURCES = (SOURCE_TDP, SOURCE_SLURM)


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


def job_nodes(rec: JobRecord) -> list[str]:
    try:
        return expand_hostlist(rec.node_list or "")
    except ValueError:
        return []


def footprint(rec: JobRecord, cfg: Config) -> JobFootprint:
    hw, profile = cfg.hardware_for(rec.partition, job_nodes(rec))
    elapsed = max(rec.elapsed_s, 0.0)
    rows: list[EnergyRow] = []
    assumptions: dict[str, Any] = {"profile": profile}
    if rec.consumed_energy_j and rec.consumed_energy_j > 0:
        rows.append(EnergyRow("", "node", "measured", SOURCE_SLURM, rec.consumed_energy_j))
        assumptions["basis"] = "Slurm ConsumedEnergyRaw (node energy measured by acct_gather_energy)"
    else:
        est = cfg.estimate
        if est.cpu_usage == "totalcpu" and rec.total_cpu_s is not None:
            core_s = rec.total_cpu_s
            if rec.alloc_cpus:
                core_s = min(core_s, rec.alloc_cpus * elapsed)  # TotalCPU cannot exceed the allocation
            basis = "TotalCPU"
        else:
            core_s = rec.alloc_cpus * elapsed
            basis = "allocated cores x elapsed"
        cpu_j = core_s * hw.cpu_tdp_w_per_core
        gpu_j = rec.alloc_gpus * elapsed * hw.gpu_tdp_w * est.gpu_utilisation
        mem_gb = (rec.req_mem_mb or 0.0) / 1024.0
        mem_j = mem_gb * elapsed * est.mem_w_per_gb
        if cpu_j > 0 or not (gpu_j or mem_j):
            rows.append(EnergyRow("", "cpu", "estimated", SOURCE_TDP, cpu_j))
        if gpu_j > 0:
            rows.append(EnergyRow("", "gpu", "estimated", SOURCE_TDP, gpu_j))
        if mem_j > 0:
            rows.append(EnergyRow("", "dram", "estimated", SOURCE_TDP, mem_j))
        assumptions.update(
            basis="estimated from TDP",
            cpu_basis=basis,
            cpu_core_seconds=round(core_s, 3),
            cpu_model=hw.cpu_model,
            cpu_tdp_w_per_core=hw.cpu_tdp_w_per_core,
            gpu_model=hw.gpu_model,
            gpu_tdp_w=hw.gpu_tdp_w,
            gpu_utilisation=est.gpu_utilisation,
            mem_gb=round(mem_gb, 3),
            mem_w_per_gb=est.mem_w_per_gb,
        )
    energy = sum(r.energy_j for r in rows)
    measured = sum(r.energy_j for r in rows if r.method == "measured")
    zone, pue = cfg.zone_and_pue(hw)
    ci = zone_intensity(zone)
    return JobFootprint(
        energies=tuple(rows),
        energy_j=energy,
        energy_measured_j=measured,
        hw_profile=profile,
        assumptions=assumptions,
        pue=pue,
        carbon_zone=ci.zone,
        carbon_g_per_kwh=ci.g_per_kwh,
        carbon_source=ci.source,
        carbon_year=ci.year,
        carbon_flag=ci.flag,
        co2_g=co2_grams(energy, pue, ci.g_per_kwh),
    )
