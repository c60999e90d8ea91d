"""The rows of each exported table over a window (`cocaq.frames`, `cocaq export`, GET /v1/export/{table}).

One reader for the database path and the read API's endpoint, so a notebook gets the same rows either
way. Each table has typed columns (`COLUMNS`: name -> kind) in the units the CLI's JSON names them
(energy_kwh, co2_kg, gpu_hours); rows come in pages in a stable order (`Page.next` is where the next one
starts), so the API can serve a million jobs without holding them at once.

Which rows a window holds: `jobs` and `job_energy`, the jobs that ran in it, each with its `share`
(cocaq.accounting.window: the part of its run inside the window), so that sum(energy_kwh * share) is
`cocaq user`'s energy_kwh; the job's own figures are whole, as `cocaq job` shows them. `rollups`, the
daily rollups of the UTC days that overlap the window (whole days). `models`, the runs that ended in it,
as `cocaq models` counts them. `sent`, the reports whose period overlaps it. `study_arms`, the arms drawn
before its end. Stdlib-only (and cocaq.db.dbapi's plain connections): the API server imports it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cocaq.accounting.window import share
from cocaq.errors import UsageError
from cocaq.footprint.dbsql import labs_clause
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

if TYPE_CHECKING:
    from cocaq.db.dbapi import Db
    from cocaq.footprint.totals import Window

# Column kinds: str, int, float, time (UTC), bool.
COLUMNS: dict[str, dict[str, str]] = {
    "jobs": {
        "cluster": "str", "job_id": "str", "user": "str", "account": "str", "partition": "str", "qos": "str",
        "state": "str", "name": "str", "submit_time": "time", "start_time": "time", "end_time": "time",
        "elapsed_h": "float", "alloc_cpus": "int", "alloc_gpus": "int", "gpu_type": "str",
        "cpu_hours": "float", "gpu_hours": "float", "energy_kwh": "float", "energy_measured_kwh": "float",
        "energy_estimated_kwh": "float", "energy_kwh_with_pue": "float", "pue": "float", "carbon_zone": "str",
        "carbon_g_per_kwh": "float", "co2_kg": "float", "co2_embodied_kg": "float", "gpu_util_pct": "float",
        "idle_gpu_hours": "float", "idle_gpu_energy_kwh": "float", "shift_saved_kg": "float",
        "shift_pause_saved_kg": "float", "share": "float",
    },
    "job_energy": {
        "cluster": "str", "job_id": "str", "user": "str", "account": "str", "start_time": "time",
        "node": "str", "component": "str", "method": "str", "source": "str", "energy_kwh": "float",
        "share": "float",
    },
    "rollups": {
        "day": "time", "cluster": "str", "user": "str", "account": "str", "partition": "str", "jobs": "int",
        "jobs_failed": "int", "jobs_oom": "int", "jobs_cancelled": "int", "jobs_timeout": "int",
        "cpu_hours": "float", "gpu_hours": "float", "energy_kwh": "float", "energy_gpu_kwh": "float",
        "energy_cpu_kwh": "float", "energy_dram_kwh": "float", "energy_other_kwh": "float",
        "energy_measured_kwh": "float", "energy_estimated_kwh": "float", "failed_energy_kwh": "float",
        "oom_energy_kwh": "float", "timeout_energy_kwh": "float", "cancelled_energy_kwh": "float",
        "co2_kg": "float", "co2_embodied_kg": "float", "gpu_util_pct": "float", "idle_gpu_hours": "float",
        "idle_gpu_energy_kwh": "float", "shift_co2_kg": "float", "shift_saved_kg": "float",
        "shift_pause_saved_kg": "float",
    },
    "models": {
        "cluster": "str", "job_id": "str", "user": "str", "account": "str", "state": "str",
        "end_time": "time", "model": "str", "task": "str", "framework": "str",
        "framework_version": "str", "parameters": "int",
        "precision": "str", "batch_size": "int", "dataset": "str", "epochs": "float", "tokens": "int",
        "gpus": "int", "gpu_hours": "float", "energy_kwh": "float", "co2_kg": "float",
    },
    "sent": {
        "kind": "str", "recipient": "str", "user": "str", "period_start": "time", "period_end": "time",
        "sent_at": "time", "status": "str", "message_id": "str", "error": "str",
    },
    "study_arms": {
        "study": "str", "user": "str", "arm": "str", "stratum": "int", "gpu_hours_before": "float",
        "draw": "float", "assigned_at": "time", "opted_out_at": "time",
    },
}  # fmt: skip
TABLES = tuple(COLUMNS)
ADMIN_ONLY = ("sent", "study_arms")  # people's addresses and the study's arms: for admins only
PAGE = 10_000  # rows per page (the API's default)
_RUNS_IN = (  # the jobs that may have run in the window (those whose share there is > 0 are kept)
    "j.start_time < %(until)s AND (j.end_time >= %(since)s OR j.end_time IS NULL)"
    " AND j.start_time IS NOT NULL"
)


@dataclass
class Page:
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    next: int | None  # where the next page starts (`after`); None: this was the last


def check_table(table: str) -> str:
    if table not in COLUMNS:
        raise UsageError(f"no table {table!r}: export one of {', '.join(TABLES)}")
    return table


def read(
    db: Db,
    table: str,
    w: Window,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    within: tuple[str, ...] | None = None,
    after: int = 0,
    limit: int = PAGE,
) -> Page:
    """One page of `table`'s rows in window `w`, after the key `after`; `within`: only jobs in these labs
    (what a lab head may see of a member)."""
    check_table(table)
    if table in ("sent", "study_arms") and (account is not None or cluster is not None or within is not None):
        raise UsageError(f"{table} has no lab or cluster: ask for it by user only")
    if after == 0:  # a name nowhere in the database is a typo (UnknownName), not an empty table
        from cocaq.footprint.lookup import check_names

        check_names(db, user=user, account=account, cluster=cluster)
    p: dict[str, Any] = {"since": w.since, "until": w.until, "after": after, "limit": limit}
    if table == "rollups":
        p["day0"] = day0(w.since)
    alias = "j" if table in ("jobs", "job_energy", "models") else "r"  # (jobs' or the table's own columns)
    where = ""
    if user is not None:
        where += f" AND {alias}.user_name = %(user)s"
        p["user"] = user
    if account is not None:
        where += f" AND {alias}.account = %(account)s"
        p["account"] = account
    if cluster is not None:
        where += " AND c.name = %(cluster)s"
        p["cluster"] = cluster
    where += labs_clause(f"{alias}.account", within, p)
    raw = db.rows(_SQL[table].format(where=where), p)
    make = _ROW[table]
    rows = [r for r in (make(db, x, w) for x in raw) if r is not None]
    nxt = int(raw[-1][0]) if len(raw) == limit and table != "study_arms" else None
    return Page(tuple(COLUMNS[table]), rows, nxt)


def read_all(db: Db, table: str, w: Window, **kw: Any) -> Iterator[Page]:
    """Every page of `table` in `w` (what `read` takes, without `after`)."""
    after = 0
    while True:
        page = read(db, table, w, after=after, **kw)
        yield page
        if page.next is None:
            return
        after = page.next


def _kwh(j: Any) -> float | None:
    return None if j is None else float(j) / J_PER_KWH


def _kg(g: Any) -> float | None:
    return None if g is None else float(g) / G_PER_KG


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def _i(x: Any) -> int | None:
    return None if x is None else int(x)


def _share(db: Db, start: Any, elapsed: Any, w: Window) -> float:
    t0 = db.timestamp(start)
    assert t0 is not None
    return share(t0.timestamp(), max(float(elapsed or 0.0), 0.0), w.since_s, w.until_s)


# --- jobs ------------------------------------------------------------------------------------------------

_SQL: dict[str, str] = {
    "jobs": f"""
SELECT j.id, c.name, j.job_id, j.user_name, j.account, j.partition, j.qos, j.state, j.name, j.submit_time,
       j.start_time, j.end_time, j.elapsed_s, j.alloc_cpus, j.alloc_gpus, j.gpu_type, j.energy_j,
       j.energy_measured_j, j.pue, j.carbon_zone, j.carbon_g_per_kwh, j.co2_g, m.co2_embodied_g,
       m.gpu_util_pct, m.idle_gpu_s, m.idle_gpu_energy_j, m.shift_saved_g, m.shift_pause_saved_g
FROM jobs j JOIN clusters c ON c.id = j.cluster_id LEFT JOIN job_metrics m ON m.job_pk = j.id
WHERE {_RUNS_IN}{{where}} AND j.id > %(after)s
ORDER BY j.id LIMIT %(limit)s""",
    "job_energy": f"""
SELECT q.id, c.name, j.job_id, j.user_name, j.account, j.start_time, j.elapsed_s, q.node, q.component,
       q.method, q.source, q.energy_j
FROM job_energy q JOIN jobs j ON j.id = q.job_pk JOIN clusters c ON c.id = j.cluster_id
WHERE {_RUNS_IN}{{where}} AND q.id > %(after)s
ORDER BY q.id LIMIT %(limit)s""",
    "rollups": """
SELECT r.id, r.day, c.name, r.user_name, r.account, r.partition, r.jobs, r.jobs_failed, r.jobs_oom,
       r.jobs_cancelled, r.jobs_timeout, r.cpu_hours, r.gpu_hours, r.energy_gpu_j, r.energy_cpu_j,
       r.energy_dram_j, r.energy_other_j, r.energy_measured_j, r.energy_estimated_j, r.energy_failed_j,
       r.energy_oom_j, r.energy_timeout_j, r.energy_cancelled_j, r.co2_g, r.co2_embodied_g,
       r.gpu_util_energy_j, r.gpu_util_weighted, r.idle_gpu_hours, r.idle_gpu_energy_j, r.shift_co2_g,
       r.shift_saved_g, r.shift_pause_saved_g
FROM daily_rollups r JOIN clusters c ON c.id = r.cluster_id
WHERE r.day >= %(day0)s AND r.day < %(until)s{where} AND r.id > %(after)s
ORDER BY r.id LIMIT %(limit)s""",
    "models": """
SELECT mm.id, c.name, j.job_id, j.user_name, j.account, j.state, j.end_time, mm.model_name, mm.task,
       mm.framework, mm.framework_version, mm.parameters, mm.precision, mm.batch_size, mm.dataset, mm.epochs,
       mm.tokens, j.alloc_gpus, j.elapsed_s, j.energy_j, j.co2_g
FROM model_metadata mm JOIN jobs j ON j.id = mm.job_pk JOIN clusters c ON c.id = j.cluster_id
WHERE j.end_time >= %(since)s AND j.end_time < %(until)s{where} AND mm.id > %(after)s
ORDER BY mm.id LIMIT %(limit)s""",
    "sent": """
SELECT r.id, r.kind, r.recipient, r.user_name, r.period_start, r.period_end, r.sent_at, r.status,
       r.message_id, r.error
FROM sent_reports r
WHERE r.period_start < %(until)s AND r.period_end > %(since)s{where} AND r.id > %(after)s
ORDER BY r.id LIMIT %(limit)s""",
    # (one row per user and study: one page holds them; `after` is a row number)
    "study_arms": """
SELECT 0, r.study, r.user_name, r.arm, r.stratum, r.gpu_hours_before, r.draw, r.assigned_at, r.opted_out_at
FROM study_arms r
WHERE r.assigned_at < %(until)s{where} AND %(after)s = 0
ORDER BY r.study, r.user_name""",
}


def _job(db: Db, x: Sequence[Any], w: Window) -> tuple[Any, ...] | None:
    (_, cl, job_id, user, acct, part, qos, state, name, submit, start, end, el, cpus, gpus, gtype, e, meas,
     pue, zone, g_kwh, co2, emb, util, idle_s, idle_j, saved, pause_saved) = x  # fmt: skip
    f = _share(db, start, el, w)
    if f <= 0:
        return None
    el_h = max(float(el or 0.0), 0.0) / S_PER_HOUR
    energy, measured = float(e or 0.0), float(meas or 0.0)
    return (
        cl, job_id, user, acct, part, qos, state, name, db.timestamp(submit), db.timestamp(start),
        db.timestamp(end), el_h, _i(cpus), _i(gpus), gtype, int(cpus or 0) * el_h, int(gpus or 0) * el_h,
        energy / J_PER_KWH, measured / J_PER_KWH, (energy - measured) / J_PER_KWH,
        energy * float(1.0 if pue is None else pue) / J_PER_KWH, _f(pue), zone, _f(g_kwh),
        float(co2 or 0.0) / G_PER_KG, float(emb or 0.0) / G_PER_KG, _f(util),
        float(idle_s or 0.0) / S_PER_HOUR, float(idle_j or 0.0) / J_PER_KWH,
        float(saved or 0.0) / G_PER_KG, float(pause_saved or 0.0) / G_PER_KG, f,
    )  # fmt: skip


def _job_energy(db: Db, x: Sequence[Any], w: Window) -> tuple[Any, ...] | None:
    _, cl, job_id, user, acct, start, el, node, comp, method, source, e = x
    f = _share(db, start, el, w)
    if f <= 0:
        return None
    return (cl, job_id, user, acct, db.timestamp(start), node, comp, method, source, _kwh(e), f)


def _rollup(db: Db, x: Sequence[Any], w: Window) -> tuple[Any, ...] | None:
    (_, day, cl, user, acct, part, jobs, jf, joom, jc, jt, cpu_h, gpu_h, e_gpu, e_cpu, e_dram, e_other,
     e_meas, e_est, e_failed, e_oom, e_timeout, e_cancelled, co2, emb, util_e, util_w, idle_h, idle_j,
     s_co2, s_saved, s_pause) = x  # fmt: skip
    meas, est = float(e_meas or 0.0), float(e_est or 0.0)
    util = float(util_w or 0.0) / float(util_e) if util_e else None
    return (
        db.timestamp(day), cl, user, acct, part, _i(jobs), _i(jf), _i(joom), _i(jc), _i(jt), _f(cpu_h),
        _f(gpu_h),
        (meas + est) / J_PER_KWH, _kwh(e_gpu), _kwh(e_cpu), _kwh(e_dram), _kwh(e_other), meas / J_PER_KWH,
        est / J_PER_KWH, _kwh(e_failed), _kwh(e_oom), _kwh(e_timeout), _kwh(e_cancelled), _kg(co2), _kg(emb),
        util, _f(idle_h), _kwh(idle_j), _kg(s_co2), _kg(s_saved), _kg(s_pause),
    )  # fmt: skip


def _model(db: Db, x: Sequence[Any], w: Window) -> tuple[Any, ...] | None:
    (_, cl, job_id, user, acct, state, end, model, task, fw, fw_v, params, prec, batch, dataset, epochs,
     tokens, gpus, el, e, co2) = x  # fmt: skip
    g = int(gpus or 0)
    return (
        cl, job_id, user, acct, state, db.timestamp(end), model, task, fw, fw_v, _i(params), prec, _i(batch),
        dataset, _f(epochs), _i(tokens), g, g * float(el or 0.0) / S_PER_HOUR, float(e or 0.0) / J_PER_KWH,
        float(co2 or 0.0) / G_PER_KG,
    )  # fmt: skip


def _sent(db: Db, x: Sequence[Any], w: Window) -> tuple[Any, ...] | None:
    _, kind, to, user, p0, p1, at, status, mid, err = x
    return (kind, to, user, db.timestamp(p0), db.timestamp(p1), db.timestamp(at), status, mid, err)


def _arm(db: Db, x: Sequence[Any], w: Window) -> tuple[Any, ...] | None:
    _, study, user, arm, stratum, before, draw, at, out = x
    return (study, user, arm, _i(stratum), _f(before), _f(draw), db.timestamp(at), db.timestamp(out))


_ROW = {"jobs": _job, "job_energy": _job_energy, "rollups": _rollup, "models": _model, "sent": _sent,
        "study_arms": _arm}  # fmt: skip


def day0(since: datetime) -> datetime:
    """The UTC midnight on or before `since`: the first day of rollups that overlaps the window."""
    return since.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
