"""The notes on one job, jobstats-style: what it used of what it asked for, what it lost, and the exact
line to change, each as an `Advice` about that job alone (its whole energy, not a window's share).

`cocaq job` and the job e-mail show these (through cocaq.footprint.one_job); they apply the same
definitions and thresholds as the window's suggestions (cocaq.footprint.advice) to a single job, with
lower bars where a note costs the reader nothing, and compare its precision with the user's own runs
(cocaq.footprint.own_runs). Kept apart from the rules over a window because it is its own set of
sentences, read one job at a time. Standard library only (login nodes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cocaq.footprint.advice import (
    BALER_SAVING,
    CHECKPOINT_SCRIPT,
    CHECKPOINT_WHY,
    Advice,
    Context,
    Evidence,
    amp_dtype,
    amp_how,
    amp_words,
    is_interactive,
    more_time,
    outcome_part,
)
from cocaq.footprint.advice_words import MB_PER_GB, energy, hours, n_gpus, num, pct, slurm_mem, slurm_time
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.jobstats_rules import notes as jobstats_notes
from cocaq.footprint.own_limits import completed_by_kind, kind_of, kind_words
from cocaq.footprint.own_runs import own_comparisons


def job_notes(job: JobFacts, ctx: Context, runs: Sequence[JobFacts] = ()) -> list[Advice]:
    """jobstats-style notes on one job, whole: what it used of what it asked for, and the exact line to
    change. `runs`: the user's runs that ended in `ctx`'s window, for the precision comparison."""
    t = ctx.thresholds
    j = job if job.share == 1.0 else _replace(job, share=1.0)
    out: list[Advice] = []
    interactive = is_interactive(j, ctx)

    def note(
        id_: str,
        title: str,
        body: str,
        change: tuple[str, ...] = (),
        kwh: float | None = None,
        upper: bool = False,
        basis: str = "none claimed",
    ) -> None:
        saved = None if kwh is None else kwh * j.kg_per_kwh
        out.append(Advice(id_, title, body, change, (), (j.job_id,), kwh, saved, upper, basis, "this job"))

    o = j.outcome
    first = j.state.split(" ")[0]
    # A running job's GPU samples are measured, so its idle notes stay ("so far"); its TotalCPU, MaxRSS
    # and run time are not final, so no note sizes its cores, memory or time limit (cpu_usage is None).
    ended = j.ended
    so_far = "" if ended else " so far"
    if o == "timeout" and not interactive:
        limit = j.time_limit_h or j.elapsed_h
        more, time_line = more_time([j], [*runs, j], ctx)
        note(
            "timeouts",
            "Save checkpoints, or ask for the time it needs" if time_line else "Save checkpoints",
            f"Slurm stopped it at its {hours(limit)} limit: its {energy(outcome_part(j))} beyond idle GPUs "
            f"is possibly lost: lost unless it saved a checkpoint. {CHECKPOINT_WHY}" + more,
            (*CHECKPOINT_SCRIPT, *((time_line,) if time_line else ())),
            outcome_part(j),
            True,
            "up to: its energy beyond idle GPUs, all of it lost only if it saved no checkpoint",
        )
    elif o == "oom":
        asked = j.mem_req_per_node_mb
        note(
            "out-of-memory",
            "Ask for the memory it needs",
            "Slurm killed it for using more memory than it asked for"
            + (f" ({num(asked / MB_PER_GB)} GB per node)" if asked else "")
            + f": its {energy(outcome_part(j))} was spent for nothing. Ask for more.",
            (f"#SBATCH --mem={slurm_mem(asked * 1.5)}",) if asked else (),
            outcome_part(j),
            True,
            "up to: its energy beyond idle GPUs",
        )
    elif first == "FAILED" and not interactive:
        code = j.exit_code if j.exit_code is not None else "?"
        log = f"slurm-{j.job_id}.out"
        if j.elapsed_h <= t.fail_early_h:
            note(
                "failures",
                "Test on a small input before the long run",
                f"It failed (exit code {code}) after {hours(j.elapsed_h)}, using {energy(outcome_part(j))} "
                f"beyond idle GPUs. Read its error output ({log}); a test run of up to "
                f"{hours(t.fail_early_h)} on a small input catches a failure this early before the long run.",
                (f"#SBATCH --time={slurm_time(t.fail_early_h)}  (for the test run)",),
                outcome_part(j),
                True,
                "up to: its energy beyond idle GPUs",
            )
        else:
            note(
                "failures-late",
                "Find why it failed late, and save checkpoints",
                f"It failed (exit code {code}) after {hours(j.elapsed_h)}, using {energy(outcome_part(j))} "
                f"beyond idle GPUs; a short test would not have caught it. Read what it printed before it "
                f"failed ({log}; sacct -j {j.job_id} -o JobID,State,ExitCode,MaxRSS,Elapsed for the step "
                "that failed), and save checkpoints regularly so that a rerun resumes from the latest.",
                (f"sacct -j {j.job_id} -o JobID,State,ExitCode,MaxRSS,Elapsed",),
                outcome_part(j),
                True,
                "up to: its energy beyond idle GPUs, what a rerun from a checkpoint would not redo",
            )
    if j.gpus > 0 and j.gpu_util_pct is not None:
        idle = j.idle_share
        if interactive and j.idle_kwh > 0:
            note(
                "notebooks",
                "End interactive sessions when you stop computing",
                f"This interactive session held {n_gpus(j.gpus)} that sat idle "
                f"{pct(idle or 0.0)} {j.idle_when}{so_far} ({num(j.idle_gpu_hours)} GPU-hours, "
                f"{energy(j.idle_kwh)}). End sessions when you stop computing, and ask for no more hours "
                "than you will work in them.",
                (f"scancel {j.job_id}" if j.is_open else "scancel JOBID",),
                j.idle_kwh,
                False,
                "what its idle GPUs drew",
            )
        elif idle is not None and idle >= t.idle_min_share and j.sampled_share >= t.min_sampled_share:
            keep = max(1, math.ceil(j.gpus * (1 - idle)))
            note(
                "fewer-gpus",
                "Ask for the GPUs it uses",
                f"Its {n_gpus(j.gpus)} sat under {ctx.idle_threshold_pct:g}% utilisation {pct(idle)} "
                f"{j.idle_when}{so_far} ({num(j.idle_gpu_hours)} GPU-hours, {energy(j.idle_kwh)}). "
                "Check that the code uses them all, or ask for fewer.",
                (f"#SBATCH --gres=gpu:{keep}",) if keep < j.gpus else (),
                j.idle_kwh,
                False,
                "what its idle GPUs drew",
            )
        elif (
            j.gpu_util_pct < t.loader_max_util_pct
            and (j.cpu_usage or 0.0) > t.loader_min_cpu_usage
            and j.elapsed_h >= t.loader_min_elapsed_h
        ):
            per_gpu = max(j.cpus // max(j.gpus, 1), 1)
            note(
                "dataloader",
                "Feed the GPUs: more CPU cores and data-loader workers",
                f"Its GPUs averaged {j.gpu_util_pct:.0f}% utilisation while its CPU cores were "
                f"{pct(j.cpu_usage or 0.0)} busy: more cores and data-loader workers would feed them.",
                (f"#SBATCH --cpus-per-task={per_gpu * 2}", "DataLoader(num_workers=N, pin_memory=True)"),
            )
    if ended and j.gpus > 0 and j.gpu_mem_peak_mb is not None and j.gpu_mem_gb > 0:
        used = j.gpu_mem_peak_mb / MB_PER_GB
        if used < 0.25 * j.gpu_mem_gb:
            note(
                "gpu-memory",
                "Use its GPUs' memory, or smaller GPUs",
                f"Its GPUs held at most {num(used)} GB of their {num(j.gpu_mem_gb)} GB: a larger batch would "
                "use them better, or a GPU with less memory would do.",
            )
    dtype = amp_dtype(j) if j.gpus > 0 else None
    if j.precision == "full" and dtype is not None:
        mine = [r for r in runs if r.pk != j.pk]
        cmp = own_comparisons([j, *mine], t.own_min_saving).get(j.model or "") if j.model else None
        if cmp is not None:
            kwh = j.energy_kwh * cmp.saving
            body = (
                f"It ran in {j.precision_label}; {cmp.sentence()}. At that rate "
                f"{cmp.reduced.precision} would have saved about {energy(kwh)} here."
            )
            basis = "your own runs' difference in energy per unit of work"
        else:
            kwh = j.gpu_kwh * BALER_SAVING
            body = (
                f"It ran in {j.precision_label}. The Baler study measured {pct(BALER_SAVING)} less energy "
                "with "
                f"mixed precision: about {energy(kwh)} of its GPU energy."
            )
            basis = f"the Baler study's {pct(BALER_SAVING)} of its GPU energy"
        how, change = amp_how({dtype})
        note("precision", f"Train in {amp_words({dtype})}", body + " " + how, change[:1], kwh, False, basis)
    used_mb, asked_mb = j.mem_used_per_node_mb, j.mem_req_per_node_mb
    if (
        ended
        and used_mb is not None
        and asked_mb
        and o != "oom"
        and asked_mb >= t.mem_min_req_gb * MB_PER_GB
        and used_mb <= t.mem_max_use * asked_mb
    ):
        note(
            "memory",
            "Ask for less memory",
            f"It used at most {num(used_mb / MB_PER_GB)} GB per node (sacct MaxRSS) of the "
            f"{num(asked_mb / MB_PER_GB)} GB it asked for.",
            (f"#SBATCH --mem={slurm_mem(max(used_mb * 1.25, MB_PER_GB))}",),
        )
    if (
        ended
        and first == "COMPLETED"
        and j.time_limit_h
        and j.time_limit_h >= t.limit_min_limit_h
        and j.elapsed_h <= t.limit_max_use * j.time_limit_h
        and not interactive
    ):
        # sized on the user's own completed runs of this kind of job (name, partition, QOS), never on
        # this run alone: the next run's input may be larger
        kinds = completed_by_kind([*runs, j] if j.pk not in {r.pk for r in runs} else runs,
                                  ctx.partition_max_time_h, ctx.qos_max_time_h)  # fmt: skip
        own = kinds.get(kind_of(j))
        said = (
            f"It ran {hours(j.elapsed_h)} of its {hours(j.time_limit_h)} limit "
            f"({pct(j.elapsed_h / j.time_limit_h)}). "
        )
        if own is not None and own.need_h <= t.limit_max_use * j.time_limit_h:
            note(
                "time-limits",
                "Ask for a shorter time limit",
                said + f"Your {len(own.runs)} completed runs of {kind_words(own.kind)} took up to "
                f"{hours(own.p95_h)} (95th percentile): a limit of {slurm_time(own.need_h)} still covers "
                "them, and Slurm's backfill scheduler starts jobs with accurate limits sooner.",
                (f"#SBATCH --time={slurm_time(own.need_h)}",),
            )
        elif own is None:
            note(
                "time-limits",
                "Ask for a shorter time limit",
                said + f"With a few more completed runs of {kind_words(kind_of(j))} cocaq can size the "
                "limit on them; an accurate limit lets Slurm's backfill scheduler start your jobs sooner.",
            )
    out += jobstats_notes(j, ctx, Advice, Evidence)
    out.sort(key=lambda a: (a.saving_kwh is None, -(a.saving_kwh or 0.0), a.id))
    return out


def _replace(j: JobFacts, **kw: Any) -> JobFacts:
    from dataclasses import replace

    return replace(j, **kw)
