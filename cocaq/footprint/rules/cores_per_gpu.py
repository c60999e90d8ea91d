"""``cores-per-gpu``: more CPU cores per GPU than a GPU's share of its node, told `--cpus-per-gpu`.

The job's AllocCPUS and GPUs (AllocTRES gres/gpu) against the node its hardware profile describes: a GPU's
fair share of a node is the node's cores / its GPUs. It fires where the cores the job kept busy (TotalCPU)
fit within that share; cores beyond it leave the node's other GPUs without cores for other jobs.
"""

from __future__ import annotations

import math

from cocaq.footprint.advice_words import num, pct
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Context
from cocaq.footprint.rules.jobstats import JOBSTATS, MIN_RUN_H, Hit, JobstatsRule, fair_share
from cocaq.footprint.rules.registry import register


def cores_beyond_share(j: JobFacts) -> Hit | None:
    """More cores per GPU than a GPU's share of the node, with the cores kept busy within it (also what
    ``cpus`` leaves to this rule)."""
    fair = fair_share(j)
    u = j.cpu_usage
    if fair is None or fair[0] <= 0 or u is None or j.elapsed_h < MIN_RUN_H:
        return None
    per_gpu = j.cpus / j.gpus
    used = per_gpu * u
    if per_gpu <= fair[0] or used > fair[0]:
        return None
    ask = min(math.floor(fair[0]), max(1, math.ceil(used * 1.25)))
    share = f"{num(fair[0])} cores per GPU ({j.node_cores} cores / {j.node_gpus} GPUs per node)"
    return Hit(
        j,
        f"It asked for {num(per_gpu)} CPU cores per GPU, more than a GPU's share of its node, {share}, and "
        f"kept {num(used)} per GPU busy ({pct(u)} of them). Cores beyond the share leave the node's other "
        f"GPUs without cores for other jobs. {ask} per GPU would do.",
        f"{j.job_id}: {num(per_gpu)} cores per GPU, {num(used)} busy",
        (f"#SBATCH --cpus-per-gpu={ask}  (in place of --cpus-per-task: Slurm takes one of the two)",),
        (
            ("CPU cores per GPU", per_gpu, "cores"),
            ("busy per GPU", used, "cores"),
            ("fair share", fair[0], "cores"),
        ),
        (per_gpu - fair[0]) * j.gpus * j.elapsed_h,
    )


@register
class CoresPerGpu(JobstatsRule):
    name = "cores-per-gpu"
    order = 110
    source = f"{JOBSTATS}: cores per GPU against the node's; sbatch(1) --cpus-per-gpu"
    title = "Ask for a GPU's share of CPU cores"
    job_title = "Ask for a GPU's share of CPU cores"
    why = "Cores beyond a GPU's share of the node leave its other GPUs without cores for other jobs."
    basis = "none claimed: it frees cores, and with them GPUs, for others"
    test = "cores per GPU above the node's cores / GPUs, with the cores it kept busy within that share"

    def find(self, j: JobFacts, ctx: Context) -> Hit | None:
        return cores_beyond_share(j)
