"""A user's month as the web app shows it (GET /v1/users/{user}/month): the monthly e-mail itself, its
text, its HTML with the charts inlined, and its figures as data.

One truth: the page shows the very e-mail the user was (or will be) sent for that month, built by the
same functions (`user_month`, `suggest_for_user`, `render_user_month`), not a second rendering that could
drift from it; the figures beside it (totals, trend, rank) are read off the same `UserMonth`.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine

from cocaq.config import Config

if TYPE_CHECKING:
    from cocaq.reports.data import UserMonth
    from cocaq.reports.render import Rendered


def month_answer(
    conn: Connection,
    cfg: Config,
    user: str,
    month_start: datetime | date,
    *,
    cluster: str | None = None,
    use_kept: bool = True,
) -> dict[str, Any]:
    """`user`'s month e-mail and figures, JSON-ready (times as ISO text): the kept answer while its stamp
    is the data's (cocaq.reports.month_store), else computed now."""
    from cocaq.reports.month_store import kept
    from cocaq.reports.render import render_user_month
    from cocaq.reports.suggest import suggest_for_user
    from cocaq.reports.user_report import user_month

    if use_kept:
        got = kept(conn, cfg, user, month_start, cluster)
        if got is not None:
            return got
    m = user_month(conn, cfg, user, month_start, cluster=cluster)
    return answer_of(m, render_user_month(m, suggest_for_user(m, cfg), cfg), cluster)


def answer_of(m: UserMonth, r: Rendered, cluster: str | None) -> dict[str, Any]:
    """The answer of a computed month `m` and its e-mail `r`."""
    from cocaq.reports.render import inline_images

    t = m.totals
    return {
        "user": m.user,
        "month": m.month.label,
        "cluster": cluster,
        "clusters": list(m.clusters),
        "accounts": list(m.accounts),
        "totals": _plain(t),
        "wasted_kwh": t.wasted_kwh,
        "trend": _plain(m.trend),
        "peers": _plain(m.peers),
        "daily": [_plain(d) for d in m.daily],
        "email": {"subject": r.subject, "text": r.text, "html": inline_images(r.html, r.images)},
    }


def _plain(x: Any) -> Any:
    """A report dataclass as JSON-ready data: nested dataclasses as dicts, times and days as ISO text."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, datetime | date):
        return x.isoformat()
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


# --- keeping settled months' answers (cocaq.reports.month_store) ---------------------------------------


@dataclass(frozen=True)
class Kept:
    """What `keep` did for a month."""

    month: str
    cluster: str | None
    users: int  # answers written
    unchanged: bool  # the kept answers' stamp was already the data's: nothing computed
    why_not: str | None  # why nothing was kept (the month is not settled)

    def line(self) -> str:
        where = f" on {self.cluster}" if self.cluster else ""
        if self.why_not:
            return f"month answers {self.month}{where}: none kept: {self.why_not}"
        if self.unchanged:
            return f"month answers {self.month}{where}: up to date"
        return f"month answers {self.month}{where}: {self.users:,} kept"


def keep(engine: Engine, cfg: Config, month_start: datetime | date, cluster: str | None = None) -> Kept:
    """Compute and keep every user's answer for a settled month (nothing if the kept ones are current).

    The stamp is taken before the data is read: whatever changes after it leaves the kept answers with
    an old stamp (computed again when asked), never a newer answer under a stamp it does not match.
    """
    from cocaq.reports import month_store
    from cocaq.reports.data import Month
    from cocaq.reports.queries import cluster_id_of
    from cocaq.reports.render import render_user_month
    from cocaq.reports.suggest import suggest_for_user
    from cocaq.reports.user_report import users_month

    month = Month.of(month_start)
    with engine.connect() as conn:
        now = month_store.stamp(conn, cfg, month.start, cluster)
        if now is None:
            why = month_store.unsettled(conn, month, cluster_id_of(conn, cluster))
            return Kept(month.label, cluster, 0, False, why or "the month changed while it was read")
        if month_store.is_current(conn, month, cluster, now):
            return Kept(month.label, cluster, 0, True, None)
        months = users_month(conn, cfg, month.start, cluster=cluster)
        conn.rollback()
    blobs = {}
    for u, m in months.items():
        answer = answer_of(m, render_user_month(m, suggest_for_user(m, cfg), cfg), cluster)
        blobs[u] = zlib.compress(json.dumps(answer, separators=(",", ":")).encode(), 6)
    month_store.store(engine, month, cluster, now, blobs)
    return Kept(month.label, cluster, len(blobs), False, None)


def keep_recent(engine: Engine, cfg: Config, now: datetime, cluster: str | None = None) -> list[Kept]:
    """Keep the latest `[reports] keep_months` months before `now`'s (the latest first), and forget the
    kept answers of months before them (all of them where it is 0)."""
    from cocaq.reports.data import Month
    from cocaq.reports.month_store import forget_before

    months = [Month.of(now)]
    for _ in range(cfg.reports.keep_months):
        months.append(months[-1].previous())
    forget_before(engine, months[-1].start if len(months) > 1 else months[0].start)
    return [keep(engine, cfg, m.start, cluster) for m in months[1:]]
