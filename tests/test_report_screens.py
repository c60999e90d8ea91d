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

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from sqlalchemy import text

from cocaq.config import Config
from cocaq.db import migrate
from cocaq.db.engine import make_engine
from cocaq.reports import admin_report, job_report, lab_report, render, user_report
from cocaq.reports.suggest import suggest_for_user
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
    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    reason = (
        f"Chromium not found ({CHROMIUM}): scripts/test.sh installs Debian's chromium when run as root "
        "(apt-get install chromium); set COCAQ_SKIP_SCREENSHOTS=1 to skip these tests on a machine without it"
    )
    if os.environ.get("COCAQ_SKIP_SCREENSHOTS") == "1":
        pytest.skip(reason)
    pytest.fail(reason)


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
