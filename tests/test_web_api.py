"""The web app as Open OnDemand runs it: as the user (runuser), with no database credentials, reading a
real `cocaq serve` through MUNGE credentials of its own uid. What it shows is what the API lets that
user see, and the same figures as their `cocaq user` through the API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_api_cli import server  # noqa: F401  (the module's fixture: cocaq serve with real data)
from tests.userkit import ROOT, user_python

pytestmark = pytest.mark.postgres

SCRIPT = """
import json, sys
from wsgiref.util import setup_testing_defaults
from cocaq.config_load import load_config
from cocaq.web.wsgi import own_user_app
app = own_user_app(load_config())
out = {}
for path in sys.argv[1:]:
    e = {"PATH_INFO": path.split("?")[0], "QUERY_STRING": path.split("?", 1)[1] if "?" in path else ""}
    setup_testing_defaults(e)
    got = {}
    body = b"".join(app(e, lambda s, h: got.update(status=int(s.split()[0]))))
    out[path] = [got["status"], body.decode()]
print(json.dumps(out))
"""


def pages(user: str, base: str, *paths: str) -> dict[str, tuple[int, str]]:
    """The app's answers, run as `user` (its own process, its own uid) against the API at `base`."""
    import shlex
    import subprocess

    cmd = (f"cd /tmp && env -i PATH=/usr/bin:/bin HOME=/tmp COCAQ_API_URL={shlex.quote(base)} "
           f"{user_python()} -c {shlex.quote(SCRIPT)} " + shlex.join(paths))  # fmt: skip
    r = subprocess.run(["runuser", "-u", user, "--", "/bin/sh", "-c", cmd], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got: dict[str, Any] = json.loads(r.stdout)
    return {k: (v[0], v[1]) for k, v in got.items()}


def test_a_user_sees_their_own_figures_through_the_api_and_nothing_else(
    server: tuple[str, Path],  # noqa: F811
) -> None:
    from tests.userkit import run_as

    base, _cfg = server
    got = pages("alice", base, "/", "/?format=json", "/jobs?format=json", "/jobs/1", "/jobs/3",
                "/jobs/3?format=json", "/labs/lab_nlp", "/labs/lab_vision", "/help")  # fmt: skip
    status, home = got["/"]
    assert status == 200 and "Signed in as <strong>alice</strong>" in home and "alice-resnet" in home
    assert "Accounting imported" in home
    mine = json.loads(got["/?format=json"][1])
    cli = run_as("alice", ["user", "--since", mine["since"], "--until", mine["until"], "-o", "json"],
                 {"COCAQ_API_URL": base})  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == mine, "the page's JSON is `cocaq user`'s, through the same API"
    jobs = json.loads(got["/jobs?format=json"][1])
    assert {r["job_id"] for r in jobs["rows"]} == {"1", "2"}
    assert got["/jobs/1"][0] == 200 and "alice-resnet" in got["/jobs/1"][1]
    for path in ("/jobs/3", "/jobs/3?format=json"):
        assert got[path][0] == 403 and "secret-bob-project" not in got[path][1], path
    assert (
        got["/labs/lab_nlp"][0] == 403 and "alice is not a member of lab lab_nlp" in got["/labs/lab_nlp"][1]
    )
    assert got["/labs/lab_vision"][0] == 200 and "bob" not in got["/labs/lab_vision"][1]


def test_a_lab_head_sees_their_lab_through_the_api(server: tuple[str, Path]) -> None:  # noqa: F811
    base, _cfg = server
    got = pages("daemon", base, "/labs", "/labs/lab_nlp", "/labs/lab_vision")
    assert got["/labs"][0] == 200 and 'href="/labs/lab_nlp"' in got["/labs"][1]
    assert got["/labs/lab_nlp"][0] == 200 and "secret-bob-project" in got["/labs/lab_nlp"][1]
    assert got["/labs/lab_vision"][0] == 403


def test_an_unreachable_api_is_a_page_that_says_so(server: tuple[str, Path]) -> None:  # noqa: F811
    got = pages("alice", "http://127.0.0.1:9", "/")
    status, body = got["/"]
    assert status == 503 and "cannot reach the API at http://127.0.0.1:9" in body
