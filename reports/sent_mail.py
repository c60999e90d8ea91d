"""The exactly-once record of sent mail: one `sent_reports` row per (kind, recipient, period_start).

Statuses and the order of writes, each committed on its own before the next step:

    (no row) / failed --claim--> sending --SMTP accepted--> sent
                                        \\--refused-------> failed (error kept; the next run tries again)

`sending` is written, with the message's Message-ID and the time, *before* the message goes out. A
crash (or kill) between the server accepting the message and the `sent` commit leaves it `sending`: the
next run cannot know whether it went, and `deliver` resolves it by `[mail] in_doubt` (see deliver.py).

Claims are compare-and-set (an INSERT guarded by the unique constraint, or an UPDATE guarded by the
status and Message-ID seen), so two runs racing for the same report cannot both send it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from cocaq.db.coltypes import as_utc
from cocaq.db.schema import SentReport

SENDING, SENT, FAILED = "sending", "sent", "failed"
_ERROR_MAX = 2000


@dataclass(frozen=True)
class Entry:
    id: int
    status: str
    message_id: str | None
    sent_at: datetime | None
    error: str | None


class Ledger:
    """Reads and moves `sent_reports` rows; every write is its own committed transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get(self, kind: str, recipient: str, period_start: datetime) -> Entry | None:
        t = SentReport
        with self.engine.connect() as conn:
            row = conn.execute(
                select(t.id, t.status, t.message_id, t.sent_at, t.error).where(
                    t.kind == kind, t.recipient == recipient, t.period_start == period_start
                )
            ).first()
        return Entry(*row) if row else None

    def claim(
        self,
        kind: str,
        recipient: str,
        period_start: datetime,
        period_end: datetime,
        message_id: str,
        now: datetime,
        seen: Entry | None,
        user_name: str | None = None,
    ) -> int | None:
        """Mark the report `sending` with this Message-ID, if the row is still as `seen`; its id, or None.

        None means another run got there first (inserted the row, or moved it on). `user_name`: the
        Slurm user a user-addressed report is for (kept: the address alone cannot say it).
        """
        t = SentReport
        values = {
            "status": SENDING,
            "message_id": message_id,
            "sent_at": now,
            "error": None,
            "user_name": user_name,
        }
        try:
            with self.engine.begin() as conn:
                if seen is None:
                    res = conn.execute(
                        insert(t).values(
                            kind=kind,
                            recipient=recipient,
                            period_start=period_start,
                            period_end=period_end,
                            **values,
                        )
                    )
                    return int(res.inserted_primary_key[0])  # type: ignore[index]
                guard = [t.id == seen.id, t.status == seen.status]
                guard.append(
                    t.message_id.is_(None) if seen.message_id is None else t.message_id == seen.message_id
                )
                res = conn.execute(update(t).where(*guard).values(period_end=period_end, **values))
                return seen.id if res.rowcount == 1 else None
        except IntegrityError:
            return None

    def finish(self, row_id: int, status: str, now: datetime | None, error: str | None = None) -> None:
        """`sent` (with the time the server accepted it) or `failed` (with the reason, no time)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(SentReport)
                .where(SentReport.id == row_id)
                .values(status=status, sent_at=now, error=error[:_ERROR_MAX] if error else None)
            )

    def in_doubt(
        self, kind: str | None = None
    ) -> list[tuple[str, str, datetime, str | None, datetime | None]]:
        """Rows left `sending` (kind, recipient, period_start, message_id, since), for reports and admins."""
        t = SentReport
        q = select(t.kind, t.recipient, t.period_start, t.message_id, t.sent_at).where(t.status == SENDING)
        if kind is not None:
            q = q.where(t.kind == kind)
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(q.order_by(t.sent_at))]  # type: ignore[misc]


def first_reports(conn: Connection, kind: str = "user-monthly") -> dict[str, datetime]:
    """user -> when their first report of `kind` was sent (`sent` rows only), for admin_month's
    before/after comparison. Rows written before migration 0007 have no user name and do not count."""
    t = SentReport
    q = (
        select(t.user_name, func.min(t.sent_at))
        .where(t.kind == kind, t.status == SENT, t.user_name.is_not(None), t.sent_at.is_not(None))
        .group_by(t.user_name)
    )
    return {str(u): as_utc(at) for u, at in conn.execute(q) if at is not None}
