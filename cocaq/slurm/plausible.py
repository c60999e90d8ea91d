"""Plausibility rules for a job record: one place, applied once to every record of every input path.

sacct's parsable and JSON output, the demo and a recompute (and any reader to come, pyslurm's) all
become `JobRecord`s, and every one passes `check` on its way into `cocaq.accounting.importer.import_records`.
What
a user controls (job names, comments) or a broken accounting database produced (absurd counts, times,
energies) is made safe here, so that one bad record can neither abort a batch (a value the column cannot
hold) nor be stored as an absurd figure that every report then adds up.

The rules, each either a skip of the whole record or a clamp of one field, with the reason the import
summary shows:

* Text: lone UTF-16 surrogates (they cannot be encoded) become U+FFFD, NUL and other control characters
  go (a comment keeps its newlines and tabs); a job's name and comment are cut to MAX_NAME and
  MAX_COMMENT characters. What identifies a job (its id, user, account, partition, QOS, cluster, state)
  is never cut: longer than its column, the record is skipped, since a cut name could merge two users.
* Whole numbers the columns hold: ids within 0..2^63-1, counts (nodes, CPUs, GPUs) within 0..MAX_COUNT
  (a negative or larger count: the record is skipped), a UID, exit code and signal within 0..2^31-1
  (else dropped).
* Times: submit, start and end between EARLIEST and a day after now (else the record is skipped); a job
  cannot end before it started (skipped); the elapsed time is at most end - start, or now - start for a
  running job (else clamped to it), never negative.
* Times that contradict each other: a finished job whose start lies more than SUSPEND_MAX before its end
  minus its elapsed time has its start set to end - elapsed (Slurm's Elapsed leaves out only suspended
  time, and no job is suspended for a month: the start is the wrong one, and would put its energy in the
  wrong month; a submit time before that wrong start moves with it, keeping its wait); with no elapsed time
  at all it is skipped (when it ran cannot be told). Then a submit time after the start is set to the
  start (a job cannot start before it is submitted): in this order, a right submit time is never moved
  back to a wrong start.
* Energy: Slurm's ConsumedEnergy at most nodes x elapsed x `[estimate] max_node_power_w` (else dropped:
  the job is then estimated, as one without a measurement); CPU time at most the allocated cores x the
  elapsed time, with a margin (else dropped); a TotalCPU of exactly 0 on a job that ended after
  CPU_UNKNOWN_AFTER_S or longer is "not gathered" (no jobacct_gather, steps not accounted), never "no CPU
  used" (a running job's 0 only says that no step has ended yet, and its estimate reads it so): dropped, so
  that the job is estimated from its allocated cores and gets no CPU-efficiency advice; memory figures
  finite and non-negative; Slurm's GPU use (gres/gpuutil, gres/gpumem) finite, non-negative and bounded.

Stdlib only, and cheap: it runs for each of a million records of an import.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta

from cocaq.slurm.record import JobRecord

INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1
MAX_COUNT = 10_000_000  # nodes, CPUs or GPUs of one job: far beyond any cluster, well within int4
MAX_NAME = 1024
MAX_COMMENT = 4096
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
FUTURE = timedelta(days=1)
DEFAULT_MAX_NODE_POWER_W = 20_000.0  # a GPU node at full load draws 10-15 kW; a margin for what comes
CPU_MARGIN = 1.05  # TotalCPU a little over cores x elapsed is accounting noise; far over is not
# A job that ran this long used some CPU time; Slurm's 00:00:00 then means it gathered none (GA4HPC and
# seff read it so too). Shorter jobs (a `sleep`, a failed start) can truly show next to nothing.
CPU_UNKNOWN_AFTER_S = 300.0
# Longer than any suspension: a start this far before end - elapsed is a wrong start.
SUSPEND_MAX = timedelta(days=30)
GPU_UTIL_MAX = 100.0 * 1024  # gres/gpuutil summed over a job's GPUs, % of one GPU
GPU_MEM_MAX_MB = 1024.0**3
TOTALCPU_UNKNOWN = "TotalCPU 00:00:00 over 5 minutes: not gathered by Slurm (estimated from allocated cores)"

# Identity fields: the column width (cocaq.db.schema.Job, Cluster); never cut.
IDENTITY = (
    ("job_id", 64),
    ("user_name", 64),
    ("account", 64),
    ("partition", 128),
    ("qos", 64),
    ("cluster", 128),
    ("state", 32),
)
# Descriptive fields: cut to their column (or a bound) with a reason.
DESCRIPTIVE = (("state_detail", 128), ("gpu_type", 64), ("node_list", 65536))

_SURROGATES = {i: 0xFFFD for i in range(0xD800, 0xE000)}
_CONTROL = {i: None for i in [*range(0, 32), 127, *range(0x80, 0xA0)]}
_LINE = {**_SURROGATES, **_CONTROL}
_MULTILINE = {k: v for k, v in _LINE.items() if k not in (9, 10)}  # a comment keeps tabs and newlines


class Problems:
    """What the rules did to one record: `skip` (the reason it was dropped) and `clamped` reasons."""

    __slots__ = ("clamped", "skip")

    def __init__(self) -> None:
        self.skip: str | None = None
        self.clamped: list[str] = []


def clean_text(value: str, limit: int, *, multiline: bool = False) -> tuple[str, bool]:
    """(the text without what cannot be stored or shown, whether it was cut to `limit`)."""
    v = value[: limit * 2 + 16]  # bounded work on a 2 MB name; what is cut here is cut anyway
    text = v.translate(_MULTILINE if multiline else _LINE)
    return text[:limit], len(text) > limit or len(value) > len(v)


def _clean_field(rec: JobRecord, name: str, limit: int, p: Problems, *, multiline: bool = False) -> None:
    v = getattr(rec, name)
    if v is None:
        return
    if not isinstance(v, str):
        setattr(rec, name, None)
        p.clamped.append(f"{name} is not text: dropped")
        return
    if v.isascii() and v.isprintable() and len(v) <= limit:
        return  # the common case, without a copy
    text, cut = clean_text(v, limit, multiline=multiline)
    if cut:
        p.clamped.append(f"{name} longer than {limit} characters: cut")
    elif text != v:
        p.clamped.append(f"{name} had control or invalid characters: removed")
    setattr(rec, name, text or None)


def _int_in(v: object, hi: int) -> bool:
    return type(v) is int and 0 <= v <= hi


def _finite(v: object) -> bool:
    """A finite number a float column holds (an int is compared as an int: float(10**400) overflows)."""
    if type(v) is int:
        return abs(v) < 1e300
    return type(v) is float and math.isfinite(v)


def _time_ok(t: datetime | None, latest: datetime) -> bool:
    return t is None or (isinstance(t, datetime) and t.tzinfo is not None and EARLIEST <= t <= latest)


def check(rec: JobRecord, now: datetime, max_node_power_w: float = DEFAULT_MAX_NODE_POWER_W) -> Problems:
    """Apply the rules to `rec` in place; `Problems.skip` says why it must not be stored at all.

    The rules run in the order the module docstring gives them, each phase on what the one before left:
    a skip ends the check with the corrections made so far.
    """
    p = Problems()
    p.skip = _identity(rec) or _whole_numbers(rec, p) or _times(rec, now, p)
    if p.skip is not None:
        return p
    _energy_and_cpu(rec, max_node_power_w, p)
    _memory_and_gpu(rec, p)
    # descriptive text
    for name, limit in DESCRIPTIVE:
        _clean_field(rec, name, limit, p)
    _clean_field(rec, "name", MAX_NAME, p)
    _clean_field(rec, "comment", MAX_COMMENT, p, multiline=True)
    return p


def _identity(rec: JobRecord) -> str | None:
    """Why what identifies the job cannot be stored, if it cannot: never cut; invalid characters replaced
    (a surrogate cannot be stored)."""
    for name, width in IDENTITY:
        v = getattr(rec, name)
        if v is None:
            continue
        if not isinstance(v, str):
            return f"{name} is not text"
        if not (v.isascii() and v.isprintable()):
            v = v.translate(_LINE)
            setattr(rec, name, v)
        if len(v) > width:
            return f"{name} longer than {width} characters"
    if not rec.job_id or not rec.user_name or not rec.state:
        return "no job id, user or state"
    return None


def _whole_numbers(rec: JobRecord, p: Problems) -> str | None:
    """Ids and counts out of their column's range skip the record; a UID, exit code or signal is dropped."""
    for name in ("job_id_raw", "array_job_id", "het_job_id"):
        v = getattr(rec, name)
        if v is not None and not _int_in(v, INT8_MAX):
            return f"{name} out of range"
    for name in ("array_task_id", "het_job_offset"):
        v = getattr(rec, name)
        if v is not None and not _int_in(v, INT4_MAX):
            return f"{name} out of range"
    for name in ("n_nodes", "alloc_cpus", "alloc_gpus"):
        v = getattr(rec, name)
        if not _int_in(v, MAX_COUNT):
            return f"{name} negative or over {MAX_COUNT:,}"
    for name in ("uid", "exit_code", "exit_signal"):
        v = getattr(rec, name)
        if v is not None and not _int_in(v, INT4_MAX):
            setattr(rec, name, None)
            p.clamped.append(f"{name} out of range: dropped")
    return None


def _times(rec: JobRecord, now: datetime, p: Problems) -> str | None:
    """Times out of bounds or in the wrong order skip the record; the start, submit time, elapsed time and
    time limit are corrected where they contradict each other (`rec.elapsed_s` is then final)."""
    latest = now + FUTURE
    if not isinstance(rec.submit_time, datetime) or not _time_ok(rec.submit_time, latest):
        return "submit time before 2000 or in the future"
    if not (_time_ok(rec.start_time, latest) and _time_ok(rec.end_time, latest)):
        return "start or end time before 2000 or in the future"
    if rec.start_time is not None and rec.end_time is not None and rec.end_time < rec.start_time:
        return "ends before it started"
    el = rec.elapsed_s
    if not _finite(el) or el < 0:
        rec.elapsed_s = el = 0.0
        p.clamped.append("elapsed time negative or not a number: 0")
    # the start first: a wrong start years early would otherwise drag a right submit time back with it
    skip = _wrong_start(rec, el, p)
    if skip is not None:
        return skip
    if rec.start_time is not None and rec.submit_time > rec.start_time:
        rec.submit_time = rec.start_time
        p.clamped.append("submitted after it started: submit time set to the start")
    if rec.start_time is not None:
        stop = rec.end_time if rec.end_time is not None else (now if rec.is_open else None)
        if stop is not None:
            span = max((stop - rec.start_time).total_seconds(), 0.0)
            if el > span + 1.0:
                rec.elapsed_s = span
                p.clamped.append("elapsed time longer than from start to end: clamped to it")
    if rec.time_limit_s is not None and not (_finite(rec.time_limit_s) and rec.time_limit_s >= 0):
        rec.time_limit_s = None
        p.clamped.append("time limit negative or not a number: dropped")
    return None


def _wrong_start(rec: JobRecord, el: float, p: Problems) -> str | None:
    """A start more than SUSPEND_MAX before end - elapsed is set to end - elapsed (a submit time before it
    moves with it); with no elapsed time, why the record is skipped."""
    if rec.start_time is None or rec.end_time is None:
        return None
    gap = (rec.end_time - rec.start_time).total_seconds() - el
    if gap > SUSPEND_MAX.total_seconds():
        if el <= 0:
            return "start and end over 30 days apart with no elapsed time: when it ran is unknown"
        wrong = rec.start_time
        rec.start_time = rec.end_time - timedelta(seconds=el)
        if rec.submit_time <= wrong:  # submitted before the wrong start: off by the same, its wait kept
            rec.submit_time += rec.start_time - wrong
        p.clamped.append("start over 30 days before end - elapsed: start set to end - elapsed")
    return None


def _energy_and_cpu(rec: JobRecord, max_node_power_w: float, p: Problems) -> None:
    """ConsumedEnergy and TotalCPU that the allocation and elapsed time cannot hold are dropped."""
    el = rec.elapsed_s
    e = rec.consumed_energy_j
    if e is not None:
        cap = max(rec.n_nodes, 1) * el * max_node_power_w
        if not _finite(e) or e < 0:
            rec.consumed_energy_j = None
            p.clamped.append("ConsumedEnergy negative or not a number: dropped (estimated instead)")
        elif e > cap + 1.0:
            rec.consumed_energy_j = None
            p.clamped.append(
                f"ConsumedEnergy over nodes x elapsed x {max_node_power_w:g} W: dropped (estimated instead)"
            )
    cpu = rec.total_cpu_s
    if cpu is not None:
        if not _finite(cpu) or cpu < 0:
            rec.total_cpu_s = None
            p.clamped.append("TotalCPU negative or not a number: dropped")
        elif rec.alloc_cpus and cpu > rec.alloc_cpus * el * CPU_MARGIN + 60.0:
            rec.total_cpu_s = None
            p.clamped.append("TotalCPU over the allocated cores x elapsed: dropped")
        elif cpu == 0 and el >= CPU_UNKNOWN_AFTER_S and not rec.is_open:
            rec.total_cpu_s = None  # (a running job's 0: no step has ended yet; its estimate knows that)
            p.clamped.append(TOTALCPU_UNKNOWN)


def _memory_and_gpu(rec: JobRecord, p: Problems) -> None:
    """Slurm's GPU use and the memory figures out of their bounds are dropped."""
    for name, hi in (("slurm_gpu_util", GPU_UTIL_MAX), ("slurm_gpu_mem_mb", GPU_MEM_MAX_MB)):
        v = getattr(rec, name)
        if v is not None and not (_finite(v) and 0 <= v <= hi):
            setattr(rec, name, None)
            p.clamped.append(f"{name} negative, not a number or over {hi:g}: dropped")
    for name in ("req_mem_mb", "max_rss_mb"):
        v = getattr(rec, name)
        if v is not None and not (_finite(v) and v >= 0):
            setattr(rec, name, None)
            p.clamped.append(f"{name} negative or not a number: dropped")
    if rec.rss_tasks_per_node is not None and not (
        _int_in(rec.rss_tasks_per_node, INT4_MAX) and rec.rss_tasks_per_node > 0
    ):
        rec.rss_tasks_per_node = None
        p.clamped.append("rss_tasks_per_node out of range: dropped")


class Tally:
    """What the rules refused (`skipped`) and corrected (`clamped`) in an import, with the first job of
    each reason (`examples`), for the import summary."""

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()
        self.clamped: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def add(self, rec: JobRecord, p: Problems) -> None:
        found = [(c, self.clamped) for c in p.clamped]
        if p.skip is not None:
            found.append((p.skip, self.skipped))
        for reason, counter in found:
            counter[reason] += 1
            if reason not in self.examples:
                jid = rec.job_id if isinstance(rec.job_id, str) else repr(rec.job_id)
                self.examples[reason] = "job " + jid[:40].encode("ascii", "backslashreplace").decode("ascii")

    def merge(self, other: Tally) -> None:
        self.skipped.update(other.skipped)
        self.clamped.update(other.clamped)
        for k, v in other.examples.items():
            self.examples.setdefault(k, v)


def checked(
    records: Iterable[JobRecord], tally: Tally, *, now: datetime | None = None, max_node_power_w: float = 0.0
) -> Iterator[JobRecord]:
    """The records that pass the rules (corrected where a rule corrects), counting the rest in `tally`."""
    at = now or datetime.now(UTC)
    max_w = max_node_power_w or DEFAULT_MAX_NODE_POWER_W
    for rec in records:
        p = check(rec, at, max_w)
        if p.skip is not None or p.clamped:
            tally.add(rec, p)
            if p.skip is not None:
                continue
        yield rec


class Checked:
    """Records that went through `checked` already (in the sacct parser's own process, where the work is
    in parallel with the import's), and their tally, complete once they are all read."""

    def __init__(self, records: Iterable[JobRecord], tally: Tally) -> None:
        self._records = records
        self.tally = tally

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(self._records)
