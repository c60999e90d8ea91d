"""``gpu-memory``: a job whose GPUs held under a quarter of their memory, told a larger batch or smaller
GPUs. A note on one job only (`cocaq job`, the job e-mail); it claims no saving. The peak is the
collector's samples' (NVML), or Slurm's gres/gpumem where there are none; the GPUs' memory is the
hardware profile's (`gpu_mem_gb`: 0 where the site did not say, and then no note).
"""

from __future__ import annotations

from collections.abc import Sequence

from cocaq.footprint.advice_words import MB_PER_GB, num
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context
from cocaq.footprint.rules.registry import Rule, register

MAX_USE = 0.25  # of the GPUs' memory


@register
class GpuMemory(Rule):
    name = "gpu-memory"
    order = 85
    source = (
        "NVML's memory used per GPU (the collector's samples), or Slurm's gres/gpumem (sacct TRESUsageInMax)"
    )
    saves = False

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        if not (j.ended and j.gpus > 0 and j.gpu_mem_peak_mb is not None and j.gpu_mem_gb > 0):
            return None
        used = j.gpu_mem_peak_mb / MB_PER_GB
        if not used < MAX_USE * j.gpu_mem_gb:
            return None
        return self.job_note(
            j,
            "Use its GPUs' memory, or smaller GPUs",
            f"Its GPUs held at most {num(used)} GB of their {num(j.gpu_mem_gb)} GB: a larger batch would "
            "use them better, or a GPU with less memory would do.",
        )
