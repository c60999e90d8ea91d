"""The reports as people read them: e-mails (plain text + HTML + inline PNG charts) and the admins'
interactive page, rendered from `reports.data` with Jinja2 templates.

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
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cocaq.config import Config

if TYPE_CHECKING:
    from cocaq.reports.data import (
        AdminMonth,
        Basis,
        Change,
        JobReport,
        LabMonth,
        MonthTotals,
        UserMonth,
    )
    from cocaq.reports.suggest import Suggestion
    from jinja2 import Environment

    from cocaq.modelstats import Comparison

TEMPLATES = Path(__file__).resolve().parent / "templates"
CHART_WIDTH = 560  # display px at most (charts are designed 420 px wide and drawn at twice that)


@dataclass(frozen=True)
class Rendered:
    subject: str
    text: str  # the plain-text part
    html: str  # e-mail-safe HTML
    images: tuple[tuple[str, bytes], ...]  # (Content-ID without <>, PNG bytes); the HTML refers to cid:ID


# --- numbers as the reports write them ---------------------------------------------------------------


def num(x: float | None) -> str:
    """About three significant digits, thousands separated: 1,234 · 56.7 · 3.14 · 0.0123 · 0."""
    if x is None or not math.isfinite(x):
        return "n/a"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        s = f"{x:.1f}"
    elif a >= 1:
        s = f"{x:.2f}"
    elif a == 0:
        return "0"
    else:
        s = f"{x:.{max(2, 2 - math.floor(math.log10(a)))}f}"
    s = s.rstrip("0").rstrip(".") if "." in s else s
    return "0" if s in ("-0", "") else s


def kwh(x: float | None) -> str:
    return f"{num(x)} kWh"


def co2(kg: float | None) -> str:
    """Operational or embodied CO2e in the unit that reads best: g, kg or t."""
    if kg is None or not math.isfinite(kg):
        return "n/a"
    a = abs(kg)
    if a >= 1000:
        return f"{num(kg / 1000)} t CO2e"
    if a >= 1 or a == 0:
        return f"{num(kg)} kg CO2e"
    return f"{num(kg * 1000)} g CO2e"


def pct(x: float | None) -> str:
    """A percentage given in percent (0-100)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if 0 < abs(x) < 1:
        return f"{x:.1f}%"
    return f"{x:.0f}%"


def share(x: float | None) -> str:
    """A fraction (0-1) as a percentage."""
    return pct(None if x is None else x * 100)


def hours(x: float | None) -> str:
    return f"{num(x)} h"


def day(d: date | datetime | None) -> str:
    """3 Mar (dates in the reports are UTC, as the months are)."""
    if d is None:
        return "n/a"
    return f"{d.day} {d:%b}"


def when(t: datetime | None) -> str:
    """3 Mar 2025 14:05 UTC."""
    if t is None:
        return "n/a"
    return f"{t.day} {t:%b %Y %H:%M} UTC"


_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_SPACES = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def short(s: object, n: int = 40) -> str:
    """One line of at most n characters (names and comments come from users: any length, any bytes)."""
    text = _SPACES.sub(" ", "" if s is None else str(s)).strip()
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def plural(n: float, word: str, words: str | None = None) -> str:
    """`3 jobs`, `1 job`."""
    return f"{num(n)} {word if n == 1 else (words or word + 's')}"


@dataclass(frozen=True)
class TrendText:
    text: str  # "up 12% on February", "" when there is nothing to compare
    tone: str  # good, bad, neutral (theme styles of the same names)


def trend(c: Change, kind: str, previous: str, unit: str = "") -> TrendText:
    """A change against the previous month in words. kind: "less-is-better" (energy, CO2), "more-is-better"
    (utilisation, in percentage points) or "neutral" (GPU-hours)."""
    if c.current is None or c.previous is None:
        return TrendText("", "neutral")
    if kind == "more-is-better":  # a utilisation: the change in points
        if c.delta is None or abs(c.delta) < 0.5:
            return TrendText(f"about the same as {previous}", "neutral")
        word = "up" if c.delta > 0 else "down"
        return TrendText(f"{word} {num(abs(c.delta))} points on {previous}", "good" if c.delta > 0 else "bad")
    if c.previous == 0:
        return TrendText(f"none in {previous}" if c.current else "", "neutral")
    if c.pct is None or abs(c.pct) < 0.5:
        return TrendText(f"about the same as {previous}", "neutral")
    word = "up" if c.pct > 0 else "down"
    tone = "neutral" if kind == "neutral" else ("bad" if c.pct > 0 else "good")
    return TrendText(f"{word} {pct(abs(c.pct))} on {previous}", tone)


def car_km(co2_kg: float) -> float:
    """Kilometres in an average petrol car with the same CO2 (US EPA, as cocaq.footprint)."""
    from cocaq.footprint import equivalents

    return equivalents(co2_kg)["car_km"]


def evidence(value: float, unit: str) -> str:
    if unit == "%":
        return pct(value)
    if unit in ("jobs", "job"):
        return plural(value, "job")
    return f"{num(value)} {unit}".strip()


def model_tip(comparisons: Sequence[Comparison]) -> str | None:
    """The user e-mail's one sentence about precision or batch size (`Your llama-3-8b runs in bf16 used
    0.42 kWh per epoch, 38% less than in fp32.`): the comparison with the largest possible saving that
    has something to say (cocaq.modelstats.Comparison.sentence), None when none has. A plain string: the
    HTML template escapes the model name in it."""
    for c in comparisons:
        line = c.sentence("Your", kwh=kwh, name=lambda s: short(s, 40))
        if line:
            return line
    return None


# --- what the figures rest on ------------------------------------------------------------------------


def _pue(b: Basis) -> str:
    if b.pue_min is None:
        return "PUE n/a"
    if b.pue_max is None or abs(b.pue_max - b.pue_min) < 0.005:
        return f"PUE {b.pue_min:.2f}"
    return f"PUE {b.pue_min:.2f}-{b.pue_max:.2f}"


def _zone_name(zone: str | None) -> str:
    return zone or "unknown zone"


def intensity_lines(b: Basis) -> list[str]:
    """Each carbon basis: `DEU 381 g/kWh (codecarbon ...; annual-fallback): 62% of the energy`."""
    out = []
    for c in b.carbon:
        g = f"{num(c.g_per_kwh)} g/kWh" if c.g_per_kwh is not None else "intensity n/a"
        src = c.source or "source not recorded"
        if c.flag:
            src += f"; {c.flag}"
        out.append(f"{_zone_name(c.zone)} {g} ({src}): {share(c.energy_share)} of the energy")
    return out


def basis_short(b: Basis) -> str:
    """One line under the headline figures: measured share, zone(s) and intensity, PUE."""
    parts = []
    if b.measured_share is not None:
        parts.append(f"{share(b.measured_share)} measured, {share(1 - b.measured_share)} estimated")
    zones = [c for c in b.carbon if c.energy_share >= 0.05] or list(b.carbon[:1])
    seen: dict[str, list[float]] = {}
    for c in zones:
        acc = seen.setdefault(_zone_name(c.zone), [0.0, 0.0])
        if c.g_per_kwh is not None:
            acc[0] += c.g_per_kwh * c.energy_kwh
            acc[1] += c.energy_kwh
    for z, (gx, e) in seen.items():
        parts.append(f"{z} {num(gx / e)} g CO2e/kWh" if e > 0 else z)
    parts.append(_pue(b))
    if not b.complete:
        parts.append("month not complete yet")
    return "Basis: " + " · ".join(parts)


def basis_lines(b: Basis, t: MonthTotals | None = None) -> list[str]:
    """What every figure of a report rests on, in sentences (the `How these figures were made` block)."""
    out = []
    if b.measured_share is not None:
        meas = t.measured_kwh if t is not None else None
        est = t.estimated_kwh if t is not None else None
        extra = (
            f" ({kwh(meas)} measured, {kwh(est)} estimated)" if meas is not None and est is not None else ""
        )
        how = " (GPU energy counters and power samples, CPU/DRAM RAPL, Slurm node energy)"
        out.append(
            f"Energy: {share(b.measured_share)} measured{how if b.measured_share > 0 else ''}, "
            f"{share(1 - b.measured_share)} estimated from the hardware's rated power (TDP) and the time "
            f"allocated{extra}. Energy is IT energy, before PUE."
        )
    else:
        out.append("Energy: none recorded in this period.")
    lines = intensity_lines(b)
    if lines:
        out.append("Carbon intensity used (energy-weighted over each job's run): " + "; ".join(lines) + ".")
    out.append(
        f"CO2 = energy x PUE x carbon intensity; {_pue(b)} (data centre overhead). Operational CO2 only: "
        "embodied (manufacturing) emissions are shown apart."
    )
    out.append(
        f"A GPU counts as idle while allocated under {pct(b.idle_threshold_pct)} utilisation (from its "
        "samples); jobs without GPU samples have no utilisation figure."
    )
    if b.rollups_through is not None:
        out.append(
            f"Data through {when(b.rollups_through)}"
            + ("." if b.complete else ": the month is not complete yet, figures will still grow.")
        )
    else:
        out.append("The aggregator has not run yet: run `cocaq aggregate` before rendering reports.")
    out.append("Days and months are UTC. Everyday equivalents: US EPA Greenhouse Gas Equivalencies.")
    return out


# --- templates --------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Text templates' finalize: no control characters (a job name could hold terminal escapes)."""
    if isinstance(value, str):
        return _CONTROLS.sub(" ", value)
    return value


FILTERS: dict[str, Callable[..., Any]] = {
    "num": num,
    "kwh": kwh,
    "co2": co2,
    "pct": pct,
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
        )
    return html, text


def _render(cfg: Config, name: str, **ctx: Any) -> tuple[str, str, str]:
    """(subject, text, html) of report `name`: NAME.txt, NAME.html and subjects.txt (with report=NAME)."""
    html_env, text_env = environments(cfg.reports.template_dir)
    ctx.setdefault("site", site_name(cfg))
    ctx.setdefault("contact", cfg.reports.contact)
    subject = _subject(text_env, name, ctx)
    ctx["subject"] = subject
    text = text_env.get_template(f"{name}.txt").render(**ctx)
    html = html_env.get_template(f"{name}.html").render(**ctx)
    return subject, text.rstrip() + "\n", html.rstrip() + "\n"


def _subject(text_env: Environment, name: str, ctx: dict[str, Any]) -> str:
    """One line from subjects.txt (one file, so a site changes every subject in one place)."""
    raw = text_env.get_template("subjects.txt").render(report=name, **ctx)
    return " ".join(_SPACES.sub(" ", raw).split())


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
    from cocaq.reports import charts as ch

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
    subject, text, html = _render(
        cfg,
        "user_month",
        m=m,
        t=t,
        suggestions=list(suggestions),
        kg_per_kwh=kg_per_kwh,
        clusters=", ".join(m.clusters) or site_name(cfg),
        chart=charts,
        **names,
    )
    return Rendered(subject, text, html, tuple(charts.images))


# --- lab --------------------------------------------------------------------------------------------------


def render_lab_month(m: LabMonth, cfg: Config) -> Rendered:
    """A lab's monthly e-mail for its head: totals and trend, its users, idle waste, models, weeks."""
    from cocaq.reports import charts as ch

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
                [day(w.first) for w in m.weekly],
                [ch.Series("energy", [w.energy_kwh for w in m.weekly], ch.COLOURS["energy"])],
                unit="kWh",
                subtitle="ISO weeks (from Monday) within " + names["month_name"] + ", IT energy before PUE",
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
    subject, text, html = _render(cfg, "lab_month", m=m, t=m.totals, chart=charts, **names)
    return Rendered(subject, text, html, tuple(charts.images))


# --- admins -----------------------------------------------------------------------------------------------


def _admin_context(m: AdminMonth, cfg: Config) -> dict[str, Any]:
    """What both admin renderings (e-mail and interactive page) show besides the charts."""
    ba = m.before_after
    return {
        "m": m,
        "t": m.totals,
        "scope": m.cluster or "all clusters",
        "ba": ba,
        "ba_days": cfg.reports.before_after_days,
        **_month_names(m),
    }


def _any(values: Sequence[float | None]) -> bool:
    return any(v is not None for v in values)


def admin_charts(m: AdminMonth) -> list[tuple[str, str, bytes]]:
    """The admin e-mail's static charts: (Content-ID, title, PNG), only those with something to show."""
    from cocaq.reports import charts as ch

    out: list[tuple[str, str, bytes]] = []
    month_name = f"{m.month.start:%B %Y}"
    measured, estimated = ch.COLOURS["measured"], ch.COLOURS["estimated"]

    def add(cid: str, title: str, draw: Callable[[str], bytes]) -> None:
        out.append((cid, title, draw(title)))

    labs = list(m.by_lab[:12])
    if labs:
        more = f" · top 12 of {len(m.by_lab)} labs" if len(m.by_lab) > 12 else ""
        lab_measured = [g.energy_kwh * (g.measured_share or 0.0) for g in labs]
        lab_estimated = [g.energy_kwh - x for g, x in zip(labs, lab_measured, strict=True)]
        add("labs", "Energy by lab", lambda title: ch.hbar_chart(
            title,
            [g.key or "(no account)" for g in labs],
            [ch.Series("measured", lab_measured, measured),
             ch.Series("estimated", lab_estimated, estimated)],
            unit="kWh",
            subtitle="IT energy before PUE" + more,
            value_labels=lambda i: kwh(labs[i].energy_kwh),
        ))  # fmt: skip
    cov = list(m.coverage[:12])
    if cov:
        add("partitions", "Energy by partition", lambda title: ch.hbar_chart(
            title,
            [c.partition or "(none)" for c in cov],
            [ch.Series("measured", [c.measured_kwh for c in cov], measured),
             ch.Series("estimated", [c.estimated_kwh for c in cov], estimated)],
            unit="kWh",
            subtitle="measured and estimated, IT energy before PUE; after each bar: the share measured",
            value_labels=lambda i: f"{kwh(cov[i].energy_kwh)} · {share(cov[i].measured_share)}",
        ))  # fmt: skip
    weeks = list(m.by_week)
    if weeks:
        util = [w.gpu_util_pct for w in weeks]
        add("weeks", "Energy per week", lambda title: ch.bar_chart(
            title,
            [day(w.first) for w in weeks],
            [ch.Series("energy", [w.energy_kwh for w in weeks], ch.COLOURS["energy"])],
            unit="kWh",
            subtitle=f"ISO weeks (from Monday) within {month_name}, IT energy before PUE",
            line=ch.Series("GPU utilisation", util, ch.COLOURS["util"]) if _any(util) else None,
            line_unit="% GPU utilisation",
            line_max=100.0,
            value_labels=num,
        ))  # fmt: skip
    h = m.util_histogram
    if any(b.gpu_hours > 0 for b in h.bins) or h.unsampled_gpu_hours > 0:
        unsampled = f"; {hours(h.unsampled_gpu_hours)} without samples not shown" if h.unsampled_jobs else ""
        add("util", "GPU utilisation of GPU jobs", lambda title: ch.bar_chart(
            title,
            [f"{b.lo:.0f}%" for b in h.bins],
            [ch.Series("GPU-hours", [b.gpu_hours for b in h.bins], ch.COLOURS["energy"])],
            unit="GPU-hours",
            subtitle="GPU-hours by the job's energy-weighted utilisation, in bins of 10% from the value shown"
            + unsampled,
            empty="no GPU samples this month",
        ))  # fmt: skip
    idle = list(m.idle_by_user[:10])
    if idle:
        threshold = pct(m.basis.idle_threshold_pct)
        add("idle", "Idle allocated GPUs: top users", lambda title: ch.hbar_chart(
            title,
            [w.key for w in idle],
            [ch.Series("idle energy", [w.idle_kwh for w in idle], ch.COLOURS["idle"])],
            unit="kWh drawn by idle GPUs",
            subtitle=f"GPUs under {threshold} utilisation; after each bar: share of the user's GPU-hours",
            value_labels=lambda i: f"{kwh(idle[i].idle_kwh)} · {share(idle[i].idle_share)}",
        ))  # fmt: skip
    zones = [z for z in m.intensity if z.daily][:6]
    if zones:
        days = m.month.days()
        series = []
        for k, z in enumerate(zones):
            by_day = {d.day: d.g_per_kwh for d in z.daily}
            series.append(ch.Series(_zone_name(z.zone), [by_day.get(d) for d in days], ch.CYCLE[k]))
        add("intensity", "Carbon intensity used", lambda title: ch.line_chart(
            title,
            [str(d.day) for d in days],
            series,
            unit="g CO2e/kWh",
            subtitle="per UTC day, weighted by the energy of the jobs that ran",
            label_every=7,
        ))  # fmt: skip
    models = list(m.models[:12])
    if models:
        more = f" · top 12 of {len(m.models)}" if len(m.models) > 12 else ""
        add("models", "Energy by ML model", lambda title: ch.hbar_chart(
            title,
            [x.model_name for x in models],
            [ch.Series("energy", [x.energy_kwh for x in models], ch.COLOURS["energy"])],
            unit="kWh",
            subtitle="jobs whose model is recorded, IT energy before PUE" + more,
            value_labels=lambda i: f"{kwh(models[i].energy_kwh)} · {plural(models[i].jobs, 'job')}",
        ))  # fmt: skip
    ba = m.before_after
    if ba is not None and ba.users and ba.idle_share_before is not None and ba.gpu_util_before is not None:
        before = [ba.idle_share_before * 100, ba.gpu_util_before]
        after = [(ba.idle_share_after or 0.0) * 100, ba.gpu_util_after or 0.0]
        add("before-after", "Before and after the first report", lambda title: ch.bar_chart(
            title,
            ["idle share of GPU-hours", "GPU utilisation"],
            [ch.Series("before", before, ch.COLOURS["before"]),
             ch.Series("after", after, ch.COLOURS["after"])],
            unit="%",
            subtitle=f"{plural(len(ba.users), 'user')}, {ba.window_days} days each side; observational, "
            "not a controlled effect",
            stacked=False,
            value_labels=pct,
        ))  # fmt: skip
    return out


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


def render_jobs(reports: Sequence[JobReport], cfg: Config) -> Rendered:
    """One job's footprint, or a digest of several (most energy first): energy by component and method, CO2
    with its zone, intensity, source and PUE, embodied CO2 apart, GPU use. No links and no images."""
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
    subject, text, html = _render(
        cfg, "jobs", jobs=jobs, job=jobs[0] if len(jobs) == 1 else None, total=total, users=users
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
