"""Redo imported estimates and CO2 after the configuration changed (hardware, PUE, zone)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, or_, select

from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.schema import Cluster, Job
from cocaq.slurm.record import JobRecord

_FACTS = [f for f in JobRecord.__slots__ if f != "cluster"]


def recompute_jobs(engine: Engine, cfg: Config, *, since: datetime | None = None) -> tuple[int, int]:
    """Re-run estimates for imported jobs; returns (jobs looked at, jobs whose numbers changed)."""
    j = Job.__table__.c
    q = select(Cluster.name, j.imported_from, *(getattr(j, f) for f in _FACTS)).join(
        Cluster, Cluster.id == j.cluster_id
    )
    q = q.where(j.imported_from.like("sacct%") | (j.imported_from == "demo"))
    if since is not None:
        q = q.where(or_(j.end_time >= since, j.end_time.is_(None)))
    by_source: dict[str, list[JobRecord]] = {}
    with engine.connect() as conn:
        for row in conn.execute(q):
            rec = JobRecord(cluster=row[0], **dict(zip(_FACTS, row[2:], strict=True)))
            by_source.setdefault(row[1], []).append(rec)
    total = sum(len(v) for v in by_source.values())
    changed = 0
    for src, items in by_source.items():
        changed += import_records(engine, items, cfg, source=src).updated
    return total, changed
