"""``mig``: a one-GPU job that used a small part of a full GPU, told to run on a MIG slice.

The job's mean GPU use and its peak GPU memory (samples, or Slurm's gres/gpuutil and gres/gpumem) against
a MIG slice of `[advice] mig_partitions`: an NVIDIA A100 or H100 has 7 compute slices, so an `Ng.XXgb`
slice has N/7 of its compute and XX GB.
"""

from __future__ import annotations

import re

from cocaq.footprint.advice_words import MB_PER_GB, num
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Context
from cocaq.footprint.rules.jobstats import MIN_RUN_H, Hit, JobstatsRule
from cocaq.footprint.rules.registry import register

MIG_SLICES = 7  # compute slices of an A100 or H100 (NVIDIA's MIG user guide)
_MIG = re.compile(r"^(?P<g>[1-7])g\.(?P<mem>\d+)gb$")


@register
class Mig(JobstatsRule):
    name = "mig"
    order = 160
    source = "NVIDIA's Multi-Instance GPU user guide (7 compute slices of an A100 or H100); sbatch(1) --gres"
    title = "Run small GPU jobs on a MIG slice"
    job_title = "Run it on a MIG slice"
    why = "A MIG slice does their work and leaves full GPUs to jobs that need them."
    basis = "none claimed: a slice frees the rest of a GPU for others"
    test = "1 GPU, mean use under the slice's share of the compute, peak GPU memory under the slice's"

    def find(self, j: JobFacts, ctx: Context) -> Hit | None:
        migs = ctx.mig_partitions
        if (
            not migs
            or j.gpus != 1
            or (j.partition or "") in migs
            or not j.ended
            or j.elapsed_h < MIN_RUN_H
            or j.gpu_util_pct is None
            or j.gpu_util_pct <= 0.0
            or j.gpu_mem_peak_mb is None
        ):
            return None
        peak_gb = j.gpu_mem_peak_mb / MB_PER_GB
        fits = []
        for part, profile in migs.items():
            m = _MIG.match(profile)
            if m is None:
                continue
            g, mem = int(m["g"]), float(m["mem"])
            larger = (
                not j.gpu_mem_gb or j.gpu_mem_gb > mem
            )  # the job's GPU is a full one, larger than the slice
            if j.gpu_util_pct < 100.0 * g / MIG_SLICES and peak_gb < mem and larger:
                fits.append((g, mem, part, profile))
        if not fits:
            return None
        g, mem, part, profile = min(fits)
        return Hit(
            j,
            f"Its GPU was busy {j.gpu_util_pct:.0f}% of the time on average and held at most {num(peak_gb)} "
            "GB "
            f"of memory: a {profile} MIG slice ({g}/{MIG_SLICES} of an A100's or H100's compute, {num(mem)} "
            "GB) "
            f"on the {part} partition would do the same work and leave the full GPU to a job that needs it.",
            f"{j.job_id}: {j.gpu_util_pct:.0f}% busy, {num(peak_gb)} GB",
            (f"#SBATCH --partition={part}", f"#SBATCH --gres=gpu:{profile}:1"),
            (("GPU use", j.gpu_util_pct, "%"), ("GPU memory peak", peak_gb, "GB")),
            j.elapsed_h,
        )
