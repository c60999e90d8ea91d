"""The notes Princeton's jobstats gives (what many sites' users know), on cocaq's data: CPU cores kept busy,
cores and memory per GPU against a fair share of the node, jobs spread over more nodes than they need,
GPUs a job never used, and MIG slices for jobs that use a small part of a full GPU.

Each note is found once per job (`_find`); the window's rules (`window_rules`, in
cocaq.footprint.advice's RULES) name every job it fits, the notes on one job (`notes`, from
cocaq.footprint.job_advice) speak of that job alone. None claims an energy saving: an idle core or a
memory reservation draws little that cocaq counts, and what idle GPUs drew is the `fewer-gpus` advice's;
they free resources for others and let the user's own jobs start sooner.

What each rests on:

* ``cpus``: sacct TotalCPU / (AllocCPUS x Elapsed), of jobs that ended (Slurm adds a step's TotalCPU when
  it ends). jobstats marks CPU use under 65% "low" and 65-80% "somewhat low" against a target of 90%
  and above, and speaks of CPU-only jobs with more than one core; cocaq sizes the request down under
  50% (GPU jobs too, from 4 cores), and from 50% to 80% asks for a scaling test instead, where fewer
  cores may or may not do.
* ``cores-per-gpu``, ``mem-per-gpu``, ``fewer-nodes``: the job's AllocCPUS, GPUs (AllocTRES gres/gpu),
  ReqMem and MaxRSS x tasks per node, against the node its hardware profile describes (`cores_per_node`,
  `gpus_per_node`, `mem_gb` of `[partitions.NAME]` or `[node_groups.NAME]`): a GPU's fair share of a
  node is the node's cores (memory) / its GPUs. Without the profile's figures, no note.
* ``unused-gpus``: cocaq's collector samples of each GPU (`JobFacts.devices`, where they were examined
  one by one): a GPU at 0% in every sample of a multi-GPU job.
* ``zero-cpu-nodes``: the nodes of a multi-node job on which Slurm accounted no CPU time in any step
  (`JobFacts.zero_cpu_nodes`, from sacct's TRESUsageInMin/MinNode/MinTask, cocaq.slurm.idle_nodes: a
  step's least-used task is the node's whole share only where the step ran one task per node). jobstats
  says "did not use N of the M allocated nodes", and leaves such a job out of its low-CPU and too-many-
  nodes notes, as these do (``cpus``, ``fewer-nodes``): the idle node is the cause of both.
* ``mig``: the job's mean GPU use and its peak GPU memory (samples, or Slurm's gres/gpuutil and
  gres/gpumem), against a MIG slice of `[advice] mig_partitions`: an NVIDIA A100 or H100 has 7 compute
  slices, so an `Ng.XXgb` slice has N/7 of its compute and XX GB.

Pure functions over JobFacts, standard library only (login nodes). It does not import
cocaq.footprint.advice (which lists these rules): the caller hands it the Advice and Evidence types.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cocaq.footprint.advice_words import MB_PER_GB, n_gpus, n_jobs, num, pct, plural, slurm_mem
from cocaq.footprint.jobfacts import JobFacts

A = TypeVar("A")

# jobstats' bands of CPU use (its CPU_UTIL_RED and CPU_UTIL_BLACK): "low" under 65%, "somewhat low" to 80%
JOBSTATS_CPU_LOW = 0.65
CPU_SOMEWHAT_LOW = 0.80
MIN_RUN_H = 0.25  # a shorter run says little about what it needs (jobstats: 300 s)
MEM_MAX_USE = 0.85  # jobstats: memory per GPU above the fair share, and under 85% of it used
MIG_SLICES = 7  # compute slices of an A100 or H100 (NVIDIA's MIG user guide)
_MIG = re.compile(r"^(?P<g>[1-7])g\.(?P<mem>\d+)gb$")


class _Thresholds(Protocol):
    cpu_max_usage: float
    cpu_min_cores: int
    gpu_min_samples: int


class Ctx(Protocol):
    """What of cocaq.footprint.advice.Context these rules read."""

    @property
    def period(self) -> str: ...
    @property
    def thresholds(self) -> _Thresholds: ...
    @property
    def mig_partitions(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class _Hit:
    """One job's note: the sentence about it alone, the detail a window's list gives, the lines."""

    job: JobFacts
    body: str
    detail: str
    change: tuple[str, ...]
    evidence: tuple[tuple[str, float, str], ...]
    weight: float  # the largest first: what the note frees
    title: str | None = None  # on one job, where it differs from the rule's


@dataclass(frozen=True)
class _Rule:
    id: str
    title: str  # over a window (plural), and on one job
    job_title: str
    why: str  # the window's sentence after the list of jobs
    basis: str
    test: str
    find: Callable[[JobFacts, Ctx], _Hit | None]


# --- the findings ---------------------------------------------------------------------------------------


def _cpus(j: JobFacts, ctx: Ctx) -> _Hit | None:
    t = ctx.thresholds
    u = j.cpu_usage  # None for a running job or one whose TotalCPU Slurm did not gather
    if u is None or j.elapsed_h < MIN_RUN_H or j.cpus < (t.cpu_min_cores if j.gpus else 2):
        return None
    if j.zero_cpu_nodes:  # its idle nodes are the cause: the zero-cpu-nodes note says so
        return None
    if j.gpus and _cores_per_gpu(j, ctx) is not None:  # the same cores, said per GPU
        return None
    per_node = j.cpus / max(j.nodes, 1)
    core_h = f"{num((j.total_cpu_s or 0) / 3600)} of {num(j.cpus * j.elapsed_h)} core-hours"
    busy = f"{pct(u)} of its {j.cpus} CPU cores busy ({core_h})"
    ev = (("CPU use", u * 100, "%"), ("CPU cores", j.cpus, "cores"))
    if u < t.cpu_max_usage:
        serial = 0.85 <= u * j.cpus <= 1.01 and j.nodes <= 1
        ask = 1 if serial else max(1, math.ceil(per_node * u * 1.25))
        why = (
            " That is about one core's worth: the code may run on one core only (a serial code); if it "
            "is, more cores do not make it faster."
            if serial
            else ""
        )
        return _Hit(
            j,
            f"It kept {busy}.{why} About {ask} {'core' if ask == 1 else 'cores'} per node would do.",
            f"{j.job_id}: {pct(u)} of {j.cpus}",
            (f"#SBATCH --cpus-per-task={ask}  (with one task per node)",),
            ev,
            j.cpus * j.elapsed_h,
            "Ask for fewer CPU cores",
        )
    if j.gpus or u >= CPU_SOMEWHAT_LOW:  # a GPU job's cores feed its GPUs: their use is not its efficiency
        return None
    word = "somewhat low" if u >= JOBSTATS_CPU_LOW else "low"
    test = max(1, math.ceil(per_node * u))
    return _Hit(
        j,
        f"It kept {busy}: {word} against the 90% and above a parallel code should reach. Common causes: "
        "waiting for files (I/O), tasks waiting for each other, or more cores than the code scales to. "
        f"A scaling test tells: run the same input with {test} cores (what it kept busy on average) and "
        "compare the run time; if it barely grows, keep the smaller request.",
        f"{j.job_id}: {pct(u)} of {j.cpus}",
        (f"#SBATCH --cpus-per-task={test}  (for the scaling test; one task per node)",),
        ev,
        j.cpus * j.elapsed_h,
        "Find out why its CPU cores wait",
    )


def _fair(j: JobFacts) -> tuple[float, float] | None:
    """A GPU's fair share of its node: (cores, GB of memory); None where the profile does not say."""
    if j.gpus <= 0 or j.node_gpus <= 0:
        return None
    return j.node_cores / j.node_gpus, j.node_mem_gb / j.node_gpus


def _cores_per_gpu(j: JobFacts, ctx: Ctx) -> _Hit | None:
    fair = _fair(j)
    u = j.cpu_usage
    if fair is None or fair[0] <= 0 or u is None or j.elapsed_h < MIN_RUN_H:
        return None
    per_gpu = j.cpus / j.gpus
    used = per_gpu * u
    if per_gpu <= fair[0] or used > fair[0]:
        return None
    ask = min(math.floor(fair[0]), max(1, math.ceil(used * 1.25)))
    share = f"{num(fair[0])} cores per GPU ({j.node_cores} cores / {j.node_gpus} GPUs per node)"
    return _Hit(
        j,
        f"It asked for {num(per_gpu)} CPU cores per GPU, more than a GPU's share of its node, {share}, and "
        f"kept {num(used)} per GPU busy ({pct(u)} of them). Cores beyond the share leave the node's other "
        f"GPUs without cores for other jobs. {ask} per GPU would do.",
        f"{j.job_id}: {num(per_gpu)} cores per GPU, {num(used)} busy",
        (f"#SBATCH --cpus-per-gpu={ask}  (in place of --cpus-per-task: Slurm takes one of the two)",),
        (
            ("CPU cores per GPU", per_gpu, "cores"),
            ("busy per GPU", used, "cores"),
            ("fair share", fair[0], "cores"),
        ),
        (per_gpu - fair[0]) * j.gpus * j.elapsed_h,
    )


def _mem_per_gpu(j: JobFacts, ctx: Ctx) -> _Hit | None:
    fair = _fair(j)
    asked, used = j.mem_req_per_node_mb, j.mem_used_per_node_mb
    if fair is None or fair[1] <= 0 or not asked or used is None or not j.ended or j.outcome == "oom":
        return None
    gpus_here = j.gpus / max(j.nodes, 1)
    per_gpu, used_gpu = asked / MB_PER_GB / gpus_here, used / MB_PER_GB / gpus_here
    if per_gpu <= fair[1] or used >= MEM_MAX_USE * asked or used_gpu > fair[1]:
        return None
    ask = slurm_mem(min(fair[1], max(used_gpu * 1.25, 1.0)) * MB_PER_GB)
    return _Hit(
        j,
        f"It asked for {num(per_gpu)} GB of memory per GPU, more than a GPU's share of its node, "
        f"{num(fair[1])} GB ({num(j.node_mem_gb)} GB / {j.node_gpus} GPUs per node), and used at most "
        f"{num(used_gpu)} GB per GPU (sacct MaxRSS). Memory beyond the share leaves the node's other GPUs "
        "without memory for other jobs.",
        f"{j.job_id}: {num(per_gpu)} GB per GPU, {num(used_gpu)} GB used",
        (
            f"#SBATCH --mem-per-gpu={ask}  (in place of --mem: Slurm takes one of --mem, --mem-per-cpu and "
            "--mem-per-gpu)",
        ),
        (("memory per GPU", per_gpu, "GB"), ("used per GPU", used_gpu, "GB"), ("fair share", fair[1], "GB")),
        (per_gpu - fair[1]) * j.gpus * j.elapsed_h,
    )


def _fewer_nodes(j: JobFacts, ctx: Ctx) -> _Hit | None:
    if j.nodes <= 1 or j.node_cores <= 0 or (j.gpus and j.node_gpus <= 0) or j.zero_cpu_nodes:
        return None
    need = math.ceil(j.cpus / j.node_cores - 1e-9)
    if j.gpus:
        need = max(need, math.ceil(j.gpus / j.node_gpus - 1e-9))
    if j.req_mem_mb and j.node_mem_gb > 0:
        need = max(need, math.ceil(j.req_mem_mb / MB_PER_GB / j.node_mem_gb - 1e-9))
    need = max(need, 1)
    if need >= j.nodes:
        return None
    node = f"{j.node_cores} cores" + (f" and {n_gpus(j.node_gpus)}" if j.gpus else "")
    held = f"{j.cpus} cores" + (f" and {n_gpus(j.gpus)}" if j.gpus else "")
    per_node = (
        f"#SBATCH --gres=gpu:{math.ceil(j.gpus / need)}  (GPUs per node)"
        if j.gpus
        else f"#SBATCH --ntasks-per-node={math.ceil(j.cpus / need)}  (with one core per task)"
    )
    return _Hit(
        j,
        f"It ran on {j.nodes} nodes with {held} in all; its nodes have {node} each, so it fits on {need}. "
        "Fewer nodes means less traffic between nodes (communication within a node is faster) and leaves "
        "whole nodes to jobs that need them.",
        f"{j.job_id}: {held} on {j.nodes} nodes, fits on {need}",
        (f"#SBATCH --nodes={need}", per_node),
        (("nodes", j.nodes, "nodes"), ("nodes it fits on", need, "nodes")),
        (j.nodes - need) * j.elapsed_h,
    )


def _unused_gpus(j: JobFacts, ctx: Ctx) -> _Hit | None:
    devs = [d for d in j.devices if d.samples >= ctx.thresholds.gpu_min_samples]
    if j.gpus < 2 or len(devs) < 2:
        return None
    zero = [d for d in devs if d.mean_util_pct <= 0.0]
    if not zero:
        return None
    used = len(devs) - len(zero)
    names = ", ".join(f"{d.device} on {d.node}" for d in zero[:4]) + (" and more" if len(zero) > 4 else "")
    keep = max(used, 1)
    change = (
        (f"#SBATCH --gres=gpu:{keep}" if j.nodes <= 1 else f"#SBATCH --gpus={keep}  (GPUs in all)"),
        f"torchrun --nproc_per_node={len(devs) // max(j.nodes, 1)}  (one process per GPU, to use them all)",
    )
    so_far = "" if j.ended else " so far"
    return _Hit(
        j,
        f"It did not use {len(zero)} of its {n_gpus(len(devs))}: {names} stayed at 0% in every sample"
        f"{so_far}. The code ran on fewer GPUs than it asked for: launch one process per GPU "
        "(torchrun, srun), or ask for the GPUs it uses.",
        f"{j.job_id}: {len(zero)} of {len(devs)} GPUs at 0%",
        change,
        (("GPUs at 0%", len(zero), "GPUs"), ("GPUs", len(devs), "GPUs")),
        len(zero) * j.elapsed_h,
    )


def _zero_cpu_nodes(j: JobFacts, ctx: Ctx) -> _Hit | None:
    idle = j.zero_cpu_nodes
    if j.nodes < 2 or not idle or not j.ended or j.elapsed_h < MIN_RUN_H or len(idle) >= j.nodes:
        return None
    worked = j.nodes - len(idle)
    names = ", ".join(idle[:4]) + (f" and {len(idle) - 4} more" if len(idle) > 4 else "")
    multi = "" if worked > 1 else " Is the code able to use more than one node?"
    per_node = (
        f"#SBATCH --ntasks-per-node={max(1, j.gpus // j.nodes)}  (one task per GPU)"
        if j.gpus
        else f"#SBATCH --ntasks-per-node={max(1, j.cpus // j.nodes)}  (one task per core, as an MPI code "
        "runs; 1 for a code that starts its own threads)"
    )
    return _Hit(
        j,
        f"It ran on {plural(j.nodes, 'node')} and Slurm accounted no CPU time on {len(idle)} of them: "
        f"{names} (sacct's least-used task of each step, TRESUsageInMin). The code was not started on "
        "every node: a batch script runs on the first node only, so a program started without srun, or a "
        f"launcher that starts one process, leaves the others idle.{multi} Start it with srun, which runs "
        "the tasks on every node of the job, or ask for the nodes it uses.",
        f"{j.job_id}: {len(idle)} of {j.nodes} nodes idle ({names})",
        (
            "srun python train.py  (your command after srun, in the batch script)",
            per_node,
            f"#SBATCH --nodes={worked}  (or ask for the nodes it used)",
        ),
        (("nodes with no CPU use", len(idle), "nodes"), ("nodes", j.nodes, "nodes")),
        len(idle) * j.elapsed_h,
    )


def _mig(j: JobFacts, ctx: Ctx) -> _Hit | None:
    migs = ctx.mig_partitions
    if (
        not migs
        or j.gpus != 1
        or (j.partition or "") in migs
        or not j.ended
        or j.elapsed_h < MIN_RUN_H
        or j.gpu_util_pct is None
        or j.gpu_util_pct <= 0.0
        or j.gpu_mem_peak_mb is None
    ):
        return None
    peak_gb = j.gpu_mem_peak_mb / MB_PER_GB
    fits = []
    for part, profile in migs.items():
        m = _MIG.match(profile)
        if m is None:
            continue
        g, mem = int(m["g"]), float(m["mem"])
        larger = not j.gpu_mem_gb or j.gpu_mem_gb > mem  # the job's GPU is a full one, larger than the slice
        if j.gpu_util_pct < 100.0 * g / MIG_SLICES and peak_gb < mem and larger:
            fits.append((g, mem, part, profile))
    if not fits:
        return None
    g, mem, part, profile = min(fits)
    return _Hit(
        j,
        f"Its GPU was busy {j.gpu_util_pct:.0f}% of the time on average and held at most {num(peak_gb)} GB "
        f"of memory: a {profile} MIG slice ({g}/{MIG_SLICES} of an A100's or H100's compute, {num(mem)} GB) "
        f"on the {part} partition would do the same work and leave the full GPU to a job that needs it.",
        f"{j.job_id}: {j.gpu_util_pct:.0f}% busy, {num(peak_gb)} GB",
        (f"#SBATCH --partition={part}", f"#SBATCH --gres=gpu:{profile}:1"),
        (("GPU use", j.gpu_util_pct, "%"), ("GPU memory peak", peak_gb, "GB")),
        j.elapsed_h,
    )


RULES: tuple[_Rule, ...] = (
    _Rule(
        "cpus", "Ask for the CPU cores your jobs use", "Ask for the CPU cores it uses",
        "Cores a job holds and does not use wait for it while other jobs wait for cores.",
        "none claimed: idle cores draw little that cocaq counts; they are freed for others",
        "TotalCPU under 50% of allocated cores x elapsed (4+ cores with GPUs, 2+ without), or under 80% "
        "for CPU-only jobs (jobstats' low and somewhat low bands)",
        _cpus,
    ),
    _Rule(
        "cores-per-gpu", "Ask for a GPU's share of CPU cores", "Ask for a GPU's share of CPU cores",
        "Cores beyond a GPU's share of the node leave its other GPUs without cores for other jobs.",
        "none claimed: it frees cores, and with them GPUs, for others",
        "cores per GPU above the node's cores / GPUs, with the cores it kept busy within that share",
        _cores_per_gpu,
    ),
    _Rule(
        "mem-per-gpu", "Ask for a GPU's share of memory", "Ask for a GPU's share of memory",
        "Memory beyond a GPU's share of the node leaves its other GPUs without memory for other jobs.",
        "none claimed: it frees memory, and with it GPUs, for others",
        "memory per GPU above the node's memory / GPUs, under 85% of it used (sacct MaxRSS)",
        _mem_per_gpu,
    ),
    _Rule(
        "fewer-nodes", "Run on as few nodes as your jobs fit on", "Run on as few nodes as it fits on",
        "Fewer nodes means less traffic between nodes and leaves whole nodes to jobs that need them.",
        "none claimed: the same cores and GPUs on fewer nodes",
        "its cores, GPUs and memory fit on fewer of its partition's nodes",
        _fewer_nodes,
    ),
    _Rule(
        "unused-gpus", "Use every GPU you ask for", "Use every GPU it asks for",
        "Launch one process per GPU (torchrun, srun), or ask for the GPUs the code uses.",
        "none claimed here: what the idle GPUs drew is the fewer-gpus advice's",
        "a GPU of a multi-GPU job at 0% in every one of its samples",
        _unused_gpus,
    ),
    _Rule(
        "zero-cpu-nodes", "Start your code on every node you ask for", "Start the code on every node",
        "Start the code with srun on every node, or ask for the nodes it uses.",
        "none claimed: an idle node draws little that cocaq counts; it is freed for others",
        "a multi-node job with a node on which no step used any CPU time (sacct TRESUsageInMin/MinNode, "
        "one task per node)",
        _zero_cpu_nodes,
    ),
    _Rule(
        "mig", "Run small GPU jobs on a MIG slice", "Run it on a MIG slice",
        "A MIG slice does their work and leaves full GPUs to jobs that need them.",
        "none claimed: a slice frees the rest of a GPU for others",
        "1 GPU, mean use under the slice's share of the compute, peak GPU memory under the slice's",
        _mig,
    ),
)  # fmt: skip


# --- as the advice's rules and notes --------------------------------------------------------------------


def window_rules(
    advice: Callable[..., A], evidence: Callable[[str, float, str], Any]
) -> tuple[Callable[[Sequence[JobFacts], Any], A | None], ...]:
    """These rules over a window of a user's jobs, as cocaq.footprint.advice's RULES take them; `advice`
    and `evidence` are its Advice and Evidence."""

    def over(rule: _Rule) -> Callable[[Sequence[JobFacts], Any], A | None]:
        def run(jobs: Sequence[JobFacts], ctx: Any) -> A | None:
            hits = [h for j in jobs if (h := rule.find(j, ctx)) is not None]
            if not hits:
                return None
            hits.sort(key=lambda h: (-h.weight, h.job.job_id))
            top = hits[0]
            more = f" and {len(hits) - 4} more" if len(hits) > 4 else ""
            return advice(
                id=rule.id,
                title=rule.title,
                body=f"{n_jobs(len(hits))} {ctx.period}: "
                + "; ".join(h.detail for h in hits[:4])
                + more
                + f". {rule.why} For a job like {top.job.job_id}: {top.body}",
                change=top.change,
                evidence=(evidence("jobs", len(hits), "jobs"), *(evidence(*e) for e in top.evidence)),
                job_ids=tuple(h.job.job_id for h in hits),
                saving_kwh=None,
                saving_kg=None,
                upper_bound=False,
                basis=rule.basis,
                test=rule.test,
            )

        run.__name__ = run.__qualname__ = f"_{rule.id.replace('-', '_')}"
        return run

    return tuple(over(r) for r in RULES)


def notes(
    job: JobFacts, ctx: Any, advice: Callable[..., A], evidence: Callable[[str, float, str], Any]
) -> list[A]:
    """These notes on one job, for cocaq.footprint.job_advice.job_notes."""
    out = []
    for rule in RULES:
        h = rule.find(job, ctx)
        if h is not None:
            out.append(
                advice(
                    id=rule.id, title=h.title or rule.job_title, body=h.body, change=h.change,
                    evidence=tuple(evidence(*e) for e in h.evidence), job_ids=(job.job_id,), saving_kwh=None,
                    saving_kg=None, upper_bound=False, basis=rule.basis, test="this job",
                )
            )  # fmt: skip
    return out
