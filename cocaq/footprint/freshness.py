"""How fresh the figures are: when Slurm's accounting was last imported, how far the daily rollups go,
when a node last shipped samples (GET /v1/status, the web app's "accounting imported 14 min ago").

A figure read from the database is only as new as its last import, and a page that does not say so
invites a user to trust a total that misses yesterday. Standard library only (and cocaq.db.dbapi).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from cocaq.footprint.totals import WATERMARK

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db

IMPORT_JOBS = ("reconcile", "catchup")  # the scheduler's jobs that import Slurm's accounting


def freshness(db: Db) -> dict[str, Any]:
    """ISO times (None: never): `accounting_imported_at`, the end of the last import the scheduler ran
    (`imported_by`: "scheduler"), else when a job row last changed ("jobs": an import run by hand, the
    demo); `rollups_through`, the aggregator's watermark; `samples_shipped_at`, the last shipment of
    any node's collector."""
    ran = db.rows(
        "SELECT MAX(finished_at) FROM scheduler_runs WHERE status = 'ok' AND job_id IN (%(a)s, %(b)s)",
        {"a": IMPORT_JOBS[0], "b": IMPORT_JOBS[1]},
    )
    imported, by = _t(db, ran[0][0]), "scheduler"
    if imported is None:
        imported, by = _t(db, db.rows("SELECT MAX(updated_at) FROM jobs")[0][0]), "jobs"
    mark = db.rows("SELECT watermark FROM aggregator_state WHERE name = %(n)s", {"n": WATERMARK})
    shipped = _t(db, db.rows("SELECT MAX(shipped_at) FROM node_shipments")[0][0])
    return {
        "accounting_imported_at": _iso(imported),
        "imported_by": by if imported is not None else None,
        "rollups_through": _iso(_t(db, mark[0][0]) if mark else None),
        "samples_shipped_at": _iso(shipped),
    }


def _t(db: Db, v: Any) -> datetime | None:
    return db.timestamp(v)


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()
