"""``dataloader``: GPUs waiting for data (low utilisation while every allocated CPU core was busy), told
to ask for more cores and data-loader workers.

The saving is an upper bound: the GPU energy the same work would not need at `loader_target_util_pct`
utilisation.
"""

from __future__ import annotations

from collections.abc import Sequence

from cocaq.footprint.advice_words import job_list, n_jobs, num, pct
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context, Evidence, Thresholds, sampled, saving
from cocaq.footprint.rules.registry import Rule, register

LOADER = "DataLoader(num_workers=N, pin_memory=True)"


def starved(j: JobFacts, t: Thresholds) -> bool:
    """A GPU job under the utilisation bound with its CPU cores busy, long enough to judge."""
    return (
        j.gpus > 0
        and j.gpu_util_pct is not None
        and j.gpu_util_pct < t.loader_max_util_pct
        and (j.cpu_usage or 0.0) > t.loader_min_cpu_usage
        and j.elapsed_h >= t.loader_min_elapsed_h
    )


@register
class Dataloader(Rule):
    name = "dataloader"
    order = 80
    source = "sbatch(1) --cpus-per-task; PyTorch's DataLoader (num_workers, pin_memory, persistent_workers)"
    after = ("notebooks", "fewer-gpus")  # idle GPUs are those rules' (one note per job's GPU use)

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        t = ctx.thresholds
        hit = [
            j for j in jobs if starved(j, t) and sampled(j, t) and (j.idle_share or 0.0) < t.idle_min_share
        ]
        if not hit:
            return None
        hit.sort(key=lambda j: -j.gpu_kwh * j.share)

        def part(j: JobFacts) -> float:
            # at the target utilisation the same work needs util/target of the GPU time
            return j.gpu_kwh * j.share * max(0.0, 1 - (j.gpu_util_pct or 0.0) / t.loader_target_util_pct)

        kwh, kg = saving(hit, part)
        util = sum((j.gpu_util_pct or 0.0) * j.gpu_kwh for j in hit) / max(sum(j.gpu_kwh for j in hit), 1e-9)
        per_gpu = max(j.cpus // max(j.gpus, 1) for j in hit)
        return Advice(
            id=self.name,
            title="Feed your GPUs: more CPU cores and data-loader workers",
            body=(
                f"In {n_jobs(len(hit))} {ctx.period} ({job_list(hit)}) the GPUs averaged {util:.0f}% "
                "utilisation while "
                "every allocated CPU core was busy: the GPUs were waiting for data. Ask for more cores "
                f"(#SBATCH --cpus-per-task={per_gpu * 2} per GPU) and give the data loader as many workers "
                "(PyTorch: DataLoader(num_workers=..., pin_memory=True, persistent_workers=True)), or move "
                "decoding and augmentation to the GPU."
            ),
            change=(f"#SBATCH --cpus-per-task={per_gpu * 2}", LOADER),
            evidence=(
                Evidence("their GPU utilisation", util, "%"),
                Evidence("their GPU energy", sum(j.gpu_kwh * j.share for j in hit), "kWh"),
            ),
            job_ids=tuple(j.job_id for j in hit),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=True,
            basis=(
                f"up to: the GPU energy the same work would not need at {t.loader_target_util_pct:.0f}% "
                "utilisation"
            ),
            test=(
                f"GPU utilisation < {t.loader_max_util_pct:.0f}% with CPU usage > "
                f"{pct(t.loader_min_cpu_usage)}, runs of >= {num(t.loader_min_elapsed_h)} h"
            ),
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        if not starved(j, ctx.thresholds):
            return None
        per_gpu = max(j.cpus // max(j.gpus, 1), 1)
        return self.job_note(
            j,
            "Feed the GPUs: more CPU cores and data-loader workers",
            f"Its GPUs averaged {j.gpu_util_pct:.0f}% utilisation while its CPU cores were "
            f"{pct(j.cpu_usage or 0.0)} busy: more cores and data-loader workers would feed them.",
            (f"#SBATCH --cpus-per-task={per_gpu * 2}", LOADER),
        )
