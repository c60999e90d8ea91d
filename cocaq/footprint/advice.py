"""What a user could change, from their own jobs: the suggestions over a window, each with its evidence
and its saving.

Every suggestion is computed from the user's own jobs in the window (cocaq.footprint.jobfacts: the ledger's
figures), names the jobs, says exactly what to change (the `#SBATCH` line, the command, the code), and
sizes its saving on the energy it would change - never on energy it would not. The rules are one module
each in cocaq.footprint.rules (their registry, in the style of the collector's sources): precision,
timeouts, failures and failures-late, out-of-memory, notebooks, fewer-gpus, dataloader, memory, the
jobstats notes (cpus, cores-per-gpu, mem-per-gpu, fewer-nodes, unused-gpus, zero-cpu-nodes, mig) and
time-limits; the notes on one job (cocaq.footprint.job_advice) run the same rules on a single job.

Rules that read sacct's TotalCPU and MaxRSS read only jobs that have ended (`JobFacts.ended`): Slurm adds
a step's TotalCPU and MaxRSS when the step ends, so a running job's would size the request on part of the
run. GPU samples are measured as the job runs: a running job's idle GPUs count, said to be so far.

Some rules free resources for others rather than energy (a memory or core that idles draws little that
cocaq counts), so their saving is what the estimate charged for them, often nothing: they rarely clear
the e-mails' threshold (`[advice] min_share` of the user's energy and `min_kwh`), but `cocaq job` lists
them as notes, as jobstats does. Suggestions are ranked by saving; an upper bound is said to be one.

This module runs the rules over a window (`candidates`, `advise`) and builds the window (`site_context`);
the suggestion (`Advice`, its `Evidence`), the thresholds (`Thresholds`) and the window (`Context`) are
cocaq.footprint.rules.base's, named here too for the surfaces that read them.

Pure functions over JobFacts: no database, no imports beyond the standard library (login nodes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.rules.base import Advice, Context, Evidence, Thresholds
from cocaq.footprint.rules.catalog import OVER_WINDOW
from cocaq.footprint.rules.registry import Rule

if TYPE_CHECKING:
    from cocaq.config import Config

__all__ = [
    "REPEATED",
    "RULES",
    "SHOWN",
    "Advice",
    "Context",
    "Evidence",
    "Thresholds",
    "advise",
    "advise_user",
    "candidates",
    "largest_per_user",
    "site_context",
]

# Every rule that speaks over a window, in the registry's order.
RULES: tuple[Rule, ...] = OVER_WINDOW

# The suggestions about jobs that ended badly: frequent ones count whatever their energy (`advise`).
REPEATED = frozenset(r.name for r in RULES if r.repeated)

# The rules whose suggestion `advise` can show: those that may claim a saving, and those of REPEATED. The
# others (jobstats' notes, time limits) never claim one and are not REPEATED, so `advise` would drop what
# they found: it does not run them (most of the rules' time for a user with 10,000 jobs). `cocaq job` and
# `candidates` still run every rule; tests/test_advice_fast.py holds this list to the rules' outputs.
SHOWN: tuple[Rule, ...] = tuple(r for r in RULES if r.saves or r.repeated)


def candidates(
    jobs: Sequence[JobFacts],
    ctx: Context,
    rules: Sequence[Rule] = RULES,
    precision_jobs: Sequence[JobFacts] | None = None,
) -> list[Advice]:
    """Every suggestion the jobs support (of `rules`), largest saving first (those without one last).
    `precision_jobs`: the jobs the precision rule (`every_gpu_job`) reads where they are not `jobs`
    (cocaq.footprint.advice_jobs: every GPU job, most of them read narrowly)."""
    out = [
        a
        for rule in rules
        if (
            a := rule.over_window(
                precision_jobs if rule.every_gpu_job and precision_jobs is not None else jobs, ctx
            )
        )
        is not None
    ]
    out.sort(key=lambda a: (a.saving_kwh is None, -(a.saving_kwh or 0.0), a.id))
    return out


def advise(
    jobs: Sequence[JobFacts],
    ctx: Context,
    *,
    total_kwh: float,
    min_share: float,
    min_kwh: float,
    precision_jobs: Sequence[JobFacts] | None = None,
) -> list[Advice]:
    """The suggestions worth a user's attention: a saving of at least `min_share` of their energy in the
    window (`total_kwh`) and `min_kwh`, largest first; then, whatever their energy, the jobs that ended the
    same bad way again and again (`REPEATED`: `repeat_min_jobs` or more), most jobs first. 27 jobs killed
    for memory in a month are worth a line even when each died in a minute."""
    floor = max(min_share * total_kwh, min_kwh)
    found = candidates(jobs, ctx, SHOWN, precision_jobs)
    sized = [a for a in found if a.saving_kwh is not None and a.saving_kwh >= floor]
    often = [
        a
        for a in found
        if a not in sized and a.id in REPEATED and len(a.job_ids) >= ctx.thresholds.repeat_min_jobs
    ]
    often.sort(key=lambda a: (-len(a.job_ids), a.id))
    return sized + often


# --- the site's settings, the same for every surface ------------------------------------------------


def site_context(
    cfg: Config,
    since: datetime,
    until: datetime,
    *,
    period: str | None = None,
    thresholds: Thresholds | None = None,
    idle_threshold_pct: float | None = None,
) -> Context:
    """The context of a window under the site's configuration (its idle threshold and interactive job
    names): `cocaq user`/`lab`, the read API, `cocaq job` and every report build it here, so that the same
    jobs get the same advice wherever they are read. `idle_threshold_pct`: the one a report recorded with
    its figures, where it has one."""
    extra: dict[str, Any] = {} if period is None else {"period": period}
    idle = cfg.aggregate.idle_gpu_util_pct if idle_threshold_pct is None else idle_threshold_pct
    return Context(
        since=since,
        until=until,
        idle_threshold_pct=idle,
        interactive_names=cfg.advice.interactive_names,
        interactive_partitions=cfg.advice.interactive_partitions,
        interactive_qos=cfg.advice.interactive_qos,
        thresholds=thresholds or Thresholds(),
        partition_max_time_h=cfg.advice.partition_max_time,
        qos_max_time_h=cfg.advice.qos_max_time,
        mig_partitions=cfg.advice.mig_partitions,
        **extra,
    )


def advise_user(
    jobs: Sequence[JobFacts],
    ctx: Context,
    total_kwh: float,
    cfg: Config,
    precision_jobs: Sequence[JobFacts] | None = None,
) -> list[Advice]:
    """`advise` at the site's configured floor: a share of the user's energy, and at least so many kWh."""
    return advise(
        jobs,
        ctx,
        total_kwh=total_kwh,
        min_share=cfg.advice.min_share,
        min_kwh=cfg.advice.min_kwh,
        precision_jobs=precision_jobs,
    )


def largest_per_user(
    jobs_by_user: Mapping[str, Sequence[JobFacts]],
    totals: Mapping[str, float],
    ctx: Context,
    cfg: Config,
    precision_jobs: Mapping[str, Sequence[JobFacts]] | None = None,
) -> list[tuple[str, Advice]]:
    """Each user's largest suggestion worth their attention (the one their own e-mail opens with), the
    largest saving first: what a lab's footprint and its monthly report show of its members.
    `precision_jobs`: per user, as `advise` takes them (a user without an entry has no GPU job)."""
    out = []
    users = jobs_by_user if precision_jobs is None else {**{u: () for u in precision_jobs}, **jobs_by_user}
    for user, jobs in users.items():
        pj = None if precision_jobs is None else precision_jobs.get(user, ())
        found = advise_user(jobs, ctx, totals.get(user, 0.0), cfg, pj)
        if found:
            out.append((user, found[0]))
    out.sort(key=lambda p: (-(p[1].saving_kwh or 0.0), p[0]))
    return out
