"""``zero-cpu-nodes``: a multi-node job with nodes on which Slurm accounted no CPU time in any step,
told to start the code with srun on every node.

The nodes are `JobFacts.zero_cpu_nodes`, from sacct's TRESUsageInMin/MinNode/MinTask
(cocaq.slurm.idle_nodes: a step's least-used task is the node's whole share only where the step ran one
task per node). jobstats says "did not use N of the M allocated nodes", and leaves such a job out of its
low-CPU and too-many-nodes notes, as ``cpus`` and ``fewer-nodes`` do: the idle node is the cause of both.
"""

from __future__ import annotations

from cocaq.footprint.advice_words import plural
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Context
from cocaq.footprint.rules.jobstats import JOBSTATS, MIN_RUN_H, Hit, JobstatsRule
from cocaq.footprint.rules.registry import register


@register
class ZeroCpuNodes(JobstatsRule):
    name = "zero-cpu-nodes"
    order = 150
    source = (
        f'{JOBSTATS}: "did not use N of the M allocated nodes"; sacct(1) TRESUsageInMin and '
        "TRESUsageInMinNode; srun(1)"
    )
    title = "Start your code on every node you ask for"
    job_title = "Start the code on every node"
    why = "Start the code with srun on every node, or ask for the nodes it uses."
    basis = "none claimed: an idle node draws little that cocaq counts; it is freed for others"
    test = (
        "a multi-node job with a node on which no step used any CPU time (sacct TRESUsageInMin/MinNode, "
        "one task per node)"
    )

    def find(self, j: JobFacts, ctx: Context) -> Hit | None:
        idle = j.zero_cpu_nodes
        if j.nodes < 2 or not idle or not j.ended or j.elapsed_h < MIN_RUN_H or len(idle) >= j.nodes:
            return None
        worked = j.nodes - len(idle)
        names = ", ".join(idle[:4]) + (f" and {len(idle) - 4} more" if len(idle) > 4 else "")
        multi = "" if worked > 1 else " Is the code able to use more than one node?"
        per_node = (
            f"#SBATCH --ntasks-per-node={max(1, j.gpus // j.nodes)}  (one task per GPU)"
            if j.gpus
            else f"#SBATCH --ntasks-per-node={max(1, j.cpus // j.nodes)}  (one task per core, as an MPI code "
            "runs; 1 for a code that starts its own threads)"
        )
        return Hit(
            j,
            f"It ran on {plural(j.nodes, 'node')} and Slurm accounted no CPU time on {len(idle)} of them: "
            f"{names} (sacct's least-used task of each step, TRESUsageInMin). The code was not started on "
            "every node: a batch script runs on the first node only, so a program started without srun, or a "
            f"launcher that starts one process, leaves the others idle.{multi} Start it with srun, which "
            "runs "
            "the tasks on every node of the job, or ask for the nodes it uses.",
            f"{j.job_id}: {len(idle)} of {j.nodes} nodes idle ({names})",
            (
                "srun python train.py  (your command after srun, in the batch script)",
                per_node,
                f"#SBATCH --nodes={worked}  (or ask for the nodes it used)",
            ),
            (("nodes with no CPU use", len(idle), "nodes"), ("nodes", j.nodes, "nodes")),
            len(idle) * j.elapsed_h,
        )
