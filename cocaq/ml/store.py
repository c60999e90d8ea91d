"""Deriving `model_metadata` rows from what was recorded: jobs' comments and the nodes' `meta` records.

Nothing here is incremental state: a job's row is recomputed from all its inputs (the comment sacct or
the prolog saw, every `meta` record its nodes shipped) and written only when it differs, so running it
again, or after a crash, gives the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, delete, insert, or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from cocaq.db.schema import Job, ModelMetadata, NodeEvent
from cocaq.db.sqlfuncs import utcnow
from cocaq.ml.meta import KNOWN, merge, parse_comment, to_row, validate

log = logging.getLogger("cocaq.modelmeta")

COLUMNS = [spec[0] for spec in KNOWN.values()] + ["extra", "sources"]
BATCH = 500


def candidates(conn: Connection, since: datetime | None) -> list[int]:
    """Jobs whose metadata may have changed since `since` (every job that has any, when None)."""
    ev = cast(Table, NodeEvent.__table__).c
    j = cast(Table, Job.__table__).c
    q1 = select(ev.job_pk).where(ev.event == "meta", ev.job_pk.is_not(None))
    q2 = select(j.id).where(j.comment.ilike("%cocaq:%"))
    if since is not None:
        q1 = q1.where(or_(ev.ts >= since, ev.shipped_at >= since))
        q2 = q2.where(j.updated_at >= since)
    return sorted({r[0] for r in conn.execute(q1)} | {r[0] for r in conn.execute(q2)})


def layers_of(
    comment: str | None, events: Iterable[tuple[Any, Any]], problems: list[str]
) -> list[tuple[str, Any]]:
    """(source, values) layers, oldest first within a source, from a comment and `meta` payloads."""
    out: list[tuple[str, Any]] = []
    for _ts, payload in events:
        meta = payload.get("meta") if isinstance(payload, dict) else None
        if not isinstance(meta, dict):
            continue
        for source in ("detected", "api"):
            if source in meta:
                out.append((source, validate(meta[source], problems)))
    got = parse_comment(comment, problems)
    if got:
        out.append(("comment", got))
    return out


def refresh(conn: Connection, job_pks: Iterable[int]) -> int:
    """Recompute these jobs' `model_metadata`; returns how many rows were written or removed."""
    jt = cast(Table, Job.__table__)
    et = cast(Table, NodeEvent.__table__)
    mt = cast(Table, ModelMetadata.__table__)
    pks = sorted(set(job_pks))
    changed = 0
    for i in range(0, len(pks), BATCH):
        chunk = pks[i : i + BATCH]
        comments = dict(conn.execute(select(jt.c.id, jt.c.comment).where(jt.c.id.in_(chunk))).all())
        events: dict[int, list[tuple[Any, Any]]] = {pk: [] for pk in chunk}
        starts: dict[int, str] = {}
        q = (
            select(et.c.job_pk, et.c.event, et.c.ts, et.c.payload)
            .where(et.c.job_pk.in_(chunk), et.c.event.in_(("meta", "start")))
            .order_by(et.c.job_pk, et.c.ts, et.c.uid)
        )
        for pk, event, ts, payload in conn.execute(q):
            if event == "meta":
                events[pk].append((ts, payload))
            elif isinstance(payload, dict) and isinstance(payload.get("job"), dict):
                c = payload["job"].get("comment")  # the prolog's SLURM_JOB_COMMENT, if Slurm gave it
                if isinstance(c, str) and pk not in starts:
                    starts[pk] = c
        existing = {r.job_pk: r for r in conn.execute(select(mt).where(mt.c.job_pk.in_(chunk)))}
        for pk in chunk:
            if pk not in comments:
                continue  # deleted meanwhile
            problems: list[str] = []
            comment = comments[pk] if comments[pk] is not None else starts.get(pk)
            values, sources = merge(layers_of(comment, events[pk], problems))
            if problems:
                log.info("job %s: model metadata: %s", pk, "; ".join(problems)[:500])
            old = existing.get(pk)
            if not values:
                if old is not None:
                    conn.execute(delete(mt).where(mt.c.job_pk == pk))
                    changed += 1
                continue
            try:  # one job's bad metadata must not take the window's other jobs with it
                with conn.begin_nested():
                    row = to_row(values, sources)
                    if old is not None and all(_same(getattr(old, c), row[c]) for c in COLUMNS):
                        continue
                    if old is None:
                        conn.execute(insert(mt).values(job_pk=pk, **row))
                    else:
                        conn.execute(update(mt).where(mt.c.job_pk == pk).values(updated_at=utcnow(), **row))
            except (SQLAlchemyError, ValueError, TypeError, OverflowError) as exc:
                log.warning("job %s: model metadata not written: %s", pk, str(exc).splitlines()[0][:300])
                continue
            changed += 1
    return changed


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return bool(a == b)


def refresh_since(conn: Connection, since: datetime | None) -> int:
    return refresh(conn, candidates(conn, since))
