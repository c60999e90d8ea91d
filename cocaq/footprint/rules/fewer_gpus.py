"""``fewer-gpus``: batch jobs whose GPUs sat idle, told to ask for the GPUs they use (`--gres=gpu:N`).

It fires, and is sized, on job-level figures that every surface has (the ledger's idle energy: what the
idle GPUs drew), so that the e-mail, `cocaq user` and the API say the same; per-GPU samples, where the
reports examined them (one GPU idle while another worked), only say which GPUs idled. GPU samples are
measured as the job runs: a running job's idle GPUs count, said to be so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cocaq.footprint.advice_words import energy, n_gpus, n_jobs, num, pct
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import (
    Advice,
    Context,
    Evidence,
    Thresholds,
    idle_part,
    is_interactive,
    sampled,
)
from cocaq.footprint.rules.registry import Rule, register

_Hit = tuple[JobFacts, int, float, float, str]  # job, GPUs to ask for, kWh, kg, detail


def mostly_idle(j: JobFacts, t: Thresholds) -> bool:
    """A GPU job whose GPUs were idle at least `idle_min_share` of their sampled time."""
    return j.gpus > 0 and sampled(j, t) and j.idle_share is not None and j.idle_share >= t.idle_min_share


def _hit(j: JobFacts, t: Thresholds) -> _Hit:
    """A mostly idle job over a window: the GPUs it needs, what its idle GPUs drew, what the list says."""
    idle = j.idle_share or 0.0
    kwh = idle_part(j)
    keep = max(1, math.ceil(j.gpus * (1 - idle) - 1e-9))
    devs = [d for d in j.devices if d.samples >= t.gpu_min_samples]
    idle_devs = [d for d in devs if d.idle_share >= t.gpu_idle_share]
    if len(devs) >= 2 and idle_devs and len(idle_devs) < len(devs):
        keep = len(devs) - len(idle_devs)
        least = pct(min(d.idle_share for d in idle_devs))
        detail = (
            f"{j.job_id}: {len(idle_devs)} of its {len(devs)} GPUs idle in {least}+ of their samples "
            "while the others worked"
        )
    else:
        detail = f"{j.job_id}: its {n_gpus(j.gpus)} idle {pct(idle)} {j.idle_when}"
    if not j.ended:
        detail += " so far"
    return j, keep, kwh, kwh * j.kg_per_kwh, detail


@register
class FewerGpus(Rule):
    name = "fewer-gpus"
    order = 70
    source = "sbatch(1) --gres=gpu:N; PyTorch's torchrun --nproc_per_node and DistributedDataParallel"
    after = ("notebooks",)  # an idle interactive session is told to end, not to ask for fewer GPUs

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        t = ctx.thresholds
        hits = [
            _hit(j, t) for j in jobs if mostly_idle(j, t) and not is_interactive(j, ctx) and idle_part(j) > 0
        ]
        if not hits:
            return None
        hits.sort(key=lambda h: -h[2])
        kwh = sum(h[2] for h in hits)
        kg = sum(h[3] for h in hits)
        j0, keep0 = hits[0][0], hits[0][1]
        single = all(h[0].gpus == 1 for h in hits)
        change = (
            ("check that the code uses the GPU (nvidia-smi on the node; torch.cuda.is_available())",)
            if single
            else (f"#SBATCH --gres=gpu:{keep0}  (job {j0.job_id} had {j0.gpus})",)
        )
        return Advice(
            id=self.name,
            title="Ask for the GPUs your jobs use" if not single else "Make sure your GPU jobs use their GPU",
            body=(
                f"In {n_jobs(len(hits))} {ctx.period} GPUs sat idle "
                f"(under {ctx.idle_threshold_pct:g}% utilisation) "
                f"while the job held them: {'; '.join(h[4] for h in hits[:4])}. They drew {energy(kwh)} for "
                "no work. If the code uses one GPU, ask for one; if it should use them all, check that it is "
                "launched on all of them (torchrun --nproc_per_node, DistributedDataParallel)."
            ),
            change=change,
            evidence=(
                Evidence("jobs with idle GPUs", len(hits), "jobs"),
                Evidence("what the idle GPUs drew", kwh, "kWh"),
            ),
            job_ids=tuple(h[0].job_id for h in hits),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=False,
            basis="what the idle GPUs drew while the jobs held them (their samples, or Slurm's gres/gpuutil)",
            test=(
                f"per GPU: idle in >= {pct(t.gpu_idle_share)} of its samples while another worked; or the "
                f"job's GPUs idle >= {pct(t.idle_min_share)} of the sampled time"
            ),
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        if not mostly_idle(j, ctx.thresholds):
            return None
        idle = j.idle_share or 0.0
        # (rounded without the window's 1e-9 tolerance, as the note always has)
        keep = max(1, math.ceil(j.gpus * (1 - idle)))
        so_far = "" if j.ended else " so far"
        return self.job_note(
            j,
            "Ask for the GPUs it uses",
            f"Its {n_gpus(j.gpus)} sat under {ctx.idle_threshold_pct:g}% utilisation {pct(idle)} "
            f"{j.idle_when}{so_far} ({num(j.idle_gpu_hours)} GPU-hours, {energy(j.idle_kwh)}). "
            "Check that the code uses them all, or ask for fewer.",
            (f"#SBATCH --gres=gpu:{keep}",) if keep < j.gpus else (),
            idle_part(j),
            False,
            "what its idle GPUs drew",
        )
