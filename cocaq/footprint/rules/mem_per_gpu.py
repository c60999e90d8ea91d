"""``mem-per-gpu``: more memory per GPU than a GPU's share of its node, told `--mem-per-gpu`.

The job's ReqMem and MaxRSS x tasks per node, of jobs that ended and were not killed for memory, against
the node its hardware profile describes: a GPU's fair share of a node is the node's memory / its GPUs. It
fires where the job used under 85% of what it asked for (jobstats' bar) and at most that share.
"""

from __future__ import annotations

from cocaq.footprint.advice_words import MB_PER_GB, num, slurm_mem
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Context
from cocaq.footprint.rules.jobstats import JOBSTATS, Hit, JobstatsRule, fair_share
from cocaq.footprint.rules.registry import register

MEM_MAX_USE = 0.85  # jobstats: memory per GPU above the fair share, and under 85% of it used


@register
class MemPerGpu(JobstatsRule):
    name = "mem-per-gpu"
    order = 120
    source = (
        f"{JOBSTATS}: memory per GPU against the node's; sacct(1) ReqMem and MaxRSS, sbatch(1) --mem-per-gpu"
    )
    title = "Ask for a GPU's share of memory"
    job_title = "Ask for a GPU's share of memory"
    why = "Memory beyond a GPU's share of the node leaves its other GPUs without memory for other jobs."
    basis = "none claimed: it frees memory, and with it GPUs, for others"
    test = "memory per GPU above the node's memory / GPUs, under 85% of it used (sacct MaxRSS)"

    def find(self, j: JobFacts, ctx: Context) -> Hit | None:
        fair = fair_share(j)
        asked, used = j.mem_req_per_node_mb, j.mem_used_per_node_mb
        if fair is None or fair[1] <= 0 or not asked or used is None or not j.ended or j.outcome == "oom":
            return None
        gpus_here = j.gpus / max(j.nodes, 1)
        per_gpu, used_gpu = asked / MB_PER_GB / gpus_here, used / MB_PER_GB / gpus_here
        if per_gpu <= fair[1] or used >= MEM_MAX_USE * asked or used_gpu > fair[1]:
            return None
        ask = slurm_mem(min(fair[1], max(used_gpu * 1.25, 1.0)) * MB_PER_GB)
        return Hit(
            j,
            f"It asked for {num(per_gpu)} GB of memory per GPU, more than a GPU's share of its node, "
            f"{num(fair[1])} GB ({num(j.node_mem_gb)} GB / {j.node_gpus} GPUs per node), and used at most "
            f"{num(used_gpu)} GB per GPU (sacct MaxRSS). Memory beyond the share leaves the node's other "
            "GPUs "
            "without memory for other jobs.",
            f"{j.job_id}: {num(per_gpu)} GB per GPU, {num(used_gpu)} GB used",
            (
                f"#SBATCH --mem-per-gpu={ask}  (in place of --mem: Slurm takes one of --mem, --mem-per-cpu "
                "and "
                "--mem-per-gpu)",
            ),
            (
                ("memory per GPU", per_gpu, "GB"),
                ("used per GPU", used_gpu, "GB"),
                ("fair share", fair[1], "GB"),
            ),
            (per_gpu - fair[1]) * j.gpus * j.elapsed_h,
        )
