"""``failures``: jobs that FAILED early in the run, told to test on a small input before the long run.

A job that failed within `fail_early_h` of its start is what a short test run catches (bugs, paths, the
environment); only these are sized here, since a job that failed after 6 h would pass a 15-minute test
(those are ``failures-late``'s). Node failures (NODE_FAIL, BOOT_FAIL) are the cluster's, not the user's,
and an interactive session that ends in an error is no run to rehearse: neither is counted.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from cocaq.footprint.advice_words import duration_unit, energy, hours, job_list, n_jobs, slurm_time
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context, Evidence, is_interactive, outcome_part, saving
from cocaq.footprint.rules.registry import Rule, register


def failed(j: JobFacts, ctx: Context) -> bool:
    """A batch job in state FAILED: the user's failure (this rule's and ``failures-late``'s)."""
    return j.state.split(" ")[0] == "FAILED" and not is_interactive(j, ctx)


def codes(failed: Sequence[JobFacts]) -> str:
    """The jobs' exit codes, the first five."""
    found = sorted({j.exit_code for j in failed if j.exit_code is not None})
    return ", ".join(str(c) for c in found[:5]) or "not recorded"


def failure_facts(failed: list[JobFacts], which: str) -> tuple[float, float, float, tuple[Evidence, ...]]:
    """Early or late failures, largest first: (kWh, kg beyond idle GPUs, median run time in hours, the
    evidence both suggestions show)."""
    failed.sort(key=lambda j: -outcome_part(j))
    kwh, kg = saving(failed, outcome_part)
    median_h = statistics.median(j.elapsed_h for j in failed)
    value, unit = duration_unit(median_h)
    evidence = (
        Evidence(f"jobs that failed {which}", len(failed), "jobs"),
        Evidence("their energy beyond idle GPUs", kwh, "kWh"),
        Evidence("median run time before failing", value, unit),
    )
    return kwh, kg, median_h, evidence


def log_of(j: JobFacts) -> str:
    """Where Slurm wrote the job's output by default (sbatch(1) --output)."""
    return f"slurm-{j.job_id}.out"


@register
class Failures(Rule):
    name = "failures"
    order = 30
    source = "Slurm's job state codes (FAILED; NODE_FAIL and BOOT_FAIL are the cluster's), sbatch(1) --time"
    repeated = True

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        t = ctx.thresholds
        hit = [j for j in jobs if failed(j, ctx) and j.elapsed_h <= t.fail_early_h]
        if len(hit) < t.fail_min_jobs:
            return None
        kwh, kg, median_h, evidence = failure_facts(hit, "early")
        test_time = slurm_time(t.fail_early_h)
        return Advice(
            id=self.name,
            title="Test on a small input before the long run",
            body=(
                f"{n_jobs(len(hit))} {ctx.period} failed within {hours(t.fail_early_h)} of starting "
                f"(exit code {codes(hit)}), after a median of {hours(median_h)}: {job_list(hit)}. "
                f"They used {energy(kwh)} beyond idle GPUs. "
                f"A test run of up to {hours(t.fail_early_h)} on a tiny input (a few steps, one evaluation, "
                "one checkpoint write) catches such failures (bugs, paths, the environment) before they cost "
                "a full allocation; read the job's error output (slurm-JOBID.out) first."
            ),
            change=(f"#SBATCH --time={test_time}  (for the test run, on a small input)",),
            evidence=evidence,
            job_ids=tuple(j.job_id for j in hit),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=True,
            basis="up to: the early failures' energy beyond idle GPUs, if a test had caught every one",
            test=f"jobs in state FAILED within {hours(t.fail_early_h)} of their start (node failures are not "
            "the user's)",
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        t = ctx.thresholds
        if not failed(j, ctx) or j.elapsed_h > t.fail_early_h:
            return None
        code = j.exit_code if j.exit_code is not None else "?"
        return self.job_note(
            j,
            "Test on a small input before the long run",
            f"It failed (exit code {code}) after {hours(j.elapsed_h)}, using {energy(outcome_part(j))} "
            f"beyond idle GPUs. Read its error output ({log_of(j)}); a test run of up to "
            f"{hours(t.fail_early_h)} on a small input catches a failure this early before the long run.",
            (f"#SBATCH --time={slurm_time(t.fail_early_h)}  (for the test run)",),
            outcome_part(j),
            True,
            "up to: its energy beyond idle GPUs",
        )
