"""What a user could change, from their own jobs: each piece of advice with its evidence and its saving.

Every suggestion is computed from the user's own jobs in the window (cocaq.footprint.jobfacts: the ledger's
figures), names the jobs, says exactly what to change (the `#SBATCH` line, the command, the code), and
sizes its saving on the energy it would change - never on energy it would not:

* ``precision``: jobs recorded as running in full precision (fp32/tf32). With the user's own runs of
  the same model in reduced precision (bf16, fp16) that ended in the window, the saving is their own
  measured difference in energy per 1M tokens (or per epoch, where they count no tokens) applied to the
  full-precision jobs' energy; otherwise the literature's figure (the Baler study: 33% less with AMP)
  applied to those jobs' GPU energy, and said so. Jobs of unknown precision get a conditional
  suggestion only when none of the user's jobs is known to use reduced precision.
* ``timeouts``: batch jobs that hit their time limit: their energy beyond idle GPUs is lost unless they
  saved a checkpoint (an upper bound: `--signal` to get a warning, checkpoints, or a longer `--time`).
* ``failures``: jobs that FAILED (not node failures): a short test on a small input first.
* ``out-of-memory``: jobs killed for memory: the `--mem` that would have held them.
* ``notebooks``: interactive sessions (notebooks, shells: `[advice] interactive_names`, or an
  "interactive" partition) holding GPUs idle: release them; saving = what their idle GPUs drew.
* ``fewer-gpus``: batch jobs whose GPUs sat idle: from per-GPU samples where the reports examined them
  (one GPU idle while another worked), else jobs idle most of their sampled time; `--gres=gpu:N`.
* ``dataloader``: low GPU utilisation with every allocated CPU busy: more cores and loader workers.
* ``memory``: memory asked for and not used (sacct MaxRSS): a smaller `--mem`.
* ``cpus``: CPU cores asked for and not used (TotalCPU): fewer cores.
* ``time-limits``: completed jobs that used a small part of their limit: a shorter `--time`.

The last three read only jobs that have ended (`JobFacts.ended`): Slurm adds a step's TotalCPU and MaxRSS
when the step ends, so a running job's would size the request on part of the run. A job whose TotalCPU
Slurm did not record (None) is no evidence either way. GPU samples are measured as the job runs: a
running job's idle GPUs count, said to be so far.

The last three free resources for others rather than energy (a memory or core that idles draws little
that cocaq counts), so their saving is what the estimate charged for them, often nothing: they rarely
clear the e-mails' threshold (`[advice] min_share` of the user's energy and `min_kwh`), but `cocaq job`
lists them as notes, as jobstats does. Suggestions are ranked by saving; an upper bound is said to be one.

This module holds the rules over a window and what they share: the suggestion (`Advice`, its `Evidence`),
when each fires (`Thresholds`), the window (`Context`) and what a job is (interactive, sampled, its
idle and lost parts). How figures are said is in cocaq.footprint.advice_words, the precision evidence
from the user's own runs in cocaq.footprint.own_runs, and the notes on one job (`cocaq job`, the job
e-mail) in cocaq.footprint.job_advice.

Pure functions over JobFacts: no database, no imports beyond the standard library (login nodes).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cocaq.accounting.sessions import Sessions
from cocaq.footprint.advice_words import (
    MB_PER_GB,
    duration_unit,
    energy,
    hours,
    job_list,
    n_gpus,
    n_jobs,
    num,
    pct,
    shorten,
    slurm_mem,
    slurm_time,
    were,
)
from cocaq.footprint.gpu_caps import capability
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.jobstats_rules import window_rules
from cocaq.footprint.own_limits import completed_by_kind, kind_of, kind_words, max_time_h
from cocaq.footprint.own_runs import own_comparisons

# The Baler energy study: the same training took 0.213 kWh without and 0.143 kWh with automatic mixed
# precision (AMP): 33% less.
BALER_FP32_KWH = 0.213
BALER_AMP_KWH = 0.143
BALER_SAVING = 1 - BALER_AMP_KWH / BALER_FP32_KWH

# How to turn mixed precision on, per the dtype the GPU can compute (cocaq.footprint.gpu_caps): bf16 needs
# compute capability 8.0 (A100, H100 and newer); on 7.x (V100, T4) it is float16, whose small range needs
# a loss scaler (torch.cuda.amp.GradScaler); "mixed": the GPU is not known, both are named.
AMP_HOWTO = {
    "bf16": (
        "In PyTorch: torch.autocast(device_type='cuda', dtype=torch.bfloat16) around the forward pass; in "
        "Lightning: Trainer(precision='bf16-mixed'); in Hugging Face: TrainingArguments(bf16=True)."
    ),
    "fp16": (
        "These GPUs have no bf16 (it needs compute capability 8.0): use float16 with a loss scaler. In "
        "PyTorch: torch.autocast(device_type='cuda', dtype=torch.float16) around the forward pass and a "
        "torch.cuda.amp.GradScaler (scaler.scale(loss).backward(); scaler.step(optimizer); "
        "scaler.update()); in Lightning: Trainer(precision='16-mixed'); in Hugging Face: "
        "TrainingArguments(fp16=True)."
    ),
    "mixed": (
        "On A100, H100 and newer GPUs (compute capability 8.0+) use bf16: torch.autocast(device_type='cuda', "
        "dtype=torch.bfloat16), Trainer(precision='bf16-mixed'), TrainingArguments(bf16=True); on V100 or "
        "T4 (7.x, no bf16) use float16 with a torch.cuda.amp.GradScaler (precision='16-mixed', fp16=True)."
    ),
}
AMP_CHANGE = {
    "bf16": "torch.autocast(device_type='cuda', dtype=torch.bfloat16)",
    "fp16": "torch.autocast(device_type='cuda', dtype=torch.float16) + torch.cuda.amp.GradScaler()",
    "mixed": "torch.autocast(device_type='cuda', dtype=torch.bfloat16)  (float16 + GradScaler before A100)",
}
AMP_RECORD = "Record it with `cocaq tag precision=bf16` (or fp16) so that the next report can compare."
AMP_HOW = AMP_HOWTO["bf16"] + " " + AMP_RECORD  # (the name the notes have used)


def amp_dtype(j: JobFacts) -> str | None:
    """The mixed precision the job's GPUs can use: "bf16", "fp16", "mixed" (GPU not known), or None (no
    tensor cores: before compute capability 7.0 mixed precision gains little, so nothing is advised)."""
    cap = capability(j.gpu_type, j.gpu_model)
    if cap is None:
        return "mixed"
    if cap.bf16:
        return "bf16"
    return "fp16" if cap.fp16_tensor_cores else None


def amp_words(dtypes: set[str]) -> str:
    """The precision a set of jobs is told to use, as a title says it (short: it is the e-mail's subject);
    the body says which GPUs take which (`amp_which`)."""
    if dtypes == {"bf16"}:
        return "bf16 mixed precision"
    if dtypes == {"fp16"}:
        return "fp16 mixed precision"
    return "mixed precision"


def amp_which(gpus: Mapping[str, set[str]]) -> str:
    """Where the jobs ran on GPUs of both kinds: which take bf16, which fp16. '' otherwise."""
    if not gpus.get("bf16") or not gpus.get("fp16"):
        return ""
    return (
        f"Use bf16 on {'/'.join(sorted(gpus['bf16']))}, and float16 with a GradScaler on "
        f"{'/'.join(sorted(gpus['fp16']))} (no bf16 before compute capability 8.0). "
    )


def _gpus_by_dtype(jobs: Iterable[JobFacts]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for j in jobs:
        cap = capability(j.gpu_type, j.gpu_model)
        d = amp_dtype(j)
        if cap is not None and d is not None:
            out[d].add(cap.model)
    return out


def amp_how(dtypes: set[str]) -> tuple[str, tuple[str, ...]]:
    """The how-to and the lines to change for the jobs' GPUs."""
    key = next(iter(dtypes)) if len(dtypes) == 1 else "mixed"
    tag = "cocaq tag precision=fp16" if key == "fp16" else "cocaq tag precision=bf16"
    record = AMP_RECORD if key == "mixed" else f"Record it with `{tag}` so that the next report can compare."
    return AMP_HOWTO[key] + " " + record, (AMP_CHANGE[key], tag)


if TYPE_CHECKING:
    from cocaq.config import Config


@dataclass(frozen=True)
class Evidence:
    label: str
    value: float
    unit: str


@dataclass(frozen=True)
class Advice:
    """One thing to change, why, and what it would save."""

    id: str
    title: str  # the action, imperative: "Train mistral-7b in bf16 mixed precision"
    body: str  # why, with the user's own numbers and job ids
    change: tuple[str, ...]  # exactly what to change: `#SBATCH --time=02:00:00`, `scancel 123`, a code line
    evidence: tuple[Evidence, ...]
    job_ids: tuple[str, ...]
    saving_kwh: float | None  # in the window; None: no energy saving claimed
    saving_kg: float | None  # its CO2, at the jobs' own intensity x PUE
    upper_bound: bool  # "up to": the saving if every one of these jobs changed, or none was otherwise
    basis: str  # how the saving was computed, or why there is none
    test: str  # the threshold test that made it fire

    def as_dict(self) -> dict[str, Any]:
        """As dataclasses.asdict says it, without its deep copy of every job id (a heavy user's
        suggestion can name 10,000 jobs)."""
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["evidence"] = tuple({"label": e.label, "value": e.value, "unit": e.unit} for e in self.evidence)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Advice:
        ev = tuple(Evidence(**e) for e in d.get("evidence", ()))
        return cls(
            **{**d, "evidence": ev, "change": tuple(d.get("change", ())), "job_ids": tuple(d["job_ids"])}
        )


@dataclass(frozen=True)
class Thresholds:
    """When each suggestion fires. Conservative: a wrong suggestion costs more trust than a missed one."""

    amp_min_gpu_kwh: float = 5.0  # GPU energy of the full-precision jobs, in the window
    amp_unknown_min_gpu_hours: float = 100.0  # unknown precision: only for GPU-heavy users
    amp_busy_idle_share: float = 0.5  # jobs idle more than this are left out (AMP does not help idling)
    own_min_saving: float = 0.05  # the user's own runs must show at least 5% less per unit
    fail_min_jobs: int = 1
    fail_early_h: float = 0.5  # a failure this early is what a short test run catches
    repeat_min_jobs: int = 5  # this many jobs ending the same bad way get a note whatever their energy
    idle_min_share: float = 0.5  # a batch job's GPUs idle at least this share of their sampled time
    gpu_idle_share: float = 0.8  # per GPU: idle in at least 80% of its samples...
    gpu_busy_share: float = 0.5  # ...while another GPU of the job was idle less than half of the time
    gpu_min_samples: int = 30
    min_sampled_share: float = 0.5  # samples must cover half of a job's GPU time (all GPU tests)
    loader_max_util_pct: float = 40.0
    loader_min_cpu_usage: float = 0.9
    loader_min_elapsed_h: float = 0.25
    loader_target_util_pct: float = 70.0
    mem_max_use: float = 0.5  # at most half of the requested memory used, on every such job
    mem_min_req_gb: float = 8.0  # per node: smaller requests are not worth a note
    cpu_max_usage: float = 0.5
    cpu_min_cores: int = 4
    limit_max_use: float = 0.5  # a kind of job whose runs need at most half of the limit they ask for
    limit_min_limit_h: float = 2.0
    limit_min_jobs: int = 3


@dataclass(frozen=True)
class Context:
    """The window the jobs are from, and the site's definitions."""

    since: datetime
    until: datetime
    idle_threshold_pct: float = 5.0
    interactive_names: tuple[str, ...] = ()
    interactive_partitions: tuple[str, ...] = ()  # [advice] interactive_partitions, _qos
    interactive_qos: tuple[str, ...] = ()
    period: str = "in this period"  # "in November", for sentences
    thresholds: Thresholds = field(default_factory=Thresholds)
    # MaxTime per partition and MaxWall per QOS where the site said ([advice]), in hours
    partition_max_time_h: Mapping[str, float] = field(default_factory=dict)
    qos_max_time_h: Mapping[str, float] = field(default_factory=dict)
    mig_partitions: Mapping[str, str] = field(default_factory=dict)  # partition -> MIG profile ([advice])


def _saving(jobs: Iterable[JobFacts], kwh: Callable[[JobFacts], float]) -> tuple[float, float]:
    """(kWh, kg) of a per-job saving in the window, each job's kWh at its own CO2 per kWh."""
    e = c = 0.0
    for j in jobs:
        x = kwh(j)
        e += x
        c += x * j.kg_per_kwh
    return e, c


# --- what a job is ---------------------------------------------------------------------------------------


def is_interactive(j: JobFacts, ctx: Context) -> bool:
    """A notebook, shell or editor session, srun --pty or salloc: by its name, partition, QOS, or its
    steps without a batch step (cocaq.accounting.sessions, the one definition the ledger uses too)."""
    return Sessions(ctx.interactive_names, ctx.interactive_partitions, ctx.interactive_qos).holds(
        j.name, j.partition, j.qos, j.batch_step
    )


def _sampled(j: JobFacts, t: Thresholds) -> bool:
    return j.gpu_util_pct is not None and j.sampled_share >= t.min_sampled_share


def _idle_part(j: JobFacts) -> float:
    """The ledger's idle GPU energy in the window."""
    return j.idle_kwh * j.share


def outcome_part(j: JobFacts) -> float:
    """The ledger's part of a job that ended badly, beyond its idle GPUs, in the window."""
    return max(j.energy_kwh - j.idle_kwh, 0.0) * j.share


def _scaled(fraction: float) -> Callable[[JobFacts], float]:
    """A job's energy in the window times `fraction`."""
    return lambda j: j.energy_kwh * j.share * fraction


def _ended_in(j: JobFacts, ctx: Context) -> bool:
    return not j.is_open and j.end is not None and ctx.since <= j.end < ctx.until


# --- the suggestions ---------------------------------------------------------------------------------------


def _precision(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    t = ctx.thresholds
    gpu = [j for j in jobs if j.gpus > 0]
    busy = [j for j in gpu if j.idle_share is None or j.idle_share < t.amp_busy_idle_share]
    # jobs on GPUs without tensor cores (before compute capability 7.0) gain little: nothing is advised there
    full = [j for j in busy if j.precision == "full" and amp_dtype(j) is not None]
    reduced_known = any(j.precision == "reduced" for j in gpu)
    own = own_comparisons([j for j in gpu if _ended_in(j, ctx)], t.own_min_saving)
    if full:
        by_model: dict[str, list[JobFacts]] = defaultdict(list)
        for j in full:
            by_model[j.model or ""].append(j)
        kwh = kg = 0.0
        own_lines: list[str] = []
        literature: list[str] = []
        per_model: list[tuple[str, float]] = []
        for model, js in sorted(by_model.items(), key=lambda kv: -sum(j.energy_kwh * j.share for j in kv[1])):
            cmp = own.get(model) if model else None
            if cmp is not None:
                e, c = _saving(js, _scaled(cmp.saving))
                r, f = cmp.reduced, cmp.full
                own_lines.append(
                    f"{cmp.percent}% less energy per {r.unit} in {r.precision} than in {f.precision}"
                    f"{cmp.at_batch()} for {shorten(model, 40)} (runs {', '.join(r.runs[:2])} against "
                    f"{', '.join(f.runs[:2])})"
                )
            else:
                e, c = _saving(js, lambda j: j.gpu_kwh * j.share * BALER_SAVING)
                literature.append(shorten(model, 40) or "jobs that name no model")
            per_model.append((model, e))
            kwh += e
            kg += c
        gpu_energy = sum(j.gpu_kwh * j.share for j in full)
        if gpu_energy < t.amp_min_gpu_kwh:
            return None
        top = max(per_model, key=lambda m: m[1])[0]
        dtypes = {d for j in full if (d := amp_dtype(j)) is not None}
        others = sum(1 for m, _ in per_model if m != top)
        what = shorten(top, 40) if top else "your jobs that name no model"
        if others:
            what += f" and {others} more {'model' if others == 1 else 'models'}"
        title = f"Train {what} in {amp_words(dtypes)}"
        how, change = amp_how(dtypes)
        said = []
        if own_lines:
            more = len(own_lines) - 3
            shown = own_lines[:3] + ([f"{more} more model{'s' if more > 1 else ''}"] if more > 0 else [])
            said.append("By your own runs: " + "; ".join(shown) + ".")
        if literature:
            names = (
                ", ".join(literature[:3]) + f" and {len(literature) - 3} more"
                if len(literature) > 3
                else " and ".join(literature)
                if len(literature) < 3
                else f"{literature[0]}, {literature[1]} and {literature[2]}"
            )
            said.append(
                f"For {names}, which you have not run in reduced precision, the Baler study's "
                f"{pct(BALER_SAVING)} less GPU energy is counted."
            )
        measured = bool(own_lines)
        largest = sorted(full, key=lambda j: -j.energy_kwh * j.share)
        return Advice(
            id="precision",
            title=title,
            body=(
                f"{n_jobs(len(full))} {ctx.period} ran in full precision (fp32), by their metadata: "
                f"{job_list(largest, 3)}. "
                + " ".join(said)
                + f" Together about {energy(kwh)} less. "
                + amp_which(_gpus_by_dtype(full))
                + how
            ),
            change=change,
            evidence=(
                Evidence("jobs in full precision", len(full), "jobs"),
                Evidence("their GPU energy", gpu_energy, "kWh"),
                *(  # in the body's order: the models by the energy that ran in full precision
                    Evidence(
                        f"{m}: less energy per {o.reduced.unit} in {o.reduced.precision}{o.at_batch()}",
                        o.percent,
                        "%",
                    )
                    for m, o in ((m, own.get(m)) for m, _ in per_model if m)
                    if o is not None
                ),
            ),
            job_ids=tuple(j.job_id for j in largest),
            saving_kwh=kwh,
            saving_kg=kg,
            upper_bound=False,
            basis=(
                "your own runs' difference in energy per unit of work, on these jobs' energy"
                if measured and not literature
                else "your own runs' difference where you have one, else the Baler study's "
                f"{pct(BALER_SAVING)} of the GPU energy"
                if measured
                else f"the Baler study's {pct(BALER_SAVING)} of these jobs' GPU energy"
            ),
            test=(
                f"jobs recorded as fp32 with {energy(gpu_energy)} of GPU energy >= "
                f"{energy(t.amp_min_gpu_kwh)}"
            ),
        )
    unknown = [j for j in busy if j.precision is None and amp_dtype(j) is not None]
    gpu_hours = sum(j.gpu_hours * j.share for j in gpu)
    if reduced_known or not unknown or gpu_hours < t.amp_unknown_min_gpu_hours:
        return None
    gpu_energy = sum(j.gpu_kwh * j.share for j in unknown)
    if gpu_energy < t.amp_min_gpu_kwh:
        return None
    unknown.sort(key=lambda j: -j.gpu_kwh * j.share)
    kwh, kg = _saving(unknown, lambda j: j.gpu_kwh * j.share * BALER_SAVING)
    dtypes = {d for j in unknown if (d := amp_dtype(j)) is not None}
    how, change = amp_how(dtypes)
    return Advice(
        id="precision",
        title="Mixed precision, if you do not use it yet",
        body=(
            f"You used {num(gpu_hours)} GPU-hours {ctx.period}; your GPU jobs ({job_list(unknown)}) drew "
            f"{energy(gpu_energy)} and none of them records its precision. If they train in full precision, "
            f"{amp_words(dtypes)} is the change most likely to pay: the Baler study measured "
            f"{pct(BALER_SAVING)} less energy for the same training. {how}"
        ),
        change=change,
        evidence=(
            Evidence("GPU-hours", gpu_hours, "h"),
            Evidence("GPU energy of jobs of unknown precision", gpu_energy, "kWh"),
        ),
        job_ids=tuple(j.job_id for j in unknown),
        saving_kwh=kwh,
        saving_kg=kg,
        upper_bound=True,
        basis=f"upper bound: the Baler study's {pct(BALER_SAVING)} of the GPU energy, if none used it yet",
        test=(
            f"{num(gpu_hours)} GPU-hours >= {num(t.amp_unknown_min_gpu_hours)}, no job recorded in reduced "
            "precision"
        ),
    )


def _limits(limits: Sequence[float]) -> str:
    """`the 24 h limit`, `limits of 1 h and 24 h`, `limits of 1 h, 12 h, 24 h and more`."""
    if len(limits) == 1:
        return f"the {hours(limits[0])} limit"
    shown = [hours(x) for x in limits[:3]]
    tail = " and more" if len(limits) > 3 else ""
    return "limits of " + (", ".join(shown) + tail if tail else ", ".join(shown[:-1]) + " and " + shown[-1])


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


def _timeouts(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    hit = [j for j in jobs if j.outcome == "timeout" and not is_interactive(j, ctx)]
    if not hit:
        return None
    hit.sort(key=lambda j: -outcome_part(j))
    kwh, kg = _saving(hit, outcome_part)
    limits = sorted({round(j.time_limit_h or j.elapsed_h, 2) for j in hit})
    one = len(hit) == 1
    more, time_line = more_time(hit, jobs, ctx)
    return Advice(
        id="timeouts",
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


def _failed(jobs: Sequence[JobFacts], ctx: Context) -> list[JobFacts]:
    # An interactive session that ends in an error is no run to rehearse: its cost is the idle time
    # (`notebooks`). NODE_FAIL and BOOT_FAIL are the cluster's, not the user's.
    return [j for j in jobs if j.state.split(" ")[0] == "FAILED" and not is_interactive(j, ctx)]


def _codes(failed: Sequence[JobFacts]) -> str:
    codes = sorted({j.exit_code for j in failed if j.exit_code is not None})
    return ", ".join(str(c) for c in codes[:5]) or "not recorded"


def _failure_facts(failed: list[JobFacts], which: str) -> tuple[float, float, float, tuple[Evidence, ...]]:
    """Early or late failures, largest first: (kWh, kg beyond idle GPUs, median run time in hours, the
    evidence both suggestions show)."""
    failed.sort(key=lambda j: -outcome_part(j))
    kwh, kg = _saving(failed, outcome_part)
    median_h = statistics.median(j.elapsed_h for j in failed)
    value, unit = duration_unit(median_h)
    evidence = (
        Evidence(f"jobs that failed {which}", len(failed), "jobs"),
        Evidence("their energy beyond idle GPUs", kwh, "kWh"),
        Evidence("median run time before failing", value, unit),
    )
    return kwh, kg, median_h, evidence


def _failures(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    """Failures early in the run: what a short test on a small input catches before the long run. Only
    these are sized: a job that failed after 6 h would pass a 15-minute test."""
    t = ctx.thresholds
    failed = [j for j in _failed(jobs, ctx) if j.elapsed_h <= t.fail_early_h]
    if len(failed) < t.fail_min_jobs:
        return None
    kwh, kg, median_h, evidence = _failure_facts(failed, "early")
    test_time = slurm_time(t.fail_early_h)
    return Advice(
        id="failures",
        title="Test on a small input before the long run",
        body=(
            f"{n_jobs(len(failed))} {ctx.period} failed within {hours(t.fail_early_h)} of starting "
            f"(exit code {_codes(failed)}), after a median of {hours(median_h)}: {job_list(failed)}. "
            f"They used {energy(kwh)} beyond idle GPUs. "
            f"A test run of up to {hours(t.fail_early_h)} on a tiny input (a few steps, one evaluation, one "
            "checkpoint write) catches such failures (bugs, paths, the environment) before they cost a full "
            "allocation; read the job's error output (slurm-JOBID.out) first."
        ),
        change=(f"#SBATCH --time={test_time}  (for the test run, on a small input)",),
        evidence=evidence,
        job_ids=tuple(j.job_id for j in failed),
        saving_kwh=kwh,
        saving_kg=kg,
        upper_bound=True,
        basis="up to: the early failures' energy beyond idle GPUs, if a test had caught every one",
        test=f"jobs in state FAILED within {hours(t.fail_early_h)} of their start (node failures are not "
        "the user's)",
    )


def _late_failures(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    """Failures late in the run: no short test catches them; what limits their cost is a checkpoint to
    resume from, and what fixes them is in that job's own log."""
    t = ctx.thresholds
    failed = [j for j in _failed(jobs, ctx) if j.elapsed_h > t.fail_early_h]
    if len(failed) < t.fail_min_jobs:
        return None
    kwh, kg, median_h, evidence = _failure_facts(failed, "late")
    j0 = failed[0]
    return Advice(
        id="failures-late",
        title="Save checkpoints in long runs that fail late",
        body=(
            f"{n_jobs(len(failed))} {ctx.period} failed after running a while (exit code {_codes(failed)}; a "
            f"median of {hours(median_h)}): {job_list(failed)}. They used {energy(kwh)} beyond idle GPUs, "
            "and a short test would not have caught them. Read what the job printed before it failed "
            f"(slurm-{j0.job_id}.out, and sacct -j {j0.job_id} -o JobID,State,ExitCode,MaxRSS,Elapsed for "
            "the step that failed), and save checkpoints regularly so that a rerun resumes from the latest "
            "instead of starting over."
        ),
        change=(f"sacct -j {j0.job_id} -o JobID,State,ExitCode,MaxRSS,Elapsed",),
        evidence=evidence,
        job_ids=tuple(j.job_id for j in failed),
        saving_kwh=kwh,
        saving_kg=kg,
        upper_bound=True,
        basis="up to: their energy beyond idle GPUs, what a rerun from a checkpoint would not redo",
        test=f"jobs in state FAILED after more than {hours(t.fail_early_h)}",
    )


def _oom(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    hit = [j for j in jobs if j.outcome == "oom"]
    if not hit:
        return None
    hit.sort(key=lambda j: -outcome_part(j))
    kwh, kg = _saving(hit, outcome_part)
    asked = max((j.mem_req_per_node_mb or 0.0) for j in hit)
    change = (f"#SBATCH --mem={slurm_mem(asked * 1.5)}",) if asked else ("#SBATCH --mem=...",)
    return Advice(
        id="out-of-memory",
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


def _notebooks(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    hit = [j for j in jobs if j.gpus > 0 and is_interactive(j, ctx) and j.idle_kwh > 0]
    if not hit:
        return None
    hit.sort(key=lambda j: -_idle_part(j))
    kwh, kg = _saving(hit, _idle_part)
    idle_h = sum(j.idle_gpu_hours * j.share for j in hit)
    return Advice(
        id="notebooks",
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


def _fewer_gpus(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    """Batch jobs whose GPUs were idle most of their sampled time. It fires, and is sized, on job-level
    figures that every surface has (the ledger's idle energy), so that the e-mail, `cocaq user` and the API
    say the same; per-GPU samples, where the reports examined them, only say which GPUs idled."""
    t = ctx.thresholds
    hits: list[tuple[JobFacts, int, float, float, str]] = []  # job, GPUs to ask for, kWh, kg, detail
    for j in jobs:
        if j.gpus <= 0 or is_interactive(j, ctx) or not _sampled(j, t):
            continue
        idle = j.idle_share
        kwh = _idle_part(j)
        if idle is None or idle < t.idle_min_share or kwh <= 0:
            continue
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
        hits.append((j, keep, kwh, kwh * j.kg_per_kwh, detail))
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
        id="fewer-gpus",
        title="Ask for the GPUs your jobs use" if not single else "Make sure your GPU jobs use their GPU",
        body=(
            f"In {n_jobs(len(hits))} {ctx.period} GPUs sat idle "
            f"(under {ctx.idle_threshold_pct:g}% utilisation) "
            f"while the job held them: {'; '.join(h[4] for h in hits[:4])}. They drew {energy(kwh)} for no "
            "work. If the code uses one GPU, ask for one; if it should use them all, check that it is "
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
            f"per GPU: idle in >= {pct(t.gpu_idle_share)} of its samples while another worked; or the job's "
            f"GPUs idle >= {pct(t.idle_min_share)} of the sampled time"
        ),
    )


def _dataloader(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    t = ctx.thresholds
    hit = [
        j
        for j in jobs
        if j.gpus > 0
        and _sampled(j, t)
        and (j.gpu_util_pct or 0.0) < t.loader_max_util_pct
        and (j.cpu_usage or 0.0) > t.loader_min_cpu_usage
        and j.elapsed_h >= t.loader_min_elapsed_h
        and (j.idle_share or 0.0) < t.idle_min_share
    ]
    if not hit:
        return None
    hit.sort(key=lambda j: -j.gpu_kwh * j.share)

    def part(j: JobFacts) -> float:
        # at the target utilisation the same work needs util/target of the GPU time
        return j.gpu_kwh * j.share * max(0.0, 1 - (j.gpu_util_pct or 0.0) / t.loader_target_util_pct)

    kwh, kg = _saving(hit, part)
    util = sum((j.gpu_util_pct or 0.0) * j.gpu_kwh for j in hit) / max(sum(j.gpu_kwh for j in hit), 1e-9)
    per_gpu = max(j.cpus // max(j.gpus, 1) for j in hit)
    return Advice(
        id="dataloader",
        title="Feed your GPUs: more CPU cores and data-loader workers",
        body=(
            f"In {n_jobs(len(hit))} {ctx.period} ({job_list(hit)}) the GPUs averaged {util:.0f}% utilisation "
            "while "
            "every allocated CPU core was busy: the GPUs were waiting for data. Ask for more cores "
            f"(#SBATCH --cpus-per-task={per_gpu * 2} per GPU) and give the data loader as many workers "
            "(PyTorch: DataLoader(num_workers=..., pin_memory=True, persistent_workers=True)), or move "
            "decoding and augmentation to the GPU."
        ),
        change=(f"#SBATCH --cpus-per-task={per_gpu * 2}", "DataLoader(num_workers=N, pin_memory=True)"),
        evidence=(
            Evidence("their GPU utilisation", util, "%"),
            Evidence("their GPU energy", sum(j.gpu_kwh * j.share for j in hit), "kWh"),
        ),
        job_ids=tuple(j.job_id for j in hit),
        saving_kwh=kwh,
        saving_kg=kg,
        upper_bound=True,
        basis=(
            f"up to: the GPU energy the same work would not need at {t.loader_target_util_pct:.0f}% "
            "utilisation"
        ),
        test=(
            f"GPU utilisation < {t.loader_max_util_pct:.0f}% with CPU usage > {pct(t.loader_min_cpu_usage)}, "
            f"runs of >= {num(t.loader_min_elapsed_h)} h"
        ),
    )


def _memory(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    t = ctx.thresholds
    hit = []
    for j in jobs:
        used, asked = j.mem_used_per_node_mb, j.mem_req_per_node_mb
        if (
            used is None
            or not asked
            or asked < t.mem_min_req_gb * MB_PER_GB
            or j.outcome == "oom"
            or not j.ended  # MaxRSS of the steps that ended so far
        ):
            continue
        if used <= t.mem_max_use * asked:
            hit.append(j)
    if not hit:
        return None
    hit.sort(key=lambda j: -(j.mem_req_per_node_mb or 0))
    most = max(j.mem_used_per_node_mb or 0.0 for j in hit)
    asked = max(j.mem_req_per_node_mb or 0.0 for j in hit)
    proposal = max(most * 1.25, MB_PER_GB)

    def part(j: JobFacts) -> float:
        req = j.mem_req_per_node_mb or 0.0
        return j.dram_kwh * j.share * max(0.0, 1 - proposal / req) if req else 0.0

    kwh, kg = _saving(hit, part)
    return Advice(
        id="memory",
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


def _time_limits(jobs: Sequence[JobFacts], ctx: Context) -> Advice | None:
    """Kinds of batch job (same name, partition, QOS) whose completed runs need at most `limit_max_use`
    of the limit they ask for: a `--time` sized on those runs (cocaq.footprint.own_limits), per kind."""
    t = ctx.thresholds
    done = [
        j
        for j in jobs
        if _ended_in(j, ctx)
        and j.time_limit_h
        and j.time_limit_h >= t.limit_min_limit_h
        and not is_interactive(j, ctx)
    ]
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
    change = tuple(
        f"#SBATCH --time={slurm_time(k.need_h)}  ({shorten(k.kind[0] or '(no name)', 24)}"
        f"{', ' + k.kind[1] if k.kind[1] else ''})"
        for k in found[:3]
    )
    short = [j for k in found for j in k.runs]
    return Advice(
        id="time-limits",
        title="Shorter time limits, sized on your own runs",
        body=(
            f"Your completed jobs {ctx.period} used much less than the time they asked for: "
            + "; ".join(lines)
            + more
            + ". A limit of their 95th percentile plus a quarter (at least 15 minutes more: the lines "
            "below) still covers them, and Slurm's backfill scheduler starts jobs with accurate limits "
            "sooner."
        ),
        change=change,
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


RULES: tuple[Callable[[Sequence[JobFacts], Context], Advice | None], ...] = (
    _precision, _timeouts, _failures, _late_failures, _oom, _notebooks, _fewer_gpus, _dataloader, _memory,
    *window_rules(Advice, Evidence), _time_limits,
)  # fmt: skip


# The suggestions about jobs that ended badly: frequent ones count whatever their energy (`advise`).
REPEATED = frozenset({"out-of-memory", "failures", "failures-late", "timeouts"})


# The rules whose suggestion `advise` can show: those that may claim a saving, and those of REPEATED. The
# others (jobstats' notes, time limits) never claim one and are not REPEATED, so `advise` would drop what
# they found: it does not run them (most of the rules' time for a user with 10,000 jobs). `cocaq job` and
# `candidates` still run every rule; tests/test_advice_fast.py holds this list to the rules' outputs.
SHOWN: tuple[Callable[[Sequence[JobFacts], Context], Advice | None], ...] = (
    _precision, _timeouts, _failures, _late_failures, _oom, _notebooks, _fewer_gpus, _dataloader, _memory,
)  # fmt: skip


def candidates(
    jobs: Sequence[JobFacts],
    ctx: Context,
    rules: Sequence[Callable[[Sequence[JobFacts], Context], Advice | None]] = RULES,
    precision_jobs: Sequence[JobFacts] | None = None,
) -> list[Advice]:
    """Every suggestion the jobs support (of `rules`), largest saving first (those without one last).
    `precision_jobs`: the jobs the precision rule reads where they are not `jobs`
    (cocaq.footprint.advice_jobs: every GPU job, most of them read narrowly)."""
    out = [
        a
        for rule in rules
        if (a := rule(precision_jobs if rule is _precision and precision_jobs is not None else jobs, ctx))
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
