"""ood/: the Open OnDemand app's folder (issue 38), as OnDemand's Passenger runs it.

OnDemand starts a Python app with the folder's own `bin/python` (its default passenger_python runs
"$PWD/bin/python" when it is executable), loads `passenger_wsgi.py` from the folder and serves its
`application` as the user. Here the wrapper is set to this checkout's virtualenv the way the Ansible
role and the admin guide set it (its VENV= and COCAQ_CONFIG= lines), and the app answers a request
through it, mounted where OnDemand mounts it.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

OOD = ROOT / "ood"
SETTINGS = ("VENV", "COCAQ_CONFIG")

# Run by the wrapper's Python in the app's folder, as Passenger's WSGI loader would: the startup file
# loaded by path, one request under OnDemand's mount point.
REQUEST = """
import runpy, sys
from wsgiref.util import setup_testing_defaults
app = runpy.run_path("passenger_wsgi.py")["application"]
environ = {"REQUEST_METHOD": "GET", "PATH_INFO": sys.argv[1], "SCRIPT_NAME": "/pun/sys/cocaq"}
setup_testing_defaults(environ)
got = {}
body = b"".join(app(environ, lambda status, headers: got.update(status=status)))
print(got["status"]); print(body.decode())
"""


def set_wrapper(text: str, venv: Path, config: Path) -> str:
    """The wrapper with the site's two settings, as the role writes it (one line each, replaced)."""
    for name, value in zip(SETTINGS, (venv, config), strict=True):
        text = re.sub(rf"(?m)^{name}=.*$", f"{name}={shlex.quote(str(value))}", text)
    return text


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A copy of ood/ as an admin installs it, its wrapper pointed at this virtualenv."""
    app = tmp_path / "apps" / "sys" / "cocaq"
    shutil.copytree(OOD, app, ignore=shutil.ignore_patterns("__pycache__"))
    wrapper = app / "bin" / "python"
    wrapper.write_text(set_wrapper(wrapper.read_text(), Path(sys.prefix), tmp_path / "cocaq.toml"))
    return app


def wrapper_env(tmp_path: Path) -> dict[str, str]:
    """A bare environment, as nginx_stage gives the per-user nginx; this checkout's cocaq on the path."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}


def test_the_manifest_describes_a_passenger_app() -> None:
    manifest = yaml.safe_load((OOD / "manifest.yml").read_text())
    assert {"name", "category", "subcategory", "description", "icon"} <= set(manifest), manifest
    assert "role" not in manifest  # batch_connect would make it an interactive app
    assert manifest["name"].startswith("cocaq") and manifest["description"].strip()
    icon = manifest["icon"]
    assert re.fullmatch(r"fa://[a-z0-9-]+", icon) or (OOD / icon).is_file(), icon


def test_the_wrapper_has_each_setting_once_and_is_a_shell_script() -> None:
    wrapper = OOD / "bin" / "python"
    text = wrapper.read_text()
    assert text.startswith("#!/bin/sh\n") and os.access(wrapper, os.X_OK)
    for name in SETTINGS:
        assert len(re.findall(rf"(?m)^{name}=", text)) == 1, name  # the line the role and the guide set
    assert re.search(r'(?m)^exec "\$VENV/bin/python" "\$@"$', text)
    r = subprocess.run(["sh", "-n", str(wrapper)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_the_wrapper_runs_the_sites_virtualenv_with_its_config(app_dir: Path, tmp_path: Path) -> None:
    code = (
        "import os, sys; print(sys.prefix); print(os.environ['COCAQ_CONFIG']); print(sys.flags.no_user_site)"
    )
    r = subprocess.run(
        [str(app_dir / "bin" / "python"), "-c", code],
        env=wrapper_env(tmp_path), cwd=app_dir, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == [sys.prefix, str(tmp_path / "cocaq.toml"), "1"]


def test_passenger_serves_the_web_app_as_the_user_under_its_mount_point(
    app_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "cocaq.toml").write_text('[api]\nurl = "http://127.0.0.1:9"\n')  # a login node's config
    r = subprocess.run(
        [str(app_dir / "bin" / "python"), "-c", REQUEST, "/help"],
        env=wrapper_env(tmp_path), cwd=app_dir, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    status, _, page = r.stdout.partition("\n")
    assert status == "200 OK", r.stdout[:2000]
    me = pwd.getpwuid(os.getuid()).pw_name
    assert f"Signed in as <strong>{me}</strong>" in page
    assert 'href="/pun/sys/cocaq/jobs"' in page and 'href="/pun/sys/cocaq/static/cocaq.css"' in page


def test_a_missing_config_is_an_error_not_the_built_in_defaults(app_dir: Path, tmp_path: Path) -> None:
    """The wrapper names the config: without the file the first request fails, rather than serving a
    footprint from built-in defaults (the user's own, empty, SQLite database)."""
    r = subprocess.run(
        [str(app_dir / "bin" / "python"), "-c", REQUEST, "/"],
        env=wrapper_env(tmp_path), cwd=app_dir, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode != 0 and f"{tmp_path / 'cocaq.toml'}: no such file" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / ".local").exists()
