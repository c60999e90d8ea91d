"""Only the jobs the shown advice reads: `cocaq user` and `cocaq lab` for a user with 10,000 jobs a month.

`advise` shows the rules that may claim a saving and the repeated bad endings (cocaq.footprint.advice's
SHOWN: the rules' `saves` and `repeated`), and the when-to-run suggestion; each of them reads only some of
a window's jobs, and a job that none of them can count for changes nothing they say. So one narrow
statement (`_triage_sql`) marks, in SQL, each job that one of them might count for (`cand`: a superset,
thresholds widened by a hair so that rounding never leaves one out; the rules then decide exactly), and
only those are loaded whole
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
reads of them, and only that rule is handed them. When-to-run's test (what the jobs with shifting
figures would have saved, against the CO2 of all the window's jobs) is made on the statement's rows,
summed as cocaq.footprint.when_advice sums them; its jobs are loaded whole only where it may pass.
Everything is in the whole computation's order (user, then energy in the window), so that every list,
sum and tie comes out the same; tests/test_advice_fast.py compares the two on the demo and on a
generated site under several thresholds, byte for byte.

Plain DB-API SQL (cocaq.db.dbapi), standard library only: login nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cocaq.accounting.ledger import FAILED_STATES, OOM_STATES, TIMEOUT_STATES
from cocaq.accounting.window import overlap_sql, share_sql
from cocaq.db.alongside import Meanwhile
from cocaq.footprint.advice_words import MB_PER_GB
from cocaq.footprint.dbsql import epoch, false, first_word, greatest, labs_bound, least, planner_fence
from cocaq.footprint.jobfacts import JobFacts, _hardware, load, scope_where
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

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
    # every GPU job, in order: of `jobs` (JobFacts), the others as GpuJob (the precision rule's own view)
    precision_jobs: list[Any] = field(default_factory=list)


@dataclass
class AdviceJobs:
    """Per user (in the whole computation's order), and for a user what when-to-run reads besides."""

    users: dict[str, UserJobs]
    co2_kg: float  # of all of a user's window jobs (when-to-run compares its saving with it)
    shift: bool  # when-to-run may fire, and its jobs are among `jobs` (else it says nothing)


def _window_cte(db: Db, where: str, columns: str) -> str:
    """The window's jobs with their share `f`, exactly as cocaq.footprint.jobfacts._sql computes it."""
    el = greatest(db, "coalesce(j.elapsed_s, 0.0)", "0.0")
    t0 = epoch(db, "j.start_time")
    ov = overlap_sql("y.t0", "y.el", "%(since)s", "%(until)s", db.dialect)
    f = share_sql("y.t0", "y.el", ov, [("%(since)s", "%(until)s")])
    fence = planner_fence(db, "\n        ")
    share = least(db, greatest(db, f, "0.0"), "1.0")
    return f"""
WITH y AS (
    SELECT j.id, j.user_name, coalesce(j.energy_j, 0.0) AS energy, coalesce(j.co2_g, 0.0) AS co2,{columns}
           {t0} AS t0, {el} AS el
    FROM jobs j
    WHERE j.start_time < %(until_ts)s AND (j.end_time >= %(since_ts)s OR j.end_time IS NULL)
          AND j.start_time IS NOT NULL{where}{fence}
), w AS (
    SELECT y.*, {share} AS f
    FROM y
)"""


def _triage_sql(db: Db, where: str) -> str:
    """Every window job: whether a shown rule may count it (`cand`), the precision rule's columns
    (`_light`'s; the GPU energy only for a GPU job no other rule reads), and what when-to-run's test
    reads (its CO2, whether it has shifting figures, what its best start would have saved)."""
    fw = first_word(db, "w.state")
    bad = ", ".join(f"'{s}'" for s in sorted({*TIMEOUT_STATES, *OOM_STATES, *FAILED_STATES, "FAILED"}))
    energy_j = greatest(db, "w.energy", "0.0")
    per_node = f"w.req_mem_mb / {greatest(db, 'w.nn', '1')}"
    has_meta = "EXISTS (SELECT 1 FROM model_metadata mm WHERE mm.job_pk = w.id)"
    tasks = greatest(db, "coalesce(w.rss_tasks_per_node, 1)", "1")
    cand = f"""(
        (w.gpus > 0 AND {has_meta})
        OR {fw} IN ({bad})
        OR (w.gpus > 0 AND coalesce(m.idle_gpu_energy_j, 0.0) > 0 AND w.energy > 0)
        OR (w.gpus > 0 AND m.gpu_util_pct < %(c_util)s AND w.total_cpu_s > %(c_cpu)s * w.cpus * w.el
            AND w.el >= %(c_el)s)
        OR (w.max_rss_mb IS NOT NULL AND w.req_mem_mb > 0 AND {per_node} >= %(c_mem_req)s
            AND w.max_rss_mb * {tasks} <= %(c_mem_use)s * {per_node})
    )"""
    no = false(db)
    held = "w.gpus * w.el"
    per_h, per_kg = f"{S_PER_HOUR}.0", f"{G_PER_KG}.0"  # SQL's float literals: divisions in floating point
    busy = least(db, f"coalesce(w.gpu_samples_s, 0.0) / ({held})", "1.0")
    light = "CASE WHEN w.gpus > 0 AND NOT w.cand THEN"  # (a row the precision rule alone reads)
    fence = planner_fence(db, "\n    ")  # (`cand` once per job, not once per use)
    gpu_j = "(SELECT sum(q.energy_j) FROM job_energy q WHERE q.job_pk = w.id AND q.component = 'gpu')"
    cols = """
           j.job_id, j.name, j.partition, j.node_list, coalesce(j.state, '') AS state,
           coalesce(j.alloc_cpus, 0) AS cpus, coalesce(j.alloc_gpus, 0) AS gpus, coalesce(j.n_nodes, 0) AS nn,
           j.req_mem_mb, j.max_rss_mb, j.rss_tasks_per_node, j.total_cpu_s, j.gpu_type,"""
    return f"""{_window_cte(db, where, cols)}, x AS (
    SELECT w.*, coalesce({cand}, {no}) AS cand, m.gpu_samples_s, m.idle_gpu_s,
           coalesce(m.shift_state = 'ok', {no}) AS flex, coalesce(m.shift_saved_g, 0.0) / {per_kg} AS saved
    FROM w LEFT JOIN job_metrics m ON m.job_pk = w.id
    WHERE w.f > 0{fence}
)
SELECT w.id, w.user_name, {energy_j} * w.f, w.cand, {light} w.job_id END, w.name, {light} w.partition END,
       {light} w.node_list END, w.gpus, {light} w.el / {per_h} END, w.f,
       {light} {energy_j} / {J_PER_KWH!r} END,
       {light} coalesce({gpu_j}, 0.0) / {J_PER_KWH!r} END, w.co2 / {per_kg},
       {light} CASE WHEN {held} > 0 THEN {busy} ELSE 0.0 END
       END, {light} coalesce(w.idle_gpu_s, 0.0) / {per_h} END, {light} w.gpu_type END, w.flex, w.saved,
       {fw} = 'COMPLETED'
FROM x w"""


class GpuJob:
    """A GPU job as the precision rule reads it, where no other rule reads it: the JobFacts attributes
    that rule (cocaq.footprint.rules.precision, `own_runs`, `advice_words.job_list`) reads, the derived
    ones computed as JobFacts computes them. Built for each of a heavy user's 10,000 GPU jobs, so plain
    slots; a rule that read anything else would fail on it loudly (tests/test_advice_fast.py runs them
    all)."""

    __slots__ = (
        "co2_kg",
        "elapsed_h",
        "energy_kwh",
        "gpu_hours",
        "gpu_kwh",
        "gpu_model",
        "gpu_type",
        "gpus",
        "idle_share",
        "job_id",
        "kg_per_kwh",
        "name",
        "pk",
        "share",
        "user",
    )  # fmt: skip
    model = precision = precision_label = end = tokens = epochs = batch_size = None
    is_open = False

    def __init__(self, r: tuple[Any, ...], gpu_model: str | None) -> None:
        self.pk, self.user, self.job_id, self.name, self.gpus = r[0], r[1], r[4], r[5], r[8]
        self.elapsed_h, self.share, self.energy_kwh, self.gpu_kwh, self.co2_kg = (
            r[9],
            r[10],
            r[11],
            r[12],
            r[13],
        )
        sampled_share, idle_gpu_hours, self.gpu_type = r[14], r[15], r[16]
        self.gpu_model = gpu_model
        self.gpu_hours = self.gpus * self.elapsed_h
        covered = sampled_share * self.gpu_hours
        self.idle_share = idle_gpu_hours / covered if covered > 0 else None
        self.kg_per_kwh = self.co2_kg / self.energy_kwh if self.energy_kwh > 0 else 0.0


def _light(cfg: Config, r: tuple[Any, ...], hw_cache: dict[tuple[Any, Any], Any]) -> GpuJob:
    """A GPU job no other rule reads, as the precision rule reads it (its hardware profile's GPU model)."""
    partition, node_list = r[6], r[7]
    key = (partition, node_list if cfg.node_groups else None)
    model = hw_cache.get(key)
    if model is None:
        hw = _hardware(cfg, partition, node_list)
        model = hw_cache[key] = (hw.gpu_model if hw.gpu_model != "unknown GPU" else None,)
    return GpuJob(r, model[0])


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
    from cocaq.footprint.own_limits import kind_of
    from cocaq.footprint.rules.base import outcome_part
    from cocaq.footprint.rules.timeouts import stopped_at_limit

    t = ctx.thresholds
    inside = labs_bound(within)
    params: dict[str, Any] = {
        "since": since.timestamp(),
        "until": until.timestamp(),
        "since_ts": since,
        "until_ts": until,
        "c_util": t.loader_max_util_pct * (1 + _HAIR),
        "c_cpu": t.loader_min_cpu_usage * (1 - _HAIR),
        "c_el": t.loader_min_elapsed_h * float(S_PER_HOUR) * (1 - _HAIR),
        "c_mem_req": t.mem_min_req_gb * MB_PER_GB * (1 - _HAIR),
        "c_mem_use": t.mem_max_use * (1 + _HAIR),
    }
    if user is not None or account is not None:
        params["key"] = user if user is not None else account
    if cluster:
        params["cluster"] = cluster
    for i, a in enumerate(inside):
        params[f"in{i}"] = a
    kind = "user" if user is not None else "account" if account is not None else None
    rows = db.rows(_triage_sql(db, scope_where(kind, bool(cluster), len(inside))), params)
    rows.sort(key=lambda r: (r[1], -r[2], r[0]))  # the whole computation's order (jobfacts.load)
    order = {r[0]: i for i, r in enumerate(rows)}  # a job's place in that order
    # when-to-run's test, as cocaq.footprint.when_advice sums it: all the user's CO2, and the saving
    co2 = sum(r[13] * r[10] for r in rows)
    flex = [r for r in rows if r[17]]
    shift = user is not None and _may_shift(cfg, sum(r[18] * r[10] for r in flex), co2, len(flex))
    whole = [r[0] for r in rows if r[3] or (shift and r[17])]
    scope: dict[str, Any] = {"user": user, "account": account, "cluster": cluster, "within": within}
    with Meanwhile(db, lambda d: load(d, cfg, since, until, **scope, ids=whole)) as loading:
        # while the database reads those whole: the GPU jobs only the precision rule reads, as it reads
        hw: dict[tuple[Any, Any], Any] = {}
        chosen = set(whole)
        light = [_light(cfg, r, hw) for r in rows if r[8] > 0 and r[0] not in chosen]
        by_user = _by_user(loading.result())
    # the completed runs of the kind of job whose time-out loses most: they size its `--time`
    extra: list[int] = []
    for js in by_user.values():
        hit = [j for j in js if stopped_at_limit(j, ctx)]
        if hit:
            top = max(hit, key=outcome_part)
            name = kind_of(top)[0]
            extra += [r[0] for r in rows if r[19] and r[1] == top.user and (r[5] or "") == name]
    if extra:
        have = {j.pk for js in by_user.values() for j in js}
        more = load(db, cfg, since, until, **scope, ids=[pk for pk in extra if pk not in have])
        for u, add in _by_user(more).items():
            by_user[u] = sorted([*by_user.get(u, []), *add], key=lambda j: order[j.pk])
    if extra:  # (those loaded whole now are no light ones)
        now_whole = set(extra)
        light = [j for j in light if j.pk not in now_whole]
    users = {u: UserJobs(js) for u, js in by_user.items()}
    gpu_jobs: list[Any] = [j for js in by_user.values() for j in js if j.gpus > 0]
    for u, pj in _by_user(sorted([*gpu_jobs, *light], key=lambda j: order[j.pk])).items():
        users.setdefault(u, UserJobs()).precision_jobs = pj
    return AdviceJobs(users, co2, shift)


def _may_shift(cfg: Config, saved: float, co2: float, flex: int) -> bool:
    """Whether when-to-run may fire (cocaq.footprint.when_advice's test, a hair wider)."""
    s = cfg.shifting
    if not flex or s.slack_s <= 0:
        return False
    return saved > 0 and saved >= max(s.min_share * co2, s.min_kg) * (1 - _HAIR)


def _by_user(jobs: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for j in jobs:
        out.setdefault(j.user, []).append(j)
    return out
