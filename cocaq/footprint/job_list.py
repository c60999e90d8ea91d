"""A user's jobs as a table a person pages through: filtered, sorted and counted by the database, one
page at a time (the web app's "My jobs", GET /v1/users/{user}/jobs).

The jobs are those that ran in the window, as `cocaq user` and `cocaq export jobs` count them, with each
job's own figures whole (as `cocaq job` shows them). The sort keys and filters are a fixed list, so no
text from a request reaches the SQL but as a bound parameter. Standard library only (and cocaq.db.dbapi's
plain connections): the API server and the login-node paths import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cocaq.errors import UsageError
from cocaq.footprint.dbsql import labs_clause
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db
    from cocaq.footprint.totals import Window

MAX_LIMIT = 500
# sort key -> its SQL (NULLs last either way: a job without the figure is not the least of them)
SORTS: dict[str, str] = {
    "end": "j.end_time",
    "start": "j.start_time",
    "job": "j.job_id_raw",
    "elapsed": "j.elapsed_s",
    "gpus": "j.alloc_gpus",
    "kwh": "j.energy_j",
    "co2": "j.co2_g",
    "idle": "m.idle_gpu_s * 1.0 / NULLIF(j.alloc_gpus * j.elapsed_s, 0)",
}
COLUMNS = ("cluster", "job_id", "name", "account", "partition", "state", "start_time", "end_time",
           "elapsed_h", "alloc_gpus", "gpu_type", "model", "energy_kwh", "co2_kg", "measured_share",
           "gpu_util_pct", "idle_share")  # fmt: skip
_RUNS_IN = (
    "j.start_time < %(until)s AND (j.end_time >= %(since)s OR j.end_time IS NULL)"
    " AND j.start_time IS NOT NULL"
)
_FROM = """
FROM jobs j JOIN clusters c ON c.id = j.cluster_id LEFT JOIN job_metrics m ON m.job_pk = j.id
LEFT JOIN model_metadata mm ON mm.job_pk = j.id"""


@dataclass(frozen=True)
class Filters:
    """What the table is narrowed to: exact partition and model names; a state by its first word
    (CANCELLED matches "CANCELLED by 1234"); `name`, a part of the job's name."""

    state: str | None = None
    partition: str | None = None
    model: str | None = None
    name: str | None = None


def list_jobs(
    db: Db,
    user: str,
    w: Window,
    *,
    filters: Filters = Filters(),
    sort: str = "end",
    descending: bool = True,
    offset: int = 0,
    limit: int = 50,
    cluster: str | None = None,
    within: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """One page of `user`'s jobs that ran in `w`, with how many match in all and the values each filter
    can take (over all of the user's jobs in the window, so a filter never hides its own choices)."""
    if sort not in SORTS:
        raise UsageError(f"sort: expected one of {', '.join(SORTS)}, got {sort!r}")
    if not (0 <= offset <= 10**9 and 1 <= limit <= MAX_LIMIT):
        raise UsageError(f"offset 0.. and limit 1..{MAX_LIMIT}, got {offset} and {limit}")
    from cocaq.footprint.lookup import check_names

    check_names(db, user=user, cluster=cluster)
    p: dict[str, Any] = {"since": w.since, "until": w.until, "user": user, "off": offset, "lim": limit}
    base = f"{_RUNS_IN} AND j.user_name = %(user)s"
    if cluster is not None:
        base += " AND c.name = %(cluster)s"
        p["cluster"] = cluster
    base += labs_clause("j.account", within, p)
    where = base + _narrowed(filters, p)
    (total,) = db.rows(f"SELECT COUNT(*) {_FROM} WHERE {where}", p)[0]
    key, way = SORTS[sort], "DESC" if descending else "ASC"
    rows = db.rows(
        f"""SELECT c.name, j.job_id, j.name, j.account, j.partition, j.state, j.start_time, j.end_time,
       j.elapsed_s, j.alloc_gpus, j.gpu_type, mm.model_name, j.energy_j, j.energy_measured_j, j.co2_g,
       m.gpu_util_pct, m.idle_gpu_s
{_FROM} WHERE {where}
ORDER BY CASE WHEN {key} IS NULL THEN 1 ELSE 0 END, {key} {way}, j.id {way}
LIMIT %(lim)s OFFSET %(off)s""",
        p,
    )
    return {
        "user": user,
        "since": w.since.isoformat(),
        "until": w.until.isoformat(),
        "total": int(total),
        "offset": offset,
        "limit": limit,
        "sort": sort,
        "descending": descending,
        "columns": list(COLUMNS),
        "rows": [_row(db, r) for r in rows],
        "choices": _choices(db, base, p),
    }


def _narrowed(f: Filters, p: dict[str, Any]) -> str:
    sql = ""
    if f.state:
        sql += " AND (j.state = %(state)s OR j.state LIKE %(state_more)s)"
        p["state"], p["state_more"] = f.state, _like_prefix(f.state) + " %"
    if f.partition:
        sql += " AND j.partition = %(partition)s"
        p["partition"] = f.partition
    if f.model:
        sql += " AND mm.model_name = %(model)s"
        p["model"] = f.model
    if f.name:
        sql += " AND j.name LIKE %(name_like)s ESCAPE '\\'"
        p["name_like"] = f"%{_like_prefix(f.name)}%"
    return sql


def _like_prefix(text: str) -> str:
    """`text` as a literal inside a LIKE pattern (its % and _ match only themselves)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _choices(db: Db, base: str, p: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, col in (("state", "j.state"), ("partition", "j.partition"), ("model", "mm.model_name")):
        got = db.rows(f"SELECT DISTINCT {col} {_FROM} WHERE {base} AND {col} IS NOT NULL", p)
        values = {str(v).split(" ", 1)[0] if key == "state" else str(v) for (v,) in got}
        out[key] = sorted(values)
    return out


def _row(db: Db, r: tuple[Any, ...]) -> dict[str, Any]:
    (cl, job_id, name, acct, part, state, start, end, el, gpus, gtype, model, e, meas, co2, util,
     idle_s) = r  # fmt: skip
    el_s = max(float(el or 0.0), 0.0)
    energy = float(e or 0.0)
    gpu_s = int(gpus or 0) * el_s
    return {
        "cluster": cl,
        "job_id": job_id,
        "name": name,
        "account": acct,
        "partition": part,
        "state": state,
        "start_time": _iso(db.timestamp(start)),
        "end_time": _iso(db.timestamp(end)),
        "elapsed_h": el_s / S_PER_HOUR,
        "alloc_gpus": None if gpus is None else int(gpus),
        "gpu_type": gtype,
        "model": model,
        "energy_kwh": energy / J_PER_KWH,
        "co2_kg": float(co2 or 0.0) / G_PER_KG,
        "measured_share": float(meas or 0.0) / energy if energy > 0 else None,
        "gpu_util_pct": None if util is None else float(util),
        "idle_share": float(idle_s or 0.0) / gpu_s if gpu_s > 0 and idle_s is not None else None,
    }


def _iso(t: Any) -> str | None:
    return None if t is None else t.isoformat()
