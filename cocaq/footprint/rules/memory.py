"""``memory``: memory asked for and not used (sacct MaxRSS), told to ask for a smaller `--mem`.

Only jobs that have ended count (Slurm adds a step's MaxRSS when the step ends, so a running job's would
size the request on part of the run), and not those killed for memory (``out-of-memory``'s). Unused
memory draws little that cocaq counts: the saving is the memory energy estimated for the unused part,
often nothing, so the e-mails rarely show it while `cocaq job` lists it as a note, as jobstats does.
"""

from __future__ import annotations

from collections.abc import Sequence

from cocaq.footprint.advice_words import MB_PER_GB, job_list, n_jobs, num, pct, slurm_mem
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context, Evidence, Thresholds, saving
from cocaq.footprint.rules.registry import Rule, register


def oversized(j: JobFacts, t: Thresholds) -> bool:
    """An ended job that used at most `mem_max_use` of a large enough request per node."""
    used, asked = j.mem_used_per_node_mb, j.mem_req_per_node_mb
    if used is None or not asked or asked < t.mem_min_req_gb * MB_PER_GB or j.outcome == "oom" or not j.ended:
        return False  # (not ended: MaxRSS of the steps that ended so far)
    return used <= t.mem_max_use * asked


def proposal_mb(used_mb: float) -> float:
    """The request that holds what a job used: a quarter more, at least 1 GB."""
    return max(used_mb * 1.25, MB_PER_GB)


@register
class Memory(Rule):
    name = "memory"
    order = 90
    source = "sacct(1) MaxRSS and ReqMem, sbatch(1) --mem; Princeton's jobstats (memory used of asked)"

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        t = ctx.thresholds
        hit = [j for j in jobs if oversized(j, t)]
        if not hit:
            return None
        hit.sort(key=lambda j: -(j.mem_req_per_node_mb or 0))
        most = max(j.mem_used_per_node_mb or 0.0 for j in hit)
        asked = max(j.mem_req_per_node_mb or 0.0 for j in hit)
        proposal = proposal_mb(most)

        def part(j: JobFacts) -> float:
            req = j.mem_req_per_node_mb or 0.0
            return j.dram_kwh * j.share * max(0.0, 1 - proposal / req) if req else 0.0

        kwh, kg = saving(hit, part)
        return Advice(
            id=self.name,
            title="Ask for less memory",
            body=(
                f"{n_jobs(len(hit))} {ctx.period} used at most {num(most / MB_PER_GB)} GB per node "
                "(sacct MaxRSS) "
                "of up "
                f"to {num(asked / MB_PER_GB)} GB requested: {job_list(hit)}. Asking for what they use "
                f"(#SBATCH --mem={slurm_mem(proposal)}) leaves the rest to others and lets your jobs start "
                "sooner."
            ),
            change=(f"#SBATCH --mem={slurm_mem(proposal)}",),
            evidence=(
                Evidence("most memory used per node", most / MB_PER_GB, "GB"),
                Evidence("memory requested per node", asked / MB_PER_GB, "GB"),
            ),
            job_ids=tuple(j.job_id for j in hit),
            saving_kwh=kwh or None,
            saving_kg=kg or None,
            upper_bound=False,
            basis="the memory energy estimated for the unused part (unused memory draws little)",
            test=f"used <= {pct(t.mem_max_use)} of a request of >= {num(t.mem_min_req_gb)} GB per node",
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        used_mb, asked_mb = j.mem_used_per_node_mb, j.mem_req_per_node_mb
        if used_mb is None or not asked_mb or not oversized(j, ctx.thresholds):
            return None
        return self.job_note(
            j,
            "Ask for less memory",
            f"It used at most {num(used_mb / MB_PER_GB)} GB per node (sacct MaxRSS) of the "
            f"{num(asked_mb / MB_PER_GB)} GB it asked for.",
            (f"#SBATCH --mem={slurm_mem(proposal_mb(used_mb))}",),
        )
