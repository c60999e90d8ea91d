"""One energy ledger per job: the parts every surface (CLI, API, e-mails, admin page, models) adds up.

A job's energy (`jobs.energy_j`, IT energy before PUE) is the sum of its `job_energy` rows, one per
component and source, each from the best source there is:

* GPU: NVML's energy counter per device, else the integral of its power samples (`nvml`,
  `nvml-power-integral`, both from the node hooks and collector); for a job whose node energy Slurm
  measured (`slurm-consumed-energy`, IPMI and the like) the aggregator takes the GPUs' share out of it
  from their power samples (`nvml-samples`, see `split_node`), so that the GPU energy is known there too;
  else the TDP estimate (`tdp-estimate`).
* CPU and DRAM: RAPL shares, else the TDP estimate.
* The rest of the node (`node` rows): what a node-level measurement holds beyond the GPUs (CPUs, memory,
  disks, fans, network), or the whole node where nothing split it.

What did no useful work is a set of *disjoint* parts of that energy, so that they can be added and never
exceed the total:

* idle GPUs: what allocated GPUs drew while under the idle threshold (their samples), at most the job's
  GPU energy;
* the rest of the energy of a job that ended badly, by how it ended (`OUTCOME`): failed (FAILED,
  NODE_FAIL, BOOT_FAIL), out of memory, cancelled. A job that ended badly and also idled counts its idle
  GPU energy as idle and the rest under its outcome, never both.

These add up to the energy that *did no work* (`Waste.total`): certain. Apart from it, never added in:

* possibly lost: the rest of the energy of a job that hit its time limit (TIMEOUT, DEADLINE), lost unless
  it saved a checkpoint (a training job at 88% GPU use may well have). An interactive session
  (cocaq.accounting.sessions) that ends at its limit ended normally: none of its energy is possibly lost
  (its idle GPUs still count as idle).

The arithmetic is here once, as Python (`waste`, `split_node`) and as the SQL the queries embed
(`outcome_sql`, `count_sql`); tests hold the two to the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The sources of the GPU share that the aggregator takes out of a node-level measurement.
from cocaq.accounting.sources import SOURCE_SAMPLES as SOURCE_SAMPLES
from cocaq.accounting.sources import SOURCE_SLURM
from cocaq.db import dialect as sql

SOURCE_NODE = SOURCE_SLURM

# How a job ended, by the first word of its Slurm state: where its energy beyond idle GPUs counts.
OUTCOME: dict[str, str] = {
    "FAILED": "failed",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "OUT_OF_MEMORY": "oom",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "CANCELLED": "cancelled",
}
OUTCOMES = ("failed", "oom", "timeout", "cancelled")
# What each part is called where people read it.
OUTCOME_LABEL = {
    "failed": "failed jobs",
    "oom": "jobs that ran out of memory",
    "timeout": "jobs that hit their time limit",
    "cancelled": "cancelled jobs",
}
# The parts that add up to the energy that did no work; "timeout" is apart (possibly lost).
CERTAIN = ("failed", "oom", "cancelled")
# What the time-limit part is called on every surface (CLI, API docs, e-mails, admin page).
POSSIBLY_LOST = "possibly lost (hit its time limit: lost unless it saved a checkpoint)"


def states(outcome: str) -> tuple[str, ...]:
    """The Slurm states of an outcome, sorted (for SQL `IN` lists)."""
    return tuple(sorted(s for s, o in OUTCOME.items() if o == outcome))


FAILED_STATES = states("failed")
OOM_STATES = states("oom")
TIMEOUT_STATES = states("timeout")
CANCELLED_STATES = states("cancelled")

# Samples must cover at least this share of the job's allocated GPU time for their mean power to stand
# for all of it; below that the samples' own energy is taken as a lower bound of the GPU energy.
SPLIT_MIN_COVERAGE = 0.5


def outcome_of(state: str | None) -> str | None:
    """`CANCELLED by 5` -> "cancelled"; None for a job that completed, runs, or ended otherwise."""
    return OUTCOME.get((state or "").split(" ", 1)[0])


@dataclass(frozen=True, slots=True)
class Waste:
    """A job's energy (J) that did no useful work, in disjoint parts, and apart from them the energy
    possibly lost at its time limit (`timeout`; see the module doc)."""

    idle: float = 0.0
    failed: float = 0.0
    oom: float = 0.0
    timeout: float = 0.0
    cancelled: float = 0.0

    @property
    def total(self) -> float:
        """The energy that certainly did no work: idle GPUs, failed, out of memory, cancelled; never the
        time-limit part, which is `timeout` (possibly lost)."""
        return self.idle + self.failed + self.oom + self.cancelled


def clamp_idle(idle_j: float, energy_j: float, gpu_j: float) -> float:
    """Idle GPU energy as the ledger counts it: at most the job's GPU energy (where it has one) and at
    most its energy (samples and counters may disagree by a little; a part must never exceed its whole)."""
    cap = min(gpu_j, energy_j) if gpu_j > 0 else energy_j
    return max(0.0, min(idle_j, cap))


def waste(state: str | None, energy_j: float, idle_j: float, interactive: bool = False) -> Waste:
    """The disjoint parts of a job's energy that did no work; `idle_j` as `clamp_idle` left it.
    `interactive`: the job is an interactive session (cocaq.accounting.sessions), whose time limit is how
    it ends normally: no part of it is possibly lost."""
    energy = max(energy_j, 0.0)
    idle = max(0.0, min(idle_j, energy))
    o = outcome_of(state)
    if o is None or (o == "timeout" and interactive):
        return Waste(idle=idle)
    return Waste(**{"idle": idle, o: energy - idle})


# --- the same in SQL -----------------------------------------------------------------------------------


def _in(values: Iterable[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"  # constants of this module, never user input


def _when(outcome: str, state: str, interactive: str) -> str:
    """SQL: the job's state is of this outcome (and, for the time limit, it is no interactive session)."""
    cond = f"{state} IN {_in(states(outcome))}"
    return f"{cond} AND NOT {interactive}" if outcome == "timeout" else cond


def outcome_sql(outcome: str, state: str, energy: str, idle: str, dialect: str, *, interactive: str) -> str:
    """SQL for `waste(state, energy, idle, interactive)`'s part `outcome` ("idle" too); the arguments are
    SQL expressions (`state` already its first word, `interactive` a boolean:
    cocaq.accounting.sessions.Sessions.sql)."""
    energy_part = sql.greatest(dialect, energy, "0.0")
    idle_part = sql.greatest(dialect, "0.0", sql.least(dialect, idle, energy_part))
    if outcome == "idle":
        return idle_part
    return f"CASE WHEN {_when(outcome, state, interactive)} THEN {energy_part} - {idle_part} ELSE 0.0 END"


def count_sql(outcome: str, state: str, *, interactive: str) -> str:
    """SQL: 1 for a job of this outcome, else 0 (an interactive session at its time limit: 0)."""
    return f"CASE WHEN {_when(outcome, state, interactive)} THEN 1 ELSE 0 END"


def counts_as(outcome: str | None, interactive: bool) -> str | None:
    """The outcome a job counts under in the ledger: none for a session that ended at its time limit."""
    return None if outcome == "timeout" and interactive else outcome


# --- the GPU share of a node-level measurement ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Split:
    gpu_j: float  # the GPUs' share, from their samples (SOURCE_SAMPLES)
    node_j: float  # the rest of the node (SOURCE_NODE)
    coverage: float  # of the allocated GPU time, the share that samples cover
    extrapolated: bool  # the samples' mean power was taken for the allocated GPU time they miss


def split_node(
    node_total_j: float, samples_j: float, samples_s: float, alloc_gpus: int, elapsed_s: float
) -> Split | None:
    """The GPUs' share of a node-level measurement from the GPUs' power samples; None where there is
    nothing to split (no node energy, no GPU, no samples).

    The samples' energy covers `samples_s` GPU-seconds of the `alloc_gpus x elapsed_s` the job held:
    with at least SPLIT_MIN_COVERAGE of it covered, their mean power stands for the rest; with less, only
    what they saw is counted (a lower bound). The GPUs can never take more than the node measured.
    """
    if node_total_j <= 0 or alloc_gpus <= 0 or samples_j <= 0 or samples_s <= 0:
        return None
    held = alloc_gpus * max(elapsed_s, 0.0)
    coverage = min(samples_s / held, 1.0) if held > 0 else 1.0
    gpu = samples_j / coverage if coverage >= SPLIT_MIN_COVERAGE else samples_j
    gpu = min(gpu, node_total_j)
    return Split(gpu, node_total_j - gpu, coverage, SPLIT_MIN_COVERAGE <= coverage < 1.0)
