"""``timeouts``: batch jobs that hit their time limit, told to save checkpoints and requeue.

Their energy beyond idle GPUs is lost unless they saved a checkpoint (an upper bound): `--signal` to get
a warning before the limit, a checkpoint, `scontrol requeue`; and, where the user's own completed runs of
that kind of job need longer (cocaq.footprint.own_limits), a longer `--time`, never above the
partition's MaxTime or the QOS's MaxWall. Interactive sessions end at their limit normally: not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from cocaq.footprint.advice_words import energy, hours, job_list, n_jobs, slurm_time
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.own_limits import completed_by_kind, kind_of, kind_words, max_time_h
from cocaq.footprint.rules.base import Advice, Context, Evidence, is_interactive, outcome_part, saving
from cocaq.footprint.rules.registry import Rule, register

# The checkpoint-and-requeue pattern of a batch script (sbatch(1) --signal, scontrol(1) requeue): Slurm
# sends the batch shell (B:) SIGUSR1 300 s before the limit (up to 60 s earlier, by its event resolution);
# the trap has the program save a checkpoint, then puts the job back in the queue, where it starts the
# script again from the top. The program runs in the background so that the shell's `wait` returns on the
# signal (bash runs a trap only between commands).
CHECKPOINT_SCRIPT = (
    "#SBATCH --signal=B:USR1@300",
    "on_warning() {",
    "  kill -USR1 $pid; wait $pid  # it saves a checkpoint",
    "  scontrol requeue $SLURM_JOB_ID",
    "}",
    "trap on_warning USR1",
    "python train.py --resume &  # from its latest checkpoint",
    "pid=$!; wait $pid",
)
CHECKPOINT_WHY = (
    "Slurm does not requeue a job that hits its time limit: --requeue only makes a job eligible to be "
    "put back in the queue after a node failure, on preemption or by scontrol requeue. Ask for a warning "
    "instead: "
    "#SBATCH --signal=B:USR1@300 sends the batch script SIGUSR1 five minutes before the limit; trap it, "
    "have the program save a checkpoint, and requeue the job with scontrol requeue $SLURM_JOB_ID (it "
    "starts the script again, so the program must resume from its latest checkpoint; sites cap requeues "
    "with MaxBatchRequeue), or resubmit it."
)


def stopped_at_limit(j: JobFacts, ctx: Context) -> bool:
    """A batch job Slurm stopped at its time limit (TIMEOUT, DEADLINE): what this rule counts."""
    return j.outcome == "timeout" and not is_interactive(j, ctx)


def _limits(limits: Sequence[float]) -> str:
    """`the 24 h limit`, `limits of 1 h and 24 h`, `limits of 1 h, 12 h, 24 h and more`."""
    if len(limits) == 1:
        return f"the {hours(limits[0])} limit"
    shown = [hours(x) for x in limits[:3]]
    tail = " and more" if len(limits) > 3 else ""
    return "limits of " + (", ".join(shown) + tail if tail else ", ".join(shown[:-1]) + " and " + shown[-1])


def more_time(hit: Sequence[JobFacts], jobs: Sequence[JobFacts], ctx: Context) -> tuple[str, str | None]:
    """What to say of asking for more time, for the kinds of job that hit their limit: sized on the
    user's own completed runs of that kind where there are some, never above the partition's MaxTime or
    the QOS's MaxWall. (sentence, an `#SBATCH --time` line or None)."""
    kinds = completed_by_kind(jobs, ctx.partition_max_time_h, ctx.qos_max_time_h)
    j = max(hit, key=lambda x: outcome_part(x))
    k = kind_of(j)
    limit = j.time_limit_h or j.elapsed_h
    cap = max_time_h(j, ctx.partition_max_time_h, ctx.qos_max_time_h)
    own = kinds.get(k)
    where = kind_words(k)
    if cap is not None and limit >= cap - 1e-9:
        return (
            f" {j.job_id}'s limit is already the longest its partition or QOS allows ({hours(cap)}): "
            "checkpoints are the way to run longer.",
            None,
        )
    if own is not None and own.need_h > limit:
        line = f"#SBATCH --time={slurm_time(own.need_h)}"
        return (
            f" Your completed runs of {where} took up to {hours(own.p95_h)} (95th percentile of "
            f"{len(own.runs)}): if the run needs that, ask for it ({line}).",
            line,
        )
    longer = limit * 1.5 if cap is None else min(limit * 1.5, cap)
    line = f"#SBATCH --time={slurm_time(longer)}"
    allows = (
        f"its partition or QOS allows up to {hours(cap)}"
        if cap is not None
        else "scontrol show partition shows the partition's MaxTime"
    )
    return (
        f" If a run of {where} really needs longer than {hours(limit)}, ask for it ({line}; {allows}).",
        line,
    )


@register
class Timeouts(Rule):
    name = "timeouts"
    order = 20
    source = (
        "sbatch(1) --signal and --requeue, scontrol(1) requeue, slurm.conf's MaxBatchRequeue and MaxTime, "
        "sacctmgr's MaxWall"
    )
    repeated = True

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        hit = [j for j in jobs if stopped_at_limit(j, ctx)]
        if not hit:
            return None
        hit.sort(key=lambda j: -outcome_part(j))
        kwh, kg = saving(hit, outcome_part)
        limits = sorted({round(j.time_limit_h or j.elapsed_h, 2) for j in hit})
        one = len(hit) == 1
        more, time_line = more_time(hit, jobs, ctx)
        return Advice(
            id=self.name,
            title="Save checkpoints in jobs that hit their time limit",
            body=(
                f"{n_jobs(len(hit))} {ctx.period} ran until Slurm stopped {'it' if one else 'them'} at "
                f"{_limits(limits)}: {job_list(hit)}. "
                f"{'Its' if one else 'Their'} {energy(kwh)} beyond idle GPUs is possibly lost: lost unless "
                f"{'it' if one else 'they'} saved a checkpoint. {CHECKPOINT_WHY}" + more
            ),
            change=(*CHECKPOINT_SCRIPT, *((time_line,) if time_line else ())),
            evidence=(
                Evidence("jobs that hit the time limit", len(hit), "jobs"),
                Evidence("their energy beyond idle GPUs, possibly lost", kwh, "kWh"),
            ),
            job_ids=tuple(j.job_id for j in hit),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=True,
            basis="up to: their energy beyond idle GPUs, all of it lost only if they saved no checkpoint",
            test="batch jobs in state TIMEOUT or DEADLINE (interactive sessions end at their limit normally)",
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        if not stopped_at_limit(j, ctx):
            return None
        limit = j.time_limit_h or j.elapsed_h
        more, time_line = more_time([j], [*runs, j], ctx)
        return self.job_note(
            j,
            "Save checkpoints, or ask for the time it needs" if time_line else "Save checkpoints",
            f"Slurm stopped it at its {hours(limit)} limit: its {energy(outcome_part(j))} beyond idle GPUs "
            f"is possibly lost: lost unless it saved a checkpoint. {CHECKPOINT_WHY}" + more,
            (*CHECKPOINT_SCRIPT, *((time_line,) if time_line else ())),
            outcome_part(j),
            True,
            "up to: its energy beyond idle GPUs, all of it lost only if it saved no checkpoint",
        )
