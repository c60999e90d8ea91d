"""``unused-gpus``: a multi-GPU job with a GPU at 0% in every one of its samples, told to launch one
process per GPU or ask for the GPUs it uses.

From cocaq's collector samples of each GPU (`JobFacts.devices`, where they were examined one by one); a
running job's samples count, said to be so far. What the idle GPUs drew is ``fewer-gpus``' to size.
"""

from __future__ import annotations

from cocaq.footprint.advice_words import n_gpus
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Context
from cocaq.footprint.rules.jobstats import JOBSTATS, Hit, JobstatsRule
from cocaq.footprint.rules.registry import register


@register
class UnusedGpus(JobstatsRule):
    name = "unused-gpus"
    order = 140
    source = (
        f"{JOBSTATS}: GPUs a job did not use; PyTorch's torchrun --nproc_per_node, sbatch(1) --gres, --gpus"
    )
    title = "Use every GPU you ask for"
    job_title = "Use every GPU it asks for"
    why = "Launch one process per GPU (torchrun, srun), or ask for the GPUs the code uses."
    basis = "none claimed here: what the idle GPUs drew is the fewer-gpus advice's"
    test = "a GPU of a multi-GPU job at 0% in every one of its samples"

    def find(self, j: JobFacts, ctx: Context) -> Hit | None:
        devs = [d for d in j.devices if d.samples >= ctx.thresholds.gpu_min_samples]
        if j.gpus < 2 or len(devs) < 2:
            return None
        zero = [d for d in devs if d.mean_util_pct <= 0.0]
        if not zero:
            return None
        used = len(devs) - len(zero)
        names = ", ".join(f"{d.device} on {d.node}" for d in zero[:4]) + (
            " and more" if len(zero) > 4 else ""
        )
        keep = max(used, 1)
        change = (
            (f"#SBATCH --gres=gpu:{keep}" if j.nodes <= 1 else f"#SBATCH --gpus={keep}  (GPUs in all)"),
            f"torchrun --nproc_per_node={len(devs) // max(j.nodes, 1)}  (one process per GPU, to use them "
            "all)",
        )
        so_far = "" if j.ended else " so far"
        return Hit(
            j,
            f"It did not use {len(zero)} of its {n_gpus(len(devs))}: {names} stayed at 0% in every sample"
            f"{so_far}. The code ran on fewer GPUs than it asked for: launch one process per GPU "
            "(torchrun, srun), or ask for the GPUs it uses.",
            f"{j.job_id}: {len(zero)} of {len(devs)} GPUs at 0%",
            change,
            (("GPUs at 0%", len(zero), "GPUs"), ("GPUs", len(devs), "GPUs")),
            len(zero) * j.elapsed_h,
        )
