"""End to end: `cocaq serve` on a port, `cocaq user` typed by ordinary users (runuser) with the API set.

The users have no database credentials and no config file; the server's config is root's. Their output
through the API is the same as root's from the database.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cocaq.config import load_config
from cocaq.db import make_engine
from cocaq.importer import import_records
from tests.conftest import ROOT, new_database, run_cocaq
from tests.test_api import _job, need_munge_and_users
from tests.userkit import run_as

pytestmark = pytest.mark.postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    need_munge_and_users()
    tmp = tmp_path_factory.mktemp("api")
    url = new_database("postgresql", tmp, request)
    cfg_path = tmp / "server.toml"
    cfg_path.write_text(
        f'database_url = "{url}"\n[cluster]\nname = "c"\n[defaults]\ngpu_tdp_w = 300\n'
        '[api]\nadmin_users = ["root"]\nlab_heads = { lab_nlp = ["daemon"] }\n'
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp)}
    assert run_cocaq(["--config", str(cfg_path), "db", "upgrade"], env).code == 0
    engine = make_engine(url)
    import_records(
        engine,
        [
            _job(1, "alice", "lab_vision", "alice-resnet", 5),
            _job(2, "alice", "lab_vision", "alice-vit", 30),
            _job(3, "bob", "lab_nlp", "secret-bob-project", 10),
        ],
        load_config(cfg_path, {}),
        source="t",
    )
    engine.dispose()
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cocaq", "--config", str(cfg_path), "serve", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(base + "/openapi.json", timeout=2) as r:
                assert json.loads(r.read())["info"]["title"] == "cocaq read API"
            break
        except OSError:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "cocaq serve did not answer in 30 s"
            time.sleep(0.2)
    try:
        yield base, cfg_path
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_user_reads_their_footprint_through_the_api_as_root_reads_the_database(
    server: tuple[str, Path],
) -> None:
    base, cfg = server
    now = datetime.now(UTC).replace(microsecond=0)
    window = ["--since", (now - timedelta(days=30)).isoformat(), "--until", now.isoformat()]
    r = run_as("alice", ["user", *window, "-o", "json"], {"COCAQ_API_URL": base})
    assert r.returncode == 0, r.stderr
    direct = run_cocaq(
        ["--config", str(cfg), "user", "alice", *window, "-o", "json"], {"PATH": "/usr/bin:/bin"}
    )
    assert direct.code == 0, direct.err
    assert json.loads(r.stdout) == json.loads(direct.out), "the same output either way"
    assert r.stdout == direct.out
    table = run_as("alice", ["user", "--since", "30d"], {"COCAQ_API_URL": base})
    assert (
        table.returncode == 0 and "Footprint of user alice" in table.stdout and "alice-resnet" in table.stdout
    )
    csv = run_as("alice", ["user", "--since", "30d", "-o", "csv"], {"COCAQ_API_URL": base})
    assert csv.returncode == 0 and csv.stdout.startswith("user,since,until,")
    job = run_as("alice", ["job", "1"], {"COCAQ_API_URL": base})
    assert job.returncode == 0 and "alice-resnet" in job.stdout, job.stderr


def test_refusals_are_one_line_and_a_non_zero_exit(server: tuple[str, Path]) -> None:
    base, _ = server
    r = run_as("alice", ["user", "bob"], {"COCAQ_API_URL": base})
    assert r.returncode == 5 and r.stdout == ""
    assert r.stderr == f"cocaq: error: {base}: 403: alice may not see user bob's footprint\n"
    r = run_as("alice", ["job", "3"], {"COCAQ_API_URL": base})
    assert r.returncode == 5 and r.stderr.strip().endswith("403: job 3: not found, or not yours")
    assert "secret" not in r.stderr
    r = run_as("daemon", ["user", "bob", "-o", "json"], {"COCAQ_API_URL": base})
    assert r.returncode == 0 and json.loads(r.stdout)["jobs"] == 1, "bob's lab head"
    # The API down, and no database credentials (no config): the API's error, not a database one.
    r = run_as("alice", ["user"], {"COCAQ_API_URL": f"http://127.0.0.1:{_free_port()}"})
    assert r.returncode == 3 and r.stderr.startswith(
        "cocaq: error: cannot reach the API at http://127.0.0.1:"
    )
    assert len(r.stderr.splitlines()) == 1
