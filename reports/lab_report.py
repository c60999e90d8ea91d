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
    R,
    _basis,
    _carbon,
    _cluster_id,
    _daily,
    _data_days,
    _data_start,
    _equivalents,
    _idle,
    _job_facts,
    _job_groups,
    _JobStats,
    _model_uses,
    _month_jobs,
    _rollups,
    _Scope,
    _stats,
    _total,
    _totals,
    _trend,
    _tune,
    _watermark,
    _weeks,
    _whole,
    accounting_gaps,
    advice_context,
    interactive_col,
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
    _tune(conn)
    month = Month.of(month_start)
    prev = month.previous()
    cid = _cluster_id(conn, cluster)
    scope = _Scope(account=account, cluster_id=cid)
    watermark = _watermark(conn)
    start = _data_start(conn, cid)
    span, prev_span = _data_days(month, start, watermark), _data_days(prev, start, watermark)
    by_user = _rollups(conn, month.start, month.end, [R.user_name], scope.rollups())
    s = _total(by_user.values())
    old = _total(_rollups(conn, prev.start, prev.end, [], scope.rollups()).values())
    days = _daily(conn, month, [], scope.rollups()).get((), {})
    y = _month_jobs(month.start, month.end, scope.jobs(), interactive_col(conn, cfg))
    groups = _job_groups(conn, y, [y.c.user_name])
    stats = _stats(groups)
    js = _JobStats()
    for v in stats.values():
        js.add(v)
    totals = _totals(s, js)
    users = []
    idle = []
    for (u,), us in by_user.items():
        t = _totals(us, stats.get((u,)))
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
            idle.append(_idle(u, t))
    users.sort(key=lambda x: (-x.energy_kwh, x.user))
    idle.sort(key=lambda x: (-x.idle_kwh, -x.idle_gpu_hours, x.key))
    return LabMonth(
        account=account,
        month=month,
        cluster=cluster,
        totals=totals,
        equivalents=_equivalents(totals),
        trend=_trend(prev, s, old, span, prev_span, ReportOptions().trend_min_days),
        users=tuple(users),
        idle_by_user=tuple(idle),
        models=_model_uses(conn, y, month).get("", ()),
        weekly=_weeks(month, days, span),
        data_days=span,
        gaps=accounting_gaps(conn, month, cid, account),
        advice=_members_advice(
            _job_facts(conn, cfg, month, cluster, None, account=account),
            {u.user: u.energy_kwh for u in users},
            month,
            cfg,
        ),
        basis=_basis(cfg, s, _carbon(groups, _whole).get((), []), js, watermark, month),
    )


def _members_advice(
    facts: Mapping[str, list[JobFacts]], totals: Mapping[str, float], month: Month, cfg: Config
) -> tuple[MemberAdvice, ...]:
    """Each lab member's largest suggestion worth their attention (as their own e-mail opens with)."""
    pairs = largest_per_user(facts, totals, advice_context(month, cfg), cfg)
    return tuple(MemberAdvice(u, a) for u, a in pairs)
