"""``notebooks``: interactive sessions (notebooks, shells: `[advice] interactive_names`, an interactive
partition or QOS, or steps without a batch step) holding GPUs idle, told to release them.

The saving is what their idle GPUs drew (the ledger's idle energy) while nobody else could use them.
"""

from __future__ import annotations

from collections.abc import Sequence

from cocaq.footprint.advice_words import energy, job_list, n_gpus, n_jobs, num, pct
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context, Evidence, idle_part, is_interactive, saving
from cocaq.footprint.rules.registry import Rule, register


def idle_session(j: JobFacts, ctx: Context) -> bool:
    """An interactive session whose GPUs drew energy idle."""
    return j.gpus > 0 and is_interactive(j, ctx) and j.idle_kwh > 0


@register
class Notebooks(Rule):
    name = "notebooks"
    order = 60
    source = "scancel(1); Slurm's interactive jobs (srun --pty, salloc) and their time limit"

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        hit = [j for j in jobs if idle_session(j, ctx)]
        if not hit:
            return None
        hit.sort(key=lambda j: -idle_part(j))
        kwh, kg = saving(hit, idle_part)
        idle_h = sum(j.idle_gpu_hours * j.share for j in hit)
        return Advice(
            id=self.name,
            title="Release GPUs your notebooks are not using",
            body=(
                f"{n_jobs(len(hit))} {ctx.period} "
                f"{'was an interactive session' if len(hit) == 1 else 'were interactive sessions'} "
                f"({job_list(hit)}) "
                "whose GPUs sat under "
                f"{ctx.idle_threshold_pct:g}% utilisation for {num(idle_h)} GPU-hours, drawing {energy(kwh)} "
                "while "
                "nobody else could use them. Ask for GPUs only while you compute: edit and explore on a CPU "
                "session, end the session when you stop (scancel JOBID, or File > Shut Down), and ask for "
                "no more hours than you will work in it."
            ),
            change=("scancel JOBID",),
            evidence=(
                Evidence("idle GPU-hours", idle_h, "GPU-h"),
                Evidence("what the idle GPUs drew", kwh, "kWh"),
            ),
            job_ids=tuple(j.job_id for j in hit),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=False,
            basis="what the allocated GPUs drew while idle (their power samples)",
            test=f"interactive sessions holding GPUs under {ctx.idle_threshold_pct:g}% utilisation",
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        if j.gpu_util_pct is None or not idle_session(j, ctx):
            return None
        so_far = "" if j.ended else " so far"
        return self.job_note(
            j,
            "End interactive sessions when you stop computing",
            f"This interactive session held {n_gpus(j.gpus)} that sat idle "
            f"{pct(j.idle_share or 0.0)} {j.idle_when}{so_far} ({num(j.idle_gpu_hours)} GPU-hours, "
            f"{energy(j.idle_kwh)}). End sessions when you stop computing, and ask for no more hours "
            "than you will work in them.",
            (f"scancel {j.job_id}" if j.is_open else "scancel JOBID",),
            idle_part(j),
            False,
            "what its idle GPUs drew",
        )
