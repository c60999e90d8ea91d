"""Write jobs and their energy to the database in bulk, idempotently.

A job is keyed by (cluster, job id, submit time): importing a dump twice, or overlapping windows, never
duplicates it; a changed record (a final state after RUNNING) updates it, and an open record never
overwrites a finished one.  PostgreSQL takes batches through COPY into a temporary table and one
`INSERT ... ON CONFLICT`; SQLite takes them through executemany.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, delete, insert, select, update

from cocaq.config import Config
from cocaq.estimate import IMPORT_SOURCES, JobFootprint, footprint
from cocaq.models import Cluster, Job, JobEnergy
from cocaq.slurm.record import JobRecord

log = logging.getLogger(__name__)

JOB_COLUMNS = [c.name for c in Job.__table__.columns if c.name not in ("id", "updated_at")]
ENERGY_COLUMNS = ["job_pk", "node", "component", "method", "source", "energy_j"]


@dataclass
class ImportSummary:
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    unknown_partitions: Counter[str] = field(default_factory=Counter)
    unknown_zones: set[str] = field(default_factory=set)

    @property
    def written(self) -> int:
        return self.inserted + self.updated


def _hash(rec: JobRecord, fp: JobFootprint) -> str:
    facts = [getattr(rec, f) for f in rec.__slots__]  # type: ignore[attr-defined]
    facts = [f.timestamp() if isinstance(f, datetime) else f for f in facts]  # same instant, any zone
    facts += [fp.energy_j, fp.co2_g, fp.carbon_g_per_kwh, fp.pue, fp.hw_profile]
    return hashlib.md5(repr(facts).encode(), usedforsecurity=False).hexdigest()


def job_row(rec: JobRecord, fp: JobFootprint, cluster_id: int, source: str) -> dict[str, Any]:
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
        "imported_from": source,
        "record_hash": _hash(rec, fp),
    }
    return row


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
    summary = ImportSummary()
    clusters = ClusterIds()
    writer = _write_pg if engine.dialect.name == "postgresql" else _write_generic
    for batch in _batches(records, batch_size):
        with engine.begin() as conn:
            rows: dict[tuple[int, str, datetime], tuple[dict[str, Any], JobFootprint]] = {}
            for rec in batch:
                fp = footprint(rec, cfg)
                if fp.hw_profile == "default" and rec.partition:
                    if rec.partition not in summary.unknown_partitions and cfg.partitions:
                        log.warning(
                            "partition %r is not in the configuration: using the default hardware profile",
                            rec.partition,
                        )
                    summary.unknown_partitions[rec.partition] += 1
                if fp.carbon_flag == "unknown-zone":
                    summary.unknown_zones.add(fp.carbon_zone)
                cid = clusters.get(conn, rec.cluster or cfg.cluster.name)
                row = job_row(rec, fp, cid, source)
                key = (cid, rec.job_id, rec.submit_time)
                prev = rows.get(key)
                if prev is not None and not prev[0]["is_open"] and row["is_open"]:
                    continue  # an open record never replaces a finished one
                rows[key] = (row, fp)
            writer(conn, list(rows.values()), summary)
        if on_batch:
            on_batch(len(batch))
    return summary


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
    jobs = Job.__table__
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
            delete(JobEnergy.__table__).where(
                JobEnergy.__table__.c.job_pk.in_([pk for pk, _, _ in changed]),
                JobEnergy.__table__.c.source.in_(IMPORT_SOURCES),
            )
        )
        for pk, _, fp in changed:
            energy.extend(_energy_rows(pk, fp))
        summary.updated += len(changed)
    if energy:
        conn.execute(insert(JobEnergy.__table__), energy)


_PG_TEMP = "_cocaq_import_jobs"


def _write_pg(
    conn: Connection, items: list[tuple[dict[str, Any], JobFootprint]], summary: ImportSummary
) -> None:
    """PostgreSQL path: COPY into a temporary table, then one INSERT ... ON CONFLICT ... RETURNING."""
    raw = conn.connection.driver_connection
    assert raw is not None
    cols = ", ".join(f'"{c}"' for c in JOB_COLUMNS)
    with raw.cursor() as cur:
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {_PG_TEMP} ON COMMIT DELETE ROWS AS "
            f"SELECT {cols} FROM jobs WITH NO DATA"
        )
        with cur.copy(f"COPY {_PG_TEMP} ({cols}) FROM STDIN") as cp:
            for row, _ in items:
                vals = [row[c] for c in JOB_COLUMNS]
                vals[JOB_COLUMNS.index("assumptions")] = json.dumps(row["assumptions"])
                cp.write_row(vals)
        sets = ", ".join(
            f'"{c}" = EXCLUDED."{c}"' for c in JOB_COLUMNS if c not in ("cluster_id", "job_id", "submit_time")
        )
        cur.execute(
            f"INSERT INTO jobs ({cols}) SELECT {cols} FROM {_PG_TEMP} "
            f"ON CONFLICT (cluster_id, job_id, submit_time) DO UPDATE SET {sets}, updated_at = now() "
            "WHERE jobs.record_hash IS DISTINCT FROM EXCLUDED.record_hash "
            "AND NOT (EXCLUDED.is_open AND NOT jobs.is_open) "
            "RETURNING id, cluster_id, job_id, submit_time, (xmax = 0) AS inserted"
        )
        returned = cur.fetchall()
        fps = {(r["cluster_id"], r["job_id"], r["submit_time"]): fp for r, fp in items}
        updated_pks = []
        energy: list[tuple[Any, ...]] = []
        for pk, cid, jid, sub, inserted in returned:
            if inserted:
                summary.inserted += 1
            else:
                summary.updated += 1
                updated_pks.append(pk)
            for e in fps[(cid, jid, sub)].energies:
                energy.append((pk, e.node, e.component, e.method, e.source, e.energy_j))
        summary.unchanged += len(items) - len(returned)
        if updated_pks:
            cur.execute(
                "DELETE FROM job_energy WHERE job_pk = ANY(%s) AND source = ANY(%s)",
                (updated_pks, list(IMPORT_SOURCES)),
            )
        if energy:
            with cur.copy(f"COPY job_energy ({', '.join(ENERGY_COLUMNS)}) FROM STDIN") as cp:
                for e_row in energy:
                    cp.write_row(e_row)
