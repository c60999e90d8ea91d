"""``fewer-nodes``: a multi-node job whose cores, GPUs and memory fit on fewer of its nodes, told `--nodes`.

Against the node its hardware profile describes (cores, GPUs and memory per node); a job with nodes on
which it used no CPU is ``zero-cpu-nodes``' (the idle node is the cause), as jobstats leaves it out too.
"""

from __future__ import annotations

import math

from cocaq.footprint.advice_words import MB_PER_GB, n_gpus
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Context
from cocaq.footprint.rules.jobstats import JOBSTATS, Hit, JobstatsRule
from cocaq.footprint.rules.registry import register


@register
class FewerNodes(JobstatsRule):
    name = "fewer-nodes"
    order = 130
    source = f"{JOBSTATS}: jobs on more nodes than they need; sbatch(1) --nodes, --ntasks-per-node, --gres"
    title = "Run on as few nodes as your jobs fit on"
    job_title = "Run on as few nodes as it fits on"
    why = "Fewer nodes means less traffic between nodes and leaves whole nodes to jobs that need them."
    basis = "none claimed: the same cores and GPUs on fewer nodes"
    test = "its cores, GPUs and memory fit on fewer of its partition's nodes"

    def find(self, j: JobFacts, ctx: Context) -> Hit | None:
        if j.nodes <= 1 or j.node_cores <= 0 or (j.gpus and j.node_gpus <= 0) or j.zero_cpu_nodes:
            return None
        need = math.ceil(j.cpus / j.node_cores - 1e-9)
        if j.gpus:
            need = max(need, math.ceil(j.gpus / j.node_gpus - 1e-9))
        if j.req_mem_mb and j.node_mem_gb > 0:
            need = max(need, math.ceil(j.req_mem_mb / MB_PER_GB / j.node_mem_gb - 1e-9))
        need = max(need, 1)
        if need >= j.nodes:
            return None
        node = f"{j.node_cores} cores" + (f" and {n_gpus(j.node_gpus)}" if j.gpus else "")
        held = f"{j.cpus} cores" + (f" and {n_gpus(j.gpus)}" if j.gpus else "")
        per_node = (
            f"#SBATCH --gres=gpu:{math.ceil(j.gpus / need)}  (GPUs per node)"
            if j.gpus
            else f"#SBATCH --ntasks-per-node={math.ceil(j.cpus / need)}  (with one core per task)"
        )
        return Hit(
            j,
            f"It ran on {j.nodes} nodes with {held} in all; its nodes have {node} each, so it fits on "
            f"{need}. "
            "Fewer nodes means less traffic between nodes (communication within a node is faster) and leaves "
            "whole nodes to jobs that need them.",
            f"{j.job_id}: {held} on {j.nodes} nodes, fits on {need}",
            (f"#SBATCH --nodes={need}", per_node),
            (("nodes", j.nodes, "nodes"), ("nodes it fits on", need, "nodes")),
            (j.nodes - need) * j.elapsed_h,
        )
