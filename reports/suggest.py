"""Suggestions for a user's monthly report, each made only when the user's own month supports it.

Every suggestion has a threshold test on figures of `reports.data.UserMonth` (what the rollups, jobs,
job metrics and samples say), cites the user's own numbers and job ids, and estimates a saving in kWh
only where the data gives one; otherwise `saving_kwh` is None and `saving_basis` says why. Nothing is
suggested on a guess: a month without GPU samples gets no utilisation-based suggestion at all.

Stable ids (for templates, and to tell one month's suggestion from the next):

* ``mixed-precision``: GPU-heavy users whose jobs are not known to use bf16/fp16/AMP.
* ``fewer-gpus``: multi-GPU jobs where one GPU's samples show it idle most of the time while another
  worked. Only per-GPU samples can show that: job_gpu_hours and job_metrics add a job's GPUs together,
  and "one GPU of two idle" looks the same there as "both GPUs idle half of the time".
* ``dataloader-workers``: low GPU utilisation while the job's CPUs were saturated.
* ``time-limits``: completed jobs that used a small part of their time limit (jobs.time_limit_s, from
  sacct's Timelimit; jobs without one are not judged).
* ``power-cap``: GPUs drawing much of their TDP at moderate utilisation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cocaq.reports.data import GpuJob, UserMonth

# The Baler energy study: the same training took 0.213 kWh without and 0.143 kWh with automatic mixed
# precision (AMP).
BALER_FP32_KWH = 0.213
BALER_AMP_KWH = 0.143
BALER_SAVING = 1 - BALER_AMP_KWH / BALER_FP32_KWH  # 0.33
# McDonald et al., "Great Power, Great Responsibility: Recommendations for Reducing Energy for Training
# Language Models", Findings of NAACL 2022 (arXiv:2205.09646): a GPU power cap cut the energy of
# training a transformer language model by about 15% for a marginal increase in run time.
POWER_CAP_MEASURED = 0.15


@dataclass(frozen=True)
class Evidence:
    label: str
    value: float
    unit: str


@dataclass(frozen=True)
class Suggestion:
    id: str  # stable: mixed-precision, fewer-gpus, dataloader-workers, time-limits, power-cap
    title: str
    body: str  # with the user's own numbers and job ids
    evidence: tuple[Evidence, ...]
    job_ids: tuple[str, ...]
    saving_kwh: float | None  # per month at this month's use; None where the data gives no estimate
    saving_basis: str  # how the saving was estimated, or why there is none
    test: str  # the threshold test that made it fire, in words


@dataclass(frozen=True)
class Thresholds:
    """What each suggestion needs before it is made. Conservative on purpose: a wrong suggestion costs
    more trust than a missed one saves energy."""

    # mixed precision: substantial GPU work, most of it not known to be in reduced precision
    amp_min_gpu_hours: float = 100.0  # in the month (about four days of one GPU)
    amp_min_gpu_kwh: float = 20.0  # GPU energy of the jobs it is about
    amp_busy_idle_share: float = 0.5  # jobs idle more than this are left out (AMP does not help idling)
    # fewer GPUs: per-GPU samples
    gpu_idle_share: float = 0.8  # a GPU under the idle threshold in at least 80% of its samples...
    gpu_busy_share: float = 0.5  # ...while another GPU of the job was under it less than half of its time
    gpu_min_samples: int = 30
    min_sampled_share: float = 0.5  # samples must cover half the job's allocated GPU time (all GPU tests)
    fewer_min_idle_gpu_hours: float = 1.0
    # data-loader workers
    loader_max_util_pct: float = 40.0
    loader_min_cpu_usage: float = 0.9  # TotalCPU / (allocated CPUs x elapsed)
    loader_min_elapsed_h: float = 0.25
    loader_min_gpu_hours: float = 2.0
    # time limits
    limit_min_jobs: int = 10  # completed jobs with a known limit
    limit_max_median_use: float = 0.25  # median elapsed / limit
    limit_min_median_limit_h: float = 2.0
    limit_max_timeout_share: float = 0.05  # of the finished jobs: users who hit their limits keep them
    # power cap
    cap_min_util_pct: float = 30.0
    cap_max_util_pct: float = 70.0
    cap_min_power_share: float = 0.6  # mean sampled power / TDP: a cap must have something to cut
    cap_min_gpu_kwh: float = 10.0
    cap_saving_share: float = 0.10  # counted, below the 15% measured (POWER_CAP_MEASURED)


def suggest_for_user(month: UserMonth, thresholds: Thresholds | None = None) -> list[Suggestion]:
    """The suggestions the month supports, largest estimated saving first (those without one last)."""
    t = thresholds or Thresholds()
    out = [
        s
        for s in (
            _mixed_precision(month, t),
            _fewer_gpus(month, t),
            _dataloader(month, t),
            _power_cap(month, t),
            _time_limits(month, t),
        )
        if s is not None
    ]
    out.sort(key=lambda s: (s.saving_kwh is None, -(s.saving_kwh or 0.0)))
    return out


# --- formatting -------------------------------------------------------------------------------------


def _num(x: float) -> str:
    """A figure as a report shows it: about 3 significant digits, no trailing zeros."""
    a = abs(x)
    if a >= 100 or not math.isfinite(x):
        return f"{x:,.0f}"
    if a >= 1:
        return f"{x:.{2 if a < 10 else 1}f}".rstrip("0").rstrip(".")
    return f"{x:.3g}" if a > 0 else "0"


def _pct(x: float) -> str:
    return f"{x:.0f}%"


def _ids(jobs: Sequence[GpuJob], n: int = 5) -> str:
    shown = ", ".join(j.job_id + (f" ({j.name})" if j.name else "") for j in jobs[:n])
    return shown + (f" and {len(jobs) - n} more" if len(jobs) > n else "")


def _drawn(j: GpuJob) -> float:
    """kWh the job's GPUs drew in the month by their samples (mean sampled power x GPU-hours)."""
    return (j.mean_gpu_power_w or 0.0) * j.gpu_hours / 1000


def _weighted(jobs: Sequence[GpuJob], value: Callable[[GpuJob], float]) -> float:
    """Mean of `value` over jobs weighted by what their GPUs drew."""
    e = sum(_drawn(j) for j in jobs)
    return sum(value(j) * _drawn(j) for j in jobs) / e if e > 0 else 0.0


def _sampled(j: GpuJob, t: Thresholds) -> bool:
    return j.gpu_util_pct is not None and j.sampled_share >= t.min_sampled_share


# --- the suggestions ------------------------------------------------------------------------------------


def _mixed_precision(m: UserMonth, t: Thresholds) -> Suggestion | None:
    """Mixed precision: only for GPU-heavy users, never for jobs their metadata says are already reduced.

    With metadata saying fp32 (or tf32) the suggestion is about those jobs; with no precision recorded
    at all it is conditional ("if not already") and made only when none of the user's jobs is known to
    use reduced precision (a user who uses it knows of it). Idle-dominated jobs are left out: AMP speeds
    up arithmetic, not waiting.
    """
    if m.totals.gpu_hours < t.amp_min_gpu_hours:
        return None
    busy = [j for j in m.gpu_jobs if j.idle_share is None or j.idle_share < t.amp_busy_idle_share]
    full = [j for j in busy if j.precision == "full"]
    unknown = [j for j in busy if j.precision is None]
    reduced = [j for j in m.gpu_jobs if j.precision == "reduced"]
    e_full = sum(j.gpu_energy_kwh for j in full)
    e_unknown = sum(j.gpu_energy_kwh for j in unknown)
    cite = (
        f"In the Baler study the same training used {BALER_FP32_KWH} kWh in full precision and "
        f"{BALER_AMP_KWH} kWh with automatic mixed precision (AMP): {_pct(BALER_SAVING * 100)} less."
    )
    how = (
        "In PyTorch: torch.autocast(device_type='cuda', dtype=torch.bfloat16) around the forward pass "
        "(with a GradScaler for float16); in Lightning: precision='bf16-mixed'. It needs GPUs with tensor "
        "cores (V100 and later) and a check that the model still converges."
    )
    if e_full >= t.amp_min_gpu_kwh:
        jobs = sorted(full, key=lambda j: -j.gpu_energy_kwh)
        saving = BALER_SAVING * e_full
        body = (
            f"Your job metadata says {len(jobs)} GPU job(s) this month ran in full precision "
            f"({_ids(jobs)}): {_num(e_full)} kWh of GPU energy over "
            f"{_num(sum(j.gpu_hours for j in jobs))} GPU-hours. {cite} At that rate these jobs would have "
            f"used about {_num(saving)} kWh less. {how}"
        )
        basis = (
            f"{_pct(BALER_SAVING * 100)} (Baler study) of the GPU energy of the jobs recorded as full "
            "precision"
        )
        test = (
            f"GPU-hours {_num(m.totals.gpu_hours)} >= {_num(t.amp_min_gpu_hours)} and GPU energy of jobs "
            f"recorded as full precision {_num(e_full)} kWh >= {_num(t.amp_min_gpu_kwh)} kWh"
        )
    elif not reduced and e_unknown >= t.amp_min_gpu_kwh:
        jobs = sorted(unknown, key=lambda j: -j.gpu_energy_kwh)
        saving = BALER_SAVING * e_unknown
        body = (
            f"You used {_num(m.totals.gpu_hours)} GPU-hours this month; your largest GPU jobs were "
            f"{_ids(jobs)} ({_num(e_unknown)} kWh of GPU energy in all). If your training does not already "
            f"use mixed precision (bf16 or fp16 with AMP), it is the change most likely to pay off. {cite} "
            f"If none of these jobs uses it yet, that would be up to {_num(saving)} kWh a month like this "
            f"one. {how}"
        )
        basis = (
            f"upper bound: {_pct(BALER_SAVING * 100)} (Baler study) of the GPU energy of the jobs whose "
            "precision is not recorded, as if none used mixed precision yet"
        )
        test = (
            f"GPU-hours {_num(m.totals.gpu_hours)} >= {_num(t.amp_min_gpu_hours)}, no job recorded as "
            f"reduced precision, and GPU energy of the busy jobs {_num(e_unknown)} kWh >= "
            f"{_num(t.amp_min_gpu_kwh)} kWh"
        )
    else:
        return None
    return Suggestion(
        id="mixed-precision",
        title="Train in mixed precision"
        if e_full >= t.amp_min_gpu_kwh
        else "Mixed precision, if not already",
        body=body,
        evidence=(
            Evidence("GPU-hours this month", m.totals.gpu_hours, "h"),
            Evidence("GPU energy of these jobs", e_full if e_full >= t.amp_min_gpu_kwh else e_unknown, "kWh"),
            Evidence("Baler study: energy saved with AMP", BALER_SAVING * 100, "%"),
        ),
        job_ids=tuple(j.job_id for j in jobs),
        saving_kwh=saving,
        saving_basis=basis,
        test=test,
    )


def _fewer_gpus(m: UserMonth, t: Thresholds) -> Suggestion | None:
    """Multi-GPU jobs in which one GPU idled most of the time while another worked (per-GPU samples).

    The saving is what the idle GPUs drew while the job held them (their samples' power x time, the
    month's share): energy charged to the user for no work. The site saves it only when those GPUs go to
    someone else or are powered down, which is what asking for fewer GPUs makes possible.
    """
    hits: list[tuple[GpuJob, list[str], list[str], float, float]] = []
    for j in m.gpu_jobs:
        devs = [d for d in j.devices if d.samples >= t.gpu_min_samples]
        if len(devs) < 2 or j.sampled_share < t.min_sampled_share:
            continue
        idle = [d for d in devs if d.idle_share >= t.gpu_idle_share]
        busy = [d for d in devs if d.idle_share < t.gpu_busy_share]
        if not idle or not busy:
            continue
        hours = sum(d.hours * d.idle_share for d in idle) * j.share_in_month
        energy = sum(d.energy_kwh or 0.0 for d in idle) * j.share_in_month
        hits.append(
            (
                j,
                [f"{d.device} on {d.node} idle in {_pct(d.idle_share * 100)} of its samples" for d in idle],
                [f"{d.device} averaged {_pct(d.mean_util_pct)}" for d in busy],
                hours,
                energy,
            )
        )
    idle_hours = sum(h[3] for h in hits)
    if not hits or idle_hours < t.fewer_min_idle_gpu_hours:
        return None
    hits.sort(key=lambda h: (-h[3], h[0].pk))
    saving = sum(h[4] for h in hits)
    lines = [
        f"job {j.job_id}{f' ({j.name})' if j.name else ''}, {j.gpus} GPUs: {'; '.join(i)}, "
        f"while {'; '.join(b)}"
        for j, i, b, _h, _e in hits[:5]
    ]
    return Suggestion(
        id="fewer-gpus",
        title="Ask for the GPUs your jobs use",
        body=(
            f"In {len(hits)} multi-GPU job(s) some GPUs sat idle (under {_pct(m.basis.idle_threshold_pct)} "
            f"utilisation) while others worked: "
            + "; ".join(lines)
            + f". That is {_num(idle_hours)} GPU-hours "
            f"held idle this month, drawing about {_num(saving)} kWh. If the code uses one GPU, ask for one "
            "(--gres=gpu:1); if it should use them all, check that it is launched for all of them (torchrun "
            "--nproc_per_node, DistributedDataParallel, or the framework's device settings)."
        ),
        evidence=(
            Evidence("jobs with an idle GPU", len(hits), "jobs"),
            Evidence("GPU-hours held idle", idle_hours, "h"),
            Evidence("energy the idle GPUs drew", saving, "kWh"),
        ),
        job_ids=tuple(h[0].job_id for h in hits),
        saving_kwh=saving,
        saving_basis=(
            "what the idle GPUs drew while the jobs held them (their samples' mean power x time); the site "
            "saves it when those GPUs are freed for other work or powered down"
        ),
        test=(
            f"a GPU under the idle threshold in >= {_pct(t.gpu_idle_share * 100)} of its samples while "
            f"another GPU of the job was idle < {_pct(t.gpu_busy_share * 100)} of the time, samples "
            f"covering >= {_pct(t.min_sampled_share * 100)} of the job, >= "
            f"{_num(t.fewer_min_idle_gpu_hours)} idle GPU-hours"
        ),
    )


def _dataloader(m: UserMonth, t: Thresholds) -> Suggestion | None:
    """Low GPU utilisation while every allocated CPU was busy: the GPUs were probably waiting for data.

    No saving is estimated: it depends on how much faster the input pipeline gets, which nothing here
    measures. The idle GPU energy of those jobs is given as evidence, not as a saving.
    """
    jobs = [
        j
        for j in m.gpu_jobs
        if _sampled(j, t)
        and j.gpu_util_pct is not None
        and j.gpu_util_pct < t.loader_max_util_pct
        and j.cpu_usage is not None
        and j.cpu_usage > t.loader_min_cpu_usage
        and j.elapsed_h >= t.loader_min_elapsed_h
    ]
    gpu_hours = sum(j.gpu_hours for j in jobs)
    if not jobs or gpu_hours < t.loader_min_gpu_hours:
        return None
    jobs.sort(key=lambda j: (-j.gpu_hours, j.pk))
    util = sum((j.gpu_util_pct or 0.0) * j.gpu_hours for j in jobs) / gpu_hours
    cpu = sum((j.cpu_usage or 0.0) * j.gpu_hours for j in jobs) / gpu_hours
    idle_kwh = sum(j.idle_kwh for j in jobs)
    detail = "; ".join(
        f"{j.job_id}: GPU {_pct(j.gpu_util_pct or 0.0)}, {j.cpus} CPUs "
        f"{_pct((j.cpu_usage or 0.0) * 100)} busy"
        for j in jobs[:5]
    )
    return Suggestion(
        id="dataloader-workers",
        title="Feed the GPUs: more CPU cores and data-loader workers",
        body=(
            f"In {len(jobs)} GPU job(s) ({_num(gpu_hours)} GPU-hours) the GPUs averaged {_pct(util)} "
            f"utilisation while the allocated CPU cores were {_pct(cpu * 100)} busy ({detail}). The GPUs "
            "were most likely waiting for data. Ask for more cores (--cpus-per-task) and give the data "
            "loader more workers (PyTorch: DataLoader(num_workers=..., pin_memory=True, "
            "persistent_workers=True)), or move decoding and augmentation to the GPU; then check the "
            "utilisation in your next report."
        ),
        evidence=(
            Evidence("GPU utilisation of these jobs", util, "%"),
            Evidence("CPU usage of these jobs", cpu * 100, "%"),
            Evidence("GPU-hours", gpu_hours, "h"),
            Evidence("energy of their GPUs while idle", idle_kwh, "kWh"),
        ),
        job_ids=tuple(j.job_id for j in jobs),
        saving_kwh=None,
        saving_basis=(
            "not estimated: it depends on how much faster the input pipeline gets, which the data does not "
            "say; the GPUs drew the idle energy given as evidence while under the idle threshold"
        ),
        test=(
            f"GPU utilisation < {_pct(t.loader_max_util_pct)} and CPU usage > "
            f"{_pct(t.loader_min_cpu_usage * 100)} in jobs of >= {_num(t.loader_min_elapsed_h)} h with "
            f"samples covering >= {_pct(t.min_sampled_share * 100)}, >= {_num(t.loader_min_gpu_hours)} "
            "GPU-hours in all"
        ),
    )


def _power_cap(m: UserMonth, t: Thresholds) -> Suggestion | None:
    """GPUs drawing most of their TDP at moderate utilisation: a power cap would cost them little.

    Why a cap is cheap there: a GPU's dynamic power grows with clock x voltage², and the voltage has to
    rise with the clock, so the top of the clock range costs much more power than it adds speed; a job
    whose GPUs are busy only part of the time (waiting on memory, data or communication) loses even less
    to a lower clock. The saving counts `cap_saving_share` of what these jobs' GPUs drew by their samples
    (measured power, not the accounted energy, which may be a TDP estimate), below the ~15% McDonald et
    al. measured for training a transformer under a cap. Only jobs whose sampled mean power is a large
    share of the TDP count: below that a cap would not bind.
    """
    jobs = [
        j
        for j in m.gpu_jobs
        if _sampled(j, t)
        and j.gpu_util_pct is not None
        and t.cap_min_util_pct <= j.gpu_util_pct <= t.cap_max_util_pct
        and j.mean_gpu_power_w is not None
        and j.gpu_tdp_w > 0
        and j.mean_gpu_power_w >= t.cap_min_power_share * j.gpu_tdp_w
    ]
    energy = sum(_drawn(j) for j in jobs)
    if not jobs or energy < t.cap_min_gpu_kwh:
        return None
    jobs.sort(key=lambda j: (-_drawn(j), j.pk))
    saving = t.cap_saving_share * energy
    detail = "; ".join(
        f"{j.job_id}: {_pct(j.gpu_util_pct or 0.0)} utilisation at {_num(j.mean_gpu_power_w or 0.0)} W "
        f"of {_num(j.gpu_tdp_w)} W"
        for j in jobs[:5]
    )
    return Suggestion(
        id="power-cap",
        title="A GPU power cap would cost these jobs little",
        body=(
            f"{len(jobs)} GPU job(s) ({_num(energy)} kWh drawn by their GPUs) kept their GPUs only partly "
            f"busy yet drew most of their rated power ({detail}). A GPU's power grows much faster than its "
            "speed near the top of its clock range, and a job that is not compute-bound loses little from a "
            "lower clock: McDonald et al. (NAACL 2022) measured about "
            f"{_pct(POWER_CAP_MEASURED * 100)} less energy for transformer training under a power cap, with "
            f"a marginal increase in run time. Counting {_pct(t.cap_saving_share * 100)} to stay on the safe "
            f"side, that is about {_num(saving)} kWh a month like this one. Caps are set by the "
            "administrators (nvidia-smi -pl): ask whether a capped partition or a per-job cap is available."
        ),
        evidence=(
            Evidence("energy their GPUs drew", energy, "kWh"),
            Evidence("their mean GPU utilisation", _weighted(jobs, lambda j: j.gpu_util_pct or 0.0), "%"),
            Evidence(
                "their mean GPU power / TDP",
                _weighted(jobs, lambda j: 100 * (j.mean_gpu_power_w or 0.0) / j.gpu_tdp_w),
                "%",
            ),
        ),
        job_ids=tuple(j.job_id for j in jobs),
        saving_kwh=saving,
        saving_basis=(
            f"{_pct(t.cap_saving_share * 100)} of what these jobs' GPUs drew (sampled power x GPU-hours in "
            f"the month), below the {_pct(POWER_CAP_MEASURED * 100)} McDonald et al. measured"
        ),
        test=(
            f"GPU utilisation {_pct(t.cap_min_util_pct)}-{_pct(t.cap_max_util_pct)} with mean sampled "
            f"power >= {_pct(t.cap_min_power_share * 100)} of the TDP, samples covering >= "
            f"{_pct(t.min_sampled_share * 100)}, >= {_num(t.cap_min_gpu_kwh)} kWh drawn by their GPUs"
        ),
    )


def _time_limits(m: UserMonth, t: Thresholds) -> Suggestion | None:
    """Completed jobs that used a small part of their time limit (only jobs whose limit is known).

    No energy saving is claimed: a job's limit does not change what it draws while it runs. Accurate
    limits let Slurm's backfill start jobs sooner, which is why the issue lists it.
    """
    tl = m.time_limits
    if (
        tl.completed < t.limit_min_jobs
        or tl.median_use is None
        or tl.median_use > t.limit_max_median_use
        or (tl.median_limit_h or 0.0) < t.limit_min_median_limit_h
        or tl.timeouts > t.limit_max_timeout_share * tl.finished
        or tl.p95_elapsed_h is None
    ):
        return None
    proposal = max(0.25, math.ceil(tl.p95_elapsed_h * 1.5 * 4) / 4)  # 1.5x the 95th percentile, by 15 min
    return Suggestion(
        id="time-limits",
        title="Shorter time limits",
        body=(
            f"Your {tl.completed} completed jobs this month asked for {_num(tl.median_limit_h or 0.0)} h "
            f"(median) and ran {_num(tl.median_elapsed_h or 0.0)} h: {_pct(tl.median_use * 100)} of the "
            f"limit; 95% of them finished within {_num(tl.p95_elapsed_h)} h. A limit of about "
            f"{_num(proposal)} h (--time) would still leave them half as much again, and Slurm's backfill "
            f"can start jobs with accurate limits sooner. Largest gaps: {', '.join(tl.examples)}."
        ),
        evidence=(
            Evidence("completed jobs with a limit", tl.completed, "jobs"),
            Evidence("median share of the limit used", tl.median_use * 100, "%"),
            Evidence("hours requested", tl.requested_h, "h"),
            Evidence("hours used", tl.used_h, "h"),
        ),
        job_ids=tl.examples,
        saving_kwh=None,
        saving_basis="none claimed: a time limit does not change the energy a job draws while it runs",
        test=(
            f">= {t.limit_min_jobs} completed jobs with a known limit, median use <= "
            f"{_pct(t.limit_max_median_use * 100)}, median limit >= {_num(t.limit_min_median_limit_h)} h, "
            f"timeouts <= {_pct(t.limit_max_timeout_share * 100)} of the finished jobs"
        ),
    )
