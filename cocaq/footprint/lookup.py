"""What `cocaq user`, `cocaq lab` and the read API's /v1/users and /v1/labs answer, built once for both.

The CLI (reading the database on an admin's machine) and the API server (answering login nodes) show the
same footprint: the window parsed from the same `--since/--until` words, the names checked the same way,
the totals, top jobs and advice computed by the same calls, and the query sent from one to the other with
the same parameters. Each front-end keeps only what is its own: how an error reaches the person (an exit
code or an HTTP status) and who may see what. Stdlib-only at import beyond cocaq.footprint.totals:
`cocaq user` runs on every login node (tests/test_user_imports.py).
"""

from __future__ import annotations

from datetime import tzinfo
from typing import TYPE_CHECKING, Any

from cocaq.footprint.totals import Window, add_advice, check_names, lab_footprint, now_utc, user_footprint
from cocaq.timeparse import parse_when

if TYPE_CHECKING:
    from cocaq.config import Config
    from cocaq.db.dbapi import Db


def parse_window(since: str, until: str | None, tz: tzinfo | None = None) -> Window:
    """[since, until or now) from the words people type (30d, 12h, a date, an ISO time), dates read in
    `tz` (None: this machine's zone). Raises what `parse_when` raises; an empty window is the caller's to
    refuse (each says it its own way)."""
    now = now_utc()
    zone = now.astimezone().tzinfo if tz is None else tz
    return Window(parse_when(since, now, zone), parse_when(until, now, zone) if until else now)


def query_params(w: Window, cluster: str | None, top: int, from_jobs: bool) -> dict[str, Any]:
    """The API query for a footprint: the window as absolute times, so that the server reads them as the
    client meant them, whatever its zone."""
    p = {"since": w.since.isoformat(), "until": w.until.isoformat(), "cluster": cluster, "top": top}
    return {**p, "from_jobs": "true"} if from_jobs else p


def user_answer(
    db: Db,
    cfg: Config,
    user: str,
    w: Window,
    *,
    cluster: str | None = None,
    top: int = 5,
    from_jobs: bool = False,
    within: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """A user's footprint with its advice, as JSON-ready data; UnknownName for a name that is nowhere."""
    check_names(db, user=user, cluster=cluster)
    fp = user_footprint(db, user, w, cluster=cluster, top=top, from_jobs=from_jobs, within=within)
    return add_advice(db, cfg, fp, cluster=cluster).as_dict()


def lab_answer(
    db: Db,
    cfg: Config,
    account: str,
    w: Window,
    *,
    cluster: str | None = None,
    top: int = 5,
    from_jobs: bool = False,
    check: bool = True,
) -> dict[str, Any]:
    """A lab's totals, members and their advice, as JSON-ready data; with `check`, UnknownName for a lab
    no job ever ran under."""
    if check:
        check_names(db, account=account, cluster=cluster)
    fp = lab_footprint(db, account, w, cluster=cluster, top=top, from_jobs=from_jobs)
    return add_advice(db, cfg, fp, cluster=cluster).as_dict()
