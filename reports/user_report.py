"""A user's month (`users_month`, `user_month`): what the user e-mail and `cocaq report user` show.

Beyond the shared blocks (`reports.queries`) a user's report has what only it shows: where the user stands
among their peers on the same clusters, their top jobs, the jobs that held GPUs nearly idle (with the
per-GPU use of multi-GPU jobs, read from `samples` for the few jobs where job-level figures leave one idle
GPU possible) and the use of their time limits. Every user of a month is computed in one pass (a dozen
statements for all of them), because the sender writes to all users at once.
"""

from __future__ import annotations

import bisect
import heapq
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, case, func, or_, select

from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.footprint.by_model import Comparison
from cocaq.footprint.by_model import Scope as ModelScope
from cocaq.footprint.by_model import comparisons as model_comparisons
from cocaq.footprint.jobfacts import DeviceUse, JobFacts
from cocaq.reports.data import JobLine, Month, PeerStanding, ReportOptions, TimeLimitUse, UserMonth
from cocaq.reports.queries import (
    PEER_SUMS,
    J,
    JobScope,
    R,
    S,
    Sums,
    add_sums,
    carbon_parts,
    cluster_id_of,
    cluster_names,
    daily_sums,
    data_start,
    day_points,
    days_of_data,
    equivalents_of,
    interactive_col,
    job_groups,
    job_stats,
    model_uses,
    month_basis,
    month_job_facts,
    month_jobs,
    month_totals,
    month_trend,
    rollup_sums,
    rollups_watermark,
    sql_float,
    sums_kwh,
    sums_util,
    total_sums,
    tune_postgres,
)
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR


def _standing(mine: float, ordered: Sequence[float]) -> tuple[int, float | None]:
    """(rank from the top, percentile of the others below, ties half) of `mine` in sorted `ordered`."""
    n = len(ordered)
    below = bisect.bisect_left(ordered, mine)
    at_or_below = bisect.bisect_right(ordered, mine)
    rank = n - at_or_below + 1
    if n < 2:
        return rank, None
    ties = at_or_below - below - 1  # the others with the same value
    return rank, 100.0 * (below + 0.5 * ties) / (n - 1)


# --- per user ---------------------------------------------------------------------------------------


def user_month(
    conn: Connection,
    cfg: Config,
    user: str,
    month_start: datetime | date,
    *,
    cluster: str | None = None,
    options: ReportOptions | None = None,
) -> UserMonth:
    """One user's month (an empty one, all zeros, if they ran nothing); see `users_month`."""
    return users_month(conn, cfg, month_start, cluster=cluster, users=[user], options=options)[user]


def users_month(
    conn: Connection,
    cfg: Config,
    month_start: datetime | date,
    *,
    cluster: str | None = None,
    users: Sequence[str] | None = None,
    options: ReportOptions | None = None,
) -> dict[str, UserMonth]:
    """The month of every user with jobs in it (or of `users`, each present, empty if idle), in one pass.

    For the sender: a dozen statements for all users together, instead of a dozen per user. Peers are
    always every user of the month on the user's cluster(s), whoever is asked for.
    """
    tune_postgres(conn)
    opts = options or ReportOptions()
    month = Month.of(month_start)
    prev = month.previous()
    cid = cluster_id_of(conn, cluster)
    names = cluster_names(conn)
    scope = JobScope(users=list(users) if users is not None else None, cluster_id=cid)
    everyone = JobScope(cluster_id=cid)
    watermark = rollups_watermark(conn)
    start = data_start(conn, cid)
    span, prev_span = days_of_data(month, start, watermark), days_of_data(prev, start, watermark)

    # Rollups: the asked users' month (per cluster and lab), previous month and days; every user's
    # energy and utilisation per cluster, for the peers.
    keys = [R.user_name, R.cluster_id, R.account]
    per_user: dict[str, dict[int, Sums]] = defaultdict(dict)
    accounts: dict[str, set[str]] = defaultdict(set)
    for (u, c, a), s in rollup_sums(conn, month.start, month.end, keys, scope.rollups()).items():
        add_sums(per_user[u].setdefault(c, {}), s)
        accounts[u].add(a)
    old = rollup_sums(conn, prev.start, prev.end, [R.user_name], scope.rollups())
    daily = daily_sums(conn, month, [R.user_name], scope.rollups())
    everyone_by_cluster: dict[str, dict[int, Sums]] = defaultdict(dict)
    lean = rollup_sums(conn, month.start, month.end, keys[:2], everyone.rollups(), PEER_SUMS)
    for (u, c), s in lean.items():
        everyone_by_cluster[u][c] = s
    peers = _peers(everyone_by_cluster, names, set(per_user) if users is not None else None)

    y = month_jobs(month.start, month.end, scope.jobs(), interactive_col(conn, cfg))
    groups = job_groups(conn, y, [y.c.user_name])
    stats, carbon = job_stats(groups), carbon_parts(groups)
    top = _top_jobs(conn, y, names, opts.top_jobs)
    facts = month_job_facts(conn, cfg, month, cluster, users)
    limits = _time_limits(conn, month, scope)
    models = model_uses(conn, y, month, by_user=True)
    comps: dict[str, list[Comparison]] = defaultdict(list)
    model_scope = ModelScope(users=tuple(users) if users is not None else None, cluster_id=cid)
    for c in model_comparisons(conn, month.start, month.end, model_scope):
        comps[c.user].append(c)

    wanted = (
        list(dict.fromkeys(users)) if users is not None else sorted(set(per_user) | {k[0] for k in stats})
    )
    _examine_devices(conn, cfg, facts, opts, wanted)
    out: dict[str, UserMonth] = {}
    for u in wanted:
        s = total_sums(per_user.get(u, {}).values())
        js = stats.get((u,))
        totals = month_totals(s, js)
        jobs = facts.get(u, [])
        idle = [
            g
            for g in jobs
            if g.idle_share is not None
            and g.idle_share >= opts.nearly_idle_share
            and g.idle_gpu_hours * g.share >= opts.min_idle_gpu_hours
        ]
        idle.sort(key=lambda g: (-g.idle_kwh * g.share, -g.idle_gpu_hours, g.pk))
        out[u] = UserMonth(
            user=u,
            month=month,
            cluster=cluster,
            clusters=tuple(sorted(names.get(c, str(c)) for c in per_user.get(u, {}))),
            accounts=tuple(sorted(accounts.get(u, set()))),
            totals=totals,
            equivalents=equivalents_of(totals),
            trend=month_trend(prev, s, old.get((u,), {}), span, prev_span, opts.trend_min_days),
            peers=peers.get(u) or PeerStanding((), 0, None, None, 0, None, None),
            top_jobs=tuple(top.get(u, [])),
            idle_jobs=tuple(idle[: opts.idle_jobs]),
            jobs=tuple(jobs),
            time_limits=limits.get(u, TimeLimitUse()),
            basis=month_basis(cfg, s, carbon.get((u,), []), js, watermark, month),
            daily=day_points(month, daily.get((u,), {}), span),
            data_days=span,
            models=models.get(u, ()),
            model_comparisons=tuple(comps.get(u, ())),
        )
    return out


def _peers(
    per_user: Mapping[str, Mapping[int, Sums]], names: Mapping[int, str], only: set[str] | None = None
) -> dict[str, PeerStanding]:
    """Each user's (or each of `only`'s) standing among the users of the month on the same cluster(s),
    compared on those clusters."""
    by_set: dict[frozenset[int], list[str]] = defaultdict(list)
    for u, cs in per_user.items():
        if only is None or u in only:
            by_set[frozenset(cs)].append(u)
    out: dict[str, PeerStanding] = {}
    for cset, members in by_set.items():
        peers = [u for u, cs in per_user.items() if cset & set(cs)]
        sums = {u: total_sums(s for c, s in per_user[u].items() if c in cset) for u in peers}
        kwh = sorted(sums_kwh(s) for s in sums.values())
        utils = {u: sums_util(s) for u, s in sums.items()}
        known = sorted(v for v in utils.values() if v is not None)
        for u in members:
            rank, pct = _standing(sums_kwh(sums[u]), kwh)
            mine = utils[u]
            urank, upct = _standing(mine, known) if mine is not None else (None, None)
            out[u] = PeerStanding(
                clusters=tuple(sorted(names.get(c, str(c)) for c in cset)),
                users=len(peers),
                energy_rank=rank,
                energy_percentile=pct,
                gpu_users=len(known),
                gpu_util_rank=urank,
                gpu_util_percentile=upct,
            )
    return out


def _top_jobs(conn: Connection, y: Any, names: Mapping[int, str], n: int) -> dict[str, list[JobLine]]:
    """Each user's n jobs with the most energy in the month (window function: one statement for all)."""
    if n <= 0:
        return {}
    e = y.c.energy * y.c.f
    rn = func.row_number().over(partition_by=y.c.user_name, order_by=(e.desc(), y.c.id))
    t = (
        select(
            y.c.id,
            y.c.cluster_id,
            y.c.job_id,
            y.c.name,
            y.c.partition,
            y.c.state,
            y.c.start_time,
            y.c.end_time,
            y.c.gpus,
            y.c.el,
            y.c.f,
            e.label("e"),
            y.c.co2.label("c"),
            (y.c.gpus * y.c.el / float(S_PER_HOUR)).label("gh"),
            y.c.measured,
            y.c.energy,
            y.c.util,
            y.c.user_name,
            rn.label("rn"),
            y.c.util_source,
            y.c.gpus_unknown,
        )
        .where(y.c.f > 0)
        .subquery("t")
    )
    out: dict[str, list[JobLine]] = defaultdict(list)
    q = select(t).where(t.c.rn <= n).order_by(t.c.user_name, t.c.rn)
    for (
        pk,
        cid,
        jid,
        name,
        part,
        state,
        start,
        end,
        gpus,
        el,
        f,
        _e_j,
        co2,
        gh,
        measured,
        energy,
        util,
        user,
        _rn,
        util_source,
        gpus_unknown,
    ) in conn.execute(q).all():
        out[user].append(
            JobLine(
                pk=pk,
                job_id=jid,
                cluster=names.get(cid, ""),
                name=name,
                partition=part or None,
                state=state,
                start=as_utc(start),
                end=as_utc(end),
                gpus=gpus,
                elapsed_h=el / S_PER_HOUR,
                share_in_month=f,
                energy_kwh=energy / J_PER_KWH,  # the whole job (ranked by the month's share)
                co2_kg=co2 / G_PER_KG,
                gpu_hours=gh or 0.0,
                measured_share=measured / energy if energy else None,
                gpu_util_pct=util,
                gpu_util_source=util_source,
                gpus_unknown=bool(gpus_unknown),
            )
        )
    return out


def _examine_devices(
    conn: Connection,
    cfg: Config,
    facts: dict[str, list[JobFacts]],
    opts: ReportOptions,
    users: Iterable[str],
) -> None:
    """Per-GPU use, from `samples`, of multi-GPU jobs where one GPU may have idled while another worked.

    Job-level figures bound what per-GPU ones can be (the job's GPUs sampled alike): one GPU idle over
    half its time puts at least 0.5 / GPUs of the job's sampled GPU time under the threshold, and one
    GPU busy over half its time at most 1 - 0.5 / GPUs. Jobs outside those bounds, with samples over
    less than half their GPU time or less than `min_idle_gpu_hours` idle, are not read.
    """
    if opts.device_jobs <= 0 or opts.device_jobs_total <= 0:
        return
    chosen: list[tuple[str, int, JobFacts]] = []
    for u in users:
        jobs = facts.get(u) or []
        cands = [
            (i, g)
            for i, g in enumerate(jobs)
            if g.gpus >= 2
            and g.idle_share is not None
            and 0.5 / g.gpus <= g.idle_share <= 1 - 0.5 / g.gpus
            and g.sampled_share >= 0.5
            and g.idle_gpu_hours * g.share >= opts.min_idle_gpu_hours
            and g.start is not None
            and g.job_id_raw is not None
        ]
        cands.sort(key=lambda t: (-t[1].idle_gpu_hours * t[1].share, t[1].pk))
        chosen += [(u, i, g) for i, g in cands[: opts.device_jobs]]
    chosen.sort(key=lambda t: (-t[2].idle_gpu_hours * t[2].share, t[2].pk))
    chosen = chosen[: opts.device_jobs_total]
    found = _devices(conn, [g for _u, _i, g in chosen], cfg)
    for u, i, g in chosen:
        if found.get(g.pk):
            facts[u][i] = g.with_devices(found[g.pk])


def _devices(
    conn: Connection, jobs: Sequence[JobFacts], cfg: Config, chunk: int = 200
) -> dict[int, tuple[DeviceUse, ...]]:
    """Per job: each GPU's share of idle samples, mean utilisation and power, the time its samples cover.

    One statement per `chunk` jobs, each job's samples by its (cluster, raw id) and run (the index's
    range); a raw id twice in a chunk (Slurm reused it) would mix two runs, so it goes to another chunk.
    """
    threshold = cfg.aggregate.idle_gpu_util_pct
    step = cfg.collector.interval_s
    chunks: list[dict[tuple[int, int], JobFacts]] = []
    for g in jobs:
        assert g.job_id_raw is not None
        key = (g.cluster_id, g.job_id_raw)
        for ch in chunks:
            if key not in ch and len(ch) < chunk:
                ch[key] = g
                break
        else:
            chunks.append({key: g})
    util = S.metric == "util_pct"
    power = S.metric == "power_w"
    zero = sql_float(0.0)
    out: dict[int, list[DeviceUse]] = defaultdict(list)
    for ch in chunks:
        runs = []
        for (cid, raw), g in ch.items():
            assert g.start is not None
            hi = (g.end or g.start + timedelta(hours=g.elapsed_h)) + timedelta(minutes=1)
            runs.append(
                and_(
                    S.cluster_id == cid,
                    S.job_id == str(raw),
                    S.ts >= g.start - timedelta(minutes=1),
                    S.ts <= hi,
                )
            )
        q = (
            select(
                S.cluster_id,
                S.job_id,
                S.node,
                S.device,
                func.sum(case((util, sql_float(1.0)), else_=zero)),
                func.sum(case((and_(util, S.value < threshold), sql_float(1.0)), else_=zero)),
                func.sum(case((util, S.value), else_=zero)),
                func.sum(case((power, sql_float(1.0)), else_=zero)),
                func.sum(case((power, S.value), else_=zero)),
                func.min(S.ts),
                func.max(S.ts),
            )
            .where(or_(*runs), S.source == "nvml", S.metric.in_(("util_pct", "power_w")))
            .group_by(S.cluster_id, S.job_id, S.node, S.device)
            .order_by(S.cluster_id, S.job_id, S.node, S.device)
        )
        for cid, raw, node, device, n, n_idle, u_sum, n_p, p_sum, t_first, t_last in conn.execute(q):
            job = ch.get((int(cid), int(raw)))
            if job is None or not n:
                continue
            # regular samples: each stands for one spacing, (last - first) / (n - 1); one alone, the interval
            span = (as_utc(t_last) - as_utc(t_first)).total_seconds()
            covered = span * n / (n - 1) if n > 1 else step
            mean_p = float(p_sum) / float(n_p) if n_p else None
            out[job.pk].append(
                DeviceUse(
                    node,
                    device,
                    int(n),
                    covered / S_PER_HOUR,
                    float(n_idle) / float(n),
                    float(u_sum) / float(n),
                    mean_p,
                    mean_p * covered / J_PER_KWH if mean_p is not None else None,
                )
            )
    return {pk: tuple(v) for pk, v in out.items()}


def _time_limits(conn: Connection, month: Month, scope: JobScope) -> dict[str, TimeLimitUse]:
    """Per user: the use of their time limits by the jobs that ended in the month with a known limit."""
    ended = (J.end_time >= month.start, J.end_time < month.end, J.is_open.is_(False), J.time_limit_s > 0)
    counts = select(J.user_name, func.count(), func.sum(case((J.state == "TIMEOUT", 1), else_=0))).where(
        *ended, *scope.jobs()
    )
    out: dict[str, TimeLimitUse] = {
        u: TimeLimitUse(finished=int(n), timeouts=int(t or 0))
        for u, n, t in conn.execute(counts.group_by(J.user_name)).all()
    }
    done: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    q = select(J.user_name, J.elapsed_s, J.time_limit_s, J.job_id).where(
        *ended, J.state == "COMPLETED", *scope.jobs()
    )
    for u, el, limit, jid in conn.execute(q).all():
        done[u].append((float(el or 0.0), float(limit), jid))
    for u, jobs in done.items():
        els = sorted(j[0] for j in jobs)
        k95 = max(0, min(len(els) - 1, -(-95 * len(els) // 100) - 1))  # nearest rank
        unused = heapq.nsmallest(3, jobs, key=lambda j: (j[0] - j[1], j[2]))
        out[u] = replace(
            out[u],
            completed=len(jobs),
            median_use=statistics.median([j[0] / j[1] for j in jobs]),
            median_limit_h=statistics.median([j[1] for j in jobs]) / S_PER_HOUR,
            median_elapsed_h=statistics.median(els) / S_PER_HOUR,
            p95_elapsed_h=els[k95] / S_PER_HOUR,
            max_elapsed_h=els[-1] / S_PER_HOUR,
            requested_h=sum(j[1] for j in jobs) / S_PER_HOUR,
            used_h=sum(els) / S_PER_HOUR,
            examples=tuple(j[2] for j in unused),
        )
    return out
