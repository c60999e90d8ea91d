"""The rendered reports as a person sees them: opened in headless Chromium at phone and desktop widths.

Each e-mail's HTML (its cid: charts swapped for data: URIs, as a mail client shows them) and the admins'
interactive page are opened, screenshotted and read back (`--dump-dom`). A page fails when it is blank
(nearly every pixel one colour), wider than the window (a table or chart that overflows a phone), shows
a broken image, or, for the interactive page, when Plotly drew no chart. Chromium runs with name
resolution disabled, so anything the pages tried to fetch from the network would not load.

Screenshots stay under pytest's tmp dir and are copied to $COCAQ_SCREENSHOT_DIR when it is set. Chromium
comes from Debian (`scripts/test.sh` installs it as root); where it is missing this module fails and
says why, unless COCAQ_SKIP_SCREENSHOTS=1 asks to skip it (a workstation without Chromium).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from cocaq.config import Config
from cocaq.db import migrate
from cocaq.db.engine import make_engine
from cocaq.reports import admin_report, job_report, lab_report, render, user_report
from cocaq.reports.suggest import suggest_for_user
from tests.conftest import built_demo
from tests.test_report_data import MONTH, at, build_month, config

CHROMIUM = os.environ.get("COCAQ_CHROMIUM", "/usr/bin/chromium")
PHONE, DESKTOP = 375, 1200  # an iPhone SE-class screen: the narrowest in common use
EVIL = '"><img src=x onerror=alert(1)>'

# Measures the page once it has loaded (only in the copies opened here: the e-mails have no script) and
# tells the page around it (`HOST`), whose DOM Chromium dumps.
PROBE = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var imgs = Array.prototype.slice.call(document.images);
  parent.postMessage(JSON.stringify({
    scroll: document.documentElement.scrollWidth, width: window.innerWidth,
    height: document.documentElement.scrollHeight,
    images: imgs.length, broken: imgs.filter(function (i) { return !i.complete || !i.naturalWidth; }).length,
    scripts: document.scripts.length - 1, injected: document.querySelectorAll("img[onerror], [onload]").length,
    plots: document.querySelectorAll(".plot-container").length,
    svgs: document.querySelectorAll("svg.main-svg").length,
    points: document.querySelectorAll(".point").length
  }), "*");
}, 300); });
</script>"""
# Headless Chromium lays pages out at least 500 px wide whatever --window-size says: a phone's width is
# given to the report by an <iframe> of that width in this host page.
HOST = """<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0;background:#fff">
<iframe src="{src}" style="display:block;width:{width}px;height:{height}px;border:0"></iframe>
<script>window.addEventListener("message", function (e) {{ document.body.setAttribute("data-probe", e.data); }});
</script></body></html>"""


def _chromium() -> str:
    from tests.browserkit import chromium

    return chromium()


def _run(page: Path, window: tuple[int, int], *, screenshot: Path | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="cocaq-chromium-") as profile:
        args = [
            _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--allow-file-access-from-files", f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}",
            "--virtual-time-budget=15000",
        ]  # fmt: skip
        args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        p = subprocess.run([*args, page.as_uri()], capture_output=True, text=True, timeout=180, check=False)
    ok = screenshot.exists() if screenshot is not None else "<html" in p.stdout
    assert p.returncode == 0 and ok, f"chromium failed on {page}: {p.stderr[-2000:]}"
    return p.stdout


def look(page: Path, width: int, png: Path) -> dict[str, int]:
    """Open `page` `width` px wide: what the probe in it measured, and a screenshot of all of it (up to
    12,000 px) in `png`."""
    import json

    from PIL import Image

    host = page.with_name(f"{page.stem}-host-{width}.html")
    host.write_text(HOST.format(src=page.name, width=width, height=900))
    m = re.search(r'data-probe="([^"]*)"', _run(host, (max(width, 500), 900)))
    assert m, f"{page.name} at {width}px: the page did not finish loading"
    probe: dict[str, int] = json.loads(m.group(1).replace("&quot;", '"'))
    height = min(probe["height"] + 20, 12_000)
    host.write_text(HOST.format(src=page.name, width=width, height=height))
    _run(host, (max(width, 500), height), screenshot=png)
    with Image.open(png) as img:
        img.crop((0, 0, width, min(height, img.height))).save(png)
    return probe


def not_blank(png: Path) -> float:
    """The share of the most common colour; fails when the page is (nearly) one colour."""
    from PIL import Image

    img = Image.open(png).convert("RGB")
    small = img.resize((img.width // 4, img.height // 4))
    colours = small.getcolors(1 << 24) or []
    top = max(n for n, _ in colours) / (small.width * small.height)
    assert top < 0.97 and len(colours) > 50, (
        f"{png.name}: blank ({top:.1%} one colour, {len(colours)} colours)"
    )
    return top


def keep(png: Path) -> None:
    target = os.environ.get("COCAQ_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy2(png, Path(target) / png.name)


@dataclass
class Pages:
    dir: Path
    emails: dict[str, render.Rendered]
    interactive: Path
    charts: int


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    """The March 2025 month of tests/test_report_data.py rendered (SQLite: test_render.py checks that both
    databases give the same reports), with a lab and a job named to break markup if anything could."""
    _chromium()
    tmp = tmp_path_factory.mktemp("screens")
    url = f"sqlite:///{tmp / 'cocaq.sqlite'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    cfg: Config = config(
        tmp,
        url,
        '[reports]\nsite_name = "HAL"\ncontact = "hpc-help@example.org"\n'
        "[advice]\nmin_kwh = 0.1\n",  # a month of a few kWh: a tenth of a kWh is worth a line here
    )
    build_month(engine, cfg)
    with engine.connect() as conn:
        um = user_report.user_month(conn, cfg, "alice", MONTH)
        lab = lab_report.lab_month(conn, cfg, "lab_a", MONTH)
        adm = admin_report.admin_month(conn, cfg, MONTH, first_report={"alice": at(15, 12)}, window_days=7)
        pks = dict(conn.execute(text("SELECT job_id_raw, id FROM jobs")).all())
        jobs = [job_report.job_footprint(conn, cfg, pks[raw]) for raw in (101, 102, 502)]
    engine.dispose()
    adm = replace(adm, by_lab=(replace(adm.by_lab[0], key=EVIL), *adm.by_lab[1:]))
    jobs[0] = replace(jobs[0], name="<script>alert(1)</script>")
    emails = {
        "user": render.render_user_month(um, suggest_for_user(um, cfg), cfg),
        "lab": render.render_lab_month(lab, cfg),
        "admin-email": render.render_admin_email(adm, cfg),
        "job": render.render_jobs(jobs[:1], cfg),
        "jobs": render.render_jobs(jobs, cfg),
    }
    for name, r in emails.items():
        (tmp / f"{name}.html").write_text(
            render.inline_images(r.html, r.images).replace("</body>", PROBE + "</body>")
        )
    interactive = tmp / "admin-interactive.html"
    page = render.render_admin_html(adm, cfg)
    interactive.write_text(page)
    yield Pages(tmp, emails, interactive, page.count("Plotly.newPlot"))


@pytest.mark.parametrize("name", ["user", "lab", "admin-email", "job", "jobs"])
def test_email_renders_on_a_phone_and_a_desktop(pages: Pages, name: str) -> None:
    page = pages.dir / f"{name}.html"
    with ThreadPoolExecutor(2) as pool:
        probes = {w: pool.submit(look, page, w, pages.dir / f"{name}-{w}px.png") for w in (PHONE, DESKTOP)}
        got = {w: f.result() for w, f in probes.items()}
    for w, probe in got.items():
        png = pages.dir / f"{name}-{w}px.png"
        not_blank(png)
        keep(png)
        assert probe["width"] == w, probe
        # nothing wider than the screen: tables wrap, charts shrink
        assert probe["scroll"] <= w, f"{name} at {w}px overflows: {probe}"
        # every chart shows (by data: URI here, by cid: in a mail client); names like markup stayed text
        assert probe["broken"] == 0 and probe["images"] == len(pages.emails[name].images), probe
        assert probe["scripts"] == 0 and probe["injected"] == 0, probe


def test_interactive_admin_page_draws_its_charts(pages: Pages) -> None:
    page = pages.interactive
    page.write_text(_with_probe(page.read_text()))
    with ThreadPoolExecutor(2) as pool:
        probes = {
            w: pool.submit(look, page, w, pages.dir / f"admin-interactive-{w}px.png")
            for w in (PHONE, DESKTOP)
        }
        got = {w: f.result() for w, f in probes.items()}
    # seven of the month, the ML models (issue 6), the waste trend (issue 15), each zone's intensity by
    # weekday and hour and the jobs that could have waited (issue 21)
    assert pages.charts == 11
    for w, probe in got.items():
        png = pages.dir / f"admin-interactive-{w}px.png"
        not_blank(png)
        keep(png)
        # Plotly drew every chart: its plot container, SVG layers, bars and points
        assert probe["plots"] == pages.charts, (
            f"Plotly drew {probe['plots']} of {pages.charts} charts at {w}px"
        )
        assert probe["svgs"] >= 2 * pages.charts and probe["points"] > 20, probe
        assert probe["scroll"] <= w, f"the interactive page at {w}px overflows: {probe}"
        # the lab named like markup is text on the page and in the charts: no element came of it
        assert probe["injected"] == 0, probe


def _with_probe(page: str) -> str:
    """The probe before the page's own </body> (plotly.js, earlier in the file, mentions </body> too)."""
    if PROBE in page:
        return page
    i = page.rindex("</body>")
    return page[:i] + PROBE + page[i:]


# What a phone would cut, measured once the page has laid out: every table's box (the table, or the box
# around it that scrolls sideways), every chart's SVG, its plot area, tick labels, axis titles and legend,
# and every image, as far as each reaches past the window's edge; and, at any width, the tables that
# need to scroll in their box.
CUT = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var W = window.innerWidth, cut = [], scrolled = [];
  function box(e) {
    for (var a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      var o = getComputedStyle(a).overflowX;
      if (o === "auto" || o === "scroll") { return a; }
    }
    return e;
  }
  function what(e) {
    var c = e.closest(".plotly-graph-div"), t = (e.textContent || "").replace(/\\s+/g, " ").trim();
    return (c ? c.id + " " : "") + e.tagName.toLowerCase() + " " + t.slice(0, 40);
  }
  function check(e, b) {
    var r = b.getBoundingClientRect();
    if (r.width > 0 && (r.left < -0.5 || r.right > W + 0.5)) {
      cut.push(what(e) + " [" + Math.round(r.left) + ", " + Math.round(r.right) + "]");
    }
  }
  document.querySelectorAll("table").forEach(function (t) {
    var b = box(t);
    check(t, b);
    if (b !== t && b.scrollWidth > b.clientWidth + 1) { scrolled.push(what(t)); }
  });
  document.querySelectorAll("img, .plotly-graph-div, svg.main-svg, .nsewdrag, .xtick text, .ytick text, " +
      ".y2tick text, .g-xtitle, .g-ytitle, .legend, .colorbar").forEach(function (e) { check(e, e); });
  parent.postMessage(JSON.stringify({
    scroll: document.documentElement.scrollWidth, width: W, height: document.documentElement.scrollHeight,
    plots: document.querySelectorAll(".plot-container").length, scripts: document.scripts.length - 1,
    cut: cut, scrolled: scrolled
  }), "*");
}, 300); });
</script>"""


@pytest.fixture(scope="module")
def demo_reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reports `cocaq demo` writes (its admin page and e-mail have the demo's wider tables: estimated
    ranges, long partition and model names), through the real CLI into a database of their own."""
    tmp = tmp_path_factory.mktemp("demo-screens")
    built_demo(tmp)
    return tmp / "demo" / "reports"


def _admin_pages(reports: Path) -> dict[str, Path]:
    """The demo's admin page and admin e-mail (its charts already data: URIs in the .html)."""
    (page,) = (p for p in reports.glob("admin-*.html") if not p.stem.endswith("-email"))
    (mail,) = reports.glob("admin-*-email.html")
    return {"admin-page": page, "admin-email": mail}


@pytest.mark.parametrize("name", ["admin-page", "admin-email"])
def test_demo_admin_report_fits_a_phone(demo_reports: Path, name: str) -> None:
    """Issue 32, point 9: at 375 px the partition table ran 37 px past the screen (and, in the e-mail,
    pushed every paragraph and chart of the card past it too). Nothing may reach past a phone's edge: a
    table too wide scrolls in its own box, charts shrink to the screen with their labels and legends on
    it; on a desktop nothing scrolls at all, the layout as before."""
    src = _admin_pages(demo_reports)[name]
    page = demo_reports.parent / "screens" / f"{name}.html"  # beside the reports: not one of them
    page.parent.mkdir(exist_ok=True)
    html = src.read_text()
    i = html.rindex("</body>")
    page.write_text(html[:i] + CUT + html[i:])
    with ThreadPoolExecutor(2) as pool:
        probes = {
            w: pool.submit(look, page, w, page.with_name(f"{name}-{w}px.png")) for w in (PHONE, DESKTOP)
        }
        got: dict[int, Any] = {w: f.result() for w, f in probes.items()}
    for w, probe in got.items():
        png = page.with_name(f"{name}-{w}px.png")
        not_blank(png)
        keep(png)
        assert probe["width"] == w, probe
        assert probe["scroll"] <= w, f"{name} at {w}px scrolls sideways: {probe['scroll']} px wide"
        assert probe["cut"] == [], f"{name} at {w}px cuts: {probe['cut']}"
        if name == "admin-page":
            assert probe["plots"] >= 10, probe  # Plotly drew the charts that were measured
        else:
            assert probe["scripts"] == 0, probe  # the e-mail has no script of its own
    assert got[DESKTOP]["scrolled"] == [], got[DESKTOP]  # a desktop shows every table whole


class _Tables(HTMLParser):
    """Each data table (one with a <th>) of a page, and whether a box around it scrolls sideways."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, bool]] = []  # open <div>s and <table>s: tag, whether it scrolls
        self.open: list[dict[str, Any]] = []
        self.tables: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        style = (dict(attrs).get("style") or "").replace(" ", "").lower()
        if tag in ("div", "table"):
            self.stack.append((tag, "overflow-x:auto" in style or "overflow-x:scroll" in style))
        if tag == "table":
            self.open.append({"wrapped": any(s for _, s in self.stack), "th": 0, "line": self.getpos()[0]})
        elif tag == "th" and self.open:
            self.open[-1]["th"] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("div", "table"):
            while self.stack and self.stack.pop()[0] != tag:
                pass
        if tag == "table" and self.open:
            t = self.open.pop()
            if t["th"]:
                self.tables.append(t)


def _plots(page: str) -> list[tuple[Any, Any]]:
    """Each Plotly.newPlot(id, data, layout, config) of a page: its layout and config."""
    dec = json.JSONDecoder()
    out = []
    for m in re.finditer(r"Plotly\.newPlot\(", page):
        args, i = [], m.end()
        for _ in range(4):
            while page[i] in " \n\t,":
                i += 1
            value, i = dec.raw_decode(page, i)
            args.append(value)
        out.append((args[2], args[3]))
    return out


def test_demo_admin_markup_is_made_for_a_phone(demo_reports: Path) -> None:
    """The same, without a browser: every Plotly chart resizes with its box (responsive, autosize, no
    fixed width), nothing on the page is given a width a phone lacks, and every data table of the page
    and of the e-mail sits in a box that scrolls sideways (an inline style: mail clients drop <style>)."""
    pages = {k: p.read_text() for k, p in _admin_pages(demo_reports).items()}
    page = pages["admin-page"]
    plots = _plots(page)
    assert len(plots) == page.count("Plotly.newPlot") >= 10
    for layout, cfg in plots:
        assert cfg.get("responsive") is True and layout.get("autosize") is True, (layout, cfg)
        assert "width" not in layout and layout["legend"]["orientation"] == "h", layout
    for style in re.findall(r'class="plotly-graph-div" style="([^"]*)"', page):
        assert "width:100%" in style.replace(" ", ""), style
    for name, html in pages.items():
        markup = re.sub(r"<script\b.*?</script>", "", html, flags=re.S | re.I)
        widths = [int(px) for px in re.findall(r"(?<![\w-])(?:min-)?width:\s*(\d+)px", markup)]
        assert all(px <= PHONE for px in widths), f"{name}: a width wider than a phone: {widths}"
        p = _Tables()
        p.feed(html)
        assert len(p.tables) >= 10, (name, len(p.tables))
        bare = [t["line"] for t in p.tables if not t["wrapped"]]
        assert bare == [], f"{name}: the tables on lines {bare} have no box that scrolls sideways"
    assert "<script" not in pages["admin-email"]
