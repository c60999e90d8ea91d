"""The web app (cocaq.web) in a real browser: headless Chromium, over the DevTools protocol
(tests/browserkit.py), against `cocaq demo`'s site served by a real WSGI server behind a stand-in for the
authenticating proxy (it sets REMOTE_USER, as `cocaq web --trust-proxy-user` expects).

What only a browser shows: Plotly draws the charts under the page's strict CSP (script-src 'self'),
nothing reaches past a phone's screen (375 px), no page logs an error or breaks its CSP, the figures are
the ones the terminal prints (`cocaq user`, `cocaq job` run against the same database), axe-core finds no
WCAG 2 A/AA violation, the keyboard reaches everything in order with the focus visible, and job names
made to break the markup stay text. Screenshots stay under pytest's tmp dir and are copied to
$COCAQ_SCREENSHOT_DIR when it is set. Chromium comes from Debian (scripts/test.sh installs it as root);
without it this module fails and says why, unless COCAQ_SKIP_SCREENSHOTS=1.

The demo's users are no Unix accounts: each is served as `cocaq web --user NAME` serves them
(cocaq.web.wsgi.own_user_app, the in-process API vouching by name), the stand-in proxy choosing the app
by its REMOTE_USER; tests/test_web.py covers the proxy mode's own check of local users. No test makes
Unix users here: made in another order they would shift the uids other tests expect.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cocaq.accounting.importer import import_records
from cocaq.config_load import load_config
from cocaq.db.engine import make_engine
from cocaq.footprint.advice_words import co2, num
from cocaq.footprint.totals import Footprint
from cocaq.footprint.totals_rows import kwh_text, totals_rows
from cocaq.web.wsgi import own_user_app
from tests.browserkit import Browser, Page, Served, chromium, not_blank, serve
from tests.builders import job
from tests.conftest import DemoSite, built_demo

PHONE, DESKTOP = 375, 1280
# dave: the demo's heaviest GPU user, head of lab_nlp here; erin: the hostile jobs' user
USERS = ("dave", "erin")
AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
HOSTILE = {"770001": "<script>alert(1)</script>", "770002": '"><img src=x onerror=alert(1)>'}
NAV = ["My footprint", "My jobs", "When to run", "My labs", "Help"]


def by_user(cfg: Any) -> Callable[..., Iterable[bytes]]:
    """One app per user the stand-in proxy names (as `cocaq web --user NAME` serves each)."""
    apps: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        user = str(environ.get("REMOTE_USER") or "")
        if user not in apps:
            apps[user] = own_user_app(cfg, user)
        return apps[user](environ, start_response)  # type: ignore[no-any-return]

    return app


@dataclass
class Demo(DemoSite):
    month: str  # the demo's month, YYYY-MM (its e-mails')
    dave_job: str  # dave's job with the most energy in the last 30 days


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """`cocaq demo`'s site, and erin's two jobs named to break the markup, imported as sacct's would be."""
    chromium()  # (fails or skips before the demo is built, not after)
    tmp = tmp_path_factory.mktemp("web-browser")
    env, url = built_demo(tmp)
    cfg_path = tmp / "demo" / "cocaq-demo.toml"
    base = load_config(cfg_path, {})
    # the demo names its lab heads' addresses for the e-mails ([reports]); the API's lab heads are users
    cfg = replace(base, database_url=url, api=replace(base.api, lab_heads={"lab_nlp": ("dave",)}))
    (page,) = (
        p.name for p in (tmp / "demo" / "reports").glob("admin-*.html") if not p.stem.endswith("-email")
    )
    month = page.removeprefix("admin-").removesuffix(".html")
    now = datetime.now(UTC).replace(microsecond=0)
    engine = make_engine(url)
    import_records(
        engine,
        [job(int(raw), now - timedelta(hours=6 - i), 1, user="erin", account="lab_nlp", partition="gpu_a100",
             cluster="demo", gpus=1, name=name) for i, (raw, name) in enumerate(HOSTILE.items())],
        cfg,
        source="test",
    )  # fmt: skip
    engine.dispose()
    d = Demo(tmp, env, cfg, cfg_path, month, "")
    d.dave_job = str(d.json("user", "dave", "--since", "30d")["top_jobs"][0]["job_id"])
    return d


@pytest.fixture(scope="module")
def server(demo: Demo) -> Iterator[Served]:
    with serve(by_user(demo.cfg), "dave") as served:
        yield served


@pytest.fixture(scope="module")
def browser(demo: Demo) -> Iterator[Browser]:
    b = Browser()
    yield b
    b.close()


@pytest.fixture
def site(server: Served) -> Served:
    """The server, its requests as dave's (a test may sign in as someone else)."""
    server.user = "dave"
    return server


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    p = browser.page(DESKTOP)
    yield p
    p.close()


def keep(png: Path) -> None:
    target = os.environ.get("COCAQ_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy2(png, Path(target) / png.name)


def paths(demo: Demo) -> dict[str, str]:
    return {
        "footprint": "/",
        "month": f"/month/{demo.month}",
        "jobs": "/jobs",
        "job": f"/jobs/{demo.dave_job}",
        "when": "/when?hours=6&within=24",
        "lab": "/labs/lab_nlp",
    }


CHARTED = {"footprint", "month", "job"}  # pages where dave's figures make at least one chart

# --- every main page at a phone's and a desktop's width ------------------------------------------------


@pytest.mark.parametrize("width", [PHONE, DESKTOP])
@pytest.mark.parametrize("name", ["footprint", "month", "jobs", "job", "when", "lab"])
def test_the_page_draws_fits_and_logs_no_error(
    demo: Demo, site: Served, page: Page, tmp_path: Path, name: str, width: int
) -> None:
    page.resize(width)
    page.goto(site.url(paths(demo)[name]))  # (waits for Plotly to draw every chart)
    got = page.eval(
        "({h1: document.querySelector('main h1').textContent, who: document.querySelector('.who').textContent,"
        " width: innerWidth, scroll: document.documentElement.scrollWidth,"
        " figures: document.querySelectorAll('[data-figure]').length,"
        " drawn: document.querySelectorAll('[data-figure] .main-svg').length})"
    )
    png = page.screenshot(tmp_path / f"web-{name}-{width}px.png")
    keep(png)
    not_blank(png)
    assert got["h1"] != "Not found, or not yours" and got["who"] == "Signed in as dave", got
    assert got["width"] == width, got
    # tables too wide for a phone scroll in their own `.scroll` box; the page itself never sideways
    assert got["scroll"] <= got["width"] + 1, f"{name} at {width} px is {got['scroll']} px wide"
    if name in CHARTED:
        assert got["figures"] >= 1 and got["drawn"] >= got["figures"], got
    assert not page.problems.any(), f"{name} at {width} px: {page.problems}"


# --- the figures are the terminal's ----------------------------------------------------------------------

FIGURES_TABLE = """Array.from(document.querySelectorAll('table.figures')).filter(t =>
  t.caption && t.caption.textContent.startsWith(%s)).map(t => Array.from(t.tBodies[0].rows).map(r =>
  [r.cells[0].textContent, r.cells[1].textContent]))"""


def test_the_footprint_shows_what_cocaq_user_prints(demo: Demo, site: Served, page: Page) -> None:
    """The tiles and the totals read as `cocaq user dave --since 30d` words them. The window moves with
    the clock (a running job grows), so the page must equal the terminal of just before or just after."""
    before = demo.json("user", "dave", "--since", "30d")
    page.goto(site.url("/"))
    tiles = page.eval(
        "Object.fromEntries(Array.from(document.querySelectorAll('[data-figure-of]'))"
        ".map(e => [e.dataset.figureOf, e.textContent]))"
    )
    (rows,) = page.eval(FIGURES_TABLE % json.dumps("Totals"))
    after = demo.json("user", "dave", "--since", "30d")

    def words(d: dict[str, Any]) -> tuple[dict[str, str], list[list[str]]]:
        t = {"energy_kwh": kwh_text(d["energy_kwh"]), "co2_kg": co2(d["co2_kg"]),
             "gpu_hours": num(d["gpu_hours"]), "wasted_energy_kwh": kwh_text(d["wasted_energy_kwh"])}  # fmt: skip
        return t, [[k.strip(), v] for k, v in totals_rows(Footprint.from_dict(d).totals)]

    terminal = [words(before), words(after)]
    assert (tiles, rows) in terminal, f"the page: {tiles} {rows}\nthe terminal: {terminal}"
    assert len(rows) >= 8 and tiles["energy_kwh"].endswith("kWh"), rows
    assert not page.problems.any(), page.problems


def test_the_job_page_shows_what_cocaq_job_prints(demo: Demo, site: Served, page: Page) -> None:
    j = demo.json("job", demo.dave_job)
    page.goto(site.url(f"/jobs/{demo.dave_job}"))
    (rows,) = page.eval(FIGURES_TABLE % json.dumps(f"Job {demo.dave_job}"))
    got = dict(rows)
    share = j["energy_measured_kwh"] / j["energy_kwh"] * 100
    assert got["energy drawn"] == f"{kwh_text(j['energy_kwh'])} ({share:.0f}% measured)", got
    assert got[f"with cooling (PUE {j['pue']})"] == kwh_text(j["energy_kwh_with_pue"]), got
    assert got["CO2e"].startswith(co2(j["co2_kg"]) + " at "), got
    assert got["user, lab"] == f"dave, {j['account']}", got
    parts = page.eval(
        "Array.from(document.querySelectorAll('.scroll table.data tbody tr')).map(r => r.cells[4].textContent)"
    )
    assert parts == [num(e["energy_kwh"]) for e in j["energies"]], (parts, j["energies"])
    assert not page.problems.any(), page.problems


# --- accessibility: axe-core ----------------------------------------------------------------------------

AXE_RUN = """axe.run(document, {runOnly: {type: "tag", values: ["wcag2a", "wcag2aa"]}}).then(r =>
  r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help, url: v.helpUrl,
    nodes: v.nodes.map(n => ({target: n.target.join(" "), html: n.html, why: n.failureSummary}))})))"""


def readable(violations: list[dict[str, Any]]) -> str:
    out = []
    for v in violations:
        out.append(f"{v['id']} ({v['impact']}): {v['help']} <{v['url']}>")
        for n in v["nodes"]:
            why = " ".join(n["why"].split())
            out.append(f"    {n['target']}: {' '.join(n['html'].split())[:160]}\n        {why}")
    return "\n".join(out)


@pytest.mark.parametrize("width", [PHONE, DESKTOP])
@pytest.mark.parametrize("name", ["footprint", "month", "jobs", "job", "when", "lab"])
def test_axe_finds_no_wcag_a_or_aa_violation(
    demo: Demo, site: Served, page: Page, name: str, width: int
) -> None:
    """axe-core (tests/vendor/axe-core), injected by DevTools (the page's CSP does not apply to that),
    on the page as drawn: at a phone's width too, where tables and code scroll in their boxes."""
    page.resize(width)
    page.goto(site.url(paths(demo)[name]))
    page.eval(AXE.read_text() + "\n;0")
    violations = page.eval(AXE_RUN, await_promise=True, timeout=90)
    assert violations == [], f"{name} at {width} px:\n{readable(violations)}"


# --- the keyboard ------------------------------------------------------------------------------------------

FOCUSED = """(() => { const e = document.activeElement, r = e.getBoundingClientRect(), s = getComputedStyle(e);
  return {tag: e.tagName.toLowerCase(), id: e.id, text: e.textContent.trim(), href: e.getAttribute("href"),
    box: [r.left, r.top, r.width, r.height], inside: r.left >= 0 && r.top >= 0 && r.right <= innerWidth &&
    r.bottom <= innerHeight, outline: s.outlineStyle !== "none" && parseFloat(s.outlineWidth) > 0}; })()"""


def _tab(page: Page) -> dict[str, Any]:
    page.press("Tab")
    got: dict[str, Any] = page.eval(FOCUSED)
    # visible: a box of its own, inside the window, and the focus outline drawn
    assert got["box"][2] > 0 and got["box"][3] > 0 and got["inside"] and got["outline"], got
    return got


def test_the_keyboard_reaches_the_jobs_page_in_order(demo: Demo, site: Served, page: Page) -> None:
    page.goto(site.url("/jobs"))
    stops = [_tab(page) for _ in range(1 + len(NAV) + 7 + 1)]  # skip link, pages, filters, a sort link
    said = [(s["tag"], s["id"] or s["text"]) for s in stops]
    assert said[0] == ("a", "Skip to the content") and stops[0]["href"] == "#main", said
    assert said[1 : 1 + len(NAV)] == [("a", n) for n in NAV], said
    form = [("select", "f-since"), ("select", "f-state"), ("select", "f-partition"), ("select", "f-model"),
            ("input", "f-name"), ("select", "f-size"), ("button", "Filter")]  # fmt: skip
    assert said[1 + len(NAV) : 1 + len(NAV) + len(form)] == form, said
    assert said[-1][1].startswith("job"), f"after the form, the table's first sort link: {said}"
    # on to the kWh heading (ended, hours, GPUs, kWh) and Enter: the page sorted by energy, largest first
    for _ in range(4):
        last = _tab(page)
    assert last["text"] == "kWh", last
    with page.navigation():
        page.press("Enter")
    now = page.eval(
        "({url: location.search, sorted: document.querySelector('th[aria-sort]').textContent.trim(),"
        " how: document.querySelector('th[aria-sort]').getAttribute('aria-sort'),"
        " kwh: Array.from(document.querySelectorAll('#jobs tbody tr')).map(r => r.cells[8].textContent)})"
    )
    assert "sort=kwh" in now["url"] and "order=desc" in now["url"], now
    assert now["sorted"].startswith("kWh") and now["how"] == "descending", now
    cells = now["kwh"]
    kwh = [float(v.replace(",", "")) for v in cells if v != "n/a"]
    assert len(kwh) > 5 and kwh == sorted(kwh, reverse=True), cells
    assert "n/a" not in cells[: len(kwh)], f"a job with no energy yet sorts last: {cells}"
    # the skip link skips: Enter on it, and the next stop is the first control of the content
    page.goto(site.url("/jobs"), charts=False)
    _tab(page)
    page.press("Enter")
    assert _tab(page)["id"] == "f-since"
    assert not page.problems.any(), page.problems


# --- names made to break the markup -------------------------------------------------------------------------


INJECTED = """({imgs: document.querySelectorAll("img").length, handlers: document.querySelectorAll("[onerror]").length,
  scripts: Array.from(document.scripts).filter(s => !(s.type === "application/json" ||
    (s.src && new URL(s.src).pathname.startsWith("/static/")))).length})"""


def test_hostile_job_names_show_as_text_and_run_nothing(demo: Demo, site: Served, page: Page) -> None:
    """erin's jobs named `<script>alert(1)</script>` and `"><img src=x onerror=alert(1)>`: on her jobs
    page and on each job's page the name is text, no element came of it, no dialog opened, and the CSP
    had nothing to stop."""
    site.user = "erin"
    page.goto(site.url("/jobs?sort=job&order=desc"))
    names = page.eval(
        "Object.fromEntries(Array.from(document.querySelectorAll('#jobs tbody tr'))"
        ".map(r => [r.cells[0].querySelector('a').textContent, r.cells[1].textContent]))"
    )
    assert {raw: names.get(raw) for raw in HOSTILE} == HOSTILE, names
    nothing = {"imgs": 0, "handlers": 0, "scripts": 0}
    assert page.eval(INJECTED) == nothing
    for raw, name in HOSTILE.items():
        page.goto(site.url(f"/jobs/{raw}"))
        caption = page.eval("document.querySelector('table.figures caption').textContent")
        assert caption == f"Job {raw} ({name})", caption
        assert page.eval(INJECTED) == nothing, raw
    assert page.problems.dialogs == [] and page.problems.csp == [], page.problems
    assert not page.problems.any(), page.problems
    # and the watch sees what it watches for: a dialog the test opens, an inline script the CSP stops
    page.eval("alert('opened by the test'); 0")
    page.eval("document.body.append(Object.assign(document.createElement('script'), {textContent: '1'})); 0")
    seen = page.problems
    page.until(lambda: bool(seen.csp), "the inline script's CSP violation")
    assert seen.dialogs == ["alert: opened by the test"], seen
    assert any(re.search(r"script-src", v) for v in seen.csp), seen
