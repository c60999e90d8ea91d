"""Parse `sacct` output (`--json`, `--parsable`, `--parsable2`) into JobRecords.

Real accounting data is messy, so every line either becomes part of a job or is skipped with a counted
reason; nothing here raises on a bad line.  Job steps (`.batch`, `.extern`, `.0`) are folded into their
job: their CPU time fills in a missing job total, their energy a missing job energy, and the step with the
largest MaxRSS gives the job's memory use.
"""

from __future__ import annotations

import json
import re
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import IO, Any

from cocaq.slurm.idle_nodes import StepCpu, idle_nodes
from cocaq.slurm.idle_nodes import from_json as step_cpu_json
from cocaq.slurm.idle_nodes import from_text as step_cpu_text
from cocaq.slurm.record import FINAL_STATES, NOT_STARTED_STATES, OPEN_STATES, JobRecord
from cocaq.timeparse import parse_slurm_duration

# What `cocaq import sacct` asks sacct for; the parser accepts any subset, in any order, plus unknown fields.
SACCT_FIELDS = (
    "JobID,JobIDRaw,JobName,User,UID,Account,Partition,QOS,NodeList,NNodes,AllocCPUS,AllocTRES,ReqTRES,"
    "ReqMem,Submit,Start,End,Elapsed,ElapsedRaw,State,ExitCode,TotalCPU,Comment,ConsumedEnergyRaw,Cluster,"
    "Timelimit,MaxRSS,NTasks,TRESUsageInAve,TRESUsageInMax,TRESUsageInMin,TRESUsageInMinNode,TRESUsageInMinTask"
)

_JOBID = re.compile(
    r"^(?P<base>(?P<id>\d+)(?:_(?P<task>\d+|\[[^\]]*\]))?(?:\+(?P<het>\d+))?)(?:\.(?P<step>[A-Za-z0-9_+-]+))?$"
)
_MEM = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>[KMGTP]?)(?P<per>[nc]?)$", re.IGNORECASE)
_UNIT_MB = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}
# Slurm's NO_VAL64 (and anything near it) means "not measured", never joules.
_ENERGY_UNSET = 2.0**63
# sacct's MaxRSS suffixes (powers of 1024) -> MB; a bare number is bytes (`--noconvert`).
_RSS_UNIT_MB = {
    "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3,
    "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0**2, "p": 1024.0**3,
}  # fmt: skip
# One task's resident set beyond 1 PiB is a corrupt value (or NO_VAL64 in bytes), not memory.
_RSS_MAX_MB = 1024.0**3
# How many jobs stay open for steps that arrive after them (sacct prints steps right after their job).
_FOLD_WINDOW = 4096
# Slurm's gpu plugins put a task's use of its GPUs in TRESUsageIn*: `gres/gpuutil` (the task's SM use
# summed over the GPUs it touched, % of one GPU) and `gres/gpumem` (bytes, summed likewise; sacct prints a
# K/M/G suffix unless --noconvert). A value beyond these is Slurm's "infinite"/unset, not a reading.
_GPUUTIL_MAX = 100.0 * 1024  # % of one GPU: 1024 fully busy GPUs in one task
_GPUMEM_MAX_MB = 1024.0**3


@dataclass
class ParseStats:
    lines: int = 0
    jobs: int = 0
    steps: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    replaced_bytes_lines: int = 0
    examples: dict[str, str] = field(default_factory=dict)  # first line number seen for each skip reason

    def skip(self, reason: str, where: str | int) -> None:
        """Count a skipped line; `where` is a label or a line number (formatted only when first seen)."""
        self.skipped[reason] += 1
        if reason not in self.examples:
            self.examples[reason] = where if isinstance(where, str) else f"line {where}"


# A record may span this many lines at most (newlines in its job name or comment) before it is skipped.
MAX_JOINED_LINES = 4


class SacctFormatError(ValueError):
    """The input is not sacct output at all (no header, not JSON)."""


# --- small field parsers --------------------------------------------------------------------------


def parse_mem_mb(text: str, n_nodes: int = 1, n_cpus: int = 1) -> float | None:
    """`199G`, `32000M`, `4Gn` (per node), `4Gc` (per CPU) -> total MB for the job."""
    t = text.strip()
    if not t or t in ("0", "Unknown"):
        return None
    m = _MEM.match(t)
    if not m:
        raise ValueError(f"bad memory {text!r}")
    mb = float(m.group("num")) * _UNIT_MB[m.group("unit").upper()]
    per = m.group("per").lower()
    if per == "n":
        mb *= max(n_nodes, 1)
    elif per == "c":
        mb *= max(n_cpus, 1)
    return mb


def parse_tres(text: str) -> dict[str, str]:
    """`cpu=4,mem=4G,gres/gpu:a100=2` -> {'cpu': '4', 'mem': '4G', 'gres/gpu:a100': '2'}."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out


def gpus_from_tres(tres: dict[str, str]) -> tuple[int, str | None]:
    """GPU count and type: the untyped `gres/gpu=N` wins; otherwise typed counts are added up."""
    typed = {k.split(":", 1)[1]: v for k, v in tres.items() if k.startswith("gres/gpu:")}
    gtype = None
    if len(typed) == 1:
        gtype = next(iter(typed))
    elif typed:
        gtype = ",".join(sorted(typed))
    if "gres/gpu" in tres:
        return int(float(tres["gres/gpu"])), gtype
    return sum(int(float(v)) for v in typed.values()), gtype


# The job line's resources (AllocTRES, ReqTRES, NNodes, AllocCPUS, ReqMem) and its Timelimit repeat from
# job to job (array tasks, one sbatch script resubmitted): parsed once per distinct text.  Bounded: cleared
# when full.  Only results are kept; a text that raises is parsed (and raises) every time.
_CACHE_MAX = 4096
_ALLOCATIONS: dict[tuple[str, str, str, str, str], tuple[int, int, int, str | None, float | None]] = {}
_DURATIONS: dict[str, float | None] = {}
_TIMELIMITS: dict[str, float | None] = {}


def _allocation(
    alloc_tres: str, req_tres: str, nnodes: str, alloc_cpus: str, req_mem: str
) -> tuple[int, int, int, str | None, float | None]:
    """(nodes, CPUs, GPUs, GPU type, requested memory MB) of a job line; cached on the five texts."""
    key = (alloc_tres, req_tres, nnodes, alloc_cpus, req_mem)
    hit = _ALLOCATIONS.get(key)
    if hit is not None:
        return hit
    alloc = parse_tres(alloc_tres)
    req = parse_tres(req_tres)
    tres = alloc or req
    n_nodes = _int(nnodes) or int(float(tres.get("node", "0") or 0))
    n_cpus = _int(alloc_cpus) or int(float(tres.get("cpu", "0") or 0))
    gpus, gtype = gpus_from_tres(tres)
    mem = tres.get("mem") or req.get("mem")
    mem_mb = parse_mem_mb(mem, n_nodes, n_cpus) if mem else parse_mem_mb(req_mem, n_nodes, n_cpus)
    if len(_ALLOCATIONS) >= _CACHE_MAX:
        _ALLOCATIONS.clear()
    out = _ALLOCATIONS[key] = (n_nodes, n_cpus, gpus, gtype, mem_mb)
    return out


def _duration(text: str) -> float | None:
    """parse_slurm_duration(text), cached (TotalCPU: a job's steps often repeat its own)."""
    try:
        return _DURATIONS[text]
    except KeyError:
        pass
    secs = parse_slurm_duration(text)
    if len(_DURATIONS) >= _CACHE_MAX:
        _DURATIONS.clear()
    _DURATIONS[text] = secs
    return secs


def parse_exit(text: str) -> tuple[int | None, int | None]:
    t = text.strip()
    if not t:
        return None, None
    code, _, sig = t.partition(":")
    return int(code), int(sig) if sig else None


def _time(text: str, tz: tzinfo) -> datetime | None:
    t = text.strip()
    if not t or t in ("Unknown", "None", "N/A"):
        return None
    dt = datetime.fromisoformat(t)
    return dt if dt.tzinfo else dt.replace(tzinfo=tz)


def _energy(text: str) -> float | None:
    """ConsumedEnergyRaw in J: None when empty, zero or Slurm's unset sentinel."""
    t = text.strip()
    e = float(t) if t else 0.0
    return e if 0 < e < _ENERGY_UNSET else None


def _rss_mb(text: str) -> float | None:
    """sacct's MaxRSS (`1234K`, `2.50M`, `16G`) in MB; None when empty, zero or not a plausible size.

    A bad value must never cost the job its line, so this returns None rather than raising.
    """
    t = text.strip()
    if not t or t == "0":
        return None
    scale = _RSS_UNIT_MB.get(t[-1])
    if scale is not None:
        t = t[:-1]
    else:
        scale = 1 / 1048576
    try:
        mb = float(t) * scale
    except ValueError:
        return None
    return mb if 0 < mb < _RSS_MAX_MB else None  # also False for nan


def _count(text: str) -> int | None:
    """A non-negative count (NTasks, NNodes), or None when empty or not one; never raises."""
    t = text.strip()
    return int(t) if t.isdecimal() and len(t) < 19 else None


def _tasks_per_node(ntasks: int | None, nnodes: int | None) -> int:
    """ceil(tasks / nodes) of a step: the tasks that shared a node; 1 when the task count is unknown."""
    if not ntasks:
        return 1
    return -(-ntasks // max(nnodes or 1, 1))


def _int(text: str) -> int | None:
    t = text.strip()
    return int(t) if t else None


def gpu_usage(tres_ave: str, tres_max: str) -> tuple[float | None, float | None]:
    """(gres/gpuutil of TRESUsageInAve in %, gres/gpumem of TRESUsageInMax in MB) of a step, None where
    Slurm gathered none (no such TRES, or its unset value); never raises: a bad value costs only itself."""
    util = mem = None
    if "gres/gpuutil" in tres_ave:
        v = parse_tres(tres_ave).get("gres/gpuutil", "")
        try:
            x = float(v)
        except ValueError:
            x = -1.0
        util = x if 0.0 <= x <= _GPUUTIL_MAX else None
    if "gres/gpumem" in tres_max:
        v = parse_tres(tres_max).get("gres/gpumem", "")
        mb = _rss_mb(v)  # the same spelling as MaxRSS: bytes, or a K/M/G/T suffix
        mem = mb if mb is not None and mb <= _GPUMEM_MAX_MB else (0.0 if v.strip() == "0" else None)
    return util, mem


def _state(text: str) -> tuple[str, str | None]:
    """`CANCELLED by 12345` -> ('CANCELLED', 'CANCELLED by 12345')."""
    t = text.strip()
    head = t.split(" ", 1)[0].upper().rstrip("+")
    return head, (t if t != head else None)


# --- folding steps into jobs ---------------------------------------------------------------------


@dataclass(slots=True)
class _StepAgg:
    total_cpu_s: float = 0.0
    energy_max_j: float = 0.0
    any_cpu: bool = False
    rss_max_mb: float = 0.0  # the largest MaxRSS of the steps, and that step's tasks per node
    rss_tasks_per_node: int = 1
    n_steps: int = 0
    gpu_util_s: float | None = None  # sum over steps of gres/gpuutil x tasks x the step's elapsed seconds
    gpu_mem_mb: float | None = None  # the largest gres/gpumem of one task in any step
    own_gpu: tuple[float | None, float | None, float | None, int | None] | None = None  # the job line's
    batch: bool = False  # one of its steps is `.batch` (sbatch)
    cpu_steps: list[StepCpu] | None = None  # a multi-node job's steps' CPU use, for its idle nodes

    def add_gpu(
        self, util: float | None, mem: float | None, ntasks: int | None, elapsed_s: float | None
    ) -> None:
        """A step's GPU use: its average per task x its tasks, over its run (steps overlap: .batch and
        srun steps use different processes, so their uses add up)."""
        if util is not None:
            self.gpu_util_s = (self.gpu_util_s or 0.0) + util * (ntasks or 1) * max(elapsed_s or 0.0, 0.0)
        if mem is not None:
            self.gpu_mem_mb = max(self.gpu_mem_mb or 0.0, mem)


class _Folder:
    """Keeps recent jobs open so their steps can be folded in, then releases them in input order."""

    def __init__(self, stats: ParseStats) -> None:
        self.stats = stats
        self.jobs: OrderedDict[str, tuple[JobRecord, _StepAgg]] = OrderedDict()
        self.done: set[str] = set()
        self.het_batch: dict[int, bool | None] = {}  # a het job's leader's batch_step, for its components

    def add_job(self, key: str, rec: JobRecord) -> Iterator[JobRecord]:
        if key in self.jobs:  # the same job twice in one dump (requeue with -D): keep the later one
            self.stats.skip("duplicate job line (later one kept)", key)
        self.jobs[key] = (rec, self.jobs.get(key, (rec, _StepAgg()))[1])
        self.jobs.move_to_end(key)
        while len(self.jobs) > _FOLD_WINDOW:
            yield self._finish(*self.jobs.popitem(last=False))

    def add_step(
        self,
        key: str,
        cpu_s: float | None,
        energy_j: float | None,
        where: str | int,
        rss_mb: float | None = None,
        ntasks: str = "",
        nnodes: str = "",
        gpu: tuple[float | None, float | None, float | None] | None = None,
        step: str = "",
        cpu: StepCpu | None = None,
    ) -> None:
        """Fold a step in; its task and node counts are parsed only if its MaxRSS is the job's largest.
        `gpu`: the step's (gres/gpuutil %, gres/gpumem MB, elapsed s) where Slurm recorded GPU use;
        `step`: its id after the dot (batch, extern, interactive, 0); `cpu`: a multi-node job's step's CPU
        use (cocaq.slurm.idle_nodes)."""
        self.stats.steps += 1
        if key not in self.jobs:
            self.stats.skip("step without its job line", where)
            return
        agg = self.jobs[key][1]
        agg.n_steps += 1
        agg.batch = agg.batch or step == "batch"
        if cpu is not None:
            agg.cpu_steps = [*(agg.cpu_steps or ()), cpu]
        if gpu is not None:
            agg.add_gpu(gpu[0], gpu[1], _count(ntasks), gpu[2])
        if cpu_s is not None:
            agg.total_cpu_s += cpu_s
            agg.any_cpu = True
        if energy_j:
            agg.energy_max_j = max(agg.energy_max_j, energy_j)
        if rss_mb and rss_mb > agg.rss_max_mb:
            agg.rss_max_mb = rss_mb
            agg.rss_tasks_per_node = _tasks_per_node(_count(ntasks), _count(nnodes))

    def _finish(self, key: str, item: tuple[JobRecord, _StepAgg]) -> JobRecord:
        rec, agg = item
        if (rec.total_cpu_s is None or rec.total_cpu_s == 0) and agg.any_cpu:
            rec.total_cpu_s = agg.total_cpu_s
        if rec.total_cpu_s == 0 and not agg.n_steps and not rec.is_open:
            rec.total_cpu_s = None  # no step was accounted: Slurm gathered no CPU time, not "none used"
        if agg.own_gpu is not None and agg.gpu_util_s is None and agg.gpu_mem_mb is None:
            agg.add_gpu(agg.own_gpu[0], agg.own_gpu[1], agg.own_gpu[3], agg.own_gpu[2])
        finish_gpu(rec, agg.gpu_util_s, agg.gpu_mem_mb)
        rec.batch_step = agg.batch if agg.n_steps else None
        het_batch(rec, self.het_batch)
        if agg.cpu_steps and not rec.is_open:
            rec.zero_cpu_nodes = idle_nodes(rec.node_list, agg.cpu_steps)
        if not rec.consumed_energy_j and agg.energy_max_j:
            # Steps overlap in time (.batch and .extern span the job), so their energies are not added:
            # the largest is the best lower bound of the job's node energy.
            rec.consumed_energy_j = agg.energy_max_j
        if agg.rss_max_mb > (rec.max_rss_mb or 0.0):  # MaxRSS is per task: the largest step's, with its tasks
            rec.max_rss_mb = agg.rss_max_mb
            rec.rss_tasks_per_node = agg.rss_tasks_per_node
        self.stats.jobs += 1
        return rec

    def flush(self) -> Iterator[JobRecord]:
        while self.jobs:
            yield self._finish(*self.jobs.popitem(last=False))


def het_batch(rec: JobRecord, leaders: dict[int, bool | None]) -> None:
    """A het job's batch script runs in its first component (`12+0.batch`): the others (`12+1`, with only
    numbered steps) take the leader's batch_step, or None where the leader was not read before them."""
    if rec.het_job_id is None or rec.het_job_offset is None:
        return
    if rec.het_job_offset == 0:
        leaders[rec.het_job_id] = rec.batch_step
    elif not rec.batch_step:
        rec.batch_step = leaders.get(rec.het_job_id)


def finish_gpu(rec: JobRecord, gpu_util_s: float | None, gpu_mem_mb: float | None) -> None:
    """The job's Slurm GPU signals from its steps': gres/gpuutil as a mean over the run (summed over its
    GPUs, % of one GPU) and the most GPU memory one task held (MB)."""
    if gpu_util_s is not None and rec.elapsed_s > 0:
        rec.slurm_gpu_util = gpu_util_s / rec.elapsed_s
    if gpu_mem_mb is not None:
        rec.slurm_gpu_mem_mb = gpu_mem_mb


def _step_gpu(get: Any) -> tuple[float | None, float | None, float | None] | None:
    """(gres/gpuutil %, gres/gpumem MB, elapsed s) of a parsable step line, None where it has neither."""
    ave, top = get("tresusageinave"), get("tresusageinmax")
    if "gres/gpu" not in ave and "gres/gpu" not in top:
        return None
    util, mem = gpu_usage(ave, top)
    if util is None and mem is None:
        return None
    el = _count(get("elapsedraw"))
    return util, mem, float(el) if el is not None else parse_slurm_duration(get("elapsed"))


def _step_cpu(get: Any, step: str, total_cpu_s: float | None) -> StepCpu | None:
    """A parsable step line's CPU use for cocaq.slurm.idle_nodes, None where sacct printed no minimum."""
    tres_min = get("tresusageinmin")
    if "cpu=" not in tres_min:
        return None
    return step_cpu_text(
        step, get("nodelist"), get("nnodes"), get("ntasks"), total_cpu_s, tres_min,
        get("tresusageinminnode"), get("tresusageinmintask"),
    )  # fmt: skip


def _classify_state(
    rec_state: str, start: datetime | None, stats: ParseStats, where: str | int
) -> tuple[bool, bool]:
    """(keep, is_open) for a job line."""
    if rec_state in NOT_STARTED_STATES:
        stats.skip("pending (not started yet)", where)
        return False, False
    if rec_state in OPEN_STATES:
        if start is None:
            stats.skip("no start time", where)
            return False, False
        return True, True
    if rec_state in FINAL_STATES:
        if start is None:
            stats.skip("never started (ended before it ran)", where)
            return False, False
        return True, False
    stats.skip(f"unknown state {rec_state[:32]!r}", where)
    return False, False


# --- parsable (--parsable / --parsable2) ---------------------------------------------------------


def _decode(raw: bytes, stats: ParseStats) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.replaced_bytes_lines += 1
        return raw.decode("utf-8", errors="replace")


def iter_parsable(
    lines: Iterable[bytes],
    *,
    tz: tzinfo,
    delimiter: str = "|",
    fields: list[str] | None = None,
    default_cluster: str | None = None,
    stats: ParseStats | None = None,
) -> Iterator[JobRecord]:
    """Jobs from `sacct --parsable[2]` lines, with a header line or with `fields` naming the columns."""
    st = stats if stats is not None else ParseStats()
    folder = _Folder(st)
    cols: list[str] | None = [f.strip() for f in fields] if fields else None
    idx: dict[str, int] = {}
    if cols:
        idx = {c.lower(): i for i, c in enumerate(cols)}
    first = True
    trailing: bool | None = None  # whether lines end with the delimiter (--parsable); None: not known
    carry: tuple[str, int, int] | None = None  # a record cut by a newline in a value: text, lines, where
    names: list[str] | None = None  # the columns' lower-case names, once they are known
    lay: _StepLayout | None = None  # where a step line's fields are, once the columns are known
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            line = _decode(raw, st).rstrip("\r\n")
        joined, where = 0, lineno
        if carry is not None:  # sacct prints a value's newline as it is: the record may go on here
            if _whole_record(line, delimiter, cols, idx):  # no: the carried one was cut short
                st.lines += 1
                st.skip("wrong number of fields (a record cut short)", carry[2])
            else:
                line, joined, where = f"{carry[0]}\n{line}", carry[1], carry[2]
            carry = None
        if first:
            line = line.lstrip("\ufeff")  # a byte order mark from an editor or a Windows export
        if not line or line.isspace():  # (not line.strip(), without copying the line)
            continue
        parts = line.split(delimiter)
        if first:
            first = False
            head = _header(parts, cols, idx)
            if head is not None:
                cols, trailing = head
                idx = {c.lower(): i for i, c in enumerate(cols)}
                continue
        assert cols is not None
        n = len(cols)
        if len(parts) == n + 1 and parts[-1] == "" and trailing is not False:
            parts = parts[:-1]  # --parsable leaves a trailing delimiter
        if len(parts) < n and joined < MAX_JOINED_LINES and _starts_a_record(parts, idx):
            carry = (line, joined + 1, where)  # a job name or comment with a newline: wait for the rest
            continue
        st.lines += 1
        lineno = where
        if len(parts) != n:
            st.skip(f"wrong number of fields ({len(parts)}, expected {n}; delimiter inside a value?)", lineno)
            continue
        if lay is None:  # the columns are known from here on
            lay = _StepLayout(idx)
        jobid = parts[lay.jobid].strip() if lay.jobid is not None else ""
        try:
            if "." in jobid:  # a step (2/3 of a dump): only its CPU time and energy matter
                _step_line(jobid, parts, idx, lay, folder, lineno)
                continue

            if names is None:
                names = [c.lower() for c in cols]
            # A field by its lower-case name, "" where the dump has no such column (C lookups, no closure)
            get = defaultdict(str, zip(names, parts, strict=True)).__getitem__
            yield from _row_to_job(get, tz, default_cluster, folder, st, lineno)
        except (ValueError, OverflowError) as exc:
            st.skip(f"bad value ({_reason(exc)})", lineno)
    if carry is not None:
        st.lines += 1
        st.skip("wrong number of fields (the last record is cut short)", carry[2])
    yield from folder.flush()


def _step_line(
    jobid: str, parts: list[str], idx: dict[str, int], lay: _StepLayout, folder: _Folder, lineno: int
) -> None:
    """Fold a step line (its id has a dot) into its job, read by position from what `lay` says it needs."""
    m = _JOBID.match(jobid)
    if not m:
        folder.stats.skip("bad job id", lineno)
        return
    base, step = m.group("base", "step")
    if not step:
        folder.stats.skip("bad job id", lineno)
        return
    rss = _rss_mb(parts[lay.rss]) if lay.rss is not None else None
    gpu = None
    if lay.ave is not None and "gres/gpu" in parts[lay.ave]:
        gpu = _step_gpu(lambda name, parts=parts, idx=idx: _field(parts, idx, name))
    i_tasks, i_nodes = (lay.tasks, lay.nodes) if rss or gpu else (None, None)
    cpu_s = _duration(parts[lay.cpu]) if lay.cpu is not None else None
    held = folder.jobs.get(base)
    cpu_use = None
    if held is not None and lay.tres_min and held[0].n_nodes > 1:
        cpu_use = _step_cpu(lambda name, parts=parts, idx=idx: _field(parts, idx, name), step, cpu_s)
    folder.add_step(
        base,
        cpu_s,
        _energy(parts[lay.energy]) if lay.energy is not None else None,
        lineno,
        rss,
        parts[i_tasks] if i_tasks is not None else "",
        parts[i_nodes] if i_nodes is not None else "",
        gpu,
        step,
        cpu_use,
    )


def _header(parts: list[str], cols: list[str] | None, idx: dict[str, int]) -> tuple[list[str], bool] | None:
    """(the columns, whether lines end with the delimiter) where the first line is a header; None where it
    is a record and `--fields` (`cols`, `idx`) names the columns. Raises where neither tells them."""
    looks_like_header = parts[0].strip().lower() in ("jobid", "jobidraw") or "JobID" in parts
    if looks_like_header:
        trailing = len(parts) > 1 and parts[-1] == ""
        if trailing:
            parts = parts[:-1]
        header = [p.strip() for p in parts]
        if cols and [c.lower() for c in header] != [c.lower() for c in cols]:
            raise SacctFormatError(
                f"line 1: the header ({','.join(header)}) differs from --fields ({','.join(cols)})"
            )
        return header, trailing
    if cols is None:
        raise SacctFormatError(
            "line 1 is not a sacct header: pass --fields with the columns in the order of sacct's "
            "--format (archived dumps usually have no header)"
        )
    if "jobid" not in idx and "jobidraw" not in idx:
        raise SacctFormatError("--fields must name JobID (or JobIDRaw)")
    return None


class _StepLayout:
    """The columns a step line is read from (None: not in the dump), looked up once per dump."""

    __slots__ = ("ave", "cpu", "energy", "jobid", "nodes", "rss", "tasks", "tres_min")

    def __init__(self, idx: dict[str, int]) -> None:
        self.jobid = idx.get("jobid", idx.get("jobidraw"))
        self.cpu = idx.get("totalcpu")
        self.energy = idx.get("consumedenergyraw")
        self.rss = idx.get("maxrss")
        self.ave = idx.get("tresusageinave")
        self.tasks = idx.get("ntasks")
        self.nodes = idx.get("nnodes")
        self.tres_min = "tresusageinmin" in idx


def _field(parts: list[str], idx: dict[str, int], name: str) -> str:
    i = idx.get(name)
    return parts[i] if i is not None else ""


def _starts_a_record(parts: list[str], idx: dict[str, int]) -> bool:
    """Whether these fields begin with a job id: what a record cut by a newline in its name still has."""
    i = idx.get("jobid", idx.get("jobidraw"))
    return i is not None and i < len(parts) - 1 and _JOBID.match(parts[i].strip()) is not None


def _whole_record(line: str, delimiter: str, cols: list[str] | None, idx: dict[str, int]) -> bool:
    """Whether `line` is a record of its own (every field, a job id): never the rest of the one before."""
    if cols is None:
        return False
    parts = line.rstrip("\r\n").split(delimiter)
    n = len(cols)
    if len(parts) == n + 1 and parts[-1] == "":
        parts = parts[:-1]
    return len(parts) == n and _starts_a_record(parts, idx)


def _reason(exc: Exception) -> str:
    msg = str(exc)
    # Keep counted reasons few: strip the offending value so identical problems group together.
    return re.sub(r"'[^']*'|\"[^\"]*\"", "…", msg)[:80]


def _row_to_job(
    get: Any, tz: tzinfo, default_cluster: str | None, folder: _Folder, st: ParseStats, where: str | int
) -> Iterator[JobRecord]:
    jobid = get("jobid").strip() or get("jobidraw").strip()
    m = _JOBID.match(jobid)
    if not m:
        st.skip("bad job id", where)
        return
    base = m.group("base")
    rss = _rss_mb(get("maxrss"))
    if m.group("step"):
        _row_to_step(get, base, m.group("step"), rss, folder, where)
        return
    # MaxRSS is a step's; a job line that has one counts as a step of its own
    tpn = _tasks_per_node(_count(get("ntasks")), _count(get("nnodes"))) if rss else None
    state, detail = _state(get("state"))
    if not state:
        st.skip("no state", where)
        return
    start = _time(get("start"), tz)
    keep, is_open = _classify_state(state, start, st, where)
    if not keep:
        return
    submit = _time(get("submit"), tz) or _time(get("eligible"), tz) or start
    user, uid = _row_user(get)
    if not user:
        st.skip("no user", where)
        return
    end = None if is_open else _time(get("end"), tz)
    elapsed_s, end = _run_time(_row_elapsed(get), start, end, is_open)
    nnodes, ncpus, gpus, gtype, req_mem = _allocation(
        get("alloctres"), get("reqtres"), get("nnodes"), get("alloccpus"), get("reqmem")
    )
    nodelist = _assigned(get("nodelist"))
    if not nodelist and not elapsed_s and not is_open:
        st.skip("never started (no node assigned)", where)
        return
    code, sig = parse_exit(get("exitcode"))
    task = m.group("task")
    rec = JobRecord(
        job_id=base,
        user_name=user,
        submit_time=submit or start,  # type: ignore[arg-type]
        state=state,
        cluster=get("cluster").strip() or default_cluster,
        job_id_raw=_int(get("jobidraw")),
        array_job_id=int(m.group("id")) if task is not None else None,
        array_task_id=int(task) if task is not None and task.isdigit() else None,
        het_job_id=int(m.group("id")) if m.group("het") is not None else None,
        het_job_offset=int(m.group("het")) if m.group("het") is not None else None,
        uid=uid,
        account=get("account").strip() or None,
        partition=get("partition").strip() or None,
        qos=get("qos").strip() or None,
        node_list=nodelist or None,
        n_nodes=nnodes,
        alloc_cpus=ncpus,
        alloc_gpus=gpus,
        gpu_type=gtype,
        req_mem_mb=req_mem,
        start_time=start,
        end_time=end,
        elapsed_s=elapsed_s,
        time_limit_s=_timelimit(get("timelimit")),
        state_detail=detail,
        is_open=is_open,
        exit_code=code,
        exit_signal=sig,
        name=get("jobname") or None,
        comment=get("comment") or None,
        total_cpu_s=_duration(get("totalcpu")),
        consumed_energy_j=_energy(get("consumedenergyraw")),
        max_rss_mb=rss,
        rss_tasks_per_node=tpn,
    )
    own_gpu = _step_gpu(get)  # a job line's usage (sacct's sum of its steps'): used only without steps'
    yield from folder.add_job(base, rec)
    if own_gpu is not None:
        folder.jobs[base][1].own_gpu = (*own_gpu, _count(get("ntasks")))


def _assigned(nodes: str) -> str:
    """A job's node list, "" where Slurm assigned none (`None assigned`, `(null)`)."""
    t = nodes.strip()
    return "" if t.lower() in ("none assigned", "(null)") else t


def _row_user(get: Any) -> tuple[str, int | None]:
    """(user name, UID) of a job line: `uid:N` names a user sacct could not resolve; "" where neither."""
    user = get("user").strip()
    uid = _int(get("uid"))
    if not user and uid is not None:
        user = f"uid:{uid}"
    return user, uid


def _row_elapsed(get: Any) -> float | None:
    """A job line's run time in seconds: ElapsedRaw, else Elapsed; None where it has neither."""
    elapsed = _int(get("elapsedraw"))
    return float(elapsed) if elapsed is not None else parse_slurm_duration(get("elapsed"))


def _row_to_step(
    get: Any, base: str, step: str, rss: float | None, folder: _Folder, where: str | int
) -> None:
    """Fold in a step line that reached `_row_to_job` (an empty JobID, a step's JobIDRaw)."""
    cpu = parse_slurm_duration(get("totalcpu"))
    held = folder.jobs.get(base)
    multi = held is not None and held[0].n_nodes > 1
    folder.add_step(
        base,
        cpu,
        _energy(get("consumedenergyraw")),
        where,
        rss,
        get("ntasks"),
        get("nnodes"),
        _step_gpu(get),
        step,
        _step_cpu(get, step, cpu) if multi else None,
    )


def _run_time(
    elapsed: float | None, start: datetime | None, end: datetime | None, is_open: bool
) -> tuple[float, datetime | None]:
    """Elapsed seconds and end time, each filled from the other when Slurm lost one of them."""
    if elapsed is None:
        elapsed = (end - start).total_seconds() if (start and end) else 0.0
    if end is None and not is_open and start is not None:
        end = start + timedelta(seconds=elapsed)  # a finished job whose End was lost
    return elapsed, end


def _timelimit(text: str) -> float | None:
    try:
        return _TIMELIMITS[text]
    except KeyError:
        pass
    secs = _timelimit_of(text)
    if len(_TIMELIMITS) >= _CACHE_MAX:
        _TIMELIMITS.clear()
    _TIMELIMITS[text] = secs
    return secs


def _timelimit_of(text: str) -> float | None:
    t = text.strip()
    if not t or t in ("UNLIMITED", "Partition_Limit", "INVALID"):
        return None
    if t.isdigit():  # bare minutes
        return int(t) * 60.0
    return parse_slurm_duration(t)


# --- JSON (--json) -------------------------------------------------------------------------------


def _n(v: Any) -> float | None:
    """A number in any data_parser version: plain, or {"set": .., "infinite": .., "number": ..}."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str) and v.strip():
        return float(v)
    return None


def _epoch(v: Any) -> datetime | None:
    x = _n(v)
    return datetime.fromtimestamp(x, UTC) if x else None


def _tres_list(items: Any) -> dict[str, str]:
    """JSON TRES lists -> the same `type[/name]` keys as the text form."""
    out: dict[str, str] = {}
    if not isinstance(items, list):
        return out
    for t in items:
        if not isinstance(t, dict):
            continue
        key = str(t.get("type") or "")
        if t.get("name"):
            key += "/" + str(t["name"])
        if key and t.get("count") is not None:  # 22.05 lists energy with a null count
            out[key] = str(t["count"])
    return out


def _json_job(j: dict[str, Any], default_cluster: str | None, st: ParseStats, where: str) -> JobRecord | None:
    # Read in a fixed order (a bad value raises where it is met, and the skip names the first one).
    job_id = int(_n(j.get("job_id")) or 0)
    if not job_id:
        st.skip("bad job id", where)
        return None
    display, arr_job, task, het_job, het_off = _json_ids(j, job_id)
    state, detail = _json_state(j)
    t = j.get("time") or {}
    start = _epoch(t.get("start"))
    keep, is_open = _classify_state(state, start, st, where)
    if not keep:
        return None
    assoc = j.get("association") or {}
    user = str(j.get("user") or assoc.get("user") or "").strip()
    if not user:
        st.skip("no user", where)
        return None
    ncpus, nnodes, gpus, gtype, mem_mb = _json_allocation(j)
    nodes = _assigned(str(j.get("nodes") or ""))
    if not nodes and not _n(t.get("elapsed")) and not is_open:
        st.skip("never started (no node assigned)", where)
        return None
    code, sig = _json_exit(j)
    total_cpu = _json_cpu_time(t.get("total") or {})
    steps = j.get("steps") or []
    agg = _json_steps(steps, nnodes > 1 and not is_open, st)
    if not total_cpu and agg.any_cpu:
        total_cpu = agg.cpu_s
    if total_cpu == 0 and not steps and not is_open:
        total_cpu = None  # no step was accounted: Slurm gathered no CPU time, not "none used"
    limit = _n(t.get("limit"))
    end = None if is_open else _epoch(t.get("end"))
    elapsed, end = _run_time(_n(t.get("elapsed")), start, end, is_open)
    rec = JobRecord(
        job_id=display,
        user_name=user,
        submit_time=_epoch(t.get("submission")) or start,  # type: ignore[arg-type]
        state=state,
        cluster=str(j.get("cluster") or assoc.get("cluster") or "") or default_cluster,
        job_id_raw=job_id,
        array_job_id=arr_job if arr_job and task is not None else None,
        array_task_id=int(task) if arr_job and task is not None else None,
        het_job_id=het_job or None,
        het_job_offset=int(het_off) if het_job and het_off is not None else None,
        uid=None,
        account=str(j.get("account") or assoc.get("account") or "") or None,
        partition=str(j.get("partition") or assoc.get("partition") or "") or None,
        qos=str(j.get("qos") or "") or None,
        node_list=nodes or None,
        n_nodes=nnodes,
        alloc_cpus=ncpus,
        alloc_gpus=gpus,
        gpu_type=gtype,
        req_mem_mb=mem_mb,
        start_time=start,
        end_time=end,
        elapsed_s=float(elapsed),
        time_limit_s=limit * 60.0 if limit else None,
        state_detail=detail,
        is_open=is_open,
        exit_code=int(code) if code is not None else None,
        exit_signal=int(sig) if sig is not None else None,
        name=str(j.get("name")) if j.get("name") is not None else None,
        comment=_json_comment(j),
        total_cpu_s=total_cpu,
        consumed_energy_j=agg.energy_j,
        max_rss_mb=agg.rss_mb,
        rss_tasks_per_node=agg.rss_tpn,
    )
    finish_gpu(rec, agg.gpu_util_s, agg.gpu_mem_mb)
    rec.batch_step = _json_batch_step(steps)
    if agg.cpu_steps:
        rec.zero_cpu_nodes = idle_nodes(rec.node_list, agg.cpu_steps)
    return rec


def _json_ids(j: dict[str, Any], job_id: int) -> tuple[str, int, float | None, int, float | None]:
    """(the id as sacct's text prints it, array job id, task id, het job id, het offset) of a JSON job:
    `12_3`, `12_[1-4]` (a pending array's tasks), `12+1`, or the plain id."""
    arr = j.get("array") or {}
    arr_job = int(_n(arr.get("job_id")) or 0)
    task_raw = arr.get("task_id")
    task = _n(task_raw) if not isinstance(task_raw, str) else None
    het = j.get("het") or {}
    het_job = int(_n(het.get("job_id")) or 0)
    het_off = _n(het.get("job_offset"))
    if arr_job and task is not None:
        display = f"{arr_job}_{int(task)}"
    elif arr_job and isinstance(arr.get("task"), str) and arr.get("task"):
        display = f"{arr_job}_[{arr['task']}]"
    elif het_job and het_off is not None:
        display = f"{het_job}+{int(het_off)}"
    else:
        display = str(job_id)
    return display, arr_job, task, het_job, het_off


def _json_state(j: dict[str, Any]) -> tuple[str, str | None]:
    """(base state, `CANCELLED by NAME` where Slurm recorded who cancelled it) of a JSON job."""
    state_obj = j.get("state") or {}
    cur = state_obj.get("current") if isinstance(state_obj, dict) else state_obj
    if isinstance(cur, list):  # newer data_parser: a list of flags, the base state first
        cur = cur[0] if cur else ""
    state, _ = _state(str(cur or ""))
    detail = None
    killer = j.get("kill_request_user")
    if state == "CANCELLED" and isinstance(killer, str) and killer:
        detail = f"CANCELLED by {killer}"  # the text output's `CANCELLED by UID`, with the name
    return state, detail


def _json_allocation(j: dict[str, Any]) -> tuple[int, int, int, str | None, float | None]:
    """(CPUs, nodes, GPUs, GPU type, memory MB) of a JSON job: its allocated TRES, else the requested."""
    tres_obj = j.get("tres") or {}
    alloc = _tres_list(tres_obj.get("allocated"))
    req = _tres_list(tres_obj.get("requested"))
    tres = alloc or req
    gpus, gtype = gpus_from_tres(tres)
    gres_detail = j.get("gres_detail") or []
    for g in gres_detail if isinstance(gres_detail, list) else []:
        mm = re.match(r"gpu:([^:(]+):\d+", str(g))
        if mm:
            gtype = mm.group(1)
    ncpus = int(float(tres.get("cpu", "0")))
    nnodes = int(_n(j.get("allocation_nodes")) or float(tres.get("node", "0") or 0))
    mem_mb = float(tres["mem"]) if "mem" in tres else None
    return ncpus, nnodes, gpus, gtype, mem_mb


def _json_exit(j: dict[str, Any]) -> tuple[float | None, float | None]:
    """(return code, signal) of a JSON job; as the text output's ExitCode "3:0" / "0:9", the other half
    of a known one is 0, not unknown."""
    ec = j.get("exit_code") or {}
    code = _n(ec.get("return_code")) if isinstance(ec, dict) else None
    sig_obj = ec.get("signal") if isinstance(ec, dict) else None
    # v0.0.38 names it signal_id, v0.0.40+ id
    sig = _n(sig_obj.get("signal_id", sig_obj.get("id")) if isinstance(sig_obj, dict) else None)
    if code is not None and sig is None:
        sig = 0.0
    elif sig is not None and code is None:
        code = 0.0
    return code, sig


def _json_cpu_time(total: Any) -> float | None:
    """A JSON job's `time.total` (its CPU time) in seconds, None where Slurm gave none."""
    if isinstance(total, dict) and ("seconds" in total or "microseconds" in total):
        return (_n(total.get("seconds")) or 0.0) + (_n(total.get("microseconds")) or 0.0) / 1e6
    return None


def _json_comment(j: dict[str, Any]) -> str | None:
    """A JSON job's comment: a text, or (newer data_parser) the `job` one of a dict of comments."""
    comment = j.get("comment")
    if isinstance(comment, dict):
        comment = comment.get("job")
    return str(comment) if comment else None


@dataclass(slots=True)
class _JsonSteps:
    """What a JSON job's steps add up to (None: no step had it)."""

    energy_j: float | None = None  # the largest step energy (steps overlap in time)
    cpu_s: float = 0.0  # the steps' CPU time, summed
    any_cpu: bool = False
    rss_mb: float | None = None  # the largest MaxRSS of a step, and that step's tasks per node
    rss_tpn: int | None = None
    gpu_util_s: float | None = None
    gpu_mem_mb: float | None = None
    cpu_steps: list[StepCpu] = field(default_factory=list)  # for a finished multi-node job's idle nodes


def _json_steps(steps: Any, idle_nodes_wanted: bool, st: ParseStats) -> _JsonSteps:
    """Fold a JSON job's steps (counted in `st.steps`); their CPU use per node where `idle_nodes_wanted`."""
    agg = _JsonSteps()
    for s in steps:
        st.steps += 1
        su = _json_step_gpu(s)
        if su is not None:
            if su[0] is not None:
                agg.gpu_util_s = (agg.gpu_util_s or 0.0) + su[0]
            if su[1] is not None:
                agg.gpu_mem_mb = max(agg.gpu_mem_mb or 0.0, su[1])
        e = _step_energy(s)
        if e:
            agg.energy_j = max(agg.energy_j or 0.0, e)
        rss = _step_rss(s)
        if rss is not None and rss[0] > (agg.rss_mb or 0.0):
            agg.rss_mb, agg.rss_tpn = rss
        stt = (s.get("time") or {}).get("total") or {}
        s_cpu = None
        if isinstance(stt, dict) and "seconds" in stt:
            s_cpu = (_n(stt.get("seconds")) or 0.0) + (_n(stt.get("microseconds")) or 0.0) / 1e6
            agg.cpu_s += s_cpu
            agg.any_cpu = True
        if idle_nodes_wanted:
            sc = step_cpu_json(s, s_cpu)
            if sc is not None:
                agg.cpu_steps.append(sc)
    return agg


def _json_batch_step(steps: Any) -> bool | None:
    """Whether a JSON job's steps hold its batch step: `step.id` is "batch" (v0.0.38) or "24.batch"
    (v0.0.40+; pyslurm's step ids are the same words). None without steps, or where a step's id is
    missing (then a batch step may be the one not named)."""
    if not isinstance(steps, list) or not steps:
        return None
    for s in steps:
        sid = ((s.get("step") or {}) if isinstance(s, dict) else {}).get("id")
        if sid is None or (isinstance(sid, str) and not sid.strip()):
            return None
        if str(sid).rsplit(".", 1)[-1].strip() == "batch":
            return True
    return False


def _json_tres_usage(step: dict[str, Any], which: str, name: str) -> str:
    """`gres/NAME=COUNT` of a JSON step's tres.requested[which] list, as the text form spells it."""
    tres = step.get("tres")
    req = tres.get("requested") if isinstance(tres, dict) else None
    items = req.get(which) if isinstance(req, dict) else None
    for t in items if isinstance(items, list) else []:
        if isinstance(t, dict) and t.get("type") == "gres" and t.get("name") == name:
            x = _safe_n(t.get("count"))
            if x is not None:
                return f"gres/{name}={x:.0f}"
    return ""


def _json_step_gpu(step: Any) -> tuple[float | None, float | None] | None:
    """(gres/gpuutil x tasks x elapsed, gres/gpumem MB) of a JSON step, None where it has neither."""
    if not isinstance(step, dict):
        return None
    util, mem = gpu_usage(
        _json_tres_usage(step, "average", "gpuutil"), _json_tres_usage(step, "max", "gpumem")
    )
    if util is None and mem is None:
        return None
    t = step.get("time")
    el = _safe_n(t.get("elapsed")) if isinstance(t, dict) else None
    tasks = _json_count(step.get("tasks")) or 1
    return (util * tasks * max(el or 0.0, 0.0) if util is not None else None), mem


def _step_energy(step: dict[str, Any]) -> float | None:
    stats = step.get("statistics") or {}
    e = _n((stats.get("energy") or {}).get("consumed")) if isinstance(stats, dict) else None
    if not (e and 0 < e < _ENERGY_UNSET):
        consumed = ((step.get("tres") or {}).get("consumed") or {}).get("total")
        e = _n(_tres_list(consumed).get("energy"))
    return e if e and 0 < e < _ENERGY_UNSET else None


def _safe_n(v: Any) -> float | None:
    """_n() that answers None instead of raising: for optional values that must not cost the job."""
    try:
        return _n(v)
    except (ValueError, OverflowError):
        return None


def _json_count(obj: Any) -> int | None:
    """`{"count": N}` (a step's tasks or nodes) -> N, or None when missing or not a sane count."""
    x = _safe_n(obj.get("count")) if isinstance(obj, dict) else None
    return int(x) if x is not None and 0 < x < 2.0**62 else None


def _step_rss(step: Any) -> tuple[float, int] | None:
    """(MaxRSS in MB, tasks per node) of a JSON step, or None: `tres.requested.max`'s mem, in bytes."""
    if not isinstance(step, dict):
        return None
    tres = step.get("tres")
    req = tres.get("requested") if isinstance(tres, dict) else None
    top = req.get("max") if isinstance(req, dict) else None
    if not isinstance(top, list):
        return None
    mb = None
    for t in top:
        if isinstance(t, dict) and t.get("type") == "mem" and not t.get("name"):
            b = _safe_n(t.get("count"))
            mb = b / 1048576 if b is not None else None
            break
    if mb is None or not 0 < mb < _RSS_MAX_MB:  # 0: nothing gathered; NO_VAL64 bytes: not measured
        return None
    nodes = step.get("nodes")
    n_nodes = _json_count(nodes)
    if n_nodes is None and isinstance(nodes, dict) and isinstance(nodes.get("list"), list):
        n_nodes = len(nodes["list"]) or None
    return mb, _tasks_per_node(_json_count(step.get("tasks")), n_nodes)


def iter_json(
    data: bytes | str | IO[bytes], *, default_cluster: str | None = None, stats: ParseStats | None = None
) -> Iterator[JobRecord]:
    """Jobs from `sacct --json` output (Slurm 22.05's data_parser and later ones)."""
    st = stats if stats is not None else ParseStats()
    try:
        raw = data.read() if hasattr(data, "read") else data
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                st.replaced_bytes_lines += 1
                text = raw.decode("utf-8", errors="replace")
        else:
            text = raw
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SacctFormatError(f"not valid sacct JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise SacctFormatError("not sacct JSON: no top-level 'jobs' list")
    yield from iter_job_dicts(doc["jobs"], default_cluster=default_cluster, stats=st)


def iter_job_dicts(
    jobs: Iterable[Any], *, default_cluster: str | None = None, stats: ParseStats | None = None
) -> Iterator[JobRecord]:
    """Jobs from dicts of sacct --json's shape (its `jobs` list; cocaq.slurm.slurmdb builds the same from
    pyslurm), with one job's record per (id, submit time): a repeated one replaces the earlier."""
    st = stats if stats is not None else ParseStats()
    seen: dict[tuple[str, Any], int] = {}
    out: list[JobRecord] = []
    leaders: dict[int, bool | None] = {}
    for i, j in enumerate(jobs):
        st.lines += 1
        where = f"jobs[{i}]"
        if not isinstance(j, dict):
            st.skip("bad job entry", where)
            continue
        try:
            rec = _json_job(j, default_cluster, st, where)
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError) as exc:
            st.skip(f"bad value ({_reason(exc)})", where)
            continue
        if rec is None:
            continue
        het_batch(rec, leaders)
        key = (rec.job_id, rec.submit_time)
        if key in seen:
            st.skip("duplicate job line (later one kept)", where)
            out[seen[key]] = rec
            continue
        seen[key] = len(out)
        out.append(rec)
    st.jobs += len(out)
    yield from out


def sniff_format(head: bytes) -> str:
    """'json' or 'parsable' from the first bytes of a dump."""
    return "json" if head.lstrip()[:1] in (b"{", b"[") else "parsable"
