"""``failures-late``: jobs that FAILED after running a while, told to read their log and save checkpoints.

No short test catches a failure late in the run (``failures`` counts the early ones): what limits its
cost is a checkpoint to resume from, and what fixes it is in that job's own output and its failed step.
"""

from __future__ import annotations

from collections.abc import Sequence

from cocaq.footprint.advice_words import energy, hours, job_list, n_jobs
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context, outcome_part
from cocaq.footprint.rules.failures import codes, failed, failure_facts, log_of
from cocaq.footprint.rules.registry import Rule, register


def _sacct(j: JobFacts) -> str:
    return f"sacct -j {j.job_id} -o JobID,State,ExitCode,MaxRSS,Elapsed"


@register
class LateFailures(Rule):
    name = "failures-late"
    order = 40
    source = "sacct(1) --format JobID,State,ExitCode,MaxRSS,Elapsed (the step that failed)"
    repeated = True

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        t = ctx.thresholds
        hit = [j for j in jobs if failed(j, ctx) and j.elapsed_h > t.fail_early_h]
        if len(hit) < t.fail_min_jobs:
            return None
        kwh, kg, median_h, evidence = failure_facts(hit, "late")
        j0 = hit[0]
        return Advice(
            id=self.name,
            title="Save checkpoints in long runs that fail late",
            body=(
                f"{n_jobs(len(hit))} {ctx.period} failed after running a while (exit code {codes(hit)}; a "
                f"median of {hours(median_h)}): {job_list(hit)}. They used {energy(kwh)} beyond idle GPUs, "
                "and a short test would not have caught them. Read what the job printed before it failed "
                f"({log_of(j0)}, and {_sacct(j0)} for "
                "the step that failed), and save checkpoints regularly so that a rerun resumes from the "
                "latest "
                "instead of starting over."
            ),
            change=(_sacct(j0),),
            evidence=evidence,
            job_ids=tuple(j.job_id for j in hit),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=True,
            basis="up to: their energy beyond idle GPUs, what a rerun from a checkpoint would not redo",
            test=f"jobs in state FAILED after more than {hours(t.fail_early_h)}",
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        if not failed(j, ctx) or j.elapsed_h <= ctx.thresholds.fail_early_h:
            return None
        code = j.exit_code if j.exit_code is not None else "?"
        return self.job_note(
            j,
            "Find why it failed late, and save checkpoints",
            f"It failed (exit code {code}) after {hours(j.elapsed_h)}, using {energy(outcome_part(j))} "
            f"beyond idle GPUs; a short test would not have caught it. Read what it printed before it "
            f"failed ({log_of(j)}; {_sacct(j)} for the step "
            "that failed), and save checkpoints regularly so that a rerun resumes from the latest.",
            (_sacct(j),),
            outcome_part(j),
            True,
            "up to: its energy beyond idle GPUs, what a rerun from a checkpoint would not redo",
        )
