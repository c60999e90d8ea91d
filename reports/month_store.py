"""Settled months' answers, kept (`cocaq report keep`) so that the web app shows a whole month's e-mail
without computing it on every view (GET /v1/users/{user}/month; issue 38).

A month's e-mail is the reports' whole computation (the month's jobs one by one, the suggestions over all
of them, the charts): seconds for the heavy users of a large site, the same answer every time once the
month's data stops changing. So the answer is kept per (user, cluster asked for, month) with a *stamp*:
a digest of what the answer is built from, which the read API computes again (a few indexed statements)
before it serves a kept answer; a different stamp, or none, and the answer is computed as before.

What the stamp holds, and why that is enough:

* The month is **settled**: the aggregator's watermark is past its end, no job that ran in it is still
  open (a running job's figures grow), and no job that ran in it changed since the aggregator's last run
  began (an import not yet derived). Otherwise there is no stamp: nothing is kept or served.
* The **daily rollups** of the month and the one before (the trend; the peers are every user's): their
  count, latest `computed_at` and sums. Every change the aggregator derives for a job (an import, new
  samples of a finished job, new carbon data that moves its CO2) rebuilds the days the job counts in,
  which moves `computed_at`; a day left empty moves the count.
* The first day of data, the clusters' names, and the **model metadata** of the month's jobs (count and
  latest change; the precision advice and model comparisons read it, the aggregator does not).
* The **settings**: the configuration without what says where things are or who may connect (database
  URL, spool, the API's own section; it holds no secret: passwords come from files or the environment),
  the installed cocaq's code and templates, and the site's
  template overrides.

Late samples of a finished job count once the aggregator has run (it marks the job, rebuilds its days).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Iterator
from datetime import UTC, date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, delete, func, insert, or_, select

from cocaq.config import Config
from cocaq.db.schema import ModelMetadata, MonthAnswer
from cocaq.reports.data import Month
from cocaq.reports.queries import (
    JOBS,
    METRICS,
    J,
    M,
    R,
    cluster_id_of,
    cluster_names,
    data_start,
    rollups_watermark,
)

log = logging.getLogger(__name__)

FORMAT = 1  # of the stamp and the kept answer: a change here forgets every kept answer
A = cast(Table, MonthAnswer.__table__).c
MM = cast(Table, ModelMetadata.__table__).c
# The configuration's keys that change nothing a report says (where things are, who may connect).
_NOT_SAID = frozenset({"database_url", "spool_dir", "source", "api"})


def _jobs_in(month: Month, cluster_id: int | None) -> list[Any]:
    """SQL: the jobs that ran in `month` (as month_jobs counts them: started before its end, not ended
    before its start)."""
    out = [J.start_time < month.end, or_(J.end_time >= month.start, J.end_time.is_(None))]
    if cluster_id is not None:
        out.append(J.cluster_id == cluster_id)
    return out


def unsettled(conn: Connection, month: Month, cluster_id: int | None) -> str | None:
    """Why `month`'s answers may still change (None: they may not, until the data does)."""
    from cocaq.accounting.aggregate import MARGIN

    wm = rollups_watermark(conn)
    if wm is None or wm < month.end:
        return "the aggregator has not rolled the month up to its end"
    ran = _jobs_in(month, cluster_id)
    running = select(func.count()).select_from(JOBS).where(J.is_open.is_(True), *ran)
    if conn.execute(running).scalar():
        return "jobs that ran in it are still running"
    # changed since the last run began (by index: few), and not derived since (the aggregator's own test)
    changed = (
        select(func.count())
        .select_from(JOBS.outerjoin(METRICS, M.job_pk == J.id))
        .where(J.updated_at >= wm - MARGIN, or_(M.job_pk.is_(None), M.computed_at <= J.updated_at), *ran)
    )
    if conn.execute(changed).scalar():
        return "jobs that ran in it changed and the aggregator has not derived them since"
    return None


def stamp(conn: Connection, cfg: Config, month_start: datetime | date, cluster: str | None) -> str | None:
    """The stamp of `month`'s answers on `cluster` (None: all clusters) as the data and settings are now,
    or None if the month is not settled (see the module)."""
    month = Month.of(month_start)
    cid = cluster_id_of(conn, cluster)
    if unsettled(conn, month, cid) is not None:
        return None
    prev = month.previous()
    days = [R.day >= prev.start, R.day < month.end]
    if cid is not None:
        days.append(R.cluster_id == cid)
    energy = R.energy_gpu_j + R.energy_cpu_j + R.energy_dram_j + R.energy_other_j
    rollups = conn.execute(
        select(
            func.count(), func.max(R.computed_at), func.sum(R.jobs), func.sum(energy), func.sum(R.co2_g)
        ).where(*days)
    ).one()
    meta = conn.execute(
        select(func.count(), func.max(MM.updated_at), func.max(MM.recorded_at))
        .select_from(JOBS.join(ModelMetadata.__table__, MM.job_pk == J.id))
        .where(*_jobs_in(month, cid))
    ).one()
    parts = [
        FORMAT,
        month.label,
        cluster or "",
        [_plain_value(v) for v in rollups],
        _plain_value(data_start(conn, cid)),
        [_plain_value(v) for v in meta],
        sorted(cluster_names(conn).items()),
        settings_digest(cfg),
    ]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _plain_value(v: Any) -> Any:
    """A stamp's value as text that is the same from both drivers: times in UTC to the microsecond, sums to
    nine significant digits (their last digits follow the order the database added them in)."""
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
    if isinstance(v, float):
        return f"{v:.9g}"
    return v


def settings_digest(cfg: Config) -> str:
    """What of the site's settings a report can say (see the module), as a digest."""
    said = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_SAID}
    overrides = _tree_digest(cfg.reports.template_dir) if cfg.reports.template_dir else None
    text = json.dumps([said, overrides, _code_digest()], default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """The installed cocaq's code and templates (once per process: they do not change under it)."""
    import cocaq

    return _tree_digest(str(Path(cocaq.__file__).parent), (".py", ".html", ".txt", ".css"))


def _tree_digest(root: str, suffixes: tuple[str, ...] = ()) -> str:
    """The names and contents of the files under `root` (all, or those ending in `suffixes`)."""
    h = hashlib.sha256()
    for rel, path in tree_files(root, suffixes):
        h.update(rel.encode() + b"\0")
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError as exc:  # unreadable: its name and the error, so that the digest still moves
            h.update(f"unreadable: {exc.strerror}".encode())
    return h.hexdigest()


def tree_files(root: str, suffixes: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(name under `root`, path) of its files, in order, found as the template loader and the importer
    find them: through symlinks (an editable install links its packages in; a site may link a
    template), each directory once."""
    seen: set[tuple[int, int]] = set()
    for here, dirs, files in os.walk(root, followlinks=True):
        st = os.stat(here)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        for name in sorted(files):
            if not suffixes or name.endswith(suffixes):
                path = os.path.join(here, name)
                yield os.path.relpath(path, root), path


# --- reading and keeping ----------------------------------------------------------------------------


def kept(
    conn: Connection, cfg: Config, user: str, month_start: datetime | date, cluster: str | None
) -> dict[str, Any] | None:
    """`user`'s kept answer for the month, if its stamp is the data's and the settings' now."""
    now = stamp(conn, cfg, month_start, cluster)
    if now is None:
        return None
    row = conn.execute(
        select(A.answer).where(
            A.user_name == user,
            A.cluster == (cluster or ""),
            A.month_start == Month.of(month_start).start,
            A.stamp == now,
        )
    ).first()
    if row is None:
        return None
    try:
        return cast(dict[str, Any], json.loads(zlib.decompress(row[0])))
    except (zlib.error, ValueError) as exc:  # a damaged row: computed again, and said
        log.warning("month answer of %s for %s unreadable (%s): computed again", user, month_start, exc)
        return None


def store(
    engine: Engine, month: Month, cluster: str | None, stamp_now: str, answers: dict[str, bytes]
) -> None:
    """Put the month's kept answers (user -> compressed answer) in place of its old ones, in one
    transaction: a reader finds the old set or the new one."""
    key, at = cluster or "", datetime.now(UTC)
    rows = [{"user_name": u, "cluster": key, "month_start": month.start, "stamp": stamp_now, "kept_at": at,
             "answer": blob} for u, blob in answers.items()]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(delete(MonthAnswer).where(A.cluster == key, A.month_start == month.start))
        for i in range(0, len(rows), 200):
            conn.execute(insert(MonthAnswer), rows[i : i + 200])


def is_current(conn: Connection, month: Month, cluster: str | None, stamp_now: str) -> bool:
    """Whether the month's kept answers were built with `stamp_now`."""
    q = select(func.count()).where(
        A.cluster == (cluster or ""), A.month_start == month.start, A.stamp == stamp_now
    )
    return bool(conn.execute(q).scalar())


def forget_before(engine: Engine, month_start: datetime) -> int:
    """Delete the kept answers of months before `month_start`; how many."""
    with engine.begin() as conn:
        return int(conn.execute(delete(MonthAnswer).where(A.month_start < month_start)).rowcount or 0)
