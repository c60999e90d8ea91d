"""`cocaq db status`: what the database holds (cocaq.db.status) and how long its samples stay, for people
(tables that fit the terminal, down to 60 columns) or for scripts (`--format json`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx


def _iso(d: datetime | None) -> str | None:
    return None if d is None else d.astimezone(UTC).isoformat()


def gather(obj: Ctx) -> dict[str, Any]:
    """The status as one JSON-able document (the table view renders the same)."""
    from sqlalchemy import select

    from cocaq.accounting.aggregate import GPU_HOURS
    from cocaq.accounting.gpu_hours import samples_horizon
    from cocaq.db.coltypes import as_utc
    from cocaq.db.engine import mask_url
    from cocaq.db.schema import AggregatorState
    from cocaq.db.status import db_status

    engine = obj.engine()
    try:
        st = db_status(engine)
        with engine.connect() as conn:
            horizon = samples_horizon(conn)
            q = select(AggregatorState.watermark).where(AggregatorState.name == GPU_HOURS)
            aggregated = as_utc(conn.execute(q).scalar())
    finally:
        engine.dispose()
    days = obj.cfg.retention.samples_days
    cutoff = datetime.now(UTC) - timedelta(days=days) if days else None
    return {
        "database": mask_url(obj.cfg.database_url),
        "dialect": st.dialect,
        "total_bytes": st.total_bytes,
        "file_bytes": st.file_bytes,
        "rows_estimated": st.dialect == "postgresql",
        "tables": [t.as_dict() for t in st.tables],
        "samples_partitions": [
            {
                "name": p.name,
                "month": p.month,
                "from": _iso(p.lo),
                "to": _iso(p.hi),
                "rows": p.rows,
                "bytes": p.bytes,
                "due": cutoff is not None and p.hi is not None and p.hi <= cutoff,
            }
            for p in st.partitions
        ],
        "retention": {
            "samples_days": days,
            "cutoff": _iso(cutoff),
            "samples_from": _iso(horizon),
            "aggregated_at": _iso(aggregated),
        },
    }


def _rows(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def _when(iso: str) -> str:
    return f"{datetime.fromisoformat(iso):%Y-%m-%d %H:%M} UTC"


def show(obj: Ctx, fmt: str) -> None:
    doc = gather(obj)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    from cocaq.cli import terminal as render
    from cocaq.cli.app import _console
    from cocaq.db.status import size_text

    console = _console()
    pg = doc["dialect"] == "postgresql"
    size = size_text(doc["total_bytes"]) if doc["total_bytes"] else "size unknown"
    console.print(f"{render.term(doc['database'])}: {size} on disk")
    title = "Tables (rows: estimates, pg_class.reltuples)" if pg else "Tables"
    cols = [("table", 0), ("rows", 0)] + ([("size", 0)] if pg else [])
    rows = [
        [t["name"], _rows(t["rows"]), *([size_text(t["bytes"] or 0)] if pg else [])] for t in doc["tables"]
    ]
    console.print(render.fit_table(console, title, cols, rows, left=("table",), complete="--format json"))
    if doc["samples_partitions"]:
        rows = [
            [p["name"], p["month"], _rows(p["rows"]), size_text(p["bytes"]), "yes" if p["due"] else ""]
            for p in doc["samples_partitions"]
        ]
        cols = [("partition", 0), ("month", 0), ("rows", 0), ("size", 0), ("due", 1)]
        console.print(
            render.fit_table(
                console, "Samples by month", cols, rows, left=("partition", "month"), complete="--format json"
            )
        )
    r = doc["retention"]
    if r["samples_days"] == 0:
        console.print("Retention: raw samples kept for ever ([retention] samples_days = 0).", markup=False)
    else:
        how = (
            "whole months go once all of a month is older than that"
            if pg
            else "rows older than that are deleted, an hour at a time"
        )
        console.print(
            f"Retention: raw samples kept {r['samples_days']} days ([retention] samples_days): {how}"
            f" (the cut-off now: {_when(r['cutoff'])}); `cocaq db retention --dry-run` lists what would go.",
            markup=False,
        )
    console.print(
        f"Samples before {_when(r['samples_from'])} are gone (summaries kept)."
        if r["samples_from"]
        else "No samples dropped yet.",
        markup=False,
    )
    console.print(
        f"The aggregator last summarised samples at {_when(r['aggregated_at'])}."
        if r["aggregated_at"]
        else "The aggregator has not summarised samples yet: nothing goes before it has.",
        markup=False,
    )
