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


# --- under Passenger, from the app's own folder, as Open OnDemand starts it -------------------------------


def passenger() -> str:
    """Debian's Passenger (`passenger` standalone, its builtin engine: the same Python loader,
    wsgi-loader.py, that an OnDemand per-user nginx runs the app with); scripts/test.sh installs it."""
    import shutil

    found = shutil.which("passenger")
    if found is None:
        pytest.fail("Passenger is not installed: scripts/test.sh installs Debian's passenger (as root)")
    return found


def test_passenger_runs_the_ood_folder_as_the_user_through_its_bin_python(
    server: tuple[str, Path],  # noqa: F811
) -> None:
    """The shipped ood/ folder, only its bin/python's two settings changed as the Ansible role changes
    them: Passenger loads passenger_wsgi.py with that Python, as alice, and alice's pages come back over
    HTTP with her figures (the API's, through her MUNGE credential) and nobody else's."""
    import os
    import shlex
    import shutil
    import subprocess
    import tempfile
    import time
    import urllib.error
    import urllib.request

    from tests.promkit import free_port

    base, _cfg = server
    exe = passenger()
    tmp = Path(tempfile.mkdtemp(prefix="cocaq-ood-"))  # (pytest's own tmp is root's alone: 0700)
    tmp.chmod(0o755)
    app = tmp / "app"
    shutil.copytree(ROOT / "ood", app)
    venv = tmp / "venv" / "bin"  # the site's virtualenv as alice can run it (this one may be under /root)
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec env {user_python()} "$@"\n')
    (venv / "python").chmod(0o755)
    (tmp / "cocaq.toml").write_text(f'[api]\nurl = "{base}"\n')
    wrapper = (app / "bin" / "python").read_text()
    for line, value in (("VENV=", str(venv.parent)), ("COCAQ_CONFIG=", str(tmp / "cocaq.toml"))):
        assert sum(w.startswith(line) for w in wrapper.splitlines()) == 1, line
        wrapper = "\n".join(f"{line}{value}" if w.startswith(line) else w for w in wrapper.splitlines())
    (app / "bin" / "python").write_text(wrapper + "\n")
    run = tmp / "run"
    run.mkdir()
    for p in (tmp, app, app / "bin", tmp / "venv", venv, *app.rglob("*"), tmp / "cocaq.toml"):
        p.chmod(p.stat().st_mode | 0o005 | (0o050 if p.is_dir() else 0))
    shutil.chown(run, "alice")
    port = free_port()
    start = [exe, "start", "--engine", "builtin", "--address", "127.0.0.1", "--port", str(port),
             "--app-type", "wsgi", "--startup-file", "passenger_wsgi.py", "--python", str(app / "bin" / "python"),
             "--environment", "production", "--log-file", str(run / "passenger.log"),
             "--pid-file", str(run / "passenger.pid"), "--instance-registry-dir", str(run),
             "--disable-security-update-check", "--disable-anonymous-telemetry", "--daemonize"]  # fmt: skip
    cmd = (
        f"cd {shlex.quote(str(app))} && env -i PATH=/usr/bin:/bin HOME={shlex.quote(str(run))} "
        + shlex.join(start)
    )
    r = subprocess.run(["runuser", "-u", "alice", "--", "/bin/sh", "-c", cmd], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, home = get("/")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, (run / "passenger.log").read_text()[-3000:]
                time.sleep(0.5)
        log = (run / "passenger.log").read_text()
        assert status == 200, home[:2000] + log[-3000:]
        assert "Signed in as <strong>alice</strong>" in home and "alice-resnet" in home
        assert "secret-bob-project" not in home
        assert get("/jobs/3")[0] == 403, "bob's job, refused by the API to alice"
        status, css = get("/static/cocaq.css")
        assert status == 200 and "--ink" in css
        # the app runs as alice: Passenger's loader for it has her uid
        pid = int((run / "passenger.pid").read_text())
        assert os.stat(f"/proc/{pid}").st_uid == __import__("pwd").getpwnam("alice").pw_uid
    finally:
        subprocess.run(["runuser", "-u", "alice", "--", exe, "stop", "--pid-file", str(run / "passenger.pid")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)
