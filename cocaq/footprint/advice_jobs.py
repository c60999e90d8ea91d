"""Only the jobs the shown advice reads: `cocaq user` and `cocaq lab` for a user with 10,000 jobs a month.

`advise` shows the rules that may claim a saving and the repeated bad endings (cocaq.footprint.advice's
SHOWN), and the when-to-run suggestion; each of them reads only some of a window's jobs, and a job that
none of them can count for changes nothing they say. So one narrow statement (`_triage_sql`) marks, in
SQL, each job that one of them might count for (`cand`: a superset, thresholds widened by a hair so that
rounding never leaves one out; the rules then decide exactly), and only those are loaded whole
(cocaq.footprint.jobfacts.load with `ids`):

* precision with model metadata (its own runs, known precision): GPU jobs with a model_metadata row
* timeouts, failures, failures-late, out-of-memory: their states; and the completed runs of a kind of job
  that timed out (by name: the `--time` they took sizes the line)
* notebooks, fewer-gpus: GPU jobs with idle GPU energy
* dataloader: GPU jobs under the utilisation bound with their CPUs busy, long enough
* memory: jobs that used at most the share of a large enough request
* when-to-run: jobs with shifting figures (`shift_state` ok)

The one rule that reads every GPU job is precision (none of them recorded in reduced precision, the
GPU-hours of all, the GPU energy of those of unknown precision, and it names them all): the GPU jobs no
other rule reads come from the same statement as narrow JobFacts (`_light`), with just what that rule
reads of them, and only that rule is handed them. The CO2 of all the window's jobs, which when-to-run
compares its saving with, is read only when it is needed (`_co2_total`), summed in the order the whole
computation sums it. Everything is in the whole computation's order (user, then energy in the window),
so that every list, sum and tie comes out the same; tests/test_advice_fast.py compares the two on the demo
and on a generated site under several thresholds, byte for byte.

Plain DB-API SQL (cocaq.db.dbapi), standard library only: login nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cocaq.accounting.ledger import FAILED_STATES, OOM_STATES, TIMEOUT_STATES
from cocaq.accounting.window import overlap_sql, share_sql
from cocaq.footprint.advice_words import MB_PER_GB
from cocaq.footprint.dbsql import epoch, first_word, greatest, labs_bound
from cocaq.footprint.jobfacts import JobFacts, _hardware, load
from cocaq.units import J_PER_KWH

if TYPE_CHECKING:
    from cocaq.config import Config
    from cocaq.db.dbapi import Db
    from cocaq.footprint.advice import Context

# A threshold widened by this (relative) so that SQL's and Python's rounding never disagree on a job.
_HAIR = 1e-9


@dataclass
class UserJobs:
    """One user's jobs as the shown advice reads them."""

    jobs: list[JobFacts] = field(default_factory=list)  # whole: those a rule or when-to-run may count
    precision_jobs: list[JobFacts] = field(default_factory=list)  # every GPU job (and `jobs`), in order


@dataclass
class AdviceJobs:
    """Per user (in the whole computation's order), and the CO2 of every window job, on demand."""

    users: dict[str, UserJobs]
    co2_total: Callable[[str], float]
    shift: bool  # when-to-run may fire, and its jobs are among `jobs` (else it says nothing)


def _scope(db: Db, user: str | None, account: str | None, cluster: str | None, within: int) -> str:
    where = ""
    if user is not None:
        where += " AND j.user_name = %(key)s"
    elif account is not None:
        where += " AND j.account = %(key)s"
    if cluster:
        where += " AND j.cluster_id = (SELECT id FROM clusters WHERE name = %(cluster)s)"
    if within:
        where += f" AND j.account IN ({', '.join(f'%(in{i})s' for i in range(within))})"
    return where


def _window_cte(db: Db, where: str, columns: str) -> str:
    """The window's jobs with their share `f`, exactly as cocaq.footprint.jobfacts._sql computes it."""
    pg = db.dialect == "postgresql"
    big, small = ("greatest", "least") if pg else ("max", "min")
    el = greatest(db, "coalesce(j.elapsed_s, 0.0)", "0.0")
    t0 = epoch(db, "j.start_time")
    ov = overlap_sql("y.t0", "y.el", "%(since)s", "%(until)s", db.dialect)
    f = share_sql("y.t0", "y.el", ov, [("%(since)s", "%(until)s")])
    fence = "\n        OFFSET 0" if pg else ""
    return f"""
WITH y AS (
    SELECT j.id, j.user_name, coalesce(j.energy_j, 0.0) AS energy, coalesce(j.co2_g, 0.0) AS co2,{columns}
           {t0} AS t0, {el} AS el
    FROM jobs j
    WHERE j.start_time < %(until_ts)s AND (j.end_time >= %(since_ts)s OR j.end_time IS NULL)
          AND j.start_time IS NOT NULL{where}{fence}
), w AS (
    SELECT y.*, {small}({big}({f}, 0.0), 1.0) AS f
    FROM y
)"""


def _triage_sql(db: Db, where: str, user: bool) -> str:
    """Each window job that a shown rule may count (`cand`), and every other GPU job as the precision rule
    reads it (`_light`'s columns); for a user, what when-to-run's test reads: the CO2 of all the window's
    jobs, and of those with shifting figures what they would have saved and how many they are (on
    every row, and so on one row of the window at least: `rn`)."""
    pg = db.dialect == "postgresql"
    big, small = ("greatest", "least") if pg else ("max", "min")
    fw = first_word(db, "w.state")
    bad = ", ".join(f"'{s}'" for s in sorted({*TIMEOUT_STATES, *OOM_STATES, *FAILED_STATES, "FAILED"}))
    energy_j = f"{big}(w.energy, 0.0)"
    per_node = f"w.req_mem_mb / {big}(w.nn, 1)"
    has_meta = "EXISTS (SELECT 1 FROM model_metadata mm WHERE mm.job_pk = w.id)"
    cand = f"""(
        (w.gpus > 0 AND {has_meta})
        OR {fw} IN ({bad})
        OR (w.gpus > 0 AND coalesce(m.idle_gpu_energy_j, 0.0) > 0 AND w.energy > 0)
        OR (w.gpus > 0 AND m.gpu_util_pct < %(c_util)s AND w.total_cpu_s > %(c_cpu)s * w.cpus * w.el
            AND w.el >= %(c_el)s)
        OR (w.max_rss_mb IS NOT NULL AND w.req_mem_mb > 0 AND {per_node} >= %(c_mem_req)s
            AND w.max_rss_mb * {big}(coalesce(w.rss_tasks_per_node, 1), 1) <= %(c_mem_use)s * {per_node})
    )"""
    no = "false" if pg else "0"
    flex = "CASE WHEN m.shift_state = 'ok' THEN"
    shift = (
        f""",
           sum(w.co2 / 1000.0 * w.f) OVER () AS co2_all,
           sum({flex} coalesce(m.shift_saved_g, 0.0) / 1000.0 * w.f END) OVER () AS saved,
           count({flex} 1 END) OVER () AS flex, row_number() OVER () AS rn"""
        if user
        else ", NULL AS co2_all, NULL AS saved, NULL AS flex, 0 AS rn"
    )
    held = "w.gpus * w.el"
    gpu_j = "(SELECT sum(q.energy_j) FROM job_energy q WHERE q.job_pk = w.id AND q.component = 'gpu')"
    cols = """
           j.job_id, j.name, j.partition, j.node_list, coalesce(j.state, '') AS state,
           coalesce(j.alloc_cpus, 0) AS cpus, coalesce(j.alloc_gpus, 0) AS gpus, coalesce(j.n_nodes, 0) AS nn,
           j.req_mem_mb, j.max_rss_mb, j.rss_tasks_per_node, j.total_cpu_s, j.gpu_type,"""
    return f"""{_window_cte(db, where, cols)}, x AS (
    SELECT w.*, coalesce({cand}, {no}) AS cand, m.gpu_samples_s, m.idle_gpu_s{shift}
    FROM w LEFT JOIN job_metrics m ON m.job_pk = w.id
    WHERE w.f > 0
)
SELECT w.id, w.user_name, {energy_j} * w.f, w.cand,
       w.job_id, w.name, w.partition, w.node_list, w.gpus, w.el / 3600.0, w.f, {energy_j} / {J_PER_KWH!r},
       CASE WHEN w.gpus > 0 AND NOT w.cand THEN coalesce({gpu_j}, 0.0) / {J_PER_KWH!r} END, w.co2 / 1000.0,
       CASE WHEN {held} > 0 THEN {small}(coalesce(w.gpu_samples_s, 0.0) / ({held}), 1.0) ELSE 0.0 END,
       coalesce(w.idle_gpu_s, 0.0) / 3600.0, w.gpu_type, w.co2_all, w.saved, w.flex
FROM x w
WHERE w.cand OR w.gpus > 0 OR w.rn = 1"""


def _flex_sql(db: Db, where: str) -> str:
    """The window's jobs with shifting figures (when-to-run's)."""
    return f"""{_window_cte(db, where, "")}
SELECT w.id FROM w JOIN job_metrics m ON m.job_pk = w.id WHERE w.f > 0 AND m.shift_state = 'ok'"""


def _co2_sql(db: Db, where: str) -> str:
    """Every window job's CO2 in the window, in the whole computation's order's terms."""
    big = "greatest" if db.dialect == "postgresql" else "max"
    return f"""{_window_cte(db, where, "")}
SELECT w.user_name, {big}(w.energy, 0.0) * w.f, w.id, w.co2 / 1000.0, w.f FROM w WHERE w.f > 0"""


def _light(cfg: Config, r: tuple[Any, ...], hw_cache: dict[tuple[Any, Any], Any]) -> JobFacts:
    """A GPU job as the precision rule reads it (and nothing else may read it): its id and name, GPUs,
    run time and share, energy, GPU energy, CO2, sampled and idle GPU time, GPU type and model."""
    partition, node_list = r[6], r[7]
    key = (partition, node_list if cfg.node_groups else None)
    hw = hw_cache.get(key)
    if hw is None:
        hw = hw_cache[key] = _hardware(cfg, partition, node_list)
    return JobFacts(
        pk=r[0], job_id=r[4], job_id_raw=None, cluster_id=0, cluster="", name=r[5], user=r[1],
        account=None, partition=partition, node_list=node_list, state="", exit_code=None, start=None,
        end=None, is_open=False, cpus=0, gpus=r[8], nodes=0, elapsed_h=r[9], time_limit_h=None,
        req_mem_mb=None, max_rss_mb=None, rss_tasks_per_node=None, total_cpu_s=None, share=r[10],
        energy_kwh=r[11], gpu_kwh=r[12], cpu_kwh=0.0, dram_kwh=0.0, other_kwh=0.0, measured_kwh=0.0,
        gpu_source=None, co2_kg=r[13], gpu_util_pct=None, sampled_share=r[14], idle_gpu_hours=r[15],
        idle_kwh=0.0, gpu_mem_peak_mb=None, mean_gpu_power_w=None, gpu_type=r[16],
        gpu_model=hw.gpu_model if hw.gpu_model != "unknown GPU" else None,
    )  # fmt: skip


def load_for_advice(
    db: Db,
    cfg: Config,
    ctx: Context,
    since: datetime,
    until: datetime,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    within: tuple[str, ...] | None = None,
) -> AdviceJobs:
    """The jobs of a user's or a lab's window that the shown advice reads, per user (see the module);
    when-to-run's only for a user (a lab's footprint has none)."""
    from cocaq.footprint.advice import is_interactive, outcome_part
    from cocaq.footprint.own_limits import kind_of

    t = ctx.thresholds
    inside = labs_bound(within)
    params: dict[str, Any] = {
        "since": since.timestamp(),
        "until": until.timestamp(),
        "since_ts": since,
        "until_ts": until,
        "c_util": t.loader_max_util_pct * (1 + _HAIR),
        "c_cpu": t.loader_min_cpu_usage * (1 - _HAIR),
        "c_el": t.loader_min_elapsed_h * 3600.0 * (1 - _HAIR),
        "c_mem_req": t.mem_min_req_gb * MB_PER_GB * (1 - _HAIR),
        "c_mem_use": t.mem_max_use * (1 + _HAIR),
    }
    if user is not None or account is not None:
        params["key"] = user if user is not None else account
    if cluster:
        params["cluster"] = cluster
    for i, a in enumerate(inside):
        params[f"in{i}"] = a
    where = _scope(db, user, account, cluster, len(inside))
    rows = db.rows(_triage_sql(db, where, user is not None), params)
    order: dict[int, tuple[str, float, int]] = {}
    scope: dict[str, Any] = {"user": user, "account": account, "cluster": cluster, "within": within}
    whole = [r[0] for r in rows if r[3]]
    shift = user is not None and bool(rows) and _may_shift(cfg, rows[0])
    if shift:  # when-to-run may fire: its jobs, whole
        cands = set(whole)
        whole += [r[0] for r in db.rows(_flex_sql(db, where), params) if r[0] not in cands]
    facts = load(db, cfg, since, until, **scope, ids=whole, order=order)
    by_user = _by_user(facts)
    # the completed runs of the kind of job whose time-out loses most: they size its `--time`
    for u, js in list(by_user.items()):
        hit = [j for j in js if j.outcome == "timeout" and not is_interactive(j, ctx)]
        if not hit:
            continue
        name = kind_of(max(hit, key=outcome_part))[0]
        more = load(
            db, cfg, since, until, **{**scope, "user": u}, name=name or None, order=order
        )  # (no name: all of the user's jobs, of which those without one are the kind)
        have = {j.pk for j in js}
        more = [j for j in more if j.pk not in have and (account is None or j.account == account)]
        by_user[u] = sorted([*js, *more], key=lambda j: order[j.pk])
    for r in rows:
        order.setdefault(r[0], (r[1], -r[2], r[0]))
    hw: dict[tuple[Any, Any], Any] = {}
    loaded = {j.pk for js in by_user.values() for j in js}
    light = [_light(cfg, r, hw) for r in rows if r[8] > 0 and r[0] not in loaded]
    users = {u: UserJobs(js) for u, js in by_user.items()}
    gpu_jobs = [j for js in by_user.values() for j in js if j.gpus > 0]
    for u, pj in _by_user(sorted([*gpu_jobs, *light], key=lambda j: order[j.pk])).items():
        users.setdefault(u, UserJobs()).precision_jobs = pj

    def co2_total(name: str) -> float:
        got = db.rows(_co2_sql(db, where), params)
        got.sort(key=lambda r: (r[0], -r[1], r[2]))
        return sum(r[3] * r[4] for r in got if r[0] == name)

    return AdviceJobs(users, co2_total, shift)


def _may_shift(cfg: Config, r: tuple[Any, ...]) -> bool:
    """Whether when-to-run may fire (cocaq.footprint.when_advice's test on the triage's sums, with a
    margin that SQL's order of summing cannot cross)."""
    s = cfg.shifting
    co2_all, saved, flex = float(r[17] or 0.0), float(r[18] or 0.0), int(r[19] or 0)
    if not flex or s.slack_s <= 0:
        return False
    eps = 1e-12
    return saved > -eps and saved >= max(s.min_share * co2_all, s.min_kg) * (1 - 1e-6) - eps


def _by_user(jobs: list[JobFacts]) -> dict[str, list[JobFacts]]:
    out: dict[str, list[JobFacts]] = {}
    for j in jobs:
        out.setdefault(j.user, []).append(j)
    return out
