"""How the web app's answers are made: Jinja2 pages (autoescaped; a site may override any template
in `[reports] template_dir`/web), JSON and CSV downloads, the static files and the Plotly charts.

Charts: Plotly's own bundled JavaScript, served from the installed package (no CDN: the app works
offline); each chart's figure travels in an inert `<script type="application/json">` block that
cocaq.js reads, so the page runs no inline script and no text of the user's is ever code.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cocaq.units import S_PER_HOUR
from cocaq.web.http import Answer, HttpError, Request

if TYPE_CHECKING:
    from jinja2 import Environment

    from cocaq.config import Config

HERE = Path(__file__).resolve().parent
HTML = "text/html; charset=utf-8"
COLOURS = {
    "energy": "#2563eb",
    "util": "#d97706",
    "gpu": "#2563eb",
    "cpu": "#0891b2",
    "dram": "#7c3aed",
    "other": "#94a3b8",
}  # fmt: skip  (reports/charts.py's, as CSS colours)


@lru_cache(maxsize=4)
def environment(template_dir: str | None) -> Environment:
    from jinja2 import ChainableUndefined, ChoiceLoader, Environment, FileSystemLoader

    from cocaq.footprint.advice_words import co2, co2_amount, hours, intensity, num
    from cocaq.footprint.totals_rows import kwh_text
    from cocaq.footprint.words import component_words, source_words
    from cocaq.reports.wording import pct, share

    dirs = [str(Path(template_dir) / "web")] if template_dir else []
    env = Environment(
        loader=ChoiceLoader([FileSystemLoader([*dirs, str(HERE / "templates")])]),
        autoescape=True,
        undefined=ChainableUndefined,  # (optional fields of the API's answers)
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        num=num, kwh=lambda v: kwh_text(float(v or 0.0)), co2=co2, co2_amount=lambda v: co2_amount(v or 0.0),
        pct=pct, share=share, hours=hours, intensity=intensity, when=when_text, ago=ago,
        component=component_words, source=source_words,
    )  # fmt: skip
    env.globals.update(trend=trend_text, change_text=change_text, id_of=id_of)
    return env


def id_of(label: str) -> str:
    import hashlib

    return "fig-" + hashlib.sha1(label.encode()).hexdigest()[:10]


def trend_text(now: float, before: float) -> str:
    """`12% more`, `8% less`, `about the same` (under 5%, as the e-mails' trend reads it)."""
    if not before:
        return "n/a"
    r = now / before - 1
    if abs(r) < 0.05:
        return "about the same"
    return f"{abs(r):.0%} {'more' if r > 0 else 'less'}"


def change_text(c: dict[str, Any]) -> str:
    """A month's Change (reports.data) in words: `12% more`, `8% less`."""
    pct = c.get("pct")
    if pct is None:
        return "n/a"
    if abs(pct) < 5:
        return "about the same"
    return f"{abs(pct):.0f}% {'more' if pct > 0 else 'less'}"


def when_text(iso: str | None) -> str:
    """An ISO time as `2026-11-07 08:47 UTC` (the e-mails' and the terminal's way)."""
    if not iso:
        return "-"
    t = datetime.fromisoformat(iso).astimezone(UTC)
    return f"{t:%Y-%m-%d %H:%M} UTC"


def ago(iso: str | None, now: datetime | None = None) -> str:
    """`14 min ago`, `3 h ago`, `2 days ago`; `never` for None."""
    if not iso:
        return "never"
    s = ((now or datetime.now(UTC)) - datetime.fromisoformat(iso)).total_seconds()
    if s < 90:
        return "just now"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    if s < 48 * S_PER_HOUR:
        return f"{s / S_PER_HOUR:.0f} h ago"
    return f"{s / 86400:.0f} days ago"


def page(req: Request, template: str, *, title: str, **ctx: Any) -> Answer:
    """A whole page: the template inside the frame (navigation, freshness, downloads, docs)."""
    from cocaq.web.reader import Refused

    try:
        fresh: dict[str, Any] | None = req.reader.get(("status",))
    except Refused:
        fresh = None
    html = (
        _env(req)
        .get_template(template)
        .render(req=req, title=title, fresh=fresh, downloads=_downloads(req), **ctx)
    )
    return Answer(200, html.encode(), HTML)


def fragment(template: str, req: Request, **ctx: Any) -> str:
    return str(_env(req).get_template(template).render(req=req, **ctx))


def error(cfg: Config, root: str, status: int, reason: str, headers: tuple[tuple[str, str], ...]) -> Answer:
    env = environment(cfg.reports.template_dir)
    html = env.get_template("error.html").render(root=root, status=status, reason=reason)
    return Answer(status, html.encode(), HTML, headers)


def _env(req: Request) -> Environment:
    return environment(req.environ.get("cocaq.template_dir"))


def _downloads(req: Request) -> dict[str, str]:
    q = {k: v for k, v in req.query.items() if k != "format"}
    return {f: req.url(req.path, **q, format=f) for f in ("json", "csv")}


def json_answer(d: Any) -> Answer:
    body = json.dumps(d, indent=2, ensure_ascii=False, default=str).encode()
    return Answer(200, body + b"\n", "application/json; charset=utf-8")


def csv_answer(rows: Iterable[Sequence[Any]], name: str) -> Answer:
    """CSV for a spreadsheet: a cell a spreadsheet would run as a formula starts with a quote."""
    from cocaq.textsafe import csv_text

    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for r in rows:
        w.writerow(["" if v is None else csv_text(v) if isinstance(v, str) else v for v in r])
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80]
    disposition = ("Content-Disposition", f'attachment; filename="cocaq-{safe}.csv"')
    return Answer(200, out.getvalue().encode(), "text/csv; charset=utf-8", (disposition,))


# --- static files -----------------------------------------------------------------------------------------


def static(req: Request, m: re.Match[str]) -> Answer:
    name = m["name"]
    body = _static(name)
    kind = "text/css; charset=utf-8" if name.endswith(".css") else "text/javascript; charset=utf-8"
    return Answer(200, body, kind, (("Cache-Control", "public, max-age=86400"),))


@lru_cache(maxsize=8)
def _static(name: str) -> bytes:
    if name == "plotly.js":
        import plotly.offline

        return plotly.offline.get_plotlyjs().encode()
    path = HERE / "static" / name
    if not path.is_file():
        raise HttpError(404, f"no static file {name!r}")
    return path.read_bytes()


# --- charts -----------------------------------------------------------------------------------------------


def figure_json(fig: dict[str, Any]) -> str:
    """A figure as text for an inert JSON block: `<`, `>` and `&` escaped, so no `</script>` in a name
    can end the block."""
    text = json.dumps(fig, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _layout(title: str, unit: str) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 15}},
        "margin": {"l": 48, "r": 12, "t": 40, "b": 40},
        "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
        "height": 300,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
    }


def daily_chart(days: Sequence[tuple[str, float]], title: str) -> str | None:
    """kWh per day as bars; None with no day of energy."""
    if not any(v for _, v in days):
        return None
    bars = {
        "type": "bar",
        "x": [d for d, _ in days],
        "y": [v for _, v in days],
        "name": "energy",
        "marker": {"color": COLOURS["energy"]},
        "hovertemplate": "%{x}: %{y:.3s} kWh<extra></extra>",
    }
    fig = {"data": [bars], "layout": _layout(title, "kWh per UTC day")}
    return figure_json(fig)


def parts_chart(job: dict[str, Any]) -> str | None:
    """A job's energy by part (GPUs, CPUs, memory, the rest), measured and estimated apart."""
    from cocaq.footprint.words import component_words

    by: dict[tuple[str, str], float] = {}
    for e in job.get("energies", []):
        key = (str(e.get("component")), str(e.get("method")))
        by[key] = by.get(key, 0.0) + float(e.get("energy_kwh") or 0.0)
    if not any(by.values()):
        return None
    parts = sorted({c for c, _ in by})
    data = [
        {"type": "bar", "name": method, "x": [component_words(c) for c in parts],
         "y": [by.get((c, method), 0.0) for c in parts],
         "marker": {"color": COLOURS["energy"] if method == "measured" else "#93c5fd"},
         "hovertemplate": "%{x}: %{y:.3s} kWh<extra>" + method + "</extra>"}
        for method in sorted({m for _, m in by})
    ]  # fmt: skip
    layout = _layout(f"Job {job.get('job_id')}: energy by part", "kWh") | {"barmode": "stack"}
    return figure_json({"data": data, "layout": layout})


def email_body(html: str) -> Any:
    """The e-mail's body, to show inside a page: our own rendering (autoescaped when it was made), so
    it is markup already, without its <html>/<head> frame."""
    from markupsafe import Markup

    m = re.search(r"<body[^>]*>(.*)</body>", html, re.S | re.I)
    return Markup(m.group(1) if m else html)
