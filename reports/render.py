"""The reports as people read them: each kind (user, lab and admin months, jobs, idle-GPU alerts) rendered
from its data (`reports.data`) with Jinja2 templates into e-mails (plain text + HTML + inline PNG charts),
and the admins' interactive page. How numbers and sentences are written is `reports.wording`.

Why it is built this way:

* Templates are files in `reports/templates/` (installed with the package), and a site can replace any
  of them: a file of the same name in `[reports] template_dir` wins (`_theme.html` holds every style).
* HTML is rendered with autoescaping always on, so a job name or comment like `<script>` is shown as
  text. The plain-text part is rendered without it (text/plain is never read as markup, and `&lt;` there
  would be nonsense); control characters are taken out of what it prints instead.
* E-mail HTML is what mail clients keep: inline styles (a small <style> only for narrow screens), a
  single 600 px column that shrinks on phones, tables for layout, no script, and no image but the charts,
  attached by Content-ID. Charts are PNGs drawn with Pillow (`reports.charts`): fast enough for a
  thousand e-mails a minute. The interactive admin page uses Plotly, with plotly.js embedded so the file
  works offline (`reports.admin_html`).
* Every figure says what it rests on: the measured share of the energy, the carbon intensity used (zone,
  source, fallbacks), the PUE, how fresh the data is; embodied CO2 is always shown apart.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cocaq.reports.charts as ch
from cocaq.config import Config
from cocaq.footprint.advice_words import co2_amount, intensity, lower_first, of_member
from cocaq.footprint.words import DRAWN_WORDS, NAME_MODEL_TIP, UNNAMED, cooling_words, model_words
from cocaq.reports.wording import (
    CONTROLS,
    SPACES,
    basis_lines,
    basis_short,
    before_after_tone,
    car_km,
    co2,
    cooling,
    day,
    duration,
    estimate,
    evidence,
    hours,
    job_waste,
    kwh,
    model_tip,
    num,
    opt_out_text,
    ordinal,
    pct,
    peer_text,
    plural,
    possibly_lost,
    rank_text,
    saving_text,
    saving_word,
    share,
    short,
    trend,
    waste_parts,
    week_text,
    when,
    zone_name,
)

if TYPE_CHECKING:
    from jinja2 import Environment

    from cocaq.reports.data import (
        AdminMonth,
        JobReport,
        LabMonth,
        UserMonth,
        ZoneWeek,
    )
    from cocaq.reports.idle_jobs import IdleAlert
    from cocaq.reports.suggest import Suggestion

TEMPLATES = Path(__file__).resolve().parent / "templates"
CHART_WIDTH = 560  # display px at most (charts are designed 420 px wide and drawn at twice that)


@dataclass(frozen=True)
class Rendered:
    subject: str
    text: str  # the plain-text part
    html: str  # e-mail-safe HTML
    images: tuple[tuple[str, bytes], ...]  # (Content-ID without <>, PNG bytes); the HTML refers to cid:ID


# --- templates --------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Text templates' finalize: no control characters (a job name could hold terminal escapes)."""
    if isinstance(value, str):
        return CONTROLS.sub(" ", value)
    return value


def _words(kind: str) -> Callable[[str], str]:
    from cocaq.footprint.words import component_words, source_words

    return component_words if kind == "component" else source_words


FILTERS: dict[str, Callable[..., Any]] = {
    "component_words": lambda c: _words("component")(c),
    "source_words": lambda c: _words("source")(c),
    "gb": lambda mb: "n/a" if mb is None else f"{num(mb / 1024)} GB",
    "num": num,
    "kwh": kwh,
    "estimate": estimate,
    "co2": co2,
    "pct": pct,
    "co2_amount": co2_amount,  # a cell under a "CO2e" heading: 462 g, 3.03 kg (the e-mail's figure and unit)
    "lower_first": lower_first,  # a title or label spliced into a sentence: "worth making: train ..."
    "of_member": of_member,  # a member's suggestion as their lab head reads it: "could release their ..."
    "intensity": intensity,  # 150 g CO2e/kWh: the one spelling of the unit
    "share": share,
    "hours": hours,
    "day": day,
    "when": when,
    "short": short,
}


@lru_cache(maxsize=8)
def environments(template_dir: str | None) -> tuple[Environment, Environment]:
    """(HTML environment, text environment) over the site's templates, then the packaged ones.

    Cached per directory: templates compile once per process, which matters for a batch of a thousand.
    """
    from jinja2 import ChoiceLoader, Environment, FileSystemLoader, StrictUndefined

    dirs = [template_dir] if template_dir else []
    loader = ChoiceLoader([FileSystemLoader([*dirs, str(TEMPLATES)])])
    common: dict[str, Any] = dict(
        loader=loader, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, auto_reload=False
    )
    html = Environment(autoescape=True, **common)
    text = Environment(autoescape=False, keep_trailing_newline=True, finalize=_plain, **common)
    for env in (html, text):
        env.filters.update(FILTERS)
        env.globals.update(
            trend=trend,
            plural=plural,
            evidence=evidence,
            car_km=car_km,
            basis_short=basis_short,
            basis_lines=basis_lines,
            model_tip=model_tip,
            rank_text=rank_text,
            ordinal=ordinal,
            waste_parts=waste_parts,
            possibly_lost=possibly_lost,
            peer_text=peer_text,
            saving_text=saving_text,
            saving_word=saving_word,
            waste=job_waste,
            week_text=week_text,
            drawn=DRAWN_WORDS,  # the two energy figures' labels (cocaq.footprint.words)
            cooling=cooling,
            model_words=model_words,  # "jobs that declared no model name, framework pytorch"
            unnamed=UNNAMED,
            name_model_tip=NAME_MODEL_TIP,
            cooling_words=cooling_words,
        )
    return html, text


def _render(cfg: Config, name: str, **ctx: Any) -> tuple[str, str, str]:
    """(subject, text, html) of report `name`: NAME.txt, NAME.html and subjects.txt (with report=NAME)."""
    html_env, text_env = environments(cfg.reports.template_dir)
    ctx.setdefault("site", site_name(cfg))
    ctx.setdefault("contact", cfg.reports.contact)
    ctx.setdefault("opt_out", opt_out_text(cfg))
    ctx.setdefault("min_share", cfg.advice.min_share)
    subject = _subject(text_env, name, ctx)
    ctx["subject"] = subject
    text = text_env.get_template(f"{name}.txt").render(**ctx)
    html = html_env.get_template(f"{name}.html").render(**ctx)
    return subject, text.rstrip() + "\n", html.rstrip() + "\n"


def _subject(text_env: Environment, name: str, ctx: dict[str, Any]) -> str:
    """One line from subjects.txt (one file, so a site changes every subject in one place)."""
    raw = text_env.get_template("subjects.txt").render(report=name, **ctx)
    return " ".join(SPACES.sub(" ", raw).split())


def site_name(cfg: Config) -> str:
    return cfg.reports.site_name or cfg.cluster.name


def _month_names(m: Any) -> dict[str, str]:
    return {
        "month_name": f"{m.month.start:%B %Y}",
        "previous": f"{m.month.previous().start:%B}",
    }


def _img(cid: str, title: str) -> Any:
    """The <img> of a chart attached as `cid` (its width in the attribute for clients ignoring CSS)."""
    from markupsafe import Markup, escape

    return Markup(
        f'<img src="cid:{escape(cid)}" width="{CHART_WIDTH}" alt="{escape(title)}" '
        'style="display:block;width:100%;max-width:560px;height:auto;border:0;margin:8px 0 4px 0;">'
    )


class _Charts:
    """Charts of one e-mail: drawn once, attached once, shown by `chart(name)` in the template."""

    def __init__(self) -> None:
        self.images: list[tuple[str, bytes]] = []
        self.titles: dict[str, str] = {}

    def add(self, cid: str, title: str, png: bytes) -> None:
        self.images.append((cid, png))
        self.titles[cid] = title

    def __call__(self, cid: str) -> Any:
        from markupsafe import Markup

        return _img(cid, self.titles[cid]) if cid in self.titles else Markup("")

    def __contains__(self, cid: str) -> bool:
        return cid in self.titles


# --- user ---------------------------------------------------------------------------------------------------


def render_user_month(m: UserMonth, suggestions: Sequence[Suggestion], cfg: Config) -> Rendered:
    """A user's monthly e-mail: what their jobs used and emitted, where energy went to waste, what to try."""
    names = _month_names(m)
    t = m.totals
    charts = _Charts()
    if t.energy_kwh > 0 or t.jobs:
        util = [d.gpu_util_pct for d in m.daily]
        title = f"Your energy per day, {names['month_name']}"
        charts.add(
            "daily",
            title,
            ch.bar_chart(
                title,
                [str(d.day.day) for d in m.daily],
                [ch.Series("energy", [d.energy_kwh for d in m.daily], ch.COLOURS["energy"])],
                unit="kWh",
                subtitle="per UTC day, IT energy before PUE"
                + (
                    f" · {share(m.basis.measured_share)} measured"
                    if m.basis.measured_share is not None
                    else ""
                ),
                line=ch.Series("GPU utilisation", util, ch.COLOURS["util"])
                if any(u is not None for u in util)
                else None,
                line_unit="% GPU utilisation",
                line_max=100.0,
                label_every=7,
            ),
        )
    kg_per_kwh = t.co2_kg / t.energy_kwh if t.energy_kwh > 0 else None
    from cocaq.footprint.when_advice import settings, when_to_run

    subject, text, html = _render(
        cfg,
        "user_month",
        m=m,
        t=t,
        suggestions=list(suggestions),
        when_to_run=when_to_run(m.jobs, settings(cfg), f"in {m.month.start:%B}"),
        kg_per_kwh=kg_per_kwh,
        clusters=", ".join(m.clusters) or site_name(cfg),
        chart=charts,
        **names,
    )
    return Rendered(subject, text, html, tuple(charts.images))


# --- lab --------------------------------------------------------------------------------------------------


def render_lab_month(m: LabMonth, cfg: Config) -> Rendered:
    """A lab's monthly e-mail for its head: totals and trend, its users, idle waste, models, weeks."""
    names = _month_names(m)
    charts = _Charts()
    if m.totals.energy_kwh > 0 or m.totals.jobs:
        util = [w.gpu_util_pct for w in m.weekly]
        title = f"{short(m.account, 30)}: energy per week"
        charts.add(
            "weekly",
            title,
            ch.bar_chart(
                title,
                [day(w.first) + ("*" if w.partial else "") for w in m.weekly],
                [ch.Series("energy", [w.energy_kwh for w in m.weekly], ch.COLOURS["energy"])],
                unit="kWh",
                subtitle="ISO weeks (from Monday) within "
                + names["month_name"]
                + ", IT energy before PUE"
                + ("; * fewer than 7 days of data" if any(w.partial for w in m.weekly) else ""),
                line=ch.Series("GPU utilisation", util, ch.COLOURS["util"])
                if any(u is not None for u in util)
                else None,
                line_unit="% GPU utilisation",
                line_max=100.0,
                value_labels=lambda v: num(v),
            ),
        )
        top = list(m.users[:10])
        if len(top) > 1:
            title = "Energy by user"
            charts.add(
                "users",
                title,
                ch.hbar_chart(
                    title,
                    [u.user for u in top],
                    [ch.Series("energy", [u.energy_kwh for u in top], ch.COLOURS["energy"])],
                    unit="kWh",
                    subtitle="IT energy before PUE"
                    + (f" · top 10 of {len(m.users)} users" if len(m.users) > 10 else ""),
                    value_labels=lambda i: kwh(top[i].energy_kwh),
                ),
            )
    subject, text, html = _render(
        cfg, "lab_month", m=m, t=m.totals, chart=charts, shift_slack=duration(cfg.shifting.slack_s), **names
    )
    return Rendered(subject, text, html, tuple(charts.images))


# --- admins -----------------------------------------------------------------------------------------------


def _admin_context(m: AdminMonth, cfg: Config) -> dict[str, Any]:
    """What both admin renderings (e-mail and interactive page) show besides the charts."""
    from cocaq.reports.data import WEEK_WINDOW_H

    ba = m.before_after
    return {
        "m": m,
        "t": m.totals,
        "scope": m.cluster or "all clusters",
        "ba": ba,
        "ba_days": cfg.reports.before_after_days,
        "min_share": cfg.advice.min_share,
        "week_window_h": WEEK_WINDOW_H,
        "shift_slack": duration(cfg.shifting.slack_s),
        **_month_names(m),
    }


def _any(values: Sequence[float | None]) -> bool:
    return any(v is not None for v in values)


# (Content-ID, title, PNG): one static chart of the admin e-mail
Chart = tuple[str, str, bytes]


def admin_charts(m: AdminMonth) -> list[Chart]:
    """The admin e-mail's static charts: (Content-ID, title, PNG), only those with something to show."""
    charts = [
        _labs_chart(m),
        _partitions_chart(m),
        _weeks_chart(m),
        _util_chart(m),
        _idle_chart(m),
        _intensity_chart(m),
        *(_carbon_week_chart(k, zw) for k, zw in enumerate(m.carbon_week[:6])),
        _shift_chart(m),
        _models_chart(m),
        _waste_trend_chart(m),
        _before_after_chart(m),
    ]
    return [c for c in charts if c is not None]


def _month_labels(months: Sequence[Any]) -> list[str]:
    """ "Mar", or "Mar*" for a month the data covers in part: the month-by-month charts' categories."""
    return [f"{w.month.start:%b}" + ("*" if w.data_days < len(w.month.days()) else "") for w in months]


def _labs_chart(m: AdminMonth) -> Chart | None:
    """Energy by lab (the 12 largest), measured and estimated."""
    labs = list(m.by_lab[:12])
    if not labs:
        return None
    more = f" · top 12 of {len(m.by_lab)} labs" if len(m.by_lab) > 12 else ""
    lab_measured = [g.energy_kwh * (g.measured_share or 0.0) for g in labs]
    lab_estimated = [g.energy_kwh - x for g, x in zip(labs, lab_measured, strict=True)]
    title = "Energy by lab"
    return (
        "labs",
        title,
        ch.hbar_chart(
            title,
            [g.key or "(no account)" for g in labs],
            [
                ch.Series("measured", lab_measured, ch.COLOURS["measured"]),
                ch.Series("estimated", lab_estimated, ch.COLOURS["estimated"]),
            ],
            unit="kWh",
            subtitle="IT energy before PUE" + more,
            value_labels=lambda i: kwh(labs[i].energy_kwh),
        ),
    )


def _partitions_chart(m: AdminMonth) -> Chart | None:
    """Energy by partition (the 12 largest), measured and estimated, with the share measured."""
    cov = list(m.coverage[:12])
    if not cov:
        return None
    title = "Energy by partition"
    return (
        "partitions",
        title,
        ch.hbar_chart(
            title,
            [c.partition or "(none)" for c in cov],
            [
                ch.Series("measured", [c.measured_kwh for c in cov], ch.COLOURS["measured"]),
                ch.Series("estimated", [c.estimated_kwh for c in cov], ch.COLOURS["estimated"]),
            ],
            unit="kWh",
            subtitle="measured and estimated, IT energy before PUE; after each bar: the share measured",
            value_labels=lambda i: f"{kwh(cov[i].energy_kwh)} · {share(cov[i].measured_share)}",
        ),
    )


def _weeks_chart(m: AdminMonth) -> Chart | None:
    """Energy per ISO week, with the GPU utilisation as a line where it is known."""
    weeks = list(m.by_week)
    if not weeks:
        return None
    util = [w.gpu_util_pct for w in weeks]
    title = "Energy per week"
    return (
        "weeks",
        title,
        ch.bar_chart(
            title,
            [day(w.first) + ("*" if w.partial else "") for w in weeks],
            [ch.Series("energy", [w.energy_kwh for w in weeks], ch.COLOURS["energy"])],
            unit="kWh",
            subtitle=f"ISO weeks (from Monday) within {m.month.start:%B %Y}, IT energy before PUE"
            + ("; * fewer than 7 days of data" if any(w.partial for w in weeks) else ""),
            line=ch.Series("GPU utilisation", util, ch.COLOURS["util"]) if _any(util) else None,
            line_unit="% GPU utilisation",
            line_max=100.0,
            value_labels=num,
        ),
    )


def _util_chart(m: AdminMonth) -> Chart | None:
    """The GPU-hours of GPU jobs by their energy-weighted utilisation, in bins of 10%."""
    h = m.util_histogram
    if not (any(b.gpu_hours > 0 for b in h.bins) or h.unsampled_gpu_hours > 0):
        return None
    unsampled = f"; {hours(h.unsampled_gpu_hours)} without samples not shown" if h.unsampled_jobs else ""
    title = "GPU utilisation of GPU jobs"
    return (
        "util",
        title,
        ch.bar_chart(
            title,
            [f"{b.lo:.0f}%" for b in h.bins],
            [ch.Series("GPU-hours", [b.gpu_hours for b in h.bins], ch.COLOURS["energy"])],
            unit="GPU-hours",
            subtitle="GPU-hours by the job's energy-weighted utilisation, in bins of 10% from the value shown"
            + unsampled,
            empty="no GPU samples this month",
        ),
    )


def _idle_chart(m: AdminMonth) -> Chart | None:
    """The users whose allocated GPUs drew the most energy idle (the 10 first)."""
    idle = list(m.idle_by_user[:10])
    if not idle:
        return None
    threshold = pct(m.basis.idle_threshold_pct)
    title = "Idle allocated GPUs: top users"
    return (
        "idle",
        title,
        ch.hbar_chart(
            title,
            [w.key for w in idle],
            [ch.Series("idle energy", [w.idle_kwh for w in idle], ch.COLOURS["idle"])],
            unit="kWh drawn by idle GPUs",
            subtitle=f"GPUs under {threshold} utilisation; after each bar: share of the user's GPU-hours",
            value_labels=lambda i: f"{kwh(idle[i].idle_kwh)} · {share(idle[i].idle_share)}",
        ),
    )


def _intensity_chart(m: AdminMonth) -> Chart | None:
    """The carbon intensity used per UTC day of the month, a line per zone (6 at most)."""
    zones = [z for z in m.intensity if z.daily][:6]
    if not zones:
        return None
    days = m.month.days()
    series = []
    for k, z in enumerate(zones):
        by_day = {d.day: d.g_per_kwh for d in z.daily}
        series.append(ch.Series(zone_name(z.zone), [by_day.get(d) for d in days], ch.CYCLE[k]))
    title = "Carbon intensity used"
    return (
        "intensity",
        title,
        ch.line_chart(
            title,
            [str(d.day) for d in days],
            series,
            unit="g CO2e/kWh",
            subtitle="per UTC day, weighted by the energy of the jobs that ran",
            label_every=7,
        ),
    )


def _carbon_week_chart(k: int, zw: ZoneWeek) -> Chart:
    """A zone's month as a heatmap of weekday by UTC hour, coloured by the mean intensity."""
    grid: list[list[float | None]] = [[None] * 24 for _ in range(7)]
    for cell in zw.cells:
        grid[cell.weekday][cell.hour] = cell.g_per_kwh
    title = f"Carbon intensity of {short(zw.zone, 28)} by hour"
    return (
        f"carbon_week_{k}",
        title,
        ch.heatmap_chart(
            title,
            ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
            [f"{h:02d}" for h in range(24)],
            grid,
            unit="g CO2e/kWh",
            subtitle=f"{zw.basis} series, mean per weekday and UTC hour over {zw.hours} of the month's "
            f"{zw.month_hours} hours; green: cleaner, grey: no data",
            label_every=3,
        ),
    )


def _shift_chart(m: AdminMonth) -> Chart | None:
    """Month by month, the CO2 of the jobs that could have waited: as they ran, at their best start and
    pausing."""
    shifts = list(m.shift_trend)
    if not shifts:
        return None
    labels = _month_labels(shifts)
    title = "The jobs that could have waited"
    return (
        "shift",
        title,
        ch.bar_chart(
            title,
            labels,
            [
                ch.Series("as they ran", [w.co2_kg for w in shifts], ch.COLOURS["co2"]),
                ch.Series("at the best start", [w.best_start_kg for w in shifts], ch.COLOURS["after"]),
                ch.Series("pausing", [w.paused_kg for w in shifts], ch.COLOURS["pause"]),
            ],
            unit="kg CO2e",
            subtitle="operational CO2 as they ran, each at its cleanest start within its slack, and run in "
            "the cleanest hours of that window"
            + ("; * a month the data covers in part" if any("*" in x for x in labels) else ""),
            stacked=False,
            value_labels=num,
        ),
    )


def _models_chart(m: AdminMonth) -> Chart | None:
    """Energy by ML model (the 12 largest), with their jobs."""
    models = list(m.models[:12])
    if not models:
        return None
    more = f" · top 12 of {len(m.models)}" if len(m.models) > 12 else ""
    title = "Energy by ML model"
    return (
        "models",
        title,
        ch.hbar_chart(
            title,
            [x.model_name for x in models],
            [ch.Series("energy", [x.energy_kwh for x in models], ch.COLOURS["energy"])],
            unit="kWh",
            subtitle="jobs whose model is recorded, IT energy before PUE" + more,
            value_labels=lambda i: f"{kwh(models[i].energy_kwh)} · {plural(models[i].jobs, 'job')}",
        ),
    )


def _waste_trend_chart(m: AdminMonth) -> Chart | None:
    """Month by month, the energy that did no work per day of data (two months at least)."""
    trend = list(m.waste_trend)
    if len(trend) <= 1:
        return None

    def per_day(f: Callable[[Any], float]) -> list[float | None]:
        return [f(w) / w.data_days for w in trend]

    title = "Energy that did no work, month by month"
    return (
        "waste_trend",
        title,
        ch.bar_chart(
            title,
            _month_labels(trend),
            [
                ch.Series("idle GPUs", per_day(lambda w: w.idle_kwh), ch.COLOURS["idle"]),
                ch.Series(
                    "failed, out of memory", per_day(lambda w: w.failed_kwh + w.oom_kwh), ch.COLOURS["failed"]
                ),
                ch.Series("cancelled", per_day(lambda w: w.cancelled_kwh), ch.COLOURS["before"]),
            ],
            unit="kWh per day of data",
            subtitle="each kWh counted once; the time-limit part (possibly lost) is not in it; * a month the "
            "data covers in part",
            value_labels=num,
        ),
    )


def _before_after_chart(m: AdminMonth) -> Chart | None:
    """The idle share and GPU utilisation of the users who got a first report, before and after it."""
    ba = m.before_after
    if ba is None or not ba.users or ba.idle_share_before is None or ba.gpu_util_before is None:
        return None
    before = [ba.idle_share_before * 100, ba.gpu_util_before]
    after = [(ba.idle_share_after or 0.0) * 100, ba.gpu_util_after or 0.0]
    # green where the change is good news (less idle, more utilisation), orange where it is not
    tones = [
        before_after_tone(before[0], after[0], "less"),
        before_after_tone(before[1], after[1], "more"),
    ]
    colours = [
        ch.COLOURS["after"] if t == "good" else ch.COLOURS["worse"] if t == "bad" else ch.COLOURS["before"]
        for t in tones
    ]
    title = "Before and after the first report"
    return (
        "before-after",
        title,
        ch.bar_chart(
            title,
            ["idle share of GPU-hours", "GPU utilisation"],
            [
                ch.Series("before", before, ch.COLOURS["before"]),
                ch.Series("after (green: better, orange: worse)", after, ch.COLOURS["after"], colours),
            ],
            unit="%",
            subtitle=f"{plural(len(ba.users), 'user')}, {ba.window_days} days each side; observational, "
            "not a controlled effect",
            stacked=False,
            value_labels=pct,
        ),
    )


def render_admin_email(m: AdminMonth, cfg: Config) -> Rendered:
    """The admins' monthly e-mail: the whole site's month as tables and static charts."""
    charts = _Charts()
    for cid, title, png in admin_charts(m):
        charts.add(cid, title, png)
    subject, text, html = _render(cfg, "admin_month", chart=charts, **_admin_context(m, cfg))
    return Rendered(subject, text, html, tuple(charts.images))


def render_admin_html(m: AdminMonth, cfg: Config) -> str:
    """The admins' monthly report as one standalone HTML file with interactive Plotly charts; plotly.js is
    embedded, so it opens offline and loads nothing from anywhere."""
    from cocaq.reports.admin_html import plotly_charts, plotly_js

    html_env, _ = environments(cfg.reports.template_dir)
    figs = plotly_charts(m)

    def chart(name: str) -> Any:
        from markupsafe import Markup

        return Markup(figs.get(name, ""))

    ctx = _admin_context(m, cfg)
    ctx.update(site=site_name(cfg), contact=cfg.reports.contact, chart=chart, plotly_js=plotly_js())
    ctx["subject"] = _subject(environments(cfg.reports.template_dir)[1], "admin_month", ctx)
    return html_env.get_template("admin_interactive.html").render(**ctx)


# --- jobs -------------------------------------------------------------------------------------------------


_OUTCOME_WORDS = {
    "failed": "it failed after {h}",
    "oom": "it ran out of memory after {h}",
    "timeout": "it hit its time limit after {h}",
    "cancelled": "it was cancelled after {h}",
}


def waste_reason(j: JobReport) -> str | None:
    """Why a job's e-mail went unasked, in one sentence from its ledger parts (cocaq.accounting.ledger.waste):
    `4.1 kWh of this job's energy did no useful work: its GPUs sat idle for 14 GPU-hours (4.1 kWh).`
    None when none of its energy counts as wasted."""
    from cocaq.accounting.ledger import outcome_of, waste
    from cocaq.units import J_PER_KWH

    w = waste(j.state, j.energy_kwh * J_PER_KWH, j.idle_kwh * J_PER_KWH, j.interactive)
    if w.total <= 0:
        return None
    parts = []
    if w.idle > 0:
        parts.append(
            f"its GPUs sat idle for {plural(j.idle_gpu_hours, 'GPU-hour')} ({kwh(w.idle / J_PER_KWH)})"
        )
    o = outcome_of(j.state)
    if o is not None and o != "timeout":  # the time-limit part is possibly lost, not wasted
        rest = getattr(w, o) / J_PER_KWH
        what = _OUTCOME_WORDS[o].format(h=hours(j.elapsed_h))
        parts.append(f"{what} ({'the other ' if w.idle > 0 else ''}{kwh(rest)})")
    return f"{kwh(w.total / J_PER_KWH)} of this job's energy did no useful work: " + " and ".join(parts) + "."


def render_jobs(reports: Sequence[JobReport], cfg: Config, *, unasked: Collection[int] = ()) -> Rendered:
    """One job's footprint, or a digest of several (most energy first): energy by component and method, CO2
    with its zone, intensity, source and PUE, embodied CO2 apart, GPU use. No links and no images.

    `unasked`: the jobs (pks) that go because their energy did no useful work, not because anyone asked
    (reports.jobmail): each says why (`waste_reason`), and the e-mail says how to stop these e-mails."""
    if not reports:
        raise ValueError("render_jobs: no jobs to report")
    jobs = sorted(reports, key=lambda j: (-j.energy_kwh, j.job_id)) if len(reports) > 1 else list(reports)
    total = {
        "energy_kwh": sum(j.energy_kwh for j in jobs),
        "measured_kwh": sum(j.measured_kwh for j in jobs),
        "co2_kg": sum(j.co2_kg for j in jobs),
        "embodied_kg": sum(j.co2_embodied_kg or 0.0 for j in jobs),
        "embodied_known": all(j.co2_embodied_kg is not None for j in jobs),
        "idle_kwh": sum(j.idle_kwh for j in jobs),
        "idle_co2_kg": sum(j.idle_co2_kg for j in jobs),
        "gpu_hours": sum(j.gpus * j.elapsed_h for j in jobs),
        "final": all(j.final for j in jobs),
    }
    users = sorted({j.user for j in jobs})
    reasons: dict[int, str] = {}
    for j in jobs:
        why = waste_reason(j) if j.pk in unasked else None
        if why:
            reasons[j.pk] = why
    subject, text, html = _render(
        cfg,
        "jobs",
        jobs=jobs,
        job=jobs[0] if len(jobs) == 1 else None,
        total=total,
        users=users,
        reasons=reasons,
        waste_kwh=cfg.reports.job_email_waste_kwh,
        opt_out=opt_out_text(cfg),
    )
    return Rendered(subject, text, html, ())


# --- alerts while a job runs ----------------------------------------------------------------------------


def render_idle_alert(a: IdleAlert, cfg: Config) -> Rendered:
    """The e-mail to a user whose running job holds GPUs that all sat idle (reports.idle_jobs; sent by
    reports.alerts): which job, which GPUs and nodes, for how long, what that drew, and the line that ends
    it (`scancel JOBID`)."""
    devices: dict[str, list[str]] = {}
    for node, dev in a.devices:
        devices.setdefault(node, []).append(dev)
    subject, text, html = _render(
        cfg,
        "alert_idle",
        a=a,
        idle=("at least " if a.at_least else "") + duration(a.idle_s),
        idle_short=duration(a.idle_s),
        devices=devices,
        throttle_hours=cfg.alerts.throttle_hours,
        opt_out=opt_out_text(cfg),
    )
    return Rendered(subject, text, html, ())


# --- viewing e-mails outside a mail client ------------------------------------------------------------


def inline_images(html: str, images: Sequence[tuple[str, bytes]]) -> str:
    """The HTML with each `cid:ID` replaced by a data: URI of its PNG, to open the e-mail in a browser
    (`cocaq report --out`, the demo, screenshots)."""
    for cid, png in images:
        uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        html = html.replace(f'"cid:{cid}"', f'"{uri}"')
    return html
