"""The daily rollups: each day's sums per cluster, user, account and partition (the daily_rollups table).

A day is rebuilt whole from every job that ran in it, each counting pro rata to its share of the day
(`cocaq.accounting.window`, the formula `cocaq user/lab` and the reports use too), its energy split by
component, measured and estimated, and into the ledger's parts (`cocaq.accounting.ledger`), with its CO2,
embodied CO2, GPU-hours, utilisation and idle time. In Python (`_add`, `_rollup_row`: SQLite) or, on
PostgreSQL, in one SQL statement per range of days (`_ROLLUP_JOBS`) that writes only the rows that
differ; both give the same rows (tests/test_aggregate.py). The aggregator (`cocaq.accounting.aggregate`)
says which days to rebuild; `cocaq.db.rollup_columns` names what a row holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, delete, func, insert, or_, select, text

from cocaq.accounting.ledger import OUTCOMES, count_sql, counts_as, outcome_of, outcome_sql, waste
from cocaq.accounting.sessions import Sessions
from cocaq.accounting.window import overlap, overlap_sql, share, share_sql
from cocaq.config import Advice
from cocaq.db.coltypes import as_utc
from cocaq.db.rollup_columns import ROLLUP_FIELDS, ROLLUP_KEYS
from cocaq.db.schema import DailyRollup, Job, JobEnergy, JobMetrics
from cocaq.units import S_PER_HOUR

DAY = 86400.0
WORK_MEM = "256MB"  # PostgreSQL, for the aggregator's big statements (SET LOCAL)

J = cast(Table, Job.__table__).c
M = cast(Table, JobMetrics.__table__)
R = cast(Table, DailyRollup.__table__)
E = cast(Table, JobEnergy.__table__).c


def day_floor(ts: float) -> float:
    """The start (UTC midnight, epoch seconds) of the day `ts` is in."""
    return ts - (ts % DAY)


def big_work_mem(conn: Connection) -> None:
    """PostgreSQL: a bigger work_mem for this transaction (the year-wide sorts and hashes stay in memory)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL work_mem = '{WORK_MEM}'")


def day_starts(d0: float, d1: float) -> list[float]:
    out = []
    d = d0
    while d <= d1:
        out.append(d)
        d += DAY
    return out


def _ranges(days: Iterable[float]) -> list[tuple[float, float]]:
    """Contiguous [first, last] runs of day starts."""
    out: list[tuple[float, float]] = []
    for d in sorted(days):
        if out and d - out[-1][1] <= DAY + 1:
            out[-1] = (out[-1][0], d)
        else:
            out.append((d, d))
    return out


def rebuild_days(
    conn: Connection,
    days: set[float],
    *,
    in_sql: bool | None = None,
    wide: bool | None = None,
    sessions: Sessions | None = None,
) -> int:
    """Rebuild the rollups of these days; on PostgreSQL in one statement per range (`in_sql`, `wide`:
    force the way, for tests). `sessions`: the site's interactive sessions (whose time-limit energy is no
    loss), by default the default configuration's."""
    sessions = sessions if sessions is not None else _DEFAULT_SESSIONS
    if in_sql is None:
        in_sql = conn.dialect.name == "postgresql"
    rows = 0
    for first, last in _ranges(days):
        lo, hi = datetime.fromtimestamp(first, UTC), datetime.fromtimestamp(last + DAY, UTC)
        if in_sql:
            rows += _rebuild_range_pg(conn, lo, hi, first, last, wide, sessions)
            continue
        jobs = conn.execute(
            select(
                J.id, J.cluster_id, J.user_name, J.account, J.partition, J.start_time, J.elapsed_s,
                J.alloc_cpus, J.alloc_gpus, J.state, J.energy_j, J.energy_measured_j, J.co2_g,
                J.energy_est_low_j, J.energy_est_high_j, M.c.co2_embodied_g, M.c.gpu_util_pct,
                M.c.gpu_samples_s, M.c.idle_gpu_s, M.c.gpu_samples_j, M.c.idle_gpu_energy_j, M.c.shift_state,
                M.c.shift_saved_g, M.c.shift_pause_saved_g, J.name, J.qos, J.batch_step,
            )
            .outerjoin(M, M.c.job_pk == J.id)
            .where(J.start_time < hi, or_(J.end_time >= lo, J.end_time.is_(None)), J.start_time.is_not(None))
        ).all()  # fmt: skip
        comp: dict[int, dict[str, float]] = defaultdict(dict)
        ids = [j.id for j in jobs]
        for i in range(0, len(ids), 20_000):
            for pk, c, e in conn.execute(
                select(E.job_pk, E.component, func.sum(E.energy_j))
                .where(E.job_pk.in_(ids[i : i + 20_000]))
                .group_by(E.job_pk, E.component)
            ):
                comp[pk][c] = e or 0.0
        acc: dict[tuple[Any, ...], list[float]] = {}
        for j in jobs:
            start = as_utc(j.start_time)
            assert start is not None
            t0 = start.timestamp()
            el = max(j.elapsed_s or 0.0, 0.0)
            t1 = t0 + el
            d = day_floor(t0)
            inter = sessions.holds(
                j.name, j.partition, j.qos, None if j.batch_step is None else bool(j.batch_step)
            )
            while d <= t1 and d <= last:
                if d >= first:
                    frac = share(t0, el, d, d + DAY)
                    if frac > 0:
                        _add(acc, j, d, frac, overlap(t0, el, d, d + DAY), comp.get(j.id, {}), inter)
                d += DAY
        conn.execute(delete(R).where(R.c.day >= lo, R.c.day < hi))
        if acc:
            batch = [_rollup_row(k, v) for k, v in acc.items()]
            for i in range(0, len(batch), 10_000):
                conn.execute(insert(R), batch[i : i + 10_000])
            rows += len(batch)
    return rows


PARALLEL_DAYS = 62  # more days than this are split among connections on PostgreSQL


def rebuild_days_parallel(
    engine: Engine, days: set[float], workers: int, *, sessions: Sessions | None = None
) -> int:
    """`rebuild_days` with the days cut into `workers` runs of consecutive days, each rebuilt on its own
    connection and in its own transaction, at once. PostgreSQL runs the rollups' statement on one core
    (it writes a temporary table: no parallel plan), and a full recompute rebuilds a year of days. A day's
    rows depend only on the jobs that ran in it, so any cut gives the same rows; a part that fails raises
    here after the others end (their days are rebuilt, which a re-run does again: it is idempotent).
    SQLite, one worker or a few days: one transaction, as `rebuild_days`."""
    order = sorted(days)
    if engine.dialect.name != "postgresql" or workers < 2 or len(order) <= PARALLEL_DAYS:
        with engine.begin() as conn:
            return rebuild_days(conn, days, sessions=sessions)
    from concurrent.futures import ThreadPoolExecutor

    size = -(-len(order) // workers)
    parts = [set(order[i : i + size]) for i in range(0, len(order), size)]

    def one(part: set[float]) -> int:
        with engine.begin() as conn:
            return rebuild_days(conn, part, sessions=sessions)

    with ThreadPoolExecutor(len(parts), thread_name_prefix="cocaq-rollups") as pool:
        futures = [pool.submit(one, part) for part in parts]
        return sum(f.result() for f in futures)


def _rebuild_range_pg(
    conn: Connection,
    lo: datetime,
    hi: datetime,
    first: float,
    last: float,
    wide: bool | None,
    sessions: Sessions,
) -> int:
    """One range of days on PostgreSQL: the rows computed into a temporary table, then only the
    differences written (most rows of a recompute come out the same, and rewriting a year's rows and
    their five indexes costs more than computing them). Returns the range's row count."""
    big_work_mem(conn)
    if wide is None:
        wide = (last - first) / DAY + 1 > WIDE_DAYS
    # One query that runs once: compiling it (JIT) costs seconds and saves nothing. Its groups (about a
    # quarter of the jobs) fit in memory: hashing them beats sorting a million job-days.
    conn.exec_driver_sql("SET LOCAL jit = off")
    conn.exec_driver_sql("SET LOCAL enable_sort = off")
    conn.exec_driver_sql("DROP TABLE IF EXISTS cocaq_rollup_new")
    sql = _rollup_pg(bool(wide), sessions)
    params = {"lo": lo, "hi": hi, "first": first, "last": last}
    conn.execute(text(f"CREATE TEMP TABLE cocaq_rollup_new ON COMMIT DROP AS {sql}"), params)
    conn.exec_driver_sql("SET LOCAL enable_sort = on")
    conn.exec_driver_sql("ANALYZE cocaq_rollup_new")
    same_key = " AND ".join(f"r.{k} = t.{k}" for k in ROLLUP_KEYS)
    keys, vals = ", ".join(ROLLUP_KEYS), ", ".join(ROLLUP_FIELDS)
    conn.execute(
        text(
            "DELETE FROM daily_rollups r WHERE r.day >= :lo AND r.day < :hi"
            f" AND NOT EXISTS (SELECT 1 FROM cocaq_rollup_new t WHERE {same_key})"
        ),
        {"lo": lo, "hi": hi},
    )
    new_vals = ", ".join("t." + f for f in ROLLUP_FIELDS)
    old_vals = ", ".join("r." + f for f in ROLLUP_FIELDS)
    conn.exec_driver_sql(
        f"UPDATE daily_rollups r SET ({vals}, computed_at) = ({new_vals}, now())"
        f" FROM cocaq_rollup_new t WHERE {same_key} AND ({old_vals}) IS DISTINCT FROM ({new_vals})"
    )
    # New rows by the unique key's index. (An anti-join here was quadratic on a first run: the table's
    # statistics said empty, so each new row scanned the heap the statement itself was growing.)
    inserted = conn.exec_driver_sql(
        f"INSERT INTO daily_rollups ({keys}, {vals}) SELECT {keys}, {vals}"
        f" FROM cocaq_rollup_new t ON CONFLICT ({keys}) DO NOTHING"
    ).rowcount
    if inserted > 10_000:  # the next ranges' plans must not take the table for the empty one it was
        conn.exec_driver_sql("ANALYZE daily_rollups")
    n = conn.exec_driver_sql("SELECT count(*) FROM cocaq_rollup_new").scalar_one()
    conn.exec_driver_sql("DROP TABLE cocaq_rollup_new")
    return int(n)


# PostgreSQL: the same rows as _add/_rollup_row below, computed in one query per range of days [first,
# last] (epoch seconds of UTC midnights): each job counts in the days d from its start's day while d <= its
# end and d <= last, kept where d >= first and it ran in d (or, with no run time, started in d).
# Two ways to get each job's energy by component: for a few days' jobs, an index lookup per job; for a
# long range (a full recompute), one pass over job_energy hashed by job. Jobs within one day (most of
# them) skip generate_series, whose row estimate would otherwise mislead the planner.
_ROLLUP_JOBS = """
WITH j AS (
    SELECT j.id, j.cluster_id, j.user_name, coalesce(j.account, '') AS account,
           coalesce(j.partition, '') AS partition, split_part(coalesce(j.state, ''), ' ', 1) AS st,
           extract(epoch FROM j.start_time)::float8 AS t0, greatest(coalesce(j.elapsed_s, 0.0), 0.0) AS el,
           coalesce(j.alloc_cpus, 0) AS cpus, coalesce(j.alloc_gpus, 0) AS gpus,
           coalesce(j.energy_j, 0.0) AS energy, coalesce(j.energy_measured_j, 0.0) AS measured,
           coalesce(j.energy_est_low_j, coalesce(j.energy_j, 0.0) - coalesce(j.energy_measured_j, 0.0))
               AS est_lo,
           coalesce(j.energy_est_high_j, coalesce(j.energy_j, 0.0) - coalesce(j.energy_measured_j, 0.0))
               AS est_hi,
           coalesce(j.co2_g, 0.0) AS co2, coalesce(m.co2_embodied_g, 0.0) AS embodied, m.gpu_util_pct AS util,
           coalesce(m.gpu_samples_j, 0.0) AS util_j,
           coalesce(m.idle_gpu_s, 0.0) AS idle_s, coalesce(m.idle_gpu_energy_j, 0.0) AS idle_j,
           CASE WHEN m.shift_state = 'ok' THEN coalesce(j.co2_g, 0.0) ELSE 0.0 END AS shift_co2,
           coalesce(m.shift_saved_g, 0.0) AS shift_saved, coalesce(m.shift_pause_saved_g, 0.0) AS shift_pause,
           coalesce(c.gpu, 0.0) AS e_gpu, coalesce(c.cpu, 0.0) AS e_cpu, coalesce(c.dram, 0.0) AS e_dram,
           coalesce(c.other, 0.0) AS e_other, {interactive} AS inter
    FROM jobs j LEFT JOIN job_metrics m ON m.job_pk = j.id
    {energy}
    WHERE j.start_time < :hi AND (j.end_time >= :lo OR j.end_time IS NULL) AND j.start_time IS NOT NULL
), x AS (
    SELECT j.*, k.day, {ov} AS ov
    FROM j CROSS JOIN LATERAL (SELECT floor(j.t0 / 86400.0) * 86400.0 AS day) k
    WHERE floor(j.t0 / 86400.0) = floor(least(j.t0 + j.el, CAST(:last AS float8)) / 86400.0)
    UNION ALL
    SELECT j.*, k.day, {ov} AS ov
    FROM j CROSS JOIN LATERAL (
        SELECT n * 86400.0::float8 AS day
        FROM generate_series(
            floor(j.t0 / 86400.0)::bigint, floor(least(j.t0 + j.el, CAST(:last AS float8)) / 86400.0)::bigint
        ) AS n
    ) k
    WHERE floor(j.t0 / 86400.0) <> floor(least(j.t0 + j.el, CAST(:last AS float8)) / 86400.0)
), d AS (
    SELECT x.*, {frac} AS frac
    FROM x WHERE x.day >= CAST(:first AS float8)
)
SELECT cluster_id, to_timestamp(day) AS day, user_name, account, partition, count(*)::int AS jobs,
       {counts},
       sum(cpus * ov / {per_h}) AS cpu_hours, sum(gpus * ov / {per_h}) AS gpu_hours,
       sum(e_gpu * frac) AS energy_gpu_j, sum(e_cpu * frac) AS energy_cpu_j,
       sum(e_dram * frac) AS energy_dram_j, sum(e_other * frac) AS energy_other_j,
       sum(measured * frac) AS energy_measured_j, sum((energy - measured) * frac) AS energy_estimated_j,
       sum(est_lo * frac) AS energy_est_low_j, sum(est_hi * frac) AS energy_est_high_j,
       {parts},
       sum(co2 * frac) AS co2_g, sum(embodied * frac) AS co2_embodied_g,
       sum(CASE WHEN util IS NOT NULL THEN util_j * frac ELSE 0.0 END) AS gpu_util_energy_j,
       sum(CASE WHEN util IS NOT NULL THEN util * (util_j * frac) ELSE 0.0 END) AS gpu_util_weighted,
       sum(idle_s * frac / {per_h}) AS idle_gpu_hours,
       sum(shift_co2 * frac) AS shift_co2_g, sum(shift_saved * frac) AS shift_saved_g,
       sum(shift_pause * frac) AS shift_pause_saved_g
FROM d
WHERE frac > 0
GROUP BY cluster_id, day, user_name, account, partition
"""
_ENERGY_SUMS = """
           sum(coalesce(e.energy_j, 0.0)) FILTER (WHERE e.component = 'gpu') AS gpu,
           sum(coalesce(e.energy_j, 0.0)) FILTER (WHERE e.component = 'cpu') AS cpu,
           sum(coalesce(e.energy_j, 0.0)) FILTER (WHERE e.component = 'dram') AS dram,
           sum(coalesce(e.energy_j, 0.0)) FILTER (WHERE e.component NOT IN ('gpu', 'cpu', 'dram')) AS other
"""
# The ledger's disjoint parts (cocaq.accounting.ledger: idle GPUs, then failed, out of memory, timed out,
# cancelled; an interactive session's time limit is none: `inter`, cocaq.accounting.sessions)
_PARTS_PG = ",\n       ".join(
    f"sum(({outcome_sql(o, 'st', 'energy', 'idle_j', 'postgresql', interactive='inter')}) * frac) AS {col}"
    for o, col in (("idle", "idle_gpu_energy_j"), *((o, f"energy_{o}_j") for o in OUTCOMES))
)
_COUNTS_PG = ",\n       ".join(
    f"sum({count_sql(o, 'st', interactive='inter')})::int AS jobs_{o}" for o in OUTCOMES
)
# Each job's share of a day (cocaq.accounting.window): ov seconds of it in [day, day + 1 day).
_OV_PG = overlap_sql("j.t0", "j.el", "k.day", "k.day + 86400.0", "postgresql")
_FRAC_PG = share_sql("x.t0", "x.el", "x.ov", [("x.day", "x.day + 86400.0")])
_NARROW = f"LEFT JOIN LATERAL (SELECT {_ENERGY_SUMS} FROM job_energy e WHERE e.job_pk = j.id) c ON true"
_WIDE = (
    f"LEFT JOIN (SELECT e.job_pk, {_ENERGY_SUMS} FROM job_energy e GROUP BY e.job_pk) c ON c.job_pk = j.id"
)
_DEFAULT_SESSIONS = Sessions.of(Advice())


def _rollup_pg(wide: bool, sessions: Sessions) -> str:
    """The rollups' statement for a range of days (`wide`: the one-pass variant)."""
    return _ROLLUP_JOBS.format(
        energy=_WIDE if wide else _NARROW,
        interactive=sessions.sql("j.name", "j.partition", "j.qos", "j.batch_step", "postgresql"),
        parts=_PARTS_PG,
        counts=_COUNTS_PG,
        ov=_OV_PG,
        frac=_FRAC_PG,
        per_h=f"{S_PER_HOUR}.0",  # SQL's float literal: a division in floating point
    )


WIDE_DAYS = 31  # ranges of more days than this take the one-pass variant

_AT = {name: i for i, name in enumerate(ROLLUP_FIELDS)}


def _add(
    acc: dict[tuple[Any, ...], list[float]],
    j: Any,
    day: float,
    frac: float,
    ov: float,
    comp: dict[str, float],
    interactive: bool = False,
) -> None:
    key = (j.cluster_id, day, j.user_name, j.account or "", j.partition or "")
    v = acc.get(key)
    if v is None:
        v = acc[key] = [0.0] * len(ROLLUP_FIELDS)
    a = _AT
    energy = j.energy_j or 0.0
    parts = waste(j.state, energy, j.idle_gpu_energy_j or 0.0, interactive)
    outcome = counts_as(outcome_of(j.state), interactive)
    v[a["jobs"]] += 1
    if outcome is not None:
        v[a[f"jobs_{outcome}"]] += 1
    v[a["cpu_hours"]] += (j.alloc_cpus or 0) * ov / S_PER_HOUR
    v[a["gpu_hours"]] += (j.alloc_gpus or 0) * ov / S_PER_HOUR
    v[a["energy_gpu_j"]] += comp.get("gpu", 0.0) * frac
    v[a["energy_cpu_j"]] += comp.get("cpu", 0.0) * frac
    v[a["energy_dram_j"]] += comp.get("dram", 0.0) * frac
    v[a["energy_other_j"]] += sum(e for c, e in comp.items() if c not in ("gpu", "cpu", "dram")) * frac
    v[a["energy_measured_j"]] += (j.energy_measured_j or 0.0) * frac
    estimated = energy - (j.energy_measured_j or 0.0)
    v[a["energy_estimated_j"]] += estimated * frac
    # the estimate's range where the job has one (calibrated GPUs), else the estimate itself
    low, high = j.energy_est_low_j, j.energy_est_high_j
    v[a["energy_est_low_j"]] += (estimated if low is None else low) * frac
    v[a["energy_est_high_j"]] += (estimated if high is None else high) * frac
    for o in OUTCOMES:
        v[a[f"energy_{o}_j"]] += getattr(parts, o) * frac
    v[a["co2_g"]] += (j.co2_g or 0.0) * frac
    v[a["co2_embodied_g"]] += (j.co2_embodied_g or 0.0) * frac
    if j.gpu_util_pct is not None:  # weighted by the GPU energy its samples saw (also node-measured jobs)
        ge = (j.gpu_samples_j or 0.0) * frac
        v[a["gpu_util_energy_j"]] += ge
        v[a["gpu_util_weighted"]] += j.gpu_util_pct * ge
    v[a["idle_gpu_hours"]] += (j.idle_gpu_s or 0.0) * frac / S_PER_HOUR
    v[a["idle_gpu_energy_j"]] += parts.idle * frac
    if j.shift_state == "ok":  # when to run (cocaq.accounting.shifting)
        v[a["shift_co2_g"]] += (j.co2_g or 0.0) * frac
        v[a["shift_saved_g"]] += (j.shift_saved_g or 0.0) * frac
        v[a["shift_pause_saved_g"]] += (j.shift_pause_saved_g or 0.0) * frac


def _rollup_row(key: tuple[Any, ...], v: list[float]) -> dict[str, Any]:
    cid, day, user, account, partition = key
    row: dict[str, Any] = {
        "cluster_id": cid,
        "day": datetime.fromtimestamp(day, UTC),
        "user_name": user,
        "account": account,
        "partition": partition,
    }
    for name, x in zip(ROLLUP_FIELDS, v, strict=True):
        row[name] = int(x) if name.startswith("jobs") else x
    return row
