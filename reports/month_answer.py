"""A user's month as the web app shows it (GET /v1/users/{user}/month): the monthly e-mail itself, its
text, its HTML with the charts inlined, and its figures as data.

One truth: the page shows the very e-mail the user was (or will be) sent for that month, built by the
same functions (`user_month`, `suggest_for_user`, `render_user_month`), not a second rendering that could
drift from it; the figures beside it (totals, trend, rank) are read off the same `UserMonth`.
"""

from __future__ import annotations

import dataclasses
from datetime import date, datetime
from typing import Any

from sqlalchemy import Connection

from cocaq.config import Config


def month_answer(
    conn: Connection, cfg: Config, user: str, month_start: datetime | date, *, cluster: str | None = None
) -> dict[str, Any]:
    """`user`'s month e-mail and figures, JSON-ready (times as ISO text)."""
    from cocaq.reports.render import inline_images, render_user_month
    from cocaq.reports.suggest import suggest_for_user
    from cocaq.reports.user_report import user_month

    m = user_month(conn, cfg, user, month_start, cluster=cluster)
    r = render_user_month(m, suggest_for_user(m, cfg), cfg)
    t = m.totals
    return {
        "user": user,
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
