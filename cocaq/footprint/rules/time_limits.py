"""``time-limits``: completed jobs that used a small part of their limit, told a shorter `--time`.

A limit is sized per kind of job (same name, partition and QOS) on the user's own completed runs of it,
never on one run alone (the next run's input may be larger), and never above the partition's MaxTime or
the QOS's MaxWall (cocaq.footprint.own_limits). A kind of which some run timed out needs its whole limit:
not counted. A time limit does not change what a job draws: no saving is claimed; accurate limits let
Slurm's backfill scheduler start jobs sooner.
"""

from __future__ import annotations

from collections.abc import Sequence

from cocaq.footprint.advice_words import hours, num, pct, shorten, slurm_time
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.own_limits import KindRuns, completed_by_kind, kind_of, kind_words
from cocaq.footprint.rules.base import Advice, Context, Evidence, ended_in, is_interactive
from cocaq.footprint.rules.registry import Rule, register

BACKFILL = "Slurm's backfill scheduler starts jobs with accurate limits sooner"


def limited(j: JobFacts, ctx: Context) -> bool:
    """A batch job with a limit long enough to be worth sizing."""
    limit = j.time_limit_h
    return (
        limit is not None
        and limit != 0
        and limit >= ctx.thresholds.limit_min_limit_h
        and not is_interactive(j, ctx)
    )


def _change(k: KindRuns) -> str:
    return (
        f"#SBATCH --time={slurm_time(k.need_h)}  ({shorten(k.kind[0] or '(no name)', 24)}"
        f"{', ' + k.kind[1] if k.kind[1] else ''})"
    )


@register
class TimeLimits(Rule):
    name = "time-limits"
    order = 170
    source = (
        "Slurm's backfill scheduling (sched/backfill), slurm.conf's MaxTime per partition, sacctmgr's "
        "MaxWall per QOS, squeue's PartitionTimeLimit and QOSMaxWallDurationPerJobLimit"
    )
    saves = False

    def over_window(self, jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
        """Kinds of batch job whose completed runs need at most `limit_max_use` of the limit they ask for:
        a `--time` sized on those runs, per kind."""
        t = ctx.thresholds
        done = [j for j in jobs if ended_in(j, ctx) and limited(j, ctx)]
        timed_out = {kind_of(j) for j in jobs if j.outcome == "timeout"}
        kinds = completed_by_kind(done, ctx.partition_max_time_h, ctx.qos_max_time_h)
        found = [
            k
            for k in kinds.values()
            if len(k.runs) >= t.limit_min_jobs
            and k.kind not in timed_out  # some runs of it need their whole limit
            and k.median_limit_h is not None
            and k.need_h <= t.limit_max_use * k.median_limit_h
        ]
        if not found:
            return None
        found.sort(key=lambda k: (-len(k.runs) * (k.median_limit_h or 0), k.kind))
        lines = [
            f"{kind_words(k.kind)}: {len(k.runs)} completed runs, 95% within {hours(k.p95_h)}, asked for "
            f"{hours(k.median_limit_h or 0)} (median)"
            for k in found[:3]
        ]
        more = f"; and {len(found) - 3} more kinds" if len(found) > 3 else ""
        short = [j for k in found for j in k.runs]
        return Advice(
            id=self.name,
            title="Shorter time limits, sized on your own runs",
            body=(
                f"Your completed jobs {ctx.period} used much less than the time they asked for: "
                + "; ".join(lines)
                + more
                + ". A limit of their 95th percentile plus a quarter (at least 15 minutes more: the lines "
                f"below) still covers them, and {BACKFILL}."
            ),
            change=tuple(_change(k) for k in found[:3]),
            evidence=(Evidence("completed jobs far under their limit", len(short), "jobs"),),
            job_ids=tuple(j.job_id for j in short),
            saving_kwh=None,
            saving_kg=None,
            upper_bound=False,
            basis="none claimed: a time limit does not change what a job draws",
            test=f">= {t.limit_min_jobs} completed runs of the same name, partition and QOS whose 95th "
            f"percentile with headroom is <= {pct(t.limit_max_use)} of their median limit (>= "
            f"{num(t.limit_min_limit_h)} h), never above the partition's or QOS's MaxTime",
        )

    def on_job(self, j: JobFacts, ctx: Context, runs: Sequence[JobFacts]) -> Advice | None:
        t = ctx.thresholds
        limit = j.time_limit_h or 0.0
        if not j.ended or j.state.split(" ")[0] != "COMPLETED" or not limited(j, ctx):
            return None
        if j.elapsed_h > t.limit_max_use * limit:
            return None
        # sized on the user's own completed runs of this kind of job (name, partition, QOS), never on
        # this run alone: the next run's input may be larger
        kinds = completed_by_kind([*runs, j] if j.pk not in {r.pk for r in runs} else runs,
                                  ctx.partition_max_time_h, ctx.qos_max_time_h)  # fmt: skip
        own = kinds.get(kind_of(j))
        said = f"It ran {hours(j.elapsed_h)} of its {hours(limit)} limit ({pct(j.elapsed_h / limit)}). "
        if own is None:
            return self.job_note(
                j,
                "Ask for a shorter time limit",
                said + f"With a few more completed runs of {kind_words(kind_of(j))} cocaq can size the "
                "limit on them; an accurate limit lets Slurm's backfill scheduler start your jobs sooner.",
            )
        if own.need_h > t.limit_max_use * limit:
            return None
        return self.job_note(
            j,
            "Ask for a shorter time limit",
            said + f"Your {len(own.runs)} completed runs of {kind_words(own.kind)} took up to "
            f"{hours(own.p95_h)} (95th percentile): a limit of {slurm_time(own.need_h)} still covers "
            f"them, and {BACKFILL}.",
            (f"#SBATCH --time={slurm_time(own.need_h)}",),
        )
