"""The site's month (`admin_month`): what the admins' e-mail and interactive report show.

Beyond the shared blocks (`reports.queries`): tables by lab, partition and user, the GPU-utilisation
histogram, energy by job state, measured coverage per partition, the carbon intensity per zone and day
and each zone's series by weekday and hour, the waste and when-to-run trends over the last months, the
site's levers (the users' suggestions added up by kind, and GPU power caps, which only admins hold) and
`before_after`, the observational comparison of users' GPU use around their first report.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, func, select, union_all

from cocaq.accounting.ledger import OUTCOMES, outcome_of
from cocaq.carbon.series import basis_of, from_epoch, kind_of, zone_key
from cocaq.carbon.shifting import HOUR
from cocaq.carbon.when import hourly
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import CarbonIntensity
from cocaq.db.sqlfuncs import floor_ as _floor
from cocaq.db.sqlfuncs import greatest, least
from cocaq.footprint.advice import advise_user
from cocaq.footprint.jobfacts import JobFacts
from cocaq.reports.data import (
    WEEK_WINDOW_H,
    AdminMonth,
    BeforeAfter,
    BeforeAfterUser,
    Coverage,
    DayIntensity,
    GroupEnergy,
    HourWindow,
    IdleWaste,
    Month,
    MonthShift,
    MonthWaste,
    ReportOptions,
    SiteLever,
    StateEnergy,
    UtilBin,
    UtilHistogram,
    WasteBreakdown,
    WeekCell,
    WindowUse,
    ZoneIntensity,
    ZoneWeek,
)
from cocaq.reports.queries import (
    DAY_S,
    SUMS,
    UTIL_BINS,
    JobGroup,
    JobScope,
    JobStats,
    R,
    Sums,
    accounting_gaps,
    add_sums,
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
    sql_float,
    sums_kwh,
    sums_util,
    total_sums,
    tune_postgres,
    utc_midnight,
    week_points,
    whole_key,
)
from cocaq.units import G_PER_KG, J_PER_KWH

# --- for admins --------------------------------------------------------------------------------------


def admin_month(
    conn: Connection,
    cfg: Config,
    month_start: datetime | date,
    cluster: str | None = None,
    *,
    first_report: Mapping[str, datetime] | None = None,
    window_days: int = 30,
    options: ReportOptions | None = None,
) -> AdminMonth:
    """The site's month: totals, by lab/partition/week, utilisation, idle waste, failures, coverage,
    intensity, top users, and (with `first_report`, user -> first report sent) the before/after
    comparison described in `BeforeAfter`."""
    tune_postgres(conn)
    opts = options or ReportOptions()
    month = Month.of(month_start)
    prev = month.previous()
    cid = cluster_id_of(conn, cluster)
    scope = JobScope(cluster_id=cid)
    watermark = rollups_watermark(conn)
    start = data_start(conn, cid)
    span, prev_span = days_of_data(month, start, watermark), days_of_data(prev, start, watermark)
    rolled = rollup_sums(conn, month.start, month.end, [R.user_name, R.account, R.partition], scope.rollups())
    old = total_sums(rollup_sums(conn, prev.start, prev.end, [], scope.rollups()).values())
    days = daily_sums(conn, month, [], scope.rollups()).get((), {})
    y = month_jobs(month.start, month.end, scope.jobs(), interactive_col(conn, cfg))
    groups = job_groups(conn, y, [y.c.user_name, y.c.account, y.c.partition], bins=True)
    stats = job_stats(groups)

    def fold(index: int) -> tuple[dict[str, Sums], dict[str, JobStats]]:
        sums: dict[str, Sums] = defaultdict(lambda: dict.fromkeys(SUMS, 0.0))
        js: dict[str, JobStats] = defaultdict(JobStats)
        for k, v in rolled.items():
            add_sums(sums[k[index]], v)
        for k, st in stats.items():
            js[k[index]].add(st)
        return sums, js

    s = total_sums(rolled.values())
    js_all = JobStats()
    for st in stats.values():
        js_all.add(st)
    totals = month_totals(s, js_all)
    labs, labs_js = fold(1)
    parts, parts_js = fold(2)
    people, people_js = fold(0)

    def table(sums: Mapping[str, Sums], js: Mapping[str, JobStats]) -> list[GroupEnergy]:
        out = []
        for k, v in sums.items():
            t = month_totals(v, js.get(k))
            out.append(
                GroupEnergy(
                    k,
                    t.jobs,
                    t.energy_kwh,
                    t.co2_kg,
                    t.gpu_hours,
                    t.cpu_hours,
                    t.gpu_util_pct,
                    t.measured_share,
                    t.energy_kwh / totals.energy_kwh if totals.energy_kwh > 0 else None,
                )
            )
        out.sort(key=lambda g: (-g.energy_kwh, g.key))
        return out

    def idle(sums: Mapping[str, Sums], js: Mapping[str, JobStats]) -> tuple[IdleWaste, ...]:
        out = [idle_waste(k, month_totals(v, js.get(k))) for k, v in sums.items() if v["idle_gpu_hours"] > 0]
        out.sort(key=lambda x: (-x.idle_kwh, -x.idle_gpu_hours, x.key))
        return tuple(out)

    failed = [WasteBreakdown.of(k, month_totals(v, labs_js.get(k))) for k, v in labs.items()]
    failed = [w for w in failed if w.wasted_kwh > 0 or w.timeout_kwh > 0]
    failed.sort(key=lambda x: (-x.wasted_kwh, x.key))
    coverage = [
        Coverage(
            k,
            sums_kwh(v),
            v["energy_measured_j"] / J_PER_KWH,
            v["energy_estimated_j"] / J_PER_KWH,
            v["energy_measured_j"] / J_PER_KWH / sums_kwh(v) if sums_kwh(v) > 0 else None,
            v["energy_est_low_j"] / J_PER_KWH,
            v["energy_est_high_j"] / J_PER_KWH,
        )
        for k, v in parts.items()
    ]
    coverage.sort(key=lambda c: (-c.energy_kwh, c.partition))
    carbon = carbon_parts(groups, whole_key).get((), [])
    intensity = _intensity(conn, y, month, carbon)
    weeks, no_series = _carbon_week(conn, cfg, [z.zone for z in intensity], month)
    waste_trend, shift_trend = _trends(conn, month, scope, start, watermark, opts.trend_months)
    return AdminMonth(
        month=month,
        cluster=cluster,
        totals=totals,
        equivalents=equivalents_of(totals),
        trend=month_trend(prev, s, old, span, prev_span, opts.trend_min_days),
        by_lab=tuple(table(labs, labs_js)),
        by_partition=tuple(table(parts, parts_js)),
        by_week=week_points(month, days, span),
        data_days=span,
        util_histogram=_histogram(groups),
        idle_by_user=idle(people, people_js),
        idle_by_lab=idle(labs, labs_js),
        waste_by_lab=tuple(failed),
        energy_by_state=_states(groups),
        coverage=tuple(coverage),
        intensity=intensity,
        top_users=tuple(table(people, people_js)[: opts.top_users]),
        before_after=None
        if first_report is None
        else before_after(
            conn, first_report, month, window_days=window_days, cluster_id=cid, watermark=watermark
        ),
        basis=month_basis(cfg, s, carbon, js_all, watermark, month),
        models=model_uses(conn, y, month).get("", ()),
        advice=_site_levers(
            month_job_facts(conn, cfg, month, cluster, None),
            {k: sums_kwh(v) for k, v in people.items()},
            month,
            cfg,
        ),
        waste_trend=waste_trend,
        carbon_week=weeks,
        carbon_week_missing=no_series,
        shift_trend=shift_trend,
        study=_study(conn, cfg, month),
        gaps=accounting_gaps(conn, month, cid),
    )


def _study(conn: Connection, cfg: Config, month: Month) -> Any:
    """The e-mail study through this month, or None where none runs yet or nobody has been drawn. Its
    users are the site's, whichever cluster the report is for."""
    if cfg.study.start is None or month.label < cfg.study.start:
        return None
    from cocaq.errors import UsageError
    from cocaq.study.analysis import study_report

    try:
        return study_report(conn, cfg, month.end - timedelta(seconds=1))
    except UsageError:
        return None


def _histogram(groups: Iterable[JobGroup]) -> UtilHistogram:
    """GPU jobs by energy-weighted utilisation in 10% bins, weighted by their GPU-hours in the month."""
    acc = [[0, 0.0] for _ in range(UTIL_BINS + 1)]
    for g in groups:
        if g.bin is not None and g.bin >= 0:
            acc[g.bin][0] += g.jobs
            acc[g.bin][1] += g.gpu_hours
    bins = tuple(UtilBin(10.0 * i, 10.0 * (i + 1), int(acc[i][0]), acc[i][1]) for i in range(UTIL_BINS))
    return UtilHistogram(bins, int(acc[UTIL_BINS][0]), acc[UTIL_BINS][1])


def _states(groups: Iterable[JobGroup]) -> tuple[StateEnergy, ...]:
    acc: dict[tuple[str, str | None], list[float]] = {}
    for g in groups:
        # interactive sessions that ended at their time limit ended normally: a row of their own, counted
        # under no part of the ledger (cocaq.accounting.sessions)
        session = g.interactive and outcome_of(g.st) == "timeout"
        key = (f"{g.st} (interactive)", None) if session else (g.st, outcome_of(g.st))
        a = acc.setdefault(key, [0, 0.0, 0.0])
        a[0] += g.jobs
        a[1] += g.energy_j
        a[2] += g.co2_g
    out = [StateEnergy(st, int(n), e / J_PER_KWH, c / G_PER_KG, o) for (st, o), (n, e, c) in acc.items()]
    out.sort(key=lambda x: (-x.energy_kwh, x.state))
    return tuple(out)


def _intensity(
    conn: Connection, y: Any, month: Month, carbon: Sequence[tuple[Any, ...]]
) -> tuple[ZoneIntensity, ...]:
    """Per zone and day: the jobs' intensity weighted by their energy in the day (pro rata of hours)."""
    d0 = month.start.timestamp()
    n = len(month.days())
    used = (y.c.f > 0, y.c.el > 0, y.c.g.is_not(None), y.c.energy > 0)
    first, last = _floor(y.c.t0 / DAY_S), _floor((y.c.t0 + y.c.el) / DAY_S)
    # most jobs run within one day: all their energy is that day's
    e1 = y.c.energy * y.c.f
    one_day = select(y.c.zone, (first * DAY_S).label("d"), (e1 * y.c.g).label("eg"), e1.label("e")).where(
        *used, first == last
    )
    # the others: split by the hours in each day of the month
    days = union_all(*(select(sql_float(d0 + i * DAY_S).label("d")) for i in range(n))).subquery("days")
    ov = greatest(sql_float(0.0), least(y.c.t0 + y.c.el, days.c.d + DAY_S) - greatest(y.c.t0, days.c.d))
    e = y.c.energy * ov / y.c.el
    more = (
        select(y.c.zone, days.c.d, (e * y.c.g).label("eg"), e.label("e"))
        .select_from(y.join(days, and_(y.c.t0 < days.c.d + DAY_S, y.c.t0 + y.c.el > days.c.d)))
        .where(*used, first != last)
    )
    u = union_all(one_day, more).subquery("u")
    q = select(u.c.zone, u.c.d, func.sum(u.c.eg), func.sum(u.c.e)).group_by(u.c.zone, u.c.d)
    per: dict[str, list[DayIntensity]] = defaultdict(list)
    for zone, d, eg, ej in conn.execute(q):
        if ej and float(ej) > 0:
            day = datetime.fromtimestamp(float(d), UTC).date()
            per[zone or ""].append(DayIntensity(day, float(eg) / float(ej), float(ej) / J_PER_KWH))
    sources: dict[str, set[str]] = defaultdict(set)
    for zone, source, flag, *_rest in carbon:
        sources[zone or ""].add(f"{source} ({flag})" if flag else str(source))
    out = []
    for zone, ds in per.items():
        ds.sort(key=lambda x: x.day)
        e = sum(d.energy_kwh for d in ds)
        out.append(
            ZoneIntensity(
                zone,
                e,
                sum(d.g_per_kwh * d.energy_kwh for d in ds) / e if e > 0 else None,
                statistics.fmean(d.g_per_kwh for d in ds) if ds else None,
                tuple(ds),
                tuple(sorted(sources.get(zone, set()))),
            )
        )
    out.sort(key=lambda z: (-z.energy_kwh, z.zone))
    return tuple(out)


def _carbon_week(
    conn: Connection, cfg: Config, zones: Sequence[str], month: Month
) -> tuple[tuple[ZoneWeek, ...], tuple[str, ...]]:
    """The zones' series over the month by weekday and UTC hour (`ZoneWeek`), in the configured basis,
    and the zones without any value in the month. Each hour's value is the one `cocaq carbon when` reads
    (`cocaq.carbon.when.hourly`: finer rows weighted by the time they cover in it); a cell is the plain
    mean of its hours, so a month's four or five Mondays at 14:00 count alike."""
    kind = kind_of(cfg.carbon.basis)
    lo, hi = month.start.timestamp(), month.end.timestamp()
    t = CarbonIntensity.__table__
    out, missing = [], []
    for zone in zones:
        if not zone:  # jobs with no zone: nothing to look up
            continue
        values = hourly(conn, zone, cfg.carbon.basis, lo, hi)
        if not values:
            missing.append(zone)
            continue
        acc: dict[tuple[int, int], list[float]] = defaultdict(list)
        for h, g in values.items():
            acc[((h // 24 + 3) % 7, h % 24)].append(g)  # 1 January 1970 was a Thursday
        cells = tuple(WeekCell(d, h, statistics.fmean(v), len(v)) for (d, h), v in sorted(acc.items()))
        day_profile = {
            h: statistics.fmean(g for (_, hh), v in acc.items() if hh == h for g in v)
            for h in sorted({h for _, h in acc})
        }
        spans = [[(h + k) % 24 for k in range(WEEK_WINDOW_H)] for h in range(24)]
        windows = [
            HourWindow(s[0], WEEK_WINDOW_H, statistics.fmean(day_profile[x] for x in s))
            for s in spans
            if all(x in day_profile for x in s)
        ]
        weekdays = [g for (d, _), v in acc.items() if d < 5 for g in v]
        weekends = [g for (d, _), v in acc.items() if d >= 5 for g in v]
        q = select(t.c.source).where(
            t.c.zone == zone_key(zone),
            t.c.kind == kind,
            t.c.ts_end > from_epoch(lo),
            t.c.ts_start < from_epoch(hi),
        )
        out.append(
            ZoneWeek(
                zone=zone,
                basis=basis_of(kind),
                cells=cells,
                hours=len(values),
                month_hours=int((hi - lo) // HOUR),
                g_per_kwh=statistics.fmean(values.values()),
                cheapest=min(windows, key=lambda w: (w.g_per_kwh, w.start)) if windows else None,
                dearest=max(windows, key=lambda w: (w.g_per_kwh, -w.start)) if windows else None,
                weekdays_g_per_kwh=statistics.fmean(weekdays) if weekdays else None,
                weekends_g_per_kwh=statistics.fmean(weekends) if weekends else None,
                sources=tuple(sorted(set(conn.execute(q.distinct()).scalars()))),
            )
        )
    return tuple(out), tuple(missing)


def _trends(
    conn: Connection,
    month: Month,
    scope: JobScope,
    start: datetime | None,
    watermark: datetime | None,
    n: int,
) -> tuple[tuple[MonthWaste, ...], tuple[MonthShift, ...]]:
    """For `n` months up to this one (those with data), from one read of the rollups: the ledger's parts,
    and the when-to-run figures of the months whose jobs have any."""
    months = [month]
    while len(months) < n:
        months.insert(0, months[0].previous())
    keys = [R.day]
    rows = rollup_sums(conn, months[0].start, month.end, keys, scope.rollups())
    acc: dict[datetime, Sums] = {}
    for (d,), v in rows.items():
        m = Month.of(as_utc(d))
        add_sums(acc.setdefault(m.start, {}), v)
    waste, shift = [], []
    for m in months:
        v = acc.get(m.start, {})
        days = days_of_data(m, start, watermark).days
        if days == 0:
            continue
        parts = [v.get(f"energy_{o}_j", 0.0) / J_PER_KWH for o in OUTCOMES]
        waste.append(MonthWaste(m, days, sums_kwh(v), v.get("idle_gpu_energy_j", 0.0) / J_PER_KWH, *parts))
        kg = [v.get(f"shift_{k}_g", 0.0) / G_PER_KG for k in ("co2", "saved", "pause_saved")]
        if kg[0] > 0:
            shift.append(MonthShift(m, days, *kg))
    return tuple(waste), tuple(shift)


# What each kind of suggestion is, site-wide, and what the admins can do about it.
LEVERS = {
    "precision": (
        "Training in full precision",
        "point users to mixed precision (their e-mails show their own figures); a bf16 example job script",
    ),
    "timeouts": (
        "Batch jobs lost at their time limit",
        "document checkpointing with --signal and --requeue; a warning signal before the limit by default",
    ),
    "failures": ("Failed jobs", "a short debug partition or QOS, so that a test run starts at once"),
    "out-of-memory": ("Jobs killed for memory", "a sensible default memory per CPU or GPU on the partitions"),
    "notebooks": (
        "GPUs held idle by interactive sessions",
        "a short MaxTime on interactive partitions, idle culling in the notebook server, and cocaq's alerts "
        "while jobs run ([alerts])",
    ),
    "fewer-gpus": (
        "Idle GPUs in batch jobs",
        "cocaq's alerts while jobs run ([alerts]); help with launching on several GPUs",
    ),
    "dataloader": ("GPUs waiting for data", "more CPU cores per GPU by default on the GPU partitions"),
    "memory": ("Memory asked for and not used", "a lower default memory request"),
    "power-cap": (
        "GPUs near full power at moderate utilisation",
        "a GPU power cap (nvidia-smi -pl) on a partition or per job from a prolog: McDonald et al. (NAACL "
        "2022) measured ~15% less energy for transformer training for a marginal increase in run time",
    ),
}
POWER_CAP_SAVING = 0.10  # counted, below the ~15% measured
POWER_CAP_UTIL = (30.0, 70.0)  # the utilisation at which a cap costs little
POWER_CAP_MIN_SHARE = 0.6  # mean sampled power / TDP: a cap must have something to cut


def _site_levers(
    facts: Mapping[str, list[JobFacts]], totals: Mapping[str, float], month: Month, cfg: Config
) -> tuple[SiteLever, ...]:
    """The users' suggestions added up by kind (each user's as their own e-mail gives them), and the one
    lever only admins hold: GPU power caps, for jobs whose GPUs drew most of their rated power at moderate
    utilisation (POWER_CAP_SAVING of those jobs' GPU energy)."""
    ctx = advice_context(month, cfg)
    acc: dict[str, list[tuple[str, float, float, bool]]] = defaultdict(list)
    for u, jobs in facts.items():
        for a in advise_user(jobs, ctx, totals.get(u, 0.0), cfg):
            acc[a.id].append((u, a.saving_kwh or 0.0, a.saving_kg or 0.0, a.upper_bound))
        capped = [
            j
            for j in jobs
            if j.gpus > 0
            and j.gpu_util_pct is not None
            and POWER_CAP_UTIL[0] <= j.gpu_util_pct <= POWER_CAP_UTIL[1]
            and j.mean_gpu_power_w is not None
            and j.gpu_tdp_w > 0
            and j.mean_gpu_power_w >= POWER_CAP_MIN_SHARE * j.gpu_tdp_w
        ]
        if capped:
            e = sum(j.gpu_kwh * j.share * POWER_CAP_SAVING for j in capped)
            c = sum(j.gpu_kwh * j.share * POWER_CAP_SAVING * j.kg_per_kwh for j in capped)
            acc["power-cap"].append((u, e, c, False))
    out = []
    for kind, rows in acc.items():
        rows.sort(key=lambda r: (-r[1], r[0]))
        label, action = LEVERS.get(kind, (kind, ""))
        users = tuple(r[0] for r in rows)
        saving = sum(r[1] for r in rows)
        kg = sum(r[2] for r in rows)
        out.append(SiteLever(kind, label, users, saving, kg, any(r[3] for r in rows), action))
    out.sort(key=lambda x: (-x.saving_kwh, x.id))
    return tuple(x for x in out if x.saving_kwh > 0)


def before_after(
    conn: Connection,
    first_report: Mapping[str, datetime],
    month: Month,
    *,
    window_days: int = 30,
    cluster_id: int | None = None,
    watermark: datetime | None = None,
) -> BeforeAfter:
    """Idle-GPU share and GPU utilisation in the windows around each user's first report (`BeforeAfter`:
    observational, not a controlled effect), from the users' daily rollups."""
    span = timedelta(days=window_days)
    windows: dict[str, tuple[datetime, datetime, datetime, datetime]] = {}
    pending = []
    limit = month.end
    if watermark is not None:
        limit = min(limit, utc_midnight(watermark))
    for u, t in sorted(first_report.items()):
        b1 = utc_midnight(t)
        a0 = b1 if b1 == as_utc(t) else b1 + timedelta(days=1)
        if a0 + span > limit:
            pending.append(u)
            continue
        windows[u] = (b1 - span, b1, a0, a0 + span)
    rows: dict[str, dict[datetime, Sums]] = defaultdict(dict)
    if windows:
        lo = min(w[0] for w in windows.values())
        hi = max(w[3] for w in windows.values())
        names = sorted(windows)
        where: list[Any] = [R.user_name.in_(names)] if len(names) <= 5000 else []
        if cluster_id is not None:
            where.append(R.cluster_id == cluster_id)
        for (u, d), s in rollup_sums(conn, lo, hi, [R.user_name, R.day], where).items():
            if u in windows:
                rows[u][as_utc(d)] = s

    def side(u: str, a: datetime, b: datetime) -> tuple[WindowUse, Sums]:
        s = total_sums(v for d, v in rows.get(u, {}).items() if a <= d < b)
        gh = s["gpu_hours"]
        return WindowUse(
            a, b, gh, s["idle_gpu_hours"], s["idle_gpu_hours"] / gh if gh > 0 else None, sums_util(s)
        ), s

    users, excluded = [], []
    for u, (b0, b1, a0, a1) in windows.items():
        before, _ = side(u, b0, b1)
        after, _ = side(u, a0, a1)
        if (
            before.gpu_hours <= 0
            or after.gpu_hours <= 0
            or before.gpu_util_pct is None
            or after.gpu_util_pct is None
        ):
            excluded.append(u)
            continue
        assert before.idle_share is not None and after.idle_share is not None
        users.append(
            BeforeAfterUser(
                u,
                as_utc(first_report[u]),
                before,
                after,
                after.idle_share - before.idle_share,
                after.gpu_util_pct - before.gpu_util_pct,
            )
        )
    hb = sum(x.before.gpu_hours for x in users)
    ha = sum(x.after.gpu_hours for x in users)
    ib = sum(x.before.idle_gpu_hours for x in users) / hb if hb > 0 else None
    ia = sum(x.after.idle_gpu_hours for x in users) / ha if ha > 0 else None
    ub = sum(x.before.gpu_hours * (x.before.gpu_util_pct or 0.0) for x in users) / hb if hb > 0 else None
    ua = sum(x.after.gpu_hours * (x.after.gpu_util_pct or 0.0) for x in users) / ha if ha > 0 else None
    return BeforeAfter(
        window_days=window_days,
        users=tuple(users),
        gpu_hours_before=hb,
        gpu_hours_after=ha,
        idle_share_before=ib,
        idle_share_after=ia,
        idle_share_change=ia - ib if ia is not None and ib is not None else None,
        gpu_util_before=ub,
        gpu_util_after=ua,
        gpu_util_change=ua - ub if ua is not None and ub is not None else None,
        excluded=tuple(sorted(excluded)),
        pending=tuple(pending),
    )
