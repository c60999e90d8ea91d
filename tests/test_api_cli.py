"""End to end: `cocaq serve` on a port, `cocaq user` typed by ordinary users (runuser) with the API set.

The users have no database credentials and no config file; the server's config is root's. Their output
through the API is the same as root's from the database.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cocaq.accounting.importer import import_records
from cocaq.config_load import load_config
from cocaq.db.engine import make_engine
from tests.conftest import ROOT, new_database, run_cocaq
from tests.test_api import _job, need_munge_and_users, server_config
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
    cfg_path.write_text(server_config(url))
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
    with serving(cfg_path, "http") as base:
        yield base, cfg_path


@contextmanager
def serving(cfg_path: Path, scheme: str, context: ssl.SSLContext | None = None) -> Iterator[str]:
    """`cocaq serve` on a free port until the block ends; its base URL once /openapi.json answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cocaq", "--config", str(cfg_path), "serve", "--port", str(port)],
        cwd=ROOT, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"{scheme}://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(base + "/openapi.json", timeout=2, context=context) as r:
                assert json.loads(r.read())["info"]["title"] == "cocaq read API"
            break
        except OSError:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "cocaq serve did not answer in 30 s"
            time.sleep(0.2)
    try:
        yield base
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
    for fmt in ("json", "table"):
        job = run_as("alice", ["job", "1", "-o", fmt], {"COCAQ_API_URL": base})
        direct = run_cocaq(["--config", str(cfg), "job", "1", "-o", fmt], {"PATH": "/usr/bin:/bin"})
        assert job.returncode == 0 and direct.code == 0, (job.stderr, direct.err)
        assert job.stdout == direct.out, fmt


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


def test_models_through_the_api_as_from_the_database(server: tuple[str, Path]) -> None:
    base, cfg = server
    now = datetime.now(UTC).replace(microsecond=0)
    window = ["--since", (now - timedelta(days=30)).isoformat(), "--until", now.isoformat()]
    for fmt in ("json", "csv", "table"):
        r = run_as("alice", ["models", *window, "-o", fmt], {"COCAQ_API_URL": base})
        direct = run_cocaq(
            ["--config", str(cfg), "models", "-u", "alice", *window, "-o", fmt], {"PATH": "/usr/bin:/bin"}
        )
        assert r.returncode == 0 and direct.code == 0, (r.stderr, direct.err)
        assert r.stdout == direct.out, fmt


def test_tls_terminated_by_the_api(server: tuple[str, Path], tmp_path: Path) -> None:
    _, cfg = server
    d = Path(tempfile.mkdtemp(prefix="cocaq-api-tls-"))  # world-readable: the users' clients read the CA
    os.chmod(d, 0o755)
    try:
        cert, key = d / "cert.pem", d / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=cocaq-test",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        os.chmod(cert, 0o644)
        tls_cfg = tmp_path / "tls.toml"
        tls = f'[api]\ntls_cert = "{cert}"\ntls_key = "{key}"\n'
        tls_cfg.write_text(cfg.read_text().replace("[api]\n", tls))
        with serving(tls_cfg, "https", ssl.create_default_context(cafile=str(cert))) as tls_base:
            r = run_as(
                "alice", ["user", "-o", "json"], {"COCAQ_API_URL": tls_base, "COCAQ_API__CA_FILE": str(cert)}
            )
            assert r.returncode == 0 and json.loads(r.stdout)["jobs"] == 2, r.stderr
            # without the CA the certificate is not trusted, and the user is told so in one line
            r = run_as("alice", ["user"], {"COCAQ_API_URL": tls_base})
            assert r.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in r.stderr, r.stderr
            assert len(r.stderr.splitlines()) == 1
            # plain HTTP to the TLS port is not served
            r = run_as("alice", ["user"], {"COCAQ_API_URL": tls_base.replace("https", "http")})
            assert r.returncode == 3, r.stderr
    finally:
        shutil.rmtree(d)


def _running_on_a_node(cfg: Path, job_id: str, user: str, account: str) -> None:
    """What a node's collector has shipped of a job still running (no sacct import yet): its prolog's
    record, its GPU's energy so far and a minute of samples."""
    from sqlalchemy import text

    from cocaq.db.migrate import ensure_sample_partitions

    now = datetime.now(UTC)
    start = now - timedelta(minutes=5)
    uuid = "GPU-a11ce000-0000-4000-8000-000000000007"
    engine = make_engine(load_config(cfg, {}).database_url)
    ensure_sample_partitions(engine, now)
    payload = {
        "ts": start.timestamp(),
        "job": {"user": user, "uid": 1001, "account": account, "partition": "gpu"},
        "gpus": [{"uuid": uuid, "slurm_index": 0, "energy_mj": 0, "power_w": 250.0, "ts": start.timestamp()}],
    }
    with engine.begin() as c:
        cid = c.execute(text("SELECT id FROM clusters")).scalars().first()
        c.execute(
            text(
                "INSERT INTO node_events (uid, cluster_id, node, job_id, event, ts, payload)"
                " VALUES (:uid, :cid, 'vm', :job, 'start', :ts, CAST(:payload AS json))"
            ),
            {
                "uid": f"t/vm/{job_id}/start",
                "cid": cid,
                "job": job_id,
                "ts": start,
                "payload": json.dumps(payload),
            },
        )
        c.execute(
            text(
                "INSERT INTO node_energy (cluster_id, node, job_id, job_start, component, device, source,"
                " method, energy_j, t0, t1, final) VALUES (:cid, 'vm', :job, :start, 'gpu', :uuid, 'nvml',"
                " 'measured', 75000.0, :start, :t1, false)"
            ),
            {"cid": cid, "job": job_id, "start": start, "uuid": uuid, "t1": now - timedelta(seconds=20)},
        )
        for k in range(6):
            ts = now - timedelta(seconds=20 + 10 * k)
            for metric, value in (("power_w", 250.0 + k), ("util_pct", 90.0), ("mem_used_mb", 40000.0)):
                c.execute(
                    text(
                        "INSERT INTO samples (ts, cluster_id, node, source, device, metric, job_id, value)"
                        " VALUES (:ts, :cid, 'vm', 'nvml', :uuid, :metric, :job, :value)"
                    ),
                    {"ts": ts, "cid": cid, "uuid": uuid, "metric": metric, "job": job_id, "value": value},
                )
    engine.dispose()


def test_watch_through_the_api_shows_ones_own_running_job_only(server: tuple[str, Path]) -> None:
    base, cfg = server
    _running_on_a_node(cfg, "77", "alice", "lab_vision")
    api = {"COCAQ_API_URL": base}
    r = run_as("alice", ["watch", "77", "-n", "1", "-o", "json"], api)
    assert r.returncode == 0, r.stderr
    direct = run_cocaq(
        ["--config", str(cfg), "watch", "77", "-n", "1", "-o", "json"], {"PATH": "/usr/bin:/bin"}
    )
    assert direct.code == 0, direct.err
    [mine], [root] = json.loads(r.stdout)["jobs"], json.loads(direct.out)["jobs"]
    for k in ("job_id", "user", "energy_j", "gpus", "parts", "co2_kg", "start_ts", "power_w"):
        assert mine[k] == root[k], k
    assert mine["energy_j"] == 75000.0 and mine["power_w"] == 250.0
    table = run_as("alice", ["watch", "77", "-n", "1"], api)
    assert table.returncode == 0 and "Power now: 250 W" in table.stdout, table.stderr
    job = run_as("alice", ["job", "77"], api)  # not imported yet: the live view
    assert job.returncode == 0 and "RUNNING for" in job.stdout, job.stderr
    mine_all = run_as("alice", ["watch", "-n", "1", "-o", "json"], api)
    assert [v["job_id"] for v in json.loads(mine_all.stdout)["jobs"]] == ["77"]
    r = run_as("bob", ["watch", "77", "-n", "1"], api)
    assert r.returncode == 5 and r.stderr.strip().endswith("403: job 77: not found, or not yours")
    assert json.loads(run_as("bob", ["watch", "-n", "1", "-o", "json"], api).stdout)["jobs"] == []
    # the API down: those who can read the database (root, with the config) are told and read it
    down = {"PATH": "/usr/bin:/bin", "COCAQ_API_URL": f"http://127.0.0.1:{_free_port()}"}
    r = run_cocaq(["--config", str(cfg), "watch", "77", "-n", "1", "-o", "json"], down)
    assert r.code == 0 and json.loads(r.out)["jobs"][0]["energy_j"] == 75000.0, r.err
    assert "cannot reach the API" in r.err and "read the database directly" in r.err
