"""Calibrated estimates: what a GPU draws, learnt from the site's own measured jobs.

The estimate of a job that nothing measured used to be GPU-hours x TDP x `[estimate] gpu_utilisation`:
on a real 8x H100 training run that was 4.9 times what the GPUs drew (143 W of 700 W). Where the site
measures some nodes, the jobs measured there say what a GPU of that model actually draws: this module
learns that table (`gpu_power_calibration`) and looks up the power for the estimate.

The table: per GPU model (normalised, see `normalise_gpu_model`) and partition, plus a row per model over
all partitions (partition ""), each by utilisation bucket (`[estimate] calibrate_buckets`, default 0-25,
25-50, 50-75, 75-100 %) and over any utilisation (bucket "any"): the median W per GPU of the jobs behind
it, their 10th and 90th percentile, how many jobs and GPU-hours, and when it was computed. Every job
weighs by its GPU-hours. A job is learnt from when all its GPUs were measured (NVML counters or power
integrals; or the GPU share of Slurm's node energy, `nvml-samples`, where the samples cover at least half
of the allocated GPU time), it ran at least MIN_ELAPSED_S, and its power per GPU is plausible.

The lookup, for a job's model, partition and (when known) GPU utilisation, uses the first cell that has
at least `[estimate] calibrate_min_jobs` jobs: the partition's bucket, the model's bucket, the partition's
"any", the model's "any"; with none (or an unknown model, or `calibrate = false`) the estimate stays TDP x
utilisation. The basis is stored on the job (`assumptions`: gpu_basis, gpu_w, gpu_w_range, gpu_cell).

Before the table, the bases of cocaq.accounting.power_bases (the user's own measured runs of the job,
the declared model, gres/gpumem, the job's shape) are tried where held-out runs judged them to help; the
range of every basis is then its held-out (split-conformal) interval instead of the cell's own spread.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from cocaq.accounting import power_bases as pb
from cocaq.accounting.quantiles import weighted_quantile as weighted_quantile
from cocaq.config import Config, Hardware
from cocaq.units import S_PER_HOUR

if TYPE_CHECKING:  # (SQLAlchemy is imported where the table is read: cocaq.accounting.estimate, and so the
    # login nodes' `cocaq user`, import this module for the lookups only)
    from sqlalchemy import Connection, Engine

# Basis labels stored on estimated jobs (assumptions["gpu_basis"]) and shown by `cocaq job`.
BASIS_PARTITION = "calibrated-partition"  # measured jobs of the same GPU model in the same partition
BASIS_MODEL = "calibrated-model"  # measured jobs of the same GPU model, any partition
BASIS_TDP = "tdp"  # nothing measured to learn from: TDP x [estimate] gpu_utilisation
BASIS_TEXT = {
    **pb.KEYED_TEXT,
    BASIS_PARTITION: "the site's measured jobs on this GPU model and partition",
    BASIS_MODEL: "the site's measured jobs on this GPU model (all partitions)",
    BASIS_TDP: "rated power (TDP) x [estimate] gpu_utilisation",
}

MIN_ELAPSED_S = 300.0  # shorter jobs say little about a GPU's steady power
MAX_GPU_W = 2000.0  # no GPU draws more: a job claiming so was mis-measured (or mis-counted GPUs)
SAMPLES_MIN_COVERAGE = (
    0.5  # below, a node split is a lower bound (cocaq.accounting.ledger.SPLIT_MIN_COVERAGE)
)
ANY = "any"

# Words that name a maker or a product line, not the GPU: dropped before the model is picked.
_BRAND = {
    "nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon", "intel", "gpu", "data", "center",
}  # fmt: skip
# Tokens that look like a model but describe a variant: form factor, memory, interconnect.
_VARIANT = re.compile(r"^(sxm\d*|pcie\d*|hbm\d*e?|nvl\d*|gddr\d*x?|\d+(gb|g|gib)|\d+)$")
_MODEL = re.compile(r"^[a-z]{1,3}\d{1,4}[a-z]{0,2}$")


def normalise_gpu_model(name: str | None) -> str | None:
    """The GPU family a name stands for, so that NVML's, Slurm's and the config's spellings meet.

    Lower case, split on anything that is not a letter or a digit, makers' and product lines' words
    dropped (NVIDIA, Tesla, GeForce, Quadro, AMD, Instinct...), then the first token of the form letters +
    digits (+ a suffix): "NVIDIA H100 80GB HBM3", "nvidia_h100_80gb_hbm3" (Slurm's AutoDetect), "H100-SXM5"
    and "h100" are all "h100"; "Tesla V100-SXM2-32GB" is "v100", "NVIDIA L40S" "l40s", "AMD Instinct
    MI250X" "mi250x". RTX/GTX followed by a number keep it ("GeForce RTX 4090": "rtx4090"). Memory size,
    form factor (SXM, PCIe, NVL) and memory type are left out: a gres type rarely says them. None when no
    token fits (a garbage name): such jobs keep the TDP estimate.
    """
    if not name or not isinstance(name, str):
        return None
    tokens = [t for t in re.split(r"[^a-z0-9]+", name.strip().lower()[:200]) if t and t not in _BRAND]
    for i, t in enumerate(tokens):
        if t in ("rtx", "gtx") and i + 1 < len(tokens) and tokens[i + 1].isdigit():
            return t + tokens[i + 1]
        if _MODEL.match(t) and not _VARIANT.match(t):
            return t
    return None


def job_gpu_model(gpu_type: str | None, hw: Hardware) -> str | None:
    """The model of a job's GPUs: Slurm's gres type where it names one, else its hardware profile's."""
    return normalise_gpu_model(gpu_type) or normalise_gpu_model(hw.gpu_model)


def bucket_of(util: float | None, edges: Sequence[float]) -> tuple[str, float, float] | None:
    """(label, lo, hi) of the utilisation bucket `util` (%) falls in; None when unknown."""
    if util is None or not math.isfinite(util):
        return None
    u = min(max(util, 0.0), 100.0)
    bounds = [0.0, *edges, 100.0]
    for lo, hi in itertools.pairwise(bounds):
        if u < hi or hi == 100.0:
            return f"{lo:g}-{hi:g}", lo, hi
    return None  # pragma: no cover - the last bucket takes 100


@dataclass(frozen=True, slots=True)
class Cell:
    gpu_model: str
    partition: str  # "": all partitions
    bucket: str  # "any" or "lo-hi"
    util_lo: float | None
    util_hi: float | None
    w_median: float
    w_p10: float
    w_p90: float
    jobs: int
    gpu_hours: float
    computed_at: datetime

    def label(self) -> str:
        where = f"in {self.partition}" if self.partition else "all partitions"
        util = "any utilisation" if self.bucket == ANY else f"{self.bucket}% utilisation"
        return (
            f"{self.gpu_model}, {where}, {util}: {self.jobs} jobs, {self.gpu_hours:,.0f} GPU-h, "
            f"{_utc(self.computed_at):%Y-%m-%d}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_model": self.gpu_model,
            "partition": self.partition or None,
            "bucket": self.bucket,
            "util_lo": self.util_lo,
            "util_hi": self.util_hi,
            "w_median": round(self.w_median, 1),
            "w_p10": round(self.w_p10, 1),
            "w_p90": round(self.w_p90, 1),
            "jobs": self.jobs,
            "gpu_hours": round(self.gpu_hours, 3),
            "computed_at": _utc(self.computed_at).isoformat(),
        }


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class GpuPower:
    """What the estimate of one job's GPUs rests on: W per GPU, its range, the basis and the cell."""

    w: float
    w_low: float
    w_high: float
    basis: str
    cell: str  # the cell's label, or why there is none

    def assumptions(self) -> dict[str, Any]:
        return {
            "gpu_basis": self.basis,
            "gpu_w": round(self.w, 3),
            "gpu_w_range": [round(self.w_low, 3), round(self.w_high, 3)],
            "gpu_cell": self.cell,
        }


class Calibration:
    """The learnt table, ready for lookups under one configuration.

    With `bases` (what cocaq.accounting.power_bases judged on held-out runs), a lookup's range is that
    basis's held-out interval and the user's own cells (`keyed`) come first where they were judged to help;
    without (a table learnt before), the range is the cell's own 10th-90th percentile.
    """

    def __init__(
        self,
        cells: Iterable[Cell],
        min_jobs: int,
        edges: Sequence[float],
        keyed: Iterable[pb.KeyedCell] = (),
        bases: Iterable[pb.BasisStats] = (),
    ) -> None:
        self.cells = {(c.gpu_model, c.partition, c.bucket): c for c in cells}
        self.min_jobs = min_jobs
        self.edges = tuple(edges)
        self.models = {c.gpu_model for c in self.cells.values()}
        self.keyed = {(c.basis, c.gpu_model, c.key): c for c in keyed}
        self.bases = {b.basis: b for b in bases}
        self.keyed_used = tuple(b for b in pb.KEYED_BASES if b in self.bases and self.bases[b].used)

    def __bool__(self) -> bool:
        return bool(self.cells) or bool(self.keyed)

    def _ranged(self, w: float, lo: float, hi: float, basis: str, label: str, group: str) -> GpuPower:
        b = self.bases.get(group)
        if b is None:
            return GpuPower(w, lo, hi, basis, label)
        f_lo, f_hi = b.factors()
        if b.widened:
            note = f"range widened: {_jobs(b.jobs)} held out" if b.jobs else "range widened: no jobs held out"
        else:
            note = f"range from {_jobs(b.jobs)} held out"
            if b.coverage is not None:
                note += f", held {b.coverage:.0%} of them"
        return GpuPower(w, w * f_lo, w * f_hi, basis, f"{label}; {note}")

    def lookup_job(
        self, model: str | None, partition: str | None, util: float | None, facts: pb.Facts | None
    ) -> GpuPower | str:
        """The power for one job: the bases judged to help on held-out runs (the user's own measured
        jobs, ...: power_bases) where one has a cell for it, else the table (`lookup`)."""
        for basis in self.keyed_used:
            c = pb.keyed_lookup(self.keyed, basis, model, facts) if facts is not None else None
            if c is not None:
                label = (
                    f"{c.gpu_model}, {pb.key_words(basis, c.key)}: {c.jobs} jobs in {c.runs} runs, "
                    f"{_utc(c.computed_at):%Y-%m-%d}"
                )
                return self._ranged(c.w_median, c.w_p10, c.w_p90, pb.KEYED_BASIS[basis], label, basis)
        return self.lookup(model, partition, util)

    def lookup(self, model: str | None, partition: str | None, util: float | None = None) -> GpuPower | str:
        """The calibrated power for a job, or (a string) why there is none."""
        if model is None:
            return "GPU model unknown"
        part = partition or ""
        b = bucket_of(util, self.edges)
        keys: list[tuple[str, str, str, str]] = []
        if b is not None:
            keys += [(model, part, b[0], BASIS_PARTITION), (model, "", b[0], BASIS_MODEL)]
        keys += [(model, part, ANY, BASIS_PARTITION), (model, "", ANY, BASIS_MODEL)]
        for m, p, bucket, basis in keys:
            if basis == BASIS_PARTITION and not p:
                continue
            c = self.cells.get((m, p, bucket))
            if c is not None and c.jobs >= self.min_jobs:
                group = pb.TABLE if bucket == ANY else pb.TABLE + "-util"
                return self._ranged(c.w_median, c.w_p10, c.w_p90, basis, c.label(), group)
        if model not in self.models:
            return f"no measured {model} jobs"
        return f"fewer than {self.min_jobs} measured {model} jobs"


def _jobs(n: int) -> str:
    return f"{n:,} job" + ("" if n == 1 else "s")


def tdp_power(hw: Hardware, utilisation: float, why: str) -> GpuPower:
    w = hw.gpu_tdp_w * utilisation
    return GpuPower(w, w, w, BASIS_TDP, why)


def load(conn: Connection, cfg: Config) -> Calibration | None:
    """The stored table under this configuration; None when calibration is off or nothing is stored.

    A database without the table yet (an older schema) reads as nothing stored.
    """
    from sqlalchemy import select
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from cocaq.db.schema import GpuPowerBasis, GpuPowerCalibration, GpuPowerKeyed

    est = cfg.estimate
    if not est.calibrate:
        return None
    try:
        rows = conn.execute(select(GpuPowerCalibration.__table__)).all()
    except (OperationalError, ProgrammingError):
        return None
    cells = [_cell(r) for r in rows]
    try:
        bases = [_basis(r) for r in conn.execute(select(GpuPowerBasis.__table__))]
        used = [b.basis for b in bases if b.used and b.basis in pb.KEYED_BASES]
        kt = GpuPowerKeyed.__table__
        keyed = [_keyed(r) for r in conn.execute(select(kt).where(kt.c.basis.in_(used)))] if used else []
    except (OperationalError, ProgrammingError):  # (a schema before 0018: the table alone)
        keyed, bases = [], []
    if not cells and not keyed:
        return None
    return Calibration(cells, est.calibrate_min_jobs, est.calibrate_buckets, keyed, bases)


def load_engine(engine: Engine, cfg: Config) -> Calibration | None:
    if not cfg.estimate.calibrate:
        return None
    with engine.connect() as conn:
        return load(conn, cfg)


def _cell(r: Any) -> Cell:
    return Cell(
        r.gpu_model, r.partition or "", r.bucket, r.util_lo, r.util_hi, r.w_median, r.w_p10, r.w_p90,
        r.jobs, r.gpu_hours, r.computed_at,
    )  # fmt: skip


def _keyed(r: Any) -> pb.KeyedCell:
    return pb.KeyedCell(*(getattr(r, f) for f in pb.KeyedCell.__slots__))


def _basis(r: Any) -> pb.BasisStats:
    return pb.BasisStats(*(getattr(r, f) for f in pb.BasisStats.__slots__))


# --- learning --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured job, as the table learns from it."""

    gpu_model: str
    partition: str
    w: float  # per GPU
    gpu_hours: float
    util: float | None
    tdp_w: float = 0.0  # the GPU's TDP in the job's hardware profile (for the held-out comparison)
    # what tells runs and a user's recurring jobs apart (cocaq.accounting.power_bases)
    user: str | None = None
    name: str | None = None
    gpus: int = 0
    start: float | None = None  # POSIX seconds
    end: float | None = None
    array_job_id: int | None = None
    job_pk: int = 0
    cpus: int = 0
    gpu_mem_mb: float | None = None  # Slurm's gres/gpumem
    meta: str | None = None  # declared model, precision, batch size (power_bases.meta_of)

    def facts(self) -> pb.Facts:
        return pb.Facts(self.user, self.name, self.gpus, self.cpus, self.gpu_mem_mb, self.meta)


@dataclass
class Learnt:
    cells: list[Cell] = field(default_factory=list)
    jobs: int = 0  # measured jobs learnt from
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    keyed: list[pb.KeyedCell] = field(default_factory=list)
    bases: list[pb.BasisStats] = field(default_factory=list)

    def line(self, min_jobs: int) -> str:
        if not self.cells:
            why = "; ".join(f"{n} {k}" for k, n in sorted(self.skipped.items()))
            return "calibrate: no measured GPU jobs to learn from" + (f" ({why})" if why else "")
        models = sorted({c.gpu_model for c in self.cells})
        used = sum(1 for c in self.cells if c.jobs >= min_jobs)
        text = (
            f"calibrate: {len(self.cells)} cells ({used} with at least {min_jobs} jobs) from {self.jobs} "
            f"measured jobs of {', '.join(models)}"
        )
        keyed = [b.basis for b in self.bases if b.basis in pb.KEYED_BASES and b.used]
        if keyed:
            text += f"; judged on held-out runs to beat the table, and tried first: {', '.join(keyed)}"
        return text


def build_cells(samples: Iterable[Sample], edges: Sequence[float], now: datetime) -> list[Cell]:
    groups: dict[tuple[str, str, str], list[Sample]] = defaultdict(list)
    bounds: dict[str, tuple[float | None, float | None]] = {ANY: (None, None)}
    for s in samples:
        b = bucket_of(s.util, edges)
        buckets = [ANY] if b is None else [ANY, b[0]]
        if b is not None:
            bounds[b[0]] = (b[1], b[2])
        for bucket in buckets:
            groups[(s.gpu_model, s.partition, bucket)].append(s)
            groups[(s.gpu_model, "", bucket)].append(s)
    cells = []
    for (model, part, bucket), ss in sorted(groups.items()):
        vw = [(s.w, s.gpu_hours) for s in ss]
        lo, hi = bounds[bucket]
        cells.append(
            Cell(
                model, part, bucket, lo, hi,
                weighted_quantile(vw, 0.5), weighted_quantile(vw, 0.1), weighted_quantile(vw, 0.9),
                len(ss), sum(s.gpu_hours for s in ss), now,
            )
        )  # fmt: skip
    return cells


def measured_samples(conn: Connection, cfg: Config, skipped: dict[str, int] | None = None) -> list[Sample]:
    """The site's measured GPU jobs, one Sample each (see the module doc for which count)."""
    from sqlalchemy import Table, and_, case, func, select

    from cocaq.db.schema import Job, JobEnergy, JobMetrics

    skipped = skipped if skipped is not None else defaultdict(int)
    jt, et, mt = (cast(Table, t.__table__) for t in (Job, JobEnergy, JobMetrics))
    j, e, m = jt.c, et.c, mt.c
    meas = func.sum(case((e.method == "measured", e.energy_j), else_=0.0))
    n_est = func.sum(case((e.method == "measured", 0), else_=1))
    from_samples = func.max(case((e.source == "nvml-samples", 1), else_=0))
    q = (
        select(
            j.id,
            j.partition,
            j.node_list,
            j.gpu_type,
            j.alloc_gpus,
            j.elapsed_s,
            j.user_name,
            j.name,
            j.start_time,
            j.end_time,
            j.array_job_id,
            j.alloc_cpus,
            j.slurm_gpu_mem_mb,
            j.comment,
            m.gpu_util_pct,
            m.gpu_samples_s,
            meas.label("meas"),
            n_est.label("n_est"),
            from_samples.label("from_samples"),
        )
        .select_from(jt.join(et, and_(e.job_pk == j.id, e.component == "gpu")))
        .outerjoin(mt, m.job_pk == j.id)
        .where(j.alloc_gpus > 0, j.is_open.is_(False))
        .group_by(j.id, j.partition, j.node_list, j.gpu_type, j.alloc_gpus, j.elapsed_s)
        .group_by(j.user_name, j.name, j.start_time, j.end_time, j.array_job_id)
        .group_by(j.alloc_cpus, j.slurm_gpu_mem_mb, j.comment)
        .group_by(m.gpu_util_pct, m.gpu_samples_s)
        .having(meas > 0)  # (jobs nothing measured are most of a site's GPU jobs: left in the database)
    )
    rows = [r for r in conn.execute(q)]
    names = _nvml_names(conn, [r.id for r in rows if not r.n_est])
    from cocaq.hostlist import expand_hostlist

    out = []
    for r in rows:
        meas_j, elapsed, gpus = float(r.meas or 0.0), float(r.elapsed_s or 0.0), int(r.alloc_gpus)
        if meas_j <= 0.0:
            continue  # nothing measured: not a job to learn from
        if r.n_est:
            skipped["partly estimated"] += 1
            continue
        if elapsed < MIN_ELAPSED_S:
            skipped[f"shorter than {MIN_ELAPSED_S:g} s"] += 1
            continue
        if r.from_samples and (r.gpu_samples_s or 0.0) < SAMPLES_MIN_COVERAGE * gpus * elapsed:
            skipped["samples cover under half the GPU time"] += 1
            continue
        w = meas_j / (gpus * elapsed)
        if not (math.isfinite(w) and 0.0 < w <= MAX_GPU_W):
            skipped["implausible power"] += 1
            continue
        try:
            nodes = expand_hostlist(r.node_list or "")
        except ValueError:
            nodes = []
        hw = cfg.hardware_for(r.partition, nodes)[0]
        model = names.get(r.id) or job_gpu_model(r.gpu_type, hw)
        if model is None:
            skipped["GPU model unknown"] += 1
            continue
        util = None if r.gpu_util_pct is None else float(r.gpu_util_pct)
        out.append(
            Sample(
                model, r.partition or "", w, gpus * elapsed / S_PER_HOUR, util, hw.gpu_tdp_w, r.user_name,
                r.name or None, gpus, _posix(r.start_time), _posix(r.end_time), r.array_job_id, r.id,
                int(r.alloc_cpus or 0), r.slurm_gpu_mem_mb, pb.meta_of(r.comment),
            )
        )  # fmt: skip
    return out


def _posix(t: datetime | None) -> float | None:
    return None if t is None else _utc(t).timestamp()


def _nvml_names(conn: Connection, pks: list[int]) -> dict[int, str]:
    """The model NVML named for each job's GPUs (the hooks' start records), where one model was seen."""
    from sqlalchemy import Table, select

    from cocaq.db.schema import NodeEvent

    ev = cast(Table, NodeEvent.__table__).c
    seen: dict[int, set[str]] = defaultdict(set)
    for i in range(0, len(pks), 500):
        q = select(ev.job_pk, ev.payload).where(ev.job_pk.in_(pks[i : i + 500]), ev.event == "start")
        for pk, payload in conn.execute(q):
            gpus = payload.get("gpus") if isinstance(payload, dict) else None
            for g in gpus if isinstance(gpus, list) else []:
                name = normalise_gpu_model(g.get("name")) if isinstance(g, dict) else None
                if name:
                    seen[pk].add(name)
    return {pk: next(iter(names)) for pk, names in seen.items() if len(names) == 1}


def learn(conn: Connection, cfg: Config, now: datetime | None = None) -> Learnt:
    res = Learnt()
    now = now or datetime.now(UTC)
    samples = measured_samples(conn, cfg, res.skipped)
    res.jobs = len(samples)
    res.cells = build_cells(samples, cfg.estimate.calibrate_buckets, now)
    if samples:
        res.keyed = pb.keyed_cells(samples, None, now)
        res.bases = list(assessment(samples, cfg, now).bases.values())
    return res


def assessment(samples: Sequence[Sample], cfg: Config, now: datetime) -> pb.Assessment:
    """Each basis judged on held-out runs of these samples (cocaq.accounting.power_bases.assess)."""
    est = cfg.estimate

    def table(train: Sequence[Any]) -> Calibration:  # (the Samples of `samples`)
        return Calibration(build_cells(train, est.calibrate_buckets, now), est.calibrate_min_jobs,
                           est.calibrate_buckets)  # fmt: skip

    return pb.assess(samples, table, lambda s: s.tdp_w * est.gpu_utilisation, now)


def refresh(engine: Engine, cfg: Config, now: datetime | None = None) -> Learnt:
    """Learn the table again from the measured jobs and store it (replacing the previous one)."""
    from sqlalchemy import Table, delete, insert

    from cocaq.db.schema import GpuPowerBasis, GpuPowerCalibration, GpuPowerKeyed

    with engine.begin() as conn:
        res = learn(conn, cfg, now)
        for model, rows, fields in (
            (GpuPowerCalibration, res.cells, Cell.__slots__),
            (GpuPowerKeyed, res.keyed, pb.KeyedCell.__slots__),
            (GpuPowerBasis, res.bases, pb.BasisStats.__slots__),
        ):
            t = cast(Table, model.__table__)
            conn.execute(delete(t))
            if rows:
                conn.execute(insert(t), [{f: getattr(r, f) for f in fields} for r in rows])
    return res


def stored(engine: Engine) -> list[Cell]:
    from sqlalchemy import select

    from cocaq.db.schema import GpuPowerCalibration

    with engine.connect() as conn:
        t = GpuPowerCalibration.__table__.c
        rows = conn.execute(
            select(GpuPowerCalibration.__table__).order_by(t.gpu_model, t.partition, t.bucket)
        )
        return [_cell(r) for r in rows]


def stored_bases(engine: Engine) -> tuple[list[pb.BasisStats], int]:
    """Each basis's held-out figures, in the order the estimate tries them, and how many user cells."""
    from sqlalchemy import func, select

    from cocaq.db.schema import GpuPowerBasis, GpuPowerKeyed

    order = {
        b: i for i, b in enumerate((*pb.KEYED_BASES, pb.TABLE, pb.TABLE + "-util", pb.CHOSEN, *pb.REFERENCES))
    }
    with engine.connect() as conn:
        bases = [_basis(r) for r in conn.execute(select(GpuPowerBasis.__table__))]
        n = conn.execute(select(func.count()).select_from(GpuPowerKeyed.__table__)).scalar_one()
    return sorted(bases, key=lambda b: order.get(b.basis, 99)), int(n)


# --- validation: measured jobs held out and estimated as if nothing had measured them -------------------


@dataclass
class Errors:
    """Relative errors (estimate / measured - 1) of one method on held-out jobs."""

    rel: list[float] = field(default_factory=list)
    est_j: float = 0.0
    meas_j: float = 0.0

    def add(self, est_w: float, s: Sample) -> None:
        self.rel.append(est_w / s.w - 1.0)
        self.est_j += est_w * s.gpu_hours
        self.meas_j += s.w * s.gpu_hours

    def summary(self) -> dict[str, float | int]:
        a = sorted(abs(x) for x in self.rel)
        if not a:
            return {"jobs": 0}
        return {
            "jobs": len(a),
            "median_abs": weighted_quantile([(x, 1.0) for x in a], 0.5),
            "p90_abs": weighted_quantile([(x, 1.0) for x in a], 0.9),
            "median_signed": weighted_quantile([(x, 1.0) for x in self.rel], 0.5),
            "bias": self.est_j / self.meas_j - 1.0 if self.meas_j > 0 else math.nan,
        }


METHODS = ("tdp_config", "tdp_job_util", "calibrated_any", "calibrated")


def holdout(
    samples: Sequence[Sample], cfg: Config, *, share: float = 0.3, seeds: Iterable[int] = range(20)
) -> dict[str, Errors]:
    """Hold out `share` of the measured jobs (a seeded shuffle per seed), learn the table from the rest,
    and estimate the held-out jobs' GPU power as if nothing had measured them:

    * tdp_config: TDP x [estimate] gpu_utilisation (what the estimate was before calibration);
    * tdp_job_util: TDP x the job's own GPU utilisation (where the aggregator knows it);
    * calibrated_any: the table's cell without the job's utilisation (a job on a node nothing samples);
    * calibrated: the table's cell with the job's utilisation bucket where known (else as above).

    Errors are pooled over the seeds; each method is scored on the same held-out jobs (tdp_job_util
    only on those with a known utilisation).
    """
    import random

    out = {m: Errors() for m in METHODS}
    est = cfg.estimate
    for seed in seeds:
        order = list(samples)
        random.Random(seed).shuffle(order)
        k = max(1, round(len(order) * share))
        held, train = order[:k], order[k:]
        cells = build_cells(train, est.calibrate_buckets, datetime.now(UTC))
        cal = Calibration(cells, est.calibrate_min_jobs, est.calibrate_buckets)
        for s in held:
            tdp = s.tdp_w * est.gpu_utilisation
            out["tdp_config"].add(tdp, s)
            if s.util is not None:
                out["tdp_job_util"].add(max(s.tdp_w * s.util / 100.0, 1e-9), s)
            for name, util in (("calibrated_any", None), ("calibrated", s.util)):
                hit = cal.lookup(s.gpu_model, s.partition, util)
                out[name].add(tdp if isinstance(hit, str) else hit.w, s)
    return out
