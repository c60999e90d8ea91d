"""The web app (cocaq.web) through WSGI, as a browser and an attacker ask it, on both databases.

The users are system accounts every Debian has (nobody, bin, daemon), so the app's check that a name
is a local user holds without root: nobody runs jobs in lab_vision, some with hostile names; bin runs a
secret one in lab_nlp; daemon heads lab_nlp. The figures are compared with what the read API and the
CLI's own functions say for the same user and window.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.db.dbapi import connect
from cocaq.db.engine import make_engine
from cocaq.footprint.lookup import user_answer
from cocaq.footprint.totals import Footprint, Window
from cocaq.footprint.totals_rows import kwh_text, totals_rows
from cocaq.web.gate import KeyGate
from cocaq.web.render import figure_json
from cocaq.web.wsgi import proxied
from tests.builders import config_toml, job
from tests.conftest import ROOT

NOW = datetime.now(UTC).replace(microsecond=0)
HOSTILE = [
    '<script>alert("x")</script>',
    '"><img src=x onerror=alert(1)>',
    "</script><b>bold",
    "=cmd|' /C calc'!A0",
]


@dataclasses.dataclass
class Got:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    app: Callable[..., Any], path: str, user: str | None = "nobody", method: str = "GET", **env: str
) -> Got:
    e: dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": path.split("?", 1)[0],
                         "QUERY_STRING": path.split("?", 1)[1] if "?" in path else "", **env}  # fmt: skip
    if user is not None:
        e["REMOTE_USER"] = user
    setup_testing_defaults(e)
    out: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        out["status"], out["headers"] = int(status.split()[0]), dict(headers)

    body = b"".join(app(e, start_response))
    return Got(out["status"], out["headers"], body)


@pytest.fixture
def site(migrated_db_url: str, tmp_path: Path) -> tuple[Config, Any]:
    cfg_path = tmp_path / "cocaq.toml"
    db_url = migrated_db_url
    cfg_path.write_text(config_toml(db_url, api={"lab_heads": {"lab_nlp": ["daemon"]}}))
    cfg = load_config(cfg_path, {})
    records = [
        job(1, NOW - timedelta(hours=30), 3, user="nobody", account="lab_vision", name="resnet-train", gpus=2),
        job(2, NOW - timedelta(hours=20), 1, user="nobody", account="lab_vision", name="vit", state="FAILED"),
        *[job(10 + i, NOW - timedelta(hours=10 + i), 0.5, user="nobody", account="lab_vision", name=n)
          for i, n in enumerate(HOSTILE)],
        job(30, NOW - timedelta(hours=5), 2, user="bin", account="lab_nlp", name="secret-bin-project", gpus=4),
        job(31, NOW - timedelta(hours=4), 1, user="daemon", account="lab_nlp", name="heads-own"),
    ]  # fmt: skip
    engine = make_engine(db_url)
    import_records(engine, records, cfg, source="t")
    engine.dispose()
    return cfg, proxied(cfg)


# --- the pages show the user's own figures ----------------------------------------------------------


def test_every_page_renders_the_users_own_figures(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    for path in ("/", "/?since=7d", "/jobs", "/jobs?sort=kwh&order=asc", "/jobs/1", "/when", "/labs",
                 "/labs/lab_vision", "/help", f"/month/{NOW:%Y-%m}"):  # fmt: skip
        got = call(app, path)
        assert got.status == 200, (path, got.text[:500])
        assert got.headers["Content-Type"] == "text/html; charset=utf-8"
        assert "Signed in as <strong>nobody</strong>" in got.text
        assert "Accounting imported" in got.text, "every page says how fresh its data is"
        assert "format=csv" in got.text and "format=json" in got.text, "every page offers its downloads"
        assert "secret-bin-project" not in got.text


def test_the_footprint_page_shows_the_terminals_rows_for_the_same_window(site: tuple[Config, Any]) -> None:
    cfg, app = site
    got = call(app, "/?format=json").json()
    w = Window(datetime.fromisoformat(got["since"]), datetime.fromisoformat(got["until"]))
    with connect(cfg.database_url) as db:
        direct = json.loads(json.dumps(user_answer(db, cfg, "nobody", w), default=str))
    assert got["energy_kwh"] == pytest.approx(direct["energy_kwh"]) and got["jobs"] == direct["jobs"] == 6
    page = call(app, "/").text
    for label, value in totals_rows(Footprint.from_dict(got).totals):
        assert f'<th scope="row">{_esc(label.strip())}</th><td>{_esc(value)}</td>' in page, label
    assert kwh_text(got["energy_kwh"]) in page


def test_the_jobs_table_sorts_filters_and_pages_in_the_database(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    everything = call(app, "/jobs?format=json&size=200").json()
    assert everything["total"] == 6 and {r["job_id"] for r in everything["rows"]} == {
        "1",
        "2",
        "10",
        "11",
        "12",
        "13",
    }
    by_kwh = call(app, "/jobs?format=json&sort=kwh&order=desc").json()["rows"]
    kwh = [r["energy_kwh"] for r in by_kwh]
    assert kwh == sorted(kwh, reverse=True)
    failed = call(app, "/jobs?format=json&state=FAILED").json()
    assert [r["job_id"] for r in failed["rows"]] == ["2"] and failed["choices"]["state"] == [
        "COMPLETED",
        "FAILED",
    ]
    named = call(app, "/jobs?format=json&name=%25").json()  # a % is a character, not a wildcard
    assert named["total"] == 0
    page1 = call(app, "/jobs?format=json&size=25&sort=job&order=asc&page=1").json()
    assert page1["offset"] == 0 and len(page1["rows"]) == 6
    html = call(app, "/jobs?sort=kwh").text
    assert 'aria-sort="descending"' in html and "6 jobs ran in the window" in html


def test_a_job_page_shows_its_energy_and_its_csv(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    d = call(app, "/jobs/1?format=json").json()
    j = d["jobs"][0]
    page = call(app, "/jobs/1").text
    assert _esc(kwh_text(j["energy_kwh"])) in page and "resnet-train" in page
    rows = list(csv.reader(io.StringIO(call(app, "/jobs/1?format=csv").text)))
    assert rows[0] == ["job_id", "node", "component", "method", "source", "energy_kwh"]
    assert sum(float(r[5]) for r in rows[1:]) == pytest.approx(j["energy_kwh"])


# --- what the app refuses ---------------------------------------------------------------------------


def test_another_users_job_reads_as_one_that_does_not_exist(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    theirs, missing = call(app, "/jobs/30"), call(app, "/jobs/999999")
    assert theirs.status == missing.status == 403
    assert "secret-bin-project" not in theirs.text
    assert theirs.text.replace("30", "N") == missing.text.replace("999999", "N"), "the same answer"
    for fmt in ("json", "csv"):
        assert call(app, f"/jobs/30?format={fmt}").status == 403
    assert call(app, "/jobs/30/live.json").status == 403


def test_another_lab_is_refused_and_its_head_sees_it(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    refused = call(app, "/labs/lab_nlp")
    assert refused.status == 403 and "nobody is not a member of lab lab_nlp" in refused.text
    head = call(app, "/labs/lab_nlp", user="daemon")
    assert head.status == 200 and "secret-bin-project" in head.text and ">bin<" in head.text
    member = call(app, "/labs/lab_vision?format=json").json()
    assert member.get("restricted") is True and {u["user"] for u in member["users"]} == {"nobody"}
    assert call(app, "/labs", user="daemon").text.count('href="/labs/lab_nlp"') == 1


def test_no_page_takes_the_user_from_the_url(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    for path in ("/?user=bin", "/jobs?user=bin&format=json", "/?format=json&user=bin"):
        got = call(app, path)
        assert got.status == 200 and b"secret-bin-project" not in got.body
    assert call(app, "/?format=json&user=bin").json()["user"] == "nobody"
    assert call(app, "/users/bin").status == 404
    # a month is the user's whole month: not a lab head's to read of a member
    assert call(app, f"/month/{NOW:%Y-%m}?format=json").json()["user"] == "nobody"


def test_hostile_job_names_are_shown_as_text(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    for path in ("/jobs?size=200", "/", "/jobs/10", "/jobs/11", "/jobs/12"):
        page = call(app, path).text
        assert "<script>alert" not in page and "<img src=x" not in page and "</script><b>" not in page
        assert _only_our_scripts(page), path
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in call(app, "/jobs?size=200").text
    # a chart's figure is inert JSON that no name can close
    text = figure_json({"layout": {"title": {"text": "</script><script>alert(1)</script>"}}})
    assert "</script>" not in text and json.loads(text)["layout"]["title"]["text"].startswith("</script>")


def test_csv_cells_a_spreadsheet_would_run_are_quoted(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    rows = list(csv.reader(io.StringIO(call(app, "/jobs?format=csv&size=200").text)))
    names = [r[rows[0].index("name")] for r in rows[1:]]
    assert "'=cmd|' /C calc'!A0" in names and not any(n.startswith("=") for n in names)


def test_only_get_and_head(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        got = call(app, "/when?hours=1", method=method)
        assert got.status == 405 and got.headers["Allow"] == "GET, HEAD"
    head = call(app, "/", method="HEAD")
    assert head.status == 200 and head.body == b"" and int(head.headers["Content-Length"]) > 0


def test_other_sites_cannot_load_its_pages_or_downloads(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    for dest, mode in (
        ("script", "no-cors"),
        ("empty", "cors"),
        ("image", "no-cors"),
        ("iframe", "navigate"),
    ):
        got = call(app, "/jobs?format=json", HTTP_SEC_FETCH_SITE="cross-site", HTTP_SEC_FETCH_MODE=mode,
                   HTTP_SEC_FETCH_DEST=dest)  # fmt: skip
        assert got.status == 403 and b"resnet" not in got.body, dest
    link = call(app, "/", HTTP_SEC_FETCH_SITE="cross-site", HTTP_SEC_FETCH_MODE="navigate",
                HTTP_SEC_FETCH_DEST="document")  # fmt: skip
    assert link.status == 200, "a link from an e-mail or another site opens the page"
    assert call(app, "/", HTTP_SEC_FETCH_SITE="same-origin", HTTP_SEC_FETCH_MODE="cors").status == 200


def test_every_answer_carries_the_security_headers(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    for path in ("/", "/jobs?format=json", "/jobs/30", "/nope", "/static/cocaq.js"):
        h = call(app, path).headers
        csp = dict(p.strip().split(" ", 1) for p in h["Content-Security-Policy"].split(";"))
        assert csp["script-src"] == "'self'" and csp["default-src"] == "'none'" and "frame-ancestors" in csp
        assert h["X-Content-Type-Options"] == "nosniff" and h["X-Frame-Options"] == "SAMEORIGIN"
    assert call(app, "/").headers["Cache-Control"] == "private, no-store"


def test_bad_query_words_get_one_line_and_no_figures(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    for path, words in (("/?since=1000d", "since: expected one of"), ("/jobs?page=abc", "page: expected"),
                        ("/jobs?sort=name;drop", "sort: expected one of"), ("/when?hours=nan", "hours:"),
                        ("/when?hours=-1", "hours:"), ("/jobs?size=100000", "size:"),
                        ("/jobs?state=%00", "state"), ("/month/2026-13", "no month")):  # fmt: skip
        got = call(app, path)
        assert got.status in (400, 404), (path, got.status)
        assert words in got.text, (path, got.text[:300])
    assert call(app, "/?" + "a=1&" * 2000).status == 414
    assert call(app, "/jobs/" + "9" * 40).status == 404  # no such route: a job id has at most 12 digits


def test_the_proxied_user_must_be_a_local_user_named_exactly(site: tuple[Config, Any]) -> None:
    cfg, app = site
    assert call(app, "/", user=None).status == 403
    assert call(app, "/", user="nobody@EVIL.REALM").status == 403
    assert call(app, "/", user="no-such-user-here").status == 403
    # a client's own Remote-User header is not the proxy's REMOTE_USER
    assert call(app, "/", user=None, HTTP_REMOTE_USER="nobody").status == 403
    by_header = proxied(cfg, "X-Remote-User")
    assert call(by_header, "/", user=None, HTTP_X_REMOTE_USER="nobody").status == 200
    assert call(by_header, "/", user="nobody").status == 403, "with a header, only the header names the user"


def test_cocaq_webs_key_becomes_a_strict_cookie(site: tuple[Config, Any]) -> None:
    _cfg, app = site
    gated = KeyGate(app, "k" * 32)
    assert call(gated, "/").status == 403
    assert call(gated, "/?key=wrong").status == 403
    first = call(gated, "/jobs?key=" + "k" * 32 + "&sort=kwh")
    assert first.status == 303 and first.headers["Location"] == "/jobs?sort=kwh"
    cookie = first.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert call(gated, "/jobs", HTTP_COOKIE=cookie.split(";")[0]).status == 200


def test_cocaq_web_refuses_to_trust_a_proxy_on_a_public_address(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "cocaq", "web", "--trust-proxy-user", "--user-header", "X-Remote-User", "--listen", "0.0.0.0:8088"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "listen on a loopback address" in r.stderr
    r = subprocess.run([sys.executable, "-m", "cocaq", "web", "--user-header", "X-User"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "only with --trust-proxy-user" in r.stderr
    r = subprocess.run([sys.executable, "-m", "cocaq", "web", "--trust-proxy-user"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "--user-header" in r.stderr


# --- the API routes the app reads -------------------------------------------------------------------


def test_the_month_page_is_the_month_email(site: tuple[Config, Any]) -> None:
    cfg, app = site
    from cocaq.reports.render import render_user_month
    from cocaq.reports.suggest import suggest_for_user
    from cocaq.reports.user_report import user_month

    engine = make_engine(cfg.database_url)
    with engine.connect() as conn:
        m = user_month(conn, cfg, "nobody", NOW)
    engine.dispose()
    r = render_user_month(m, suggest_for_user(m, cfg), cfg)
    page = call(app, f"/month/{NOW:%Y-%m}").text
    assert _esc(r.subject) in page
    d = call(app, f"/month/{NOW:%Y-%m}?format=json").json()
    assert d["email"]["text"] == r.text and d["totals"]["energy_kwh"] == pytest.approx(m.totals.energy_kwh)


def test_a_lab_head_sees_a_members_jobs_only_in_the_labs_they_head(site: tuple[Config, Any]) -> None:
    cfg, _app = site
    from cocaq.web.reader import LocalReader, Refused, local_app

    head = LocalReader(cfg, "daemon", app=local_app(cfg))
    got = head.get(("users", "bin", "jobs"))
    assert [r["job_id"] for r in got["rows"]] == ["30"]
    with pytest.raises(Refused) as no:
        head.get(("users", "nobody", "jobs"))
    assert no.value.status == 403
    with pytest.raises(Refused) as month:
        head.get(("users", "bin", "month"), {"month": f"{NOW:%Y-%m}"})
    assert month.value.status == 403 and "month" in month.value.reason
    fresh = head.get(("status",))
    assert datetime.fromisoformat(fresh["accounting_imported_at"]) <= datetime.now(UTC) + timedelta(seconds=5)


def test_when_to_run_says_what_the_cli_says(site: tuple[Config, Any], tmp_path: Path) -> None:
    """No intensity series near now in this database: the page gives the CLI's own one-line reason (the
    plan itself, from a real series, is checked on the demo in tests/test_web_browser.py)."""
    cfg, app = site
    cli = subprocess.run([sys.executable, "-m", "cocaq", "carbon", "when", "--hours", "3", "--within", "12h"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "COCAQ_DATABASE_URL": cfg.database_url})  # fmt: skip
    assert cli.returncode != 0
    reason = cli.stderr.strip().removeprefix("cocaq: error: ")
    page = call(app, "/when?hours=3&within=12")
    assert page.status == 200 and _esc(reason) in page.text and 'role="alert"' in page.text
    assert call(app, "/when?hours=3&within=12&format=json").status == 400
    assert call(app, "/when").status == 200, "the form, before anything is asked"
    bad = call(app, "/when?hours=800")
    assert bad.status == 400 and "hours" in bad.text


# --- helpers ------------------------------------------------------------------------------------------


def _esc(s: str) -> str:
    from markupsafe import escape

    return str(escape(s))


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.bad: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" and not (
            a.get("type") == "application/json" or (a.get("src") or "").startswith("/static/")
        ):
            self.bad.append(str(a))
        if any(k.startswith("on") for k in a):
            self.bad.append(f"{tag} {a}")


def _only_our_scripts(page: str) -> bool:
    p = _Scripts()
    p.feed(page)
    assert p.bad == [], p.bad
    return re.search(r"javascript:", page, re.I) is None


def test_another_users_view_only_for_who_reads_the_database_anyway(site: tuple[Config, Any]) -> None:
    """`cocaq web --user NAME` (the demo): as `cocaq user NAME` reads the database, never through the
    API, which vouches only for the caller's own uid; a name only the database knows is served by name."""
    from cocaq.errors import UsageError
    from cocaq.web.wsgi import own_user_app

    cfg, _app = site
    as_bin = own_user_app(cfg, "bin")
    got = call(as_bin, "/jobs?format=json", user=None)
    assert got.status == 200 and [r["job_id"] for r in got.json()["rows"]] == ["30"]
    assert call(as_bin, "/jobs/1", user=None).status == 403, "still only bin's own jobs"
    with pytest.raises(UsageError, match="only where this machine reads the database directly"):
        own_user_app(dataclasses.replace(cfg, api=dataclasses.replace(cfg.api, url="http://api:8470")), "bin")


def test_the_in_process_api_takes_only_requests_its_reader_made(site: tuple[Config, Any]) -> None:
    from fastapi.testclient import TestClient

    from cocaq.api.client import payload_for
    from cocaq.web.reader import local_app

    cfg, _app = site
    client = TestClient(local_app(cfg))
    own = payload_for("GET", "/v1/users/nobody").decode()
    assert client.get("/v1/users/bin", headers={"Authorization": f"MUNGE nobody {own}"}).status_code == 401
    assert client.get("/v1/users/nobody", headers={"Authorization": f"MUNGE nobody {own}"}).status_code == 200
    assert client.get("/v1/users/nobody").status_code == 401


def test_through_the_api_the_app_loads_no_database_driver_nor_the_api_server() -> None:
    """Open OnDemand starts the app per user: through the API it imports no SQLAlchemy, no driver and no
    FastAPI (as `cocaq user` on a login node, tests/test_user_imports.py)."""
    code = (
        "import sys\nfrom wsgiref.util import setup_testing_defaults\nfrom cocaq.web.wsgi import application\n"
        "e = {'PATH_INFO': '/'}\nsetup_testing_defaults(e)\ngot = []\n"
        "b''.join(application(e, lambda s, h: got.append(s)))\n"
        "print(got[0], sorted(m for m in ('sqlalchemy', 'psycopg', 'psycopg2', 'fastapi', 'pandas') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "COCAQ_API_URL": "http://127.0.0.1:9"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "503 Service Unavailable []", (
        "unreachable API: a page that says so, nothing heavy"
    )


def test_an_arrays_page_lists_its_tasks_and_their_sum(site: tuple[Config, Any]) -> None:
    cfg, app = site
    tasks = []
    for task in (0, 1):
        r = job(40 + task, NOW - timedelta(hours=3), 1, user="nobody", account="lab_vision", name="sweep")
        r.job_id, r.array_job_id, r.array_task_id = f"40_{task}", 40, task
        tasks.append(r)
    engine = make_engine(cfg.database_url)
    import_records(engine, tasks, cfg, source="t")
    engine.dispose()
    page = call(app, "/jobs/40").text
    d = call(app, "/jobs/40?format=json").json()
    (whole,) = d["arrays"]
    assert "<h2>Array 40 (sweep)</h2>" in page and f"2 tasks: {_esc(kwh_text(whole['energy_kwh']))}" in page
    assert 'href="/jobs/40_0"' in page and 'href="/jobs/40_1"' in page
    assert call(app, "/jobs/40_[0-1]").status == 200 and call(app, "/jobs/40_1").status == 200


def test_answers_are_remembered_for_a_minute_and_refusals_not(site: tuple[Config, Any]) -> None:
    from cocaq.web.reader import LocalReader, Refused, Remembered, local_app

    cfg, _app = site
    inner = LocalReader(cfg, "nobody", app=local_app(cfg))
    asked: list[tuple[str, ...]] = []

    class Counting:
        user = "nobody"

        def get(self, parts: tuple[str, ...], params: Any = None) -> Any:
            asked.append(parts)
            return inner.get(parts, params)

    kept = Remembered(Counting(), ttl_s=60)
    first = kept.get(("users", "nobody"), {"since": "30d"})
    assert kept.get(("users", "nobody"), {"since": "30d"}) is first and len(asked) == 1
    kept.get(("users", "nobody"), {"since": "7d"})
    assert len(asked) == 2, "other words, another answer"
    for _ in range(2):
        with pytest.raises(Refused):
            kept.get(("jobs", "30"))
    assert asked.count(("jobs", "30")) == 2, "a refusal is asked again"
    stale = Remembered(Counting(), ttl_s=0)
    stale.get(("status",))
    stale.get(("status",))
    assert asked.count(("status",)) == 2


def test_behind_a_proxy_each_users_answers_are_remembered_apart(
    site: tuple[Config, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `own_user_app` remembers its one user's answers for a minute, the proxied app remembers each
    user's in a reader of their own: the same page again asks the API nothing, and another user's view
    of the same page is theirs, not the first user's remembered one."""
    from cocaq.web import reader as web_reader

    cfg, _ = site
    app = proxied(cfg, users=2)
    asked: list[str] = []
    real = web_reader.LocalReader.get

    def counting(self: Any, parts: tuple[str, ...], params: Any = None) -> Any:
        asked.append(self.user)
        return real(self, parts, params)

    monkeypatch.setattr(web_reader.LocalReader, "get", counting)
    first = call(app, "/jobs?format=json", user="nobody").json()
    n = len(asked)
    assert n >= 1 and call(app, "/jobs?format=json", user="nobody").json() == first
    assert len(asked) == n, "the same page again within the minute: nothing asked again"
    theirs = call(app, "/jobs?format=json", user="daemon").json()
    assert asked[n:] and set(asked[n:]) == {"daemon"}
    assert {r["name"] for r in theirs["rows"]} == {"heads-own"}  # daemon's own job, not nobody's
    assert "heads-own" not in {r["name"] for r in first["rows"]}
    call(app, "/jobs?format=json", user="bin")  # a third user: the first one's answers are let go
    m = len(asked)
    call(app, "/jobs?format=json", user="nobody")
    assert len(asked) > m, "at most `users` users are kept"
