"""Write jobs and their energy to the database in bulk, idempotently.

A job is keyed by (cluster, job id, submit time): importing a dump twice, or overlapping windows, never
duplicates it; a changed record (a final state after RUNNING) updates it, and an open record never
overwrites a finished one.  PostgreSQL takes batches through COPY into a temporary table and one
`INSERT ... ON CONFLICT`, written by a second thread while the next batch is parsed and estimated;
SQLite takes them through executemany.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, bindparam, delete, insert, or_, select, update

from cocaq.accounting import calibrate
from cocaq.accounting.estimate import (
    IMPORT_SOURCES,
    Estimator,
    FootprintValues,
    JobFootprint,
    footprint_from_values,
)
from cocaq.config import Config
from cocaq.db.schema import Cluster, Job, JobEnergy
from cocaq.slurm.plausible import Checked, Tally, checked
from cocaq.slurm.record import JobRecord

log = logging.getLogger(__name__)

JOB_COLUMNS = [c.name for c in Job.__table__.columns if c.name not in ("id", "updated_at")]
ENERGY_COLUMNS = ["job_pk", "node", "component", "method", "source", "energy_j"]


@dataclass
class ImportSummary:
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # records refused (cocaq.slurm.plausible)
    clamped: Counter[str] = field(default_factory=Counter)  # fields dropped or cut, the record kept
    examples: dict[str, str] = field(default_factory=dict)  # the first job of each reason
    unknown_partitions: Counter[str] = field(default_factory=Counter)
    unknown_zones: set[str] = field(default_factory=set)
    measured: int = 0  # jobs whose node measurements were applied after the import
    models: int = 0  # jobs whose model metadata (from their comment) was written

    @property
    def written(self) -> int:
        return self.inserted + self.updated


def _hash(rec: JobRecord, fp: JobFootprint) -> str:
    facts = [getattr(rec, f) for f in rec.__slots__]
    facts = [f.timestamp() if isinstance(f, datetime) else f for f in facts]  # same instant, any zone
    facts += [fp.energy_j, fp.co2_g, fp.carbon_g_per_kwh, fp.pue, fp.hw_profile]
    if fp.energy_est_low_j is not None:  # (only then: the digests of jobs without a range stay as they were)
        facts += [fp.energy_est_low_j, fp.energy_est_high_j]
    return hashlib.md5(repr(facts).encode(), usedforsecurity=False).hexdigest()


_SLOTS: tuple[str, ...] = JobRecord.__slots__
_TYPES = {f.name: str(f.type) for f in fields(JobRecord)}
# Where the datetimes are (submit, start, end): _hash turns them into timestamps wherever they are.
_TIME_AT = tuple(i for i, name in enumerate(_SLOTS) if "datetime" in _TYPES[name])
_md5 = hashlib.md5


def _hash_values_any(rec: JobRecord, v: FootprintValues) -> str:
    """_hash(rec, footprint) from the footprint's values: the same digest."""
    facts = [getattr(rec, f) for f in _SLOTS]
    for i in _TIME_AT:
        t = facts[i]
        if isinstance(t, datetime):
            facts[i] = t.timestamp()
    facts += [v[1], v[11], v[7], v[5], v[3]]  # energy_j, co2_g, carbon_g_per_kwh, pue, hw_profile
    if v[12] is not None:
        facts += [v[12], v[13]]  # the estimate's range
    return _md5(repr(facts).encode(), usedforsecurity=False).hexdigest()


if _TIME_AT == (2, 20, 21) and _SLOTS[2] == "submit_time" and _SLOTS[20:22] == ("start_time", "end_time"):
    _HEAD = operator.attrgetter(*_SLOTS[:2])
    _MID = operator.attrgetter(*_SLOTS[3:20])
    _TAIL = operator.attrgetter(*_SLOTS[22:])

    def _hash_values(rec: JobRecord, v: FootprintValues) -> str:
        """_hash_values_any() for JobRecord's field order, the list built in one go: the same digest."""
        sub, start, end = rec.submit_time, rec.start_time, rec.end_time
        facts = [
            *_HEAD(rec),
            sub.timestamp() if isinstance(sub, datetime) else sub,
            *_MID(rec),
            start.timestamp() if isinstance(start, datetime) else start,
            end.timestamp() if isinstance(end, datetime) else end,
            *_TAIL(rec),
            v[1],  # energy_j
            v[11],  # co2_g
            v[7],  # carbon_g_per_kwh
            v[5],  # pue
            v[3],  # hw_profile
        ]
        if v[12] is not None:
            facts += [v[12], v[13]]  # the estimate's range
        return _md5(repr(facts).encode(), usedforsecurity=False).hexdigest()

else:  # pragma: no cover - JobRecord's fields were reordered
    _hash_values = _hash_values_any


# What the memory columns hold: a float8 (no inf or nan wanted) and an int4.
_FLOAT_MAX = 1.7976931348623157e308
_INT4_MAX = 2**31 - 1


def _clean_rss(rec: JobRecord) -> None:
    """Drop MaxRSS values the `jobs` columns cannot hold (a bad one would abort the whole batch).

    On the record itself, before it is hashed: a recompute, which rebuilds it from the columns, then
    gives the same digest.
    """
    rss = rec.max_rss_mb
    if rss is not None and not (isinstance(rss, int | float) and 0 <= rss <= _FLOAT_MAX):
        rec.max_rss_mb = None  # nan, inf, negative, or not a number
    tpn = rec.rss_tasks_per_node
    if tpn is not None and not (type(tpn) is int and 0 < tpn <= _INT4_MAX):
        rec.rss_tasks_per_node = None


def job_row(
    rec: JobRecord, fp: JobFootprint, cluster_id: int, source: str, gpus_unknown: bool = False
) -> dict[str, Any]:
    """The `jobs` row of a record; `gpus_unknown` as GpuTres.settle() decided it."""
    if rec.max_rss_mb is not None or rec.rss_tasks_per_node is not None:
        _clean_rss(rec)
    row = {
        "cluster_id": cluster_id,
        "job_id": rec.job_id,
        "job_id_raw": rec.job_id_raw,
        "array_job_id": rec.array_job_id,
        "array_task_id": rec.array_task_id,
        "het_job_id": rec.het_job_id,
        "het_job_offset": rec.het_job_offset,
        "user_name": rec.user_name[:64],
        "uid": rec.uid,
        "account": rec.account[:64] if rec.account else None,
        "partition": rec.partition[:128] if rec.partition else None,
        "qos": rec.qos[:64] if rec.qos else None,
        "node_list": rec.node_list,
        "n_nodes": rec.n_nodes,
        "alloc_cpus": rec.alloc_cpus,
        "alloc_gpus": rec.alloc_gpus,
        "gpu_type": rec.gpu_type[:64] if rec.gpu_type else None,
        "req_mem_mb": rec.req_mem_mb,
        "max_rss_mb": rec.max_rss_mb,
        "rss_tasks_per_node": rec.rss_tasks_per_node,
        "slurm_gpu_util": rec.slurm_gpu_util,
        "slurm_gpu_mem_mb": rec.slurm_gpu_mem_mb,
        "batch_step": rec.batch_step,
        "zero_cpu_nodes": rec.zero_cpu_nodes,
        "gpus_unknown": gpus_unknown,
        "submit_time": rec.submit_time,
        "start_time": rec.start_time,
        "end_time": rec.end_time,
        "elapsed_s": rec.elapsed_s,
        "time_limit_s": rec.time_limit_s,
        "state": rec.state[:32],
        "state_detail": rec.state_detail[:128] if rec.state_detail else None,
        "is_open": rec.is_open,
        "exit_code": rec.exit_code,
        "exit_signal": rec.exit_signal,
        "name": rec.name,
        "comment": rec.comment,
        "total_cpu_s": rec.total_cpu_s,
        "consumed_energy_j": rec.consumed_energy_j,
        "energy_j": fp.energy_j,
        "energy_measured_j": fp.energy_measured_j,
        "pue": fp.pue,
        "carbon_zone": fp.carbon_zone,
        "carbon_g_per_kwh": fp.carbon_g_per_kwh,
        "carbon_source": fp.carbon_source,
        "carbon_year": fp.carbon_year,
        "carbon_flag": fp.carbon_flag,
        "co2_g": fp.co2_g,
        "hw_profile": fp.hw_profile,
        "assumptions": fp.assumptions,
        "energy_est_low_j": fp.energy_est_low_j,
        "energy_est_high_j": fp.energy_est_high_j,
        "imported_from": source,
        "record_hash": _hash(rec, fp),
    }
    return row


# Whether a job's GPU count is unknown (jobs.gpus_unknown), before its cluster's accounting is known:
UNKNOWN_NO = 0  # it has GPUs in its TRES, or ran on no GPU partition
UNKNOWN_IF_UNTRACKED = 1  # none in its TRES on a GPU partition: unknown while the cluster records no GPUs
UNKNOWN_YES = 2  # none in its TRES, yet Slurm's gres/gpuutil says it used GPUs


def gpus_unknown_code(rec: JobRecord, gpu_hardware: bool) -> int:
    if rec.alloc_gpus:
        return UNKNOWN_NO
    if rec.slurm_gpu_util:
        return UNKNOWN_YES
    return UNKNOWN_IF_UNTRACKED if gpu_hardware else UNKNOWN_NO


class GpuTres:
    """Per cluster, whether its accounting ever recorded a GPU in a job's TRES (clusters.gpu_tres).

    A site without `AccountingStorageTRES=gres/gpu` has no GPU in any job's TRES: a job on a GPU partition
    then held an unknown number of GPUs, not none. The first job with a GPU in its TRES settles it for the
    cluster, and clears the flag on the jobs imported before it.
    """

    def __init__(self) -> None:
        self._seen: dict[int, bool] = {}

    def note(self, conn: Connection, cid: int, has_gpus: bool) -> bool:
        """Whether the cluster records GPUs, after a batch in which it had a job with GPUs or not."""
        seen = self._seen.get(cid)
        if seen is None:
            seen = bool(conn.execute(select(Cluster.gpu_tres).where(Cluster.id == cid)).scalar())
        if has_gpus and not seen:
            conn.execute(update(Cluster).where(Cluster.id == cid).values(gpu_tres=True))
            jobs = Job.__table__.c
            conn.execute(
                update(Job)
                .where(
                    jobs.cluster_id == cid,
                    jobs.gpus_unknown,
                    or_(jobs.slurm_gpu_util.is_(None), jobs.slurm_gpu_util <= 0),
                )
                .values(gpus_unknown=False)
            )
            seen = True
        self._seen[cid] = seen
        return seen

    @staticmethod
    def settle(code: int, tracked: bool) -> bool:
        return code == UNKNOWN_YES or (code == UNKNOWN_IF_UNTRACKED and not tracked)


class ClusterIds:
    """Cluster name -> id, creating clusters on first sight."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def get(self, conn: Connection, name: str) -> int:
        if name in self._ids:
            return self._ids[name]
        cid = conn.execute(select(Cluster.id).where(Cluster.name == name)).scalar()
        if cid is None:
            cid = conn.execute(insert(Cluster).values(name=name).returning(Cluster.id)).scalar_one()
        self._ids[name] = cid
        return cid


def _batches(it: Iterable[JobRecord], n: int) -> Iterator[list[JobRecord]]:
    batch: list[JobRecord] = []
    for rec in it:
        batch.append(rec)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def import_records(
    engine: Engine,
    records: Iterable[JobRecord],
    cfg: Config,
    *,
    source: str,
    batch_size: int = 20_000,
    on_batch: Callable[[int], None] | None = None,
) -> ImportSummary:
    """Upsert `records` with their estimated or measured energy and CO2; returns what happened."""
    # Parsing and estimating allocate millions of short-lived containers and few cycles; the collector's
    # default 700-allocation trigger spends about a tenth of an import walking them.
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], _GC_THRESHOLD), *thresholds[1:])
    earliest: list[datetime] = []
    began = datetime.now(UTC) - META_MARGIN
    # The plausibility rules (cocaq.slurm.plausible), here unless the parser's process applied them
    tally = records.tally if isinstance(records, Checked) else Tally()
    if not isinstance(records, Checked):
        records = checked(records, tally, max_node_power_w=cfg.estimate.max_node_power_w)

    def watch(it: Iterable[JobRecord]) -> Iterator[JobRecord]:
        lo = None
        for rec in it:
            t = rec.start_time or rec.submit_time
            if t is not None and (lo is None or t < lo):
                lo = t
            yield rec
        if lo is not None:
            earliest.append(lo)

    try:
        if engine.dialect.name == "postgresql":
            summary = _import_pg(
                engine, watch(records), cfg, source=source, batch_size=batch_size, on_batch=on_batch
            )
        else:
            summary = _import_generic(
                engine, watch(records), cfg, source=source, batch_size=batch_size, on_batch=on_batch
            )
    finally:
        gc.set_threshold(*thresholds)
    summary.skipped.update(tally.skipped)
    summary.clamped.update(tally.clamped)
    summary.examples.update(tally.examples)
    # The import rewrote estimates and totals; jobs that nodes measured get their measurements back.
    from cocaq.accounting import measured

    with engine.connect() as conn:
        has_nodes = measured.has_node_data(conn)
    if has_nodes and earliest:
        summary.measured = measured.refresh(engine, cfg, since=earliest[0] - measured.MARGIN).jobs_measured
    # Model metadata declared in the comments (`cocaq: model=...`) of the jobs this import wrote.
    from cocaq.ml import store as modelmeta_store

    with engine.begin() as conn:
        summary.models = modelmeta_store.refresh_since(conn, began)
    return summary


# Jobs written by an import are found by `updated_at` (the database's clock) >= the import's start (ours).
META_MARGIN = timedelta(minutes=10)


_GC_THRESHOLD = 20_000


def _import_generic(
    engine: Engine,
    records: Iterable[JobRecord],
    cfg: Config,
    *,
    source: str,
    batch_size: int,
    on_batch: Callable[[int], None] | None,
) -> ImportSummary:
    """Portable path (SQLite): one batch after the other, each in its own transaction."""
    summary = ImportSummary()
    clusters = ClusterIds()
    est = Estimator(cfg, calibrate.load_engine(engine, cfg))
    tres = GpuTres()
    for batch in _batches(records, batch_size):
        with engine.begin() as conn:
            rows: dict[tuple[int, str, datetime], tuple[dict[str, Any], JobFootprint]] = {}
            with_gpus: dict[int, bool] = {}
            for rec in batch:
                cid = clusters.get(conn, rec.cluster or cfg.cluster.name)
                with_gpus[cid] = with_gpus.get(cid, False) or rec.alloc_gpus > 0
            tracked = {cid: tres.note(conn, cid, has) for cid, has in with_gpus.items()}
            for rec in batch:
                fp = est.footprint(rec)
                _note_profile(summary, cfg, rec, fp.hw_profile, fp.carbon_flag, fp.carbon_zone)
                cid = clusters.get(conn, rec.cluster or cfg.cluster.name)
                unknown = GpuTres.settle(gpus_unknown_code(rec, est.gpu_hardware(rec)), tracked[cid])
                row = job_row(rec, fp, cid, source, unknown)
                key = (cid, rec.job_id, rec.submit_time)
                prev = rows.get(key)
                if prev is not None and not prev[0]["is_open"] and row["is_open"]:
                    continue  # an open record never replaces a finished one
                rows[key] = (row, fp)
            _write_generic(conn, list(rows.values()), summary)
        if on_batch:
            on_batch(len(batch))
    return summary


def _note_profile(
    summary: ImportSummary, cfg: Config, rec: JobRecord, profile: str, flag: str | None, zone: str
) -> None:
    if profile == "default" and rec.partition:
        if rec.partition not in summary.unknown_partitions and cfg.partitions:
            log.warning(
                "partition %r is not in the configuration: using the default hardware profile", rec.partition
            )
        summary.unknown_partitions[rec.partition] += 1
    if flag == "unknown-zone":
        summary.unknown_zones.add(zone)


def _energy_rows(pk: int, fp: JobFootprint) -> list[dict[str, Any]]:
    return [
        {
            "job_pk": pk,
            "node": e.node,
            "component": e.component,
            "method": e.method,
            "source": e.source,
            "energy_j": e.energy_j,
        }
        for e in fp.energies
    ]


def _write_generic(
    conn: Connection, items: list[tuple[dict[str, Any], JobFootprint]], summary: ImportSummary
) -> None:
    """Portable path (SQLite): look the batch up, insert the new, update the changed."""
    jobs = cast(Table, Job.__table__)
    energy_table = cast(Table, JobEnergy.__table__)
    existing: dict[tuple[int, str, datetime], tuple[int, str | None, bool]] = {}
    by_cluster: dict[int, list[str]] = {}
    for row, _ in items:
        by_cluster.setdefault(row["cluster_id"], []).append(row["job_id"])
    for cid, ids in by_cluster.items():
        for i in range(0, len(ids), 500):
            q = select(
                jobs.c.id, jobs.c.job_id, jobs.c.submit_time, jobs.c.record_hash, jobs.c.is_open
            ).where(jobs.c.cluster_id == cid, jobs.c.job_id.in_(ids[i : i + 500]))
            for pk, jid, sub, h, is_open in conn.execute(q):
                existing[(cid, jid, sub)] = (pk, h, is_open)
    new, changed = [], []
    for row, fp in items:
        hit = existing.get((row["cluster_id"], row["job_id"], row["submit_time"]))
        if hit is None:
            new.append((row, fp))
        elif hit[1] == row["record_hash"] or (row["is_open"] and not hit[2]):
            summary.unchanged += 1
        else:
            changed.append((hit[0], row, fp))
    energy: list[dict[str, Any]] = []
    if new:
        pks = (
            conn.execute(insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True), [r for r, _ in new])
            .scalars()
            .all()
        )
        for pk, (_, fp) in zip(pks, new, strict=True):
            energy.extend(_energy_rows(pk, fp))
        summary.inserted += len(new)
    if changed:
        params = [{**row, "_pk": pk} for pk, row, _ in changed]
        stmt = (
            update(jobs).where(jobs.c.id == bindparam("_pk")).values({c: bindparam(c) for c in JOB_COLUMNS})
        )
        conn.execute(stmt, params)
        conn.execute(
            delete(energy_table).where(
                energy_table.c.job_pk.in_([pk for pk, _, _ in changed]),
                energy_table.c.source.in_(IMPORT_SOURCES),
            )
        )
        for pk, _, fp in changed:
            energy.extend(_energy_rows(pk, fp))
        summary.updated += len(changed)
    if energy:
        conn.execute(insert(energy_table), energy)


_PG_TEMP = "_cocaq_import_jobs"

# The PostgreSQL path builds each job's COPY row straight from the record and its footprint values, in
# this column order (job_row()'s values, without the dict); cluster_id is filled in by the writer.
_PG_COLS = (
    "cluster_id", "job_id", "job_id_raw", "array_job_id", "array_task_id", "het_job_id", "het_job_offset",
    "user_name", "uid", "account", "partition", "qos", "node_list", "n_nodes", "alloc_cpus", "alloc_gpus",
    "gpu_type", "req_mem_mb", "max_rss_mb", "rss_tasks_per_node", "slurm_gpu_util", "slurm_gpu_mem_mb",
    "gpus_unknown", "submit_time", "start_time", "end_time",
    "elapsed_s", "time_limit_s", "state", "state_detail", "is_open", "exit_code", "exit_signal", "name",
    "comment", "total_cpu_s", "consumed_energy_j", "energy_j", "energy_measured_j", "pue", "carbon_zone",
    "carbon_g_per_kwh", "carbon_source", "carbon_year", "carbon_flag", "co2_g", "hw_profile", "assumptions",
    "imported_from", "record_hash", "energy_est_low_j", "energy_est_high_j", "batch_step", "zero_cpu_nodes",
)  # fmt: skip
# A schema with other job columns than these (a migration in progress) takes the job_row() route.
_PG_FAST = sorted(_PG_COLS) == sorted(JOB_COLUMNS)


def _pg_row(
    rec: JobRecord, v: FootprintValues, source: str, dumps: Callable[[Any], str], unknown: int
) -> list[Any]:
    """job_row(rec, footprint, cluster_id, source)'s values in _PG_COLS order, assumptions as JSON text;
    gpus_unknown holds gpus_unknown_code() until the writer knows the cluster (GpuTres.settle)."""
    if rec.max_rss_mb is not None or rec.rss_tasks_per_node is not None:
        _clean_rss(rec)
    return [
        None,
        rec.job_id,
        rec.job_id_raw,
        rec.array_job_id,
        rec.array_task_id,
        rec.het_job_id,
        rec.het_job_offset,
        rec.user_name[:64],
        rec.uid,
        rec.account[:64] if rec.account else None,
        rec.partition[:128] if rec.partition else None,
        rec.qos[:64] if rec.qos else None,
        rec.node_list,
        rec.n_nodes,
        rec.alloc_cpus,
        rec.alloc_gpus,
        rec.gpu_type[:64] if rec.gpu_type else None,
        rec.req_mem_mb,
        rec.max_rss_mb,
        rec.rss_tasks_per_node,
        rec.slurm_gpu_util,
        rec.slurm_gpu_mem_mb,
        unknown,
        rec.submit_time,
        rec.start_time,
        rec.end_time,
        rec.elapsed_s,
        rec.time_limit_s,
        rec.state[:32],
        rec.state_detail[:128] if rec.state_detail else None,
        rec.is_open,
        rec.exit_code,
        rec.exit_signal,
        rec.name,
        rec.comment,
        rec.total_cpu_s,
        rec.consumed_energy_j,
        v[1],  # energy_j
        v[2],  # energy_measured_j
        v[5],  # pue
        v[6],  # carbon_zone
        v[7],  # carbon_g_per_kwh
        v[8],  # carbon_source
        v[9],  # carbon_year
        v[10],  # carbon_flag
        v[11],  # co2_g
        v[3],  # hw_profile
        dumps(v[4]),  # assumptions
        source,
        _hash_values(rec, v),
        v[12],  # energy_est_low_j
        v[13],  # energy_est_high_j
        rec.batch_step,
        rec.zero_cpu_nodes,
    ]


def _slow_row(
    rec: JobRecord, v: FootprintValues, source: str, dumps: Callable[[Any], str], unknown: int
) -> list[Any]:
    """The same through job_row(), in JOB_COLUMNS order: for a schema the fast row does not know."""
    fp = footprint_from_values(v)
    row = job_row(rec, fp, 0, source)
    row["assumptions"] = dumps(row["assumptions"])
    row["gpus_unknown"] = unknown  # settled by the writer, as _pg_row's
    return [row[c] for c in JOB_COLUMNS]


# One batch for the writer: (cluster name, job id, submit time) -> (COPY row, is_open, energy rows).
_PgBatch = dict[tuple[str, str, datetime], tuple[list[Any], bool, tuple[tuple[Any, ...], ...]]]


def _import_pg(
    engine: Engine,
    records: Iterable[JobRecord],
    cfg: Config,
    *,
    source: str,
    batch_size: int,
    on_batch: Callable[[int], None] | None,
) -> ImportSummary:
    """PostgreSQL: batches are estimated here while a writer thread upserts the previous one.

    The writer runs one batch at a time, in order, each in its own transaction, exactly as a loop would;
    the database's work on batch N overlaps the parsing and estimating of batch N+1.
    """
    summary = ImportSummary()
    est = Estimator(cfg, calibrate.load_engine(engine, cfg))
    values = est.values
    gpu_hardware = est.gpu_hardware
    dumps = est.assumptions_json
    default_cluster = cfg.cluster.name
    cols = _PG_COLS if _PG_FAST else tuple(JOB_COLUMNS)
    make_row = _pg_row if _PG_FAST else _slow_row
    writer = _PgWriter(engine, cols)
    in_flight: tuple[Future[tuple[int, int, int]], int] | None = None

    def collect() -> None:
        nonlocal in_flight
        assert in_flight is not None
        future, n = in_flight
        in_flight = None
        inserted, updated, unchanged = future.result()
        summary.inserted += inserted
        summary.updated += updated
        summary.unchanged += unchanged
        if on_batch:
            on_batch(n)

    # One writer thread, one batch at a time and in order: each batch is written, in its own transaction,
    # before the next is handed over, exactly as a loop would -- only the preparing of the next overlaps.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cocaq-import-writer")
    try:
        for batch in _batches(records, batch_size):
            rows: _PgBatch = {}
            for rec in batch:
                v = values(rec)
                if v[3] == "default" or v[10] == "unknown-zone":
                    _note_profile(summary, cfg, rec, v[3], v[10], v[6])
                key = (rec.cluster or default_cluster, rec.job_id, rec.submit_time)
                prev = rows.get(key)
                if prev is not None and not prev[1] and rec.is_open:
                    continue  # an open record never replaces a finished one
                unknown = gpus_unknown_code(rec, gpu_hardware(rec))
                rows[key] = (make_row(rec, v, source, dumps, unknown), rec.is_open, v[0])
            if in_flight is not None:
                collect()
            in_flight = (pool.submit(writer.write, rows), len(batch))
        if in_flight is not None:
            collect()
    finally:
        pool.shutdown(wait=True)  # after an error here, the batch already handed over is still written
    return summary


# Column types COPY (FORMAT BINARY) can take from the rows' Python values; json is sent as its text.
_BINARY_TYPES = {
    "smallint", "integer", "bigint", "real", "double precision", "boolean", "text", "character varying",
    "timestamp with time zone", "json",
}  # fmt: skip


_INT_RANGE = {"smallint": 2**15, "integer": 2**31, "bigint": 2**63}
# Made here, never with a NUL: json.dumps escapes control characters, the hash is hex.
_NUL_FREE = {"assumptions", "record_hash"}


def _binary_safe(rows: list[list[Any]], types: list[str], cols: tuple[str, ...]) -> bool:
    """Whether a binary COPY stores these rows exactly as a text COPY would, or fails the same way.

    A binary COPY wraps an integer too big for its column where the server rejects its text, and
    refuses a NUL in a string client-side rather than as the text COPY's DataError: such a batch (only
    malformed input makes one) goes as text.  Column by column, in C loops: a few ms a batch.
    """
    for i, (name, col) in enumerate(zip(types, cols, strict=True)):
        if col in _NUL_FREE:
            continue
        get = operator.itemgetter(i)
        if name in _INT_RANGE:
            ints = list(filter(None, map(get, rows)))
            if ints and (
                not set(map(type, ints)) <= {int}  # a bool or a float: leave it to the server
                or max(ints) >= _INT_RANGE[name]
                or min(ints) < -_INT_RANGE[name]
            ):
                return False
        elif name in ("text", "character varying") and "\x00" in "\n".join(filter(None, map(get, rows))):
            return False
    return True


def _copy_writer(cur: Any) -> Any:
    """A COPY writer that hands libpq the whole batch before waiting for the socket (None: the default).

    psycopg's default waits for the data to drain every megabyte; each wait gives up the GIL, and
    taking it back from the thread that is parsing the next batch costs up to a switch interval (5 ms).
    A batch is a few megabytes: libpq can hold it.
    """
    try:
        from psycopg.copy import LibpqWriter

        return LibpqWriter(cur, flush_threshold=1 << 40)
    except (ImportError, TypeError):  # psycopg before 3.3
        return None


class _PgWriter:
    """COPY into a temporary table, one INSERT ... ON CONFLICT ... RETURNING, then COPY job_energy."""

    def __init__(self, engine: Engine, cols: tuple[str, ...]) -> None:
        self.engine = engine
        self.cols = cols
        self.cid_at = cols.index("cluster_id")
        self.gpus_at = cols.index("alloc_gpus")
        self.unknown_at = cols.index("gpus_unknown")
        self.clusters = ClusterIds()
        self.tres = GpuTres()
        self.types: dict[str, list[str] | None] = {}

    def _types(self, cur: Any, table: str, cols: Iterable[str]) -> list[str] | None:
        """The columns' type names for a binary COPY, or None where one is not a plain type (text COPY)."""
        if table not in self.types:
            cur.execute(
                "SELECT attname, atttypid::regtype::text FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                (table,),
            )
            by_name = dict(cur.fetchall())
            names = [by_name.get(c) for c in cols]
            ok = all(n in _BINARY_TYPES for n in names)
            self.types[table] = ["text" if n == "json" else str(n) for n in names] if ok else None
        return self.types[table]

    def write(self, rows: _PgBatch) -> tuple[int, int, int]:
        """(inserted, updated, unchanged) for one batch, in one transaction."""
        with self.engine.begin() as conn:
            cids: dict[str, int] = {}
            with_gpus: dict[str, bool] = {}
            gpus_at, unknown_at = self.gpus_at, self.unknown_at
            for (name, _, _), (row, _, _) in rows.items():
                if name not in cids:
                    cids[name] = self.clusters.get(conn, name)
                with_gpus[name] = with_gpus.get(name, False) or bool(row[gpus_at])
            tracked = {name: self.tres.note(conn, cids[name], has) for name, has in with_gpus.items()}
            settle = GpuTres.settle
            for (name, _, _), (row, _, _) in rows.items():
                row[unknown_at] = settle(row[unknown_at], tracked[name])
            return self._write(conn, rows, cids)

    def _write(self, conn: Connection, rows: _PgBatch, cids: dict[str, int]) -> tuple[int, int, int]:
        raw = conn.connection.driver_connection
        assert raw is not None
        cols = ", ".join(f'"{c}"' for c in self.cols)
        cid_at = self.cid_at
        with raw.cursor() as cur:
            cur.execute(
                f"CREATE TEMP TABLE IF NOT EXISTS {_PG_TEMP} ON COMMIT DELETE ROWS AS "
                f"SELECT {cols} FROM jobs WITH NO DATA"
            )
            types = self._types(cur, "jobs", self.cols)
            if types and not _binary_safe([r for r, _, _ in rows.values()], types, self.cols):
                types = None  # a text COPY: the server judges the odd value, as it always did
            binary = " (FORMAT BINARY)" if types else ""
            with cur.copy(f"COPY {_PG_TEMP} ({cols}) FROM STDIN{binary}", writer=_copy_writer(cur)) as cp:
                if types:
                    cp.set_types(types)
                write_row = cp.write_row
                if len(cids) == 1:
                    cid = next(iter(cids.values()))
                    for row, _, _ in rows.values():
                        row[cid_at] = cid
                        write_row(row)
                else:
                    for (name, _, _), (row, _, _) in rows.items():
                        row[cid_at] = cids[name]
                        write_row(row)
            key_cols = ("cluster_id", "job_id", "submit_time")
            sets = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in self.cols if c not in key_cols)
            cur.execute(
                f"INSERT INTO jobs ({cols}) SELECT {cols} FROM {_PG_TEMP} "
                f"ON CONFLICT (cluster_id, job_id, submit_time) DO UPDATE SET {sets}, updated_at = now() "
                "WHERE jobs.record_hash IS DISTINCT FROM EXCLUDED.record_hash "
                "AND NOT (EXCLUDED.is_open AND NOT jobs.is_open) "
                "RETURNING id, cluster_id, job_id, submit_time, (xmax = 0) AS inserted",
                binary=True,
            )
            returned = cur.fetchall()
            # The returned rows' energies, found by (cluster id, job id): a job id seen twice in the batch
            # (a reused id, another submit time) is looked up with its submit time as well.
            by_id: dict[tuple[int, str], Any] = {}
            twice: set[tuple[int, str]] = set()
            for (name, jid, _), (_, _, energies) in rows.items():
                k = (cids[name], jid)
                if k in by_id:
                    twice.add(k)
                by_id[k] = energies
            name_of = {cid: name for name, cid in cids.items()}
            inserted = 0
            updated_pks = []
            energy: list[tuple[Any, ...]] = []
            add = energy.append
            for pk, cid, jid, sub, is_new in returned:
                if is_new:
                    inserted += 1
                else:
                    updated_pks.append(pk)
                k = (cid, jid)
                energies = by_id[k] if k not in twice else rows[(name_of[cid], jid, sub)][2]
                for e in energies:
                    add((pk, *e))
            if updated_pks:
                cur.execute(
                    "DELETE FROM job_energy WHERE job_pk = ANY(%s) AND source = ANY(%s)",
                    (updated_pks, list(IMPORT_SOURCES)),
                )
            if energy:
                etypes = self._types(cur, "job_energy", ENERGY_COLUMNS)
                ecols = ", ".join(ENERGY_COLUMNS)
                with cur.copy(
                    f"COPY job_energy ({ecols}) FROM STDIN" + (" (FORMAT BINARY)" if etypes else ""),
                    writer=_copy_writer(cur),
                ) as cp:
                    if etypes:
                        cp.set_types(etypes)
                    write_row = cp.write_row
                    for e_row in energy:
                        write_row(e_row)
        return inserted, len(updated_pks), len(rows) - len(returned)
