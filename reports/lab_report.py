"""A lab's month (`lab_month`): what a lab head's e-mail and `cocaq report lab` show.

A lab is a Slurm account. Its report is the shared blocks (`reports.queries`) over the account's jobs,
its members' table with each one's waste, the idle GPUs per member, its models, the weekly series, and
each member's largest suggestion (`cocaq.footprint.advice`, as their own e-mail opens with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime

from sqlalchemy import Connection

from cocaq.config import Config
from cocaq.footprint.advice import largest_per_user
from cocaq.footprint.jobfacts import JobFacts
from cocaq.reports.data import LabMonth, LabUser, MemberAdvice, Month, ReportOptions, WasteBreakdown
from cocaq.reports.queries import (
    JobScope,
    JobStats,
    R,
    accounting_gaps,
    advice_context,
    carbon_parts,
    cluster_id_of,
    daily_sums,
    data_start,
    days_of_data,
    equivalents_of,
    idle_waste,
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
    total_sums,
    tune_postgres,
    week_points,
    whole_key,
)

# --- per lab ------------------------------------------------------------------------------------------


def lab_month(
    conn: Connection,
    cfg: Config,
    account: str,
    month_start: datetime | date,
    *,
    cluster: str | None = None,
) -> LabMonth:
    """A lab's (Slurm account's) month: totals and trend, its users, idle waste, models, weeks."""
    tune_postgres(conn)
    month = Month.of(month_start)
    prev = month.previous()
    cid = cluster_id_of(conn, cluster)
    scope = JobScope(account=account, cluster_id=cid)
    watermark = rollups_watermark(conn)
    start = data_start(conn, cid)
    span, prev_span = days_of_data(month, start, watermark), days_of_data(prev, start, watermark)
    by_user = rollup_sums(conn, month.start, month.end, [R.user_name], scope.rollups())
    s = total_sums(by_user.values())
    old = total_sums(rollup_sums(conn, prev.start, prev.end, [], scope.rollups()).values())
    days = daily_sums(conn, month, [], scope.rollups()).get((), {})
    y = month_jobs(month.start, month.end, scope.jobs(), interactive_col(conn, cfg))
    groups = job_groups(conn, y, [y.c.user_name])
    stats = job_stats(groups)
    js = JobStats()
    for v in stats.values():
        js.add(v)
    totals = month_totals(s, js)
    users = []
    idle = []
    for (u,), us in by_user.items():
        t = month_totals(us, stats.get((u,)))
        users.append(
            LabUser(
                u,
                t.jobs,
                t.energy_kwh,
                t.co2_kg,
                t.gpu_hours,
                t.gpu_util_pct,
                t.idle_gpu_hours,
                t.idle_gpu_kwh,
                t.failed_kwh,
                WasteBreakdown.of(u, t),
            )
        )
        if t.idle_gpu_hours > 0:
            idle.append(idle_waste(u, t))
    users.sort(key=lambda x: (-x.energy_kwh, x.user))
    idle.sort(key=lambda x: (-x.idle_kwh, -x.idle_gpu_hours, x.key))
    return LabMonth(
        account=account,
        month=month,
        cluster=cluster,
        totals=totals,
        equivalents=equivalents_of(totals),
        trend=month_trend(prev, s, old, span, prev_span, ReportOptions().trend_min_days),
        users=tuple(users),
        idle_by_user=tuple(idle),
        models=model_uses(conn, y, month).get("", ()),
        weekly=week_points(month, days, span),
        data_days=span,
        gaps=accounting_gaps(conn, month, cid, account),
        advice=_members_advice(
            month_job_facts(conn, cfg, month, cluster, None, account=account),
            {u.user: u.energy_kwh for u in users},
            month,
            cfg,
        ),
        basis=month_basis(cfg, s, carbon_parts(groups, whole_key).get((), []), js, watermark, month),
    )


def _members_advice(
    facts: Mapping[str, list[JobFacts]], totals: Mapping[str, float], month: Month, cfg: Config
) -> tuple[MemberAdvice, ...]:
    """Each lab member's largest suggestion worth their attention (as their own e-mail opens with)."""
    pairs = largest_per_user(facts, totals, advice_context(month, cfg), cfg)
    return tuple(MemberAdvice(u, a) for u, a in pairs)
