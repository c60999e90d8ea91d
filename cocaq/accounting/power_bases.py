"""Which facts about a job predict what its GPUs draw, judged on the site's own measured jobs.

GPU utilisation says little about power on real GPUs (runs of one workload at 74-87 % utilisation drew
143 to 441 W per H100); the same user's earlier runs of the same job say much more, because recurring
training jobs are most of a GPU cluster's energy. So the estimate of a job nothing measured tries, in this
order, and only where the site's data has the fact:

1. ``series``: the same user's measured jobs of the same job name on the same GPU model and GPU count;
2. ``user``: the same user's measured jobs on the same GPU model and GPU count;
3. ``meta``: measured jobs that declared the same model, precision and batch size in a `cocaq:` comment;
4. ``gpumem``: measured jobs on as many GPUs that used as much GPU memory (Slurm's gres/gpumem, in
   powers of two of GiB);
5. ``shape``: measured jobs of the same GPU count and CPUs per GPU;
6. ``table``: the GPU model's cells (cocaq.accounting.calibrate: partition, then model; by utilisation
   bucket where the job's utilisation is known, else over any);
7. rated power x `[estimate] gpu_utilisation`.

Model metadata given with `cocaq tag` or `cocaq.annotate()` (not in the comment) reaches the database
after the job is imported, so the import's estimate does not see it.

A basis is used only when, on held-out measured jobs, it beats what would be used in its place on the same
jobs. Held out means grouped by run (FOLDS folds of whole runs, never random rows: a run's jobs are alike
and would leak into their own training set). A run is one array, or a user's consecutive jobs of one name,
model and GPU count with at most RUN_GAP_S between one's end and the next one's start.

The range shown with an estimate is a split-conformal interval: the 10th and 90th percentiles of the
held-out log ratios measured / estimated of its basis (finite-sample corrected), so that it covers about
80 % of jobs like the held-out ones. The coverage reported is itself measured out of fold: each fold's jobs
against the interval learnt from the other folds' residuals. A basis with fewer than MIN_RESIDUALS
held-out jobs gets the pooled residuals' 5th-95th percentiles, at least half to twice its estimate, and
says so.
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from cocaq.accounting.quantiles import conformal_quantile, weighted_quantile
from cocaq.textsafe import plain
from cocaq.units import S_PER_HOUR


class Sample(Protocol):
    """A measured job as cocaq.accounting.calibrate.Sample holds it (what this module reads of one)."""

    @property
    def gpu_model(self) -> str: ...
    @property
    def partition(self) -> str: ...
    @property
    def w(self) -> float: ...
    @property
    def gpu_hours(self) -> float: ...
    @property
    def util(self) -> float | None: ...
    @property
    def tdp_w(self) -> float: ...
    @property
    def user(self) -> str | None: ...
    @property
    def name(self) -> str | None: ...
    @property
    def gpus(self) -> int: ...
    @property
    def start(self) -> float | None: ...
    @property
    def end(self) -> float | None: ...
    @property
    def array_job_id(self) -> int | None: ...
    @property
    def job_pk(self) -> int: ...
    def facts(self) -> Facts: ...


class Power(Protocol):
    @property
    def w(self) -> float: ...
    @property
    def cell(self) -> str: ...


class Table(Protocol):
    """The model/partition table (cocaq.accounting.calibrate.Calibration), as the judging looks it up."""

    def __bool__(self) -> bool: ...
    def lookup(self, model: str | None, partition: str | None, util: float | None = None) -> Any: ...


SERIES = "series"
USER = "user"
META = "meta"
GPUMEM = "gpumem"
SHAPE = "shape"
TABLE = "table"
KEYED_BASES = (SERIES, USER, META, GPUMEM, SHAPE)  # most specific first: the order they are tried in
RUN_GAP_S = 12 * float(S_PER_HOUR)  # a chained job waits in the queue; a new run of the same job starts later
FOLDS = 5
MIN_RESIDUALS = 20  # held-out jobs below which a basis is not judged, and its range is widened
MIN_KEYED_JOBS = 3  # measured jobs a keyed cell needs to be used
COVER = (0.1, 0.9)  # the range: 10th to 90th percentile
WIDE_COVER = (0.05, 0.95)
MIN_FACTOR = 2.0  # a widened range spans at least half to twice the estimate
_SEP = "\x1f"

CHOSEN = "chosen"  # the estimate as made: each job on the first basis used that has a cell for it
REFERENCES = ("rated-util", "rated-config")  # judged beside the bases on the same held-out jobs
BASIS_SERIES = "calibrated-series"  # assumptions["gpu_basis"] of an estimate on the series basis
BASIS_USER = "calibrated-user"
KEYED_BASIS = {b: f"calibrated-{b}" for b in KEYED_BASES}
KEYED_TEXT = {
    BASIS_SERIES: "the same user's measured jobs of this name on this GPU model and GPU count",
    BASIS_USER: "the same user's measured jobs on this GPU model and GPU count",
    KEYED_BASIS[META]: "measured jobs of the same declared model, precision and batch size (cocaq: comment)",
    KEYED_BASIS[GPUMEM]: "measured jobs that used as much GPU memory (Slurm's gres/gpumem)",
    KEYED_BASIS[SHAPE]: "measured jobs of the same GPU count and CPUs per GPU",
}


@dataclass(frozen=True, slots=True)
class Facts:
    """What a job's estimate may rest on besides its GPU model and partition, where the site has it."""

    user: str | None
    name: str | None
    gpus: int
    cpus: int = 0
    gpu_mem_mb: float | None = None  # Slurm's gres/gpumem (the largest of one task, over its GPUs)
    meta: str | None = None  # model, precision and batch size from a `cocaq:` comment


def meta_of(comment: str | None) -> str | None:
    """The declared model, precision and batch size of a `cocaq:` comment, as one key; None without."""
    if not comment or "cocaq:" not in comment.lower():
        return None
    from cocaq.ml.meta import parse_comment

    m = parse_comment(comment)
    model = m.get("model")
    if not model:
        return None
    return _SEP.join(
        str(m.get(k) or "").strip().lower().replace(_SEP, " ") for k in ("model", "precision", "batch_size")
    )


def _mem_bucket(mb: float | None) -> str | None:
    """Powers of two of GiB: 0-1, 1-2, 2-4, ... 64-128, 128+."""
    if mb is None or not math.isfinite(mb) or mb <= 0:
        return None
    gib = mb / 1024.0
    if gib < 1:
        return "0-1"
    k = min(int(math.log2(gib)), 7)
    return f"{2**k}-{2 ** (k + 1)}" if k < 7 else "128+"


def _cpus_bucket(cpus: int, gpus: int) -> str:
    per = cpus / gpus
    for hi in (2, 4, 8, 16, 32):
        if per <= hi:
            return f"<={hi}"
    return ">32"


def keyed_key(basis: str, f: Facts) -> str | None:
    """The key of a job under a keyed basis; None where the job lacks the fact."""
    if f.gpus <= 0:
        return None
    if basis == SERIES:
        return f"{f.user}{_SEP}{f.name.replace(_SEP, ' ')}{_SEP}{f.gpus}" if f.user and f.name else None
    if basis == USER:
        return f"{f.user}{_SEP}{f.gpus}" if f.user else None
    if basis == META:
        return f"{f.meta}{_SEP}{f.gpus}" if f.meta else None
    if basis == GPUMEM:
        b = _mem_bucket(f.gpu_mem_mb)
        return f"{b}{_SEP}{f.gpus}" if b else None
    if basis == SHAPE:
        return f"{_cpus_bucket(f.cpus, f.gpus)}{_SEP}{f.gpus}" if f.cpus > 0 else None
    return None


def key_words(basis: str, key: str) -> str:
    """A key as a reader says it: "alice's train-llm on 8 GPUs"."""
    parts = [plain(p)[:60] for p in key.split(_SEP)]  # (a user's job name: any text, any length)
    gpus = f"{parts[-1]} GPU" + ("" if parts[-1] == "1" else "s")
    if basis == SERIES and len(parts) == 3:
        return f"{parts[0]}'s {parts[1]} on {gpus}"
    if basis == USER and len(parts) == 2:
        return f"{parts[0]}'s jobs on {gpus}"
    if basis == META and len(parts) == 4:
        said = ", ".join(x for x in (parts[0], parts[1], f"batch {parts[2]}" if parts[2] else "") if x)
        return f"{said} on {gpus}"
    if basis == GPUMEM and len(parts) == 2:
        return f"{parts[0]} GiB of GPU memory (gres/gpumem) on {gpus}"
    if basis == SHAPE and len(parts) == 2:
        return f"{parts[0]} CPUs per GPU on {gpus}"
    return plain(key)[:120]


@dataclass(frozen=True, slots=True)
class KeyedCell:
    basis: str  # one of KEYED_BASES
    gpu_model: str
    key: str
    w_median: float
    w_p10: float
    w_p90: float
    jobs: int
    runs: int
    gpu_hours: float
    computed_at: datetime


@dataclass(frozen=True, slots=True)
class BasisStats:
    """How a basis did on held-out measured jobs, and the range it gives."""

    basis: str  # series, user, table, table-util; or a reference: rated-config, rated-util
    used: bool
    jobs: int  # held-out jobs it estimated
    runs: int
    median_err: float | None  # median |estimate / measured - 1|
    p90_err: float | None
    err_instead: float | None  # the median error, on the same jobs, of what would be used instead
    coverage: float | None  # share of held-out jobs inside the range learnt from the other folds
    log_lo: float  # the range: estimate x exp(log_lo) to estimate x exp(log_hi)
    log_hi: float
    widened: bool  # too few held-out jobs: the pooled, wider range
    computed_at: datetime

    def factors(self) -> tuple[float, float]:
        return math.exp(self.log_lo), math.exp(self.log_hi)


# --- runs and folds -------------------------------------------------------------------------------------


def run_ids(samples: Sequence[Sample]) -> list[str]:
    """Each sample's run: its array, or its consecutive jobs of one user, name, model and GPU count."""
    out = [""] * len(samples)
    series: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        if s.array_job_id is not None:
            out[i] = f"array{_SEP}{s.array_job_id}"
        else:
            series[(s.user, s.name or f"{_SEP}job{s.job_pk}", s.gpu_model, s.gpus)].append(i)
    for key, idx in series.items():
        idx.sort(key=lambda i: samples[i].start or 0.0)
        n, end = 0, -math.inf
        for i in idx:
            s = samples[i]
            if (s.start or 0.0) - end > RUN_GAP_S:
                n += 1
            end = max(end, s.end or s.start or 0.0)
            out[i] = _SEP.join(map(str, (*key, n)))
    return out


def fold_of(run: str, folds: int = FOLDS) -> int:
    return zlib.crc32(run.encode()) % folds


# --- quantiles ------------------------------------------------------------------------------------------


def _median(xs: Sequence[float]) -> float | None:
    ys = sorted(xs)
    if not ys:
        return None
    m = len(ys) // 2
    return ys[m] if len(ys) % 2 else (ys[m - 1] + ys[m]) / 2


def _p90(xs: Sequence[float]) -> float | None:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, math.ceil(0.9 * len(ys)) - 1)] if ys else None


# --- learning -------------------------------------------------------------------------------------------


def keyed_cells(samples: Iterable[Sample], runs: Sequence[str] | None, now: datetime) -> list[KeyedCell]:
    """The series and user cells of these samples (GPU-hour weighted, as the table's)."""
    samples = list(samples)
    runs = runs if runs is not None else run_ids(samples)
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        f = s.facts()
        for basis in KEYED_BASES:
            k = keyed_key(basis, f)
            if k is not None:
                groups[(basis, s.gpu_model, k)].append(i)
    out = []
    for (basis, model, key), idx in sorted(groups.items()):
        vw = [(samples[i].w, samples[i].gpu_hours) for i in idx]
        out.append(
            KeyedCell(
                basis, model, key, weighted_quantile(vw, 0.5), weighted_quantile(vw, 0.1),
                weighted_quantile(vw, 0.9), len(idx), len({runs[i] for i in idx}),
                sum(samples[i].gpu_hours for i in idx), now,
            )
        )  # fmt: skip
    return out


def keyed_lookup(
    cells: dict[tuple[str, str, str], KeyedCell], basis: str, model: str | None, f: Facts
) -> KeyedCell | None:
    if model is None:
        return None
    key = keyed_key(basis, f)
    c = cells.get((basis, model, key)) if key is not None else None
    return c if c is not None and c.jobs >= MIN_KEYED_JOBS else None


@dataclass
class Assessment:
    bases: dict[str, BasisStats]
    jobs: int
    runs: int
    folds: int


def assess(
    samples: Sequence[Sample],
    table: Callable[[Sequence[Sample]], Table],
    rated_config: Callable[[Sample], float],
    now: datetime,
    folds: int = FOLDS,
) -> Assessment:
    """Judge each basis on held-out runs, choose the ones that help, and learn each one's range.

    `table` learns the model/partition table from training samples; `rated_config` is a sample's
    rated-power estimate (TDP x `[estimate] gpu_utilisation`).
    """
    n = len(samples)
    runs = run_ids(samples)
    fold = [fold_of(r, folds) for r in runs]
    pred = _held_out(samples, fold, table, rated_config, now, folds)
    chain, judged = _choose_chain(samples, pred)
    resid = _residuals(samples, pred, chain)
    pooled = [r for g, rs in resid.items() if g in (*KEYED_BASES, TABLE) for _, r in rs]
    out: dict[str, BasisStats] = {}
    for group in (*KEYED_BASES, TABLE, TABLE + "-util", CHOSEN, *REFERENCES):
        rs = resid.get(group, [])
        if group in KEYED_BASES and group not in chain:  # not used: what it did where it had a cell
            rs = [(i, math.log(samples[i].w / pred[i][group][0])) for i in range(n) if group in pred[i]]
        idx = [i for i, _ in rs]
        errs = [abs(math.exp(r) ** -1 - 1.0) for _, r in rs]  # |estimate / measured - 1|
        lo, hi, widened = _interval([r for _, r in rs], pooled)
        used = group in chain or group in (TABLE + "-util", CHOSEN)
        instead = judged[group][2] if group in judged else None
        out[group] = BasisStats(
            group, used and bool(rs), len(idx), len({runs[i] for i in idx}), _median(errs), _p90(errs),
            instead, _coverage(rs, fold, pooled, folds), lo, hi, widened, now,
        )  # fmt: skip
    return Assessment(out, n, len(set(runs)), folds)


# Per sample, each candidate's held-out estimate (W per GPU) and the range group it falls in.
_Predictions = list[dict[str, tuple[float, str]]]


def _held_out(
    samples: Sequence[Sample],
    fold: Sequence[int],
    table: Callable[[Sequence[Sample]], Table],
    rated_config: Callable[[Sample], float],
    now: datetime,
    folds: int,
) -> _Predictions:
    """Each sample's estimate by every basis, learnt from the other folds' runs only."""
    n = len(samples)
    pred: _Predictions = [{} for _ in range(n)]
    for f in range(folds):
        train = [s for s, g in zip(samples, fold, strict=True) if g != f]
        held = [i for i in range(n) if fold[i] == f]
        if not train or not held:
            continue
        cal = table(train)
        kc = {(c.basis, c.gpu_model, c.key): c for c in keyed_cells(train, None, now)}
        for i in held:
            s = samples[i]
            for basis in KEYED_BASES:
                c = keyed_lookup(kc, basis, s.gpu_model, s.facts())
                if c is not None:
                    pred[i][basis] = (c.w_median, basis)
            for variant, util in ((TABLE, None), (TABLE + "-util", s.util)):
                hit = cal.lookup(s.gpu_model, s.partition, util) if cal else None
                if hit is not None and not isinstance(hit, str):
                    util_cell = "any utilisation" not in hit.cell
                    if variant == TABLE or util_cell:
                        pred[i][variant] = (hit.w, variant)
            pred[i]["rated-config"] = (rated_config(s), "rated-config")
            if s.util is not None:
                pred[i]["rated-util"] = (max(s.tdp_w * s.util / 100.0, 1e-9), "rated-util")
    return pred


def _chain_pred(p: dict[str, tuple[float, str]], chain: Sequence[str]) -> tuple[float, str]:
    """A sample's estimate by the first basis of `chain` that has one, else by its rated power."""
    for b in chain:
        if b in p:
            return p[b]
    return p["rated-config"]


def _choose_chain(
    samples: Sequence[Sample], pred: _Predictions
) -> tuple[list[str], dict[str, tuple[int, float | None, float | None]]]:
    """(the chain, each keyed basis's (jobs, median error with it, without it)): from the most general to
    the most specific, a basis joins the front of the chain where it beats the chain so far on the jobs
    it applies to."""

    def err(i: int, w: float) -> float:
        return abs(w / samples[i].w - 1.0)

    n = len(samples)
    chain: list[str] = [TABLE]
    judged: dict[str, tuple[int, float | None, float | None]] = {}
    for basis in reversed(KEYED_BASES):
        idx = [i for i in range(n) if basis in pred[i]]
        with_ = _median([err(i, pred[i][basis][0]) for i in idx])
        instead = _median([err(i, _chain_pred(pred[i], chain)[0]) for i in idx])
        judged[basis] = (len(idx), with_, instead)
        if len(idx) >= MIN_RESIDUALS and with_ is not None and instead is not None and with_ < instead:
            chain.insert(0, basis)
    return chain, judged


def _residuals(
    samples: Sequence[Sample], pred: _Predictions, chain: Sequence[str]
) -> dict[str, list[tuple[int, float]]]:
    """The chosen chain's held-out log residuals (sample, log(measured / estimate)), by range group."""
    resid: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for i in range(len(samples)):
        if not pred[i]:
            continue
        w, group = _chain_pred(pred[i], chain)
        resid[group].append((i, math.log(samples[i].w / w)))
        resid[CHOSEN].append((i, math.log(samples[i].w / w)))
        if TABLE + "-util" in pred[i]:
            resid[TABLE + "-util"].append((i, math.log(samples[i].w / pred[i][TABLE + "-util"][0])))
        if "rated-util" in pred[i]:
            resid["rated-util"].append((i, math.log(samples[i].w / pred[i]["rated-util"][0])))
        if group != "rated-config":
            resid["rated-config"].append((i, math.log(samples[i].w / pred[i]["rated-config"][0])))
    return resid


def _interval(rs: Sequence[float], pooled: Sequence[float]) -> tuple[float, float, bool]:
    if len(rs) >= MIN_RESIDUALS:
        return conformal_quantile(rs, COVER[0]), conformal_quantile(rs, COVER[1]), False
    lo = hi = 0.0
    if len(pooled) >= MIN_RESIDUALS:
        lo, hi = conformal_quantile(pooled, WIDE_COVER[0]), conformal_quantile(pooled, WIDE_COVER[1])
    m = math.log(MIN_FACTOR)
    return min(lo, -m), max(hi, m), True


def _coverage(
    rs: Sequence[tuple[int, float]], fold: Sequence[int], pooled: Sequence[float], folds: int
) -> float | None:
    """The share of held-out residuals inside the range learnt from the other folds' residuals."""
    if not rs:
        return None
    inside = 0
    for f in range(folds):
        mine = [r for i, r in rs if fold[i] == f]
        if not mine:
            continue
        others = [r for i, r in rs if fold[i] != f]
        lo, hi, _ = _interval(others, pooled)
        inside += sum(1 for r in mine if lo <= r <= hi)
    return inside / len(rs)
