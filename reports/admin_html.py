"""The Plotly charts of the admins' interactive report (`reports.render.render_admin_html`).

The page is one standalone file: plotly.js is embedded once in its <head> and each chart is a <div> with
its figure as JSON (Plotly escapes <, > and / in it, so a lab or user name cannot close the script).
Names are HTML-escaped too, because Plotly reads a few tags (<b>, <br>, <a>) in labels. No chart links
anywhere: there is no mode bar (no Plotly logo, no "edit in Chart Studio"); hovering shows the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from html import escape
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cocaq.reports.data import AdminMonth, ZoneWeek

from cocaq.footprint.words import UNNAMED
from cocaq.reports.charts import COLOURS, CYCLE
from cocaq.reports.wording import before_after_tone, hours, pct, short

# No mode bar: on a phone it sits over the bars, and the e-mail carries each chart as an image anyway;
# hovering and the legends are what a reader uses here.
CONFIG = {"displayModeBar": False, "responsive": True}
FONT = "-apple-system, BlinkMacSystemFont, Segoe UI, Roboto, Helvetica, Arial, sans-serif"


def _rgb(c: tuple[int, int, int]) -> str:
    return f"rgb({c[0]},{c[1]},{c[2]})"


def _name(s: str | None, fallback: str) -> str:
    """A label for Plotly: short, and with <, > and & escaped (Plotly reads a few tags in labels and shows
    entities as their characters; a quote needs no escaping there)."""
    return escape(short(s or fallback, 28), quote=False)


@lru_cache(maxsize=1)
def plotly_js() -> Any:
    """plotly.js, minified, as markup to put inside a <script> element (it holds no `</script`)."""
    from markupsafe import Markup
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # never seen; would end the element early
        js = js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    return Markup(js)


def _layout(title: str, subtitle: str, *, height: int = 380, **kw: Any) -> dict[str, Any]:
    """A plain white layout (no Plotly template: each would add 10 kB of JSON per chart).

    Made for a phone's 375 px as much as for a desktop: the title and subtitle are HTML around the chart
    (Plotly does not wrap a title; `_div` puts them there from `meta`), margins are small and grow only as
    the axis labels need (automargin), and the legend sits under the plot, wrapping."""
    axis = {"gridcolor": "#e5e7eb", "linecolor": "#9ca3af", "zeroline": False, "automargin": True}
    layout: dict[str, Any] = {
        "template": "none",
        "meta": {"title": title, "subtitle": subtitle},
        "font": {"family": FONT, "size": 12, "color": "#111827"},
        "height": height,
        "autosize": True,
        "margin": {"l": 8, "r": 8, "t": 8, "b": 8, "pad": 2},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "y": 0,
            "yanchor": "bottom",
            "yref": "container",
            "traceorder": "normal",
        },
        "bargap": 0.3,
        "hoverlabel": {"font": {"family": FONT}},
        "xaxis": dict(axis),
        "yaxis": dict(axis),
    }
    for k, v in kw.items():
        layout[k] = {**layout[k], **v} if isinstance(v, dict) and isinstance(layout.get(k), dict) else v
    return layout


def _div(name: str, data: Sequence[dict[str, Any]], layout: dict[str, Any]) -> str:
    """The chart's title and subtitle as HTML (they wrap on a phone), then Plotly's <div> and script."""
    import plotly.graph_objects as go
    import plotly.io as pio

    meta = layout.pop("meta", {}) or {}
    fig = go.Figure(data=list(data), layout=layout)
    html: str = pio.to_html(
        fig, config=CONFIG, full_html=False, include_plotlyjs=False, div_id=f"chart-{name}", validate=False
    )
    head = (
        f'<p style="margin:16px 0 0 0;font-weight:700;font-size:15px;">{escape(meta.get("title", ""))}</p>'
        f'<p style="margin:0 0 4px 0;color:#6b7280;font-size:12px;">{escape(meta.get("subtitle", ""))}</p>'
    )
    return head + html


def _bar(name: str, x: Sequence[Any], y: Sequence[Any], colour: str, hover: str, **kw: Any) -> dict[str, Any]:
    return {
        "type": "bar",
        "name": name,
        "x": list(x),
        "y": list(y),
        "marker": {"color": _rgb(COLOURS[colour])},
        "hovertemplate": hover,
        **kw,
    }


def _height(rows: int, least: int = 220) -> int:
    return max(least, 150 + 30 * rows)


KWH_H = "%{y}: %{x:,.1f} kWh<extra>%{fullData.name}</extra>"
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# Intensity from low to high: green (cleaner) through yellow to red (dirtier), the colours the reports give
# good and bad news; every cell keeps its value in the hover.
WEEK_SCALE = [[0.0, "rgb(22,163,74)"], [0.5, "rgb(250,204,21)"], [1.0, "rgb(220,38,38)"]]


def _week(name: str, z: ZoneWeek) -> str:
    """A zone's month as a heatmap: weekdays (Monday on top) by UTC hour, coloured by the mean intensity;
    cells the series does not cover are left blank."""
    grid: list[list[float | None]] = [[None] * 24 for _ in WEEKDAYS]
    n: list[list[int]] = [[0] * 24 for _ in WEEKDAYS]
    for c in z.cells:
        grid[c.weekday][c.hour] = c.g_per_kwh
        n[c.weekday][c.hour] = c.hours
    heat = {
        "type": "heatmap",
        "x": [f"{h:02d}" for h in range(24)],
        "y": list(WEEKDAYS),
        "z": grid,
        "customdata": n,
        "colorscale": WEEK_SCALE,
        "xgap": 1,
        "ygap": 1,
        "hoverongaps": False,
        "colorbar": {"title": {"text": "g CO2e/kWh", "side": "right"}, "thickness": 10, "outlinewidth": 0},
        "hovertemplate": "%{y} %{x}:00 UTC: %{z:,.0f} g CO2e/kWh<br>mean of %{customdata} hours"
        "<extra></extra>",
    }
    return _div(
        name,
        [heat],
        _layout(
            f"Carbon intensity of {short(z.zone or 'unknown zone', 28)} by hour",
            f"{z.basis} series, mean per weekday and UTC hour over {z.hours} of the month's {z.month_hours}"
            " hours; green: cleaner",
            height=300,
            xaxis={"title": {"text": "hour of day (UTC)"}, "showgrid": False, "tickangle": 0},
            yaxis={"autorange": "reversed", "showgrid": False},
        ),
    )


def plotly_charts(m: AdminMonth) -> dict[str, str]:
    """name -> the chart's HTML (<div> and the <script> that draws it), only for charts with data.

    The names are those of the e-mail's static charts, so one template (`_admin_body.html`) places both.
    Horizontal bars are listed bottom-up by Plotly: the lists are reversed to put the largest on top.
    """
    charts = {
        "labs": _labs(m),
        "partitions": _partitions(m),
        "weeks": _weeks(m),
        "util": _util(m),
        "idle": _idle(m),
        "intensity": _intensity(m),
        **{f"carbon_week_{k}": _week(f"carbon_week_{k}", z) for k, z in enumerate(m.carbon_week)},
        "shift": _shift(m),
        "models": _models(m),
        "waste_trend": _waste_trend(m),
        "before-after": _before_after(m),
    }
    return {name: html for name, html in charts.items() if html is not None}


# the x axis of the horizontal energy bars
KWH_AXIS = {"title": {"text": "kWh"}}


def _labs(m: AdminMonth) -> str | None:
    """Energy by lab (the 25 largest), measured and estimated stacked."""
    labs = list(reversed(m.by_lab[:25]))
    if not labs:
        return None
    names = [_name(g.key, "(no account)") for g in labs]
    meas = [g.energy_kwh * (g.measured_share or 0.0) for g in labs]
    est = [g.energy_kwh - x for g, x in zip(labs, meas, strict=True)]
    extra = [[g.co2_kg, g.gpu_hours, g.jobs] for g in labs]
    hover = (
        "%{y}: %{x:,.1f} kWh %{fullData.name}<br>the lab: %{customdata[0]:,.1f} kg CO2e, "
        "%{customdata[1]:,.0f} GPU-h, %{customdata[2]} jobs<extra></extra>"
    )
    h = {"orientation": "h", "customdata": extra}
    return _div(
        "labs",
        [
            _bar("measured", meas, names, "measured", hover, **h),
            _bar("estimated", est, names, "estimated", hover, **h),
        ],
        _layout(
            "Energy by lab",
            "IT energy before PUE, measured and estimated",
            barmode="stack",
            height=_height(len(labs)),
            xaxis=KWH_AXIS,
        ),
    )


def _partitions(m: AdminMonth) -> str | None:
    """Energy by partition (the 25 largest), measured and estimated stacked."""
    cov = list(reversed(m.coverage[:25]))
    if not cov:
        return None
    names = [_name(c.partition, "(none)") for c in cov]
    h = {"orientation": "h"}
    return _div(
        "partitions",
        [
            _bar("measured", [c.measured_kwh for c in cov], names, "measured", KWH_H, **h),
            _bar("estimated", [c.estimated_kwh for c in cov], names, "estimated", KWH_H, **h),
        ],
        _layout(
            "Energy by partition",
            "measured and estimated, IT energy before PUE",
            barmode="stack",
            height=_height(len(cov)),
            xaxis=KWH_AXIS,
        ),
    )


def _weeks(m: AdminMonth) -> str | None:
    """Energy per ISO week, with the GPU utilisation as a line on a right-hand axis where it is known."""
    weeks = list(m.by_week)
    if not weeks:
        return None
    x = [
        f"{w.first:%d %b}" + (f"-{w.last:%d %b}" if w.last != w.first else "") + ("*" if w.partial else "")
        for w in weeks
    ]
    hover = "%{x}: %{y:,.1f} kWh, %{customdata[0]:,.1f} kg CO2e, %{customdata[1]:,.0f} GPU-h<extra></extra>"
    data = [
        _bar(
            "energy (kWh)",
            x,
            [w.energy_kwh for w in weeks],
            "energy",
            hover,
            customdata=[[w.co2_kg, w.gpu_hours] for w in weeks],
        )
    ]
    if any(w.gpu_util_pct is not None for w in weeks):
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "GPU utilisation (%)",
                "x": x,
                "yaxis": "y2",
                "y": [w.gpu_util_pct for w in weeks],
                "line": {"color": _rgb(COLOURS["util"])},
                "hovertemplate": "%{x}: GPU utilisation %{y:.0f}%<extra></extra>",
            }
        )
    y2 = {  # no title: the legend names the line, and a title on the right crowds a phone's width
        "automargin": True,
        "ticksuffix": "%",
        "overlaying": "y",
        "side": "right",
        "range": [0, 100],
        "tickmode": "linear",
        "dtick": 25,
        "showgrid": False,
    }
    return _div(
        "weeks",
        data,
        _layout(
            "Energy per week",
            f"ISO weeks (from Monday) within {m.month.start:%B %Y}"
            + ("; * fewer than 7 days of data" if any(w.partial for w in weeks) else ""),
            yaxis={"title": {"text": "kWh"}},
            yaxis2=y2,
        ),
    )


def _util(m: AdminMonth) -> str | None:
    """The GPU-hours of GPU jobs by their energy-weighted utilisation, in bins."""
    hist = m.util_histogram
    if not any(b.gpu_hours > 0 for b in hist.bins):
        return None
    note = f"; {hours(hist.unsampled_gpu_hours)} without samples not shown" if hist.unsampled_jobs else ""
    return _div(
        "util",
        [
            _bar(
                "GPU-hours",
                [f"{b.lo:.0f}-{b.hi:.0f}%" for b in hist.bins],
                [b.gpu_hours for b in hist.bins],
                "energy",
                "%{x}: %{y:,.0f} GPU-h in %{customdata} jobs<extra></extra>",
                customdata=[b.jobs for b in hist.bins],
            )
        ],
        _layout(
            "GPU utilisation of GPU jobs",
            "GPU-hours by the job's energy-weighted utilisation" + note,
            xaxis={"title": {"text": "utilisation"}},
            yaxis={"title": {"text": "GPU-hours"}},
        ),
    )


def _idle(m: AdminMonth) -> str | None:
    """The users whose allocated GPUs drew the most energy idle (the 25 first)."""
    idle = list(reversed(m.idle_by_user[:25]))
    if not idle:
        return None
    hover = (
        "%{y}: %{x:,.2f} kWh, %{customdata[2]:,.2f} kg CO2e<br>%{customdata[0]:,.1f} idle GPU-h, "
        "%{customdata[1]:.0f}% of their GPU-hours<extra></extra>"
    )
    extra = [[w.idle_gpu_hours, (w.idle_share or 0.0) * 100, w.idle_co2_kg] for w in idle]
    return _div(
        "idle",
        [
            _bar(
                "idle GPU energy",
                [w.idle_kwh for w in idle],
                [_name(w.key, "?") for w in idle],
                "idle",
                hover,
                orientation="h",
                customdata=extra,
            )
        ],
        _layout(
            "Idle GPUs: top users",
            f"GPUs under {pct(m.basis.idle_threshold_pct)} utilisation while allocated",
            height=_height(len(idle)),
            xaxis={"title": {"text": "kWh drawn by idle GPUs"}},
        ),
    )


def _intensity(m: AdminMonth) -> str | None:
    """The carbon intensity used per UTC day, a line per zone."""
    zones = [z for z in m.intensity if z.daily]
    if not zones:
        return None
    lines = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": _name(z.zone, "unknown zone"),
            "x": [d.day.isoformat() for d in z.daily],
            "y": [d.g_per_kwh for d in z.daily],
            "line": {"color": _rgb(CYCLE[k % len(CYCLE)])},
            "hovertemplate": "%{x}: %{y:,.0f} g CO2e/kWh<extra>%{fullData.name}</extra>",
        }
        for k, z in enumerate(zones)
    ]
    return _div(
        "intensity",
        lines,
        _layout(
            "Carbon intensity used",
            "per UTC day, weighted by the energy of the jobs that ran",
            yaxis={"title": {"text": "g CO2e/kWh"}, "rangemode": "tozero"},
        ),
    )


def _shift(m: AdminMonth) -> str | None:
    """Month by month, the CO2 of the jobs that could have waited: as they ran, at their best start and
    pausing."""
    shifts = list(m.shift_trend)
    if not shifts:
        return None
    x = [f"{w.month.start:%b %Y}" + ("*" if w.data_days < len(w.month.days()) else "") for w in shifts]
    bars = (
        ("as they ran", "co2", lambda w: w.co2_kg, lambda w: 0.0),
        ("at the best start", "after", lambda w: w.best_start_kg, lambda w: (w.saved_share or 0.0) * 100),
        ("pausing", "pause", lambda w: w.paused_kg, lambda w: (w.pause_saved_share or 0.0) * 100),
    )
    return _div(
        "shift",
        [
            _bar(
                label,
                x,
                [f(w) for w in shifts],
                colour,
                "%{x}: %{y:,.1f} kg CO2e, %{customdata:.0f}% less<extra>" + label + "</extra>",
                customdata=[less(w) for w in shifts],
            )
            for label, colour, f, less in bars
        ],
        _layout(
            "The jobs that could have waited: CO2 as they ran and at their best start",
            "operational CO2 of the jobs with when-to-run figures; best start: each at its cleanest "
            "hour within its slack; pausing: run in the cleanest hours of that window"
            + ("; * a month the data covers in part" if "*" in "".join(x) else ""),
            barmode="group",
            yaxis={"title": {"text": "kg CO2e"}, "rangemode": "tozero"},
        ),
    )


def _models(m: AdminMonth) -> str | None:
    """Energy by ML model (the 25 largest)."""
    models = list(reversed(m.models[:25]))
    if not models:
        return None
    hover = (
        "%{y}: %{x:,.1f} kWh, %{customdata[0]:,.2f} kg CO2e<br>%{customdata[1]} jobs of "
        "%{customdata[2]} users, %{customdata[3]:,.0f} GPU-h<extra></extra>"
    )
    labels = [
        ("no model name declared" if x.model_name == UNNAMED else _name(x.model_name, UNNAMED))
        + (f" ({_name(x.framework, '')})" if x.framework else "")
        for x in models
    ]
    return _div(
        "models",
        [
            _bar(
                "energy",
                [x.energy_kwh for x in models],
                labels,
                "energy",
                hover,
                orientation="h",
                customdata=[[x.co2_kg, x.jobs, x.users, x.gpu_hours] for x in models],
            )
        ],
        _layout(
            "Energy by ML model",
            "jobs whose model is recorded (job comment, in-job API or detected), IT energy before PUE",
            height=_height(len(models)),
            xaxis=KWH_AXIS,
        ),
    )


def _waste_trend(m: AdminMonth) -> str | None:
    """Month by month, the energy that did no work per day of data (two months at least)."""
    trend = list(m.waste_trend)
    if len(trend) <= 1:
        return None
    x = [f"{w.month.start:%b %Y}" + ("*" if w.data_days < len(w.month.days()) else "") for w in trend]
    parts = (
        ("idle GPUs", "idle", lambda w: w.idle_kwh),
        ("failed, out of memory", "failed", lambda w: w.failed_kwh + w.oom_kwh),
        ("cancelled", "before", lambda w: w.cancelled_kwh),
    )
    return _div(
        "waste_trend",
        [
            _bar(
                label,
                x,
                [f(w) / w.data_days for w in trend],
                colour,
                f"%{{x}}: %{{y:,.2f}} kWh a day<extra>{label}</extra>",
            )
            for label, colour, f in parts
        ],
        _layout(
            "Energy that did no work, month by month",
            "kWh per day of data (* months the data covers in part), each kWh counted once; the"
            " time-limit part (possibly lost) is not in it",
            barmode="stack",
            yaxis={"title": {"text": "kWh per day"}},
        ),
    )


def _before_after(m: AdminMonth) -> str | None:
    """The idle share and GPU utilisation of the users who got a first report, before and after it; the
    "after" bars green where the change is good news, orange where it is not."""
    ba = m.before_after
    if ba is None or not ba.users or ba.idle_share_before is None or ba.gpu_util_before is None:
        return None
    cats = ["idle share of GPU-hours (%)", "GPU utilisation (%)"]
    before = [ba.idle_share_before * 100, ba.gpu_util_before]
    after = [(ba.idle_share_after or 0.0) * 100, ba.gpu_util_after or 0.0]
    sub = f"{len(ba.users)} users, {ba.window_days} days each side; observational, not a controlled effect"
    tones = [
        before_after_tone(before[0], after[0], "less"),
        before_after_tone(before[1], after[1], "more"),
    ]
    colours = [_rgb(COLOURS["after" if t == "good" else "worse" if t == "bad" else "before"]) for t in tones]
    after_bar = _bar(
        "after (green: better, orange: worse)", cats, after, "after", "%{x}: %{y:.1f}<extra>after</extra>"
    )
    after_bar["marker"] = {"color": colours}
    return _div(
        "before-after",
        [_bar("before", cats, before, "before", "%{x}: %{y:.1f}<extra>before</extra>"), after_bar],
        _layout(
            "Before and after first reports",
            sub,
            barmode="group",
            yaxis={"title": {"text": "%"}, "rangemode": "tozero"},
        ),
    )
