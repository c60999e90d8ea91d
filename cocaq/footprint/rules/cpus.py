"""``cpus``: CPU cores asked for and not kept busy, told to ask for fewer, or to find out why they wait.

CPU use is sacct's TotalCPU / (AllocCPUS x Elapsed), of jobs that ended (Slurm adds a step's TotalCPU
when it ends; a job whose TotalCPU Slurm did not record is no evidence either way). jobstats marks CPU use
under 65% "low" and 65-80% "somewhat low" against a target of 90% and above, and speaks of CPU-only jobs
with more than one core; cocaq sizes the request down under 50% (GPU jobs too, from 4 cores), and from 50%
to 80% asks for a scaling test instead, where fewer cores may or may not do. A job with idle nodes is
``zero-cpu-nodes``' (the idle node is the cause), and a GPU job's cores beyond a GPU's share of the node
are ``cores-per-gpu``'s: the same cores, said once.
"""

from __future__ import annotations

import math

from cocaq.footprint.advice_words import num, pct
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Context
from cocaq.footprint.rules.cores_per_gpu import cores_beyond_share
from cocaq.footprint.rules.jobstats import JOBSTATS, MIN_RUN_H, Hit, JobstatsRule
from cocaq.footprint.rules.registry import register
from cocaq.units import S_PER_HOUR

# jobstats' bands of CPU use (its CPU_UTIL_RED and CPU_UTIL_BLACK): "low" under 65%, "somewhat low" to 80%
JOBSTATS_CPU_LOW = 0.65
CPU_SOMEWHAT_LOW = 0.80


@register
class Cpus(JobstatsRule):
    name = "cpus"
    order = 100
    source = f"{JOBSTATS}: its CPU_UTIL_RED and CPU_UTIL_BLACK bands; sacct(1) TotalCPU, AllocCPUS, Elapsed"
    title = "Ask for the CPU cores your jobs use"
    job_title = "Ask for the CPU cores it uses"
    why = "Cores a job holds and does not use wait for it while other jobs wait for cores."
    basis = "none claimed: idle cores draw little that cocaq counts; they are freed for others"
    test = (
        "TotalCPU under 50% of allocated cores x elapsed (4+ cores with GPUs, 2+ without), or under 80% "
        "for CPU-only jobs (jobstats' low and somewhat low bands)"
    )

    def find(self, j: JobFacts, ctx: Context) -> Hit | None:
        t = ctx.thresholds
        u = j.cpu_usage  # None for a running job or one whose TotalCPU Slurm did not gather
        if u is None or j.elapsed_h < MIN_RUN_H or j.cpus < (t.cpu_min_cores if j.gpus else 2):
            return None
        if j.zero_cpu_nodes:  # its idle nodes are the cause: the zero-cpu-nodes note says so
            return None
        if j.gpus and cores_beyond_share(j) is not None:  # the same cores, said per GPU
            return None
        per_node = j.cpus / max(j.nodes, 1)
        core_h = f"{num((j.total_cpu_s or 0) / S_PER_HOUR)} of {num(j.cpus * j.elapsed_h)} core-hours"
        busy = f"{pct(u)} of its {j.cpus} CPU cores busy ({core_h})"
        ev = (("CPU use", u * 100, "%"), ("CPU cores", j.cpus, "cores"))
        if u < t.cpu_max_usage:
            serial = 0.85 <= u * j.cpus <= 1.01 and j.nodes <= 1
            ask = 1 if serial else max(1, math.ceil(per_node * u * 1.25))
            why = (
                " That is about one core's worth: the code may run on one core only (a serial code); if it "
                "is, more cores do not make it faster."
                if serial
                else ""
            )
            return Hit(
                j,
                f"It kept {busy}.{why} About {ask} {'core' if ask == 1 else 'cores'} per node would do.",
                f"{j.job_id}: {pct(u)} of {j.cpus}",
                (f"#SBATCH --cpus-per-task={ask}  (with one task per node)",),
                ev,
                j.cpus * j.elapsed_h,
                "Ask for fewer CPU cores",
            )
        if (
            j.gpus or u >= CPU_SOMEWHAT_LOW
        ):  # a GPU job's cores feed its GPUs: their use is not its efficiency
            return None
        word = "somewhat low" if u >= JOBSTATS_CPU_LOW else "low"
        test = max(1, math.ceil(per_node * u))
        return Hit(
            j,
            f"It kept {busy}: {word} against the 90% and above a parallel code should reach. Common causes: "
            "waiting for files (I/O), tasks waiting for each other, or more cores than the code scales to. "
            f"A scaling test tells: run the same input with {test} cores (what it kept busy on average) and "
            "compare the run time; if it barely grows, keep the smaller request.",
            f"{j.job_id}: {pct(u)} of {j.cpus}",
            (f"#SBATCH --cpus-per-task={test}  (for the scaling test; one task per node)",),
            ev,
            j.cpus * j.elapsed_h,
            "Find out why its CPU cores wait",
        )
