"""What every advice rule reads and returns: the suggestion (`Advice`, its `Evidence`), when the rules fire
(`Thresholds`), the window they read (`Context`), and what a job is to them (interactive, sampled, the
parts of its energy that were idle or lost, and a saving summed at each job's own CO2 per kWh).

The rules (one module each in this package, cocaq.footprint.rules.registry) and the two surfaces that run
them (the window's suggestions, cocaq.footprint.advice, and the notes on one job,
cocaq.footprint.job_advice) all take these from here, so that a job is interactive, or its energy lost, by
one definition. Pure functions over JobFacts, standard library only (login nodes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cocaq.accounting.sessions import Sessions
from cocaq.footprint.jobfacts import JobFacts


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


def saving(jobs: Iterable[JobFacts], kwh: Callable[[JobFacts], float]) -> tuple[float, float]:
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


def sampled(j: JobFacts, t: Thresholds) -> bool:
    """GPU samples that cover enough of the job's GPU time to judge it by (every GPU test)."""
    return j.gpu_util_pct is not None and j.sampled_share >= t.min_sampled_share


def idle_part(j: JobFacts) -> float:
    """The ledger's idle GPU energy in the window."""
    return j.idle_kwh * j.share


def outcome_part(j: JobFacts) -> float:
    """The ledger's part of a job that ended badly, beyond its idle GPUs, in the window."""
    return max(j.energy_kwh - j.idle_kwh, 0.0) * j.share


def ended_in(j: JobFacts, ctx: Context) -> bool:
    """The job ended within the window: the runs a rule compares precision or sizes a time limit on."""
    return not j.is_open and j.end is not None and ctx.since <= j.end < ctx.until
