"""``out-of-memory``: jobs Slurm killed for memory, told the `--mem` that would have held them.

Their energy beyond idle GPUs was spent on runs that could not finish (an upper bound); the line asks
for half as much again as they asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from cocaq.footprint.advice_words import MB_PER_GB, energy, job_list, n_jobs, num, slurm_mem, were
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context, Evidence, outcome_part, saving
from cocaq.footprint.rules.registry import Rule, register


def more_memory(asked_mb: float) -> str:
    """The `--mem` line for a job killed with `asked_mb` per node."""
    return f"#SBATCH --mem={slurm_mem(asked_mb * 1.5)}"


@register
class OutOfMemory(Rule):
    name = "out-of-memory"
    order = 50
    source = "Slurm's job state OUT_OF_MEMORY (the cgroup's memory limit), sbatch(1) --mem"
    repeated = True

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        hit = [j for j in jobs if j.outcome == "oom"]
        if not hit:
            return None
        hit.sort(key=lambda j: -outcome_part(j))
        kwh, kg = saving(hit, outcome_part)
        asked = max((j.mem_req_per_node_mb or 0.0) for j in hit)
        change = (more_memory(asked),) if asked else ("#SBATCH --mem=...",)
        return Advice(
            id=self.name,
            title="Ask for the memory your jobs need",
            body=(
                f"{n_jobs(len(hit))} {ctx.period} {were(len(hit))} killed for running out of memory: "
                f"{job_list(hit)}"
                + (f", with up to {num(asked / MB_PER_GB)} GB per node" if asked else "")
                + f". They used {energy(kwh)} for nothing. Ask for more ({change[0]}), or load the data in "
                "smaller pieces; `cocaq job JOBID` shows what a finished job used."
            ),
            change=change,
            evidence=(Evidence("jobs out of memory", len(hit), "jobs"), Evidence("their energy", kwh, "kWh")),
            job_ids=tuple(j.job_id for j in hit),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=True,
            basis="up to: their energy beyond idle GPUs, spent on runs that could not finish",
            test="jobs in state OUT_OF_MEMORY",
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        if j.outcome != "oom":
            return None
        asked = j.mem_req_per_node_mb
        return self.job_note(
            j,
            "Ask for the memory it needs",
            "Slurm killed it for using more memory than it asked for"
            + (f" ({num(asked / MB_PER_GB)} GB per node)" if asked else "")
            + f": its {energy(outcome_part(j))} was spent for nothing. Ask for more.",
            (more_memory(asked),) if asked else (),
            outcome_part(j),
            True,
            "up to: its energy beyond idle GPUs",
        )
