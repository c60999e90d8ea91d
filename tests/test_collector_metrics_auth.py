"""`[collector] metrics_token_file` and `metrics_tls_*_file` (issue 33, point 1): the node endpoint names
every running job's user, account and job id, so a site can make it require a bearer token (as the
API's /metrics does) and speak TLS. A real Collector serves over real HTTP(S); a real Prometheus scrapes
it with `authorization: {credentials_file: ...}` and `tls_config`, and is refused without them; a token
file that others could read, or reached through someone else's link, stops the start in one line.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cocaq.collector.daemon import Collector
from cocaq.config_load import load_config
from tests.conftest import run_cocaq
from tests.nodekit import Clock, Node, cocaq_env
from tests.promkit import Prometheus, free_port
from tests.test_collector_metrics import _busy_cycle, _node

TOKEN = "s3cr3t-Token_0123456789abcdef"
NOBODY = 65534


def _token_file(d: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / "metrics-token"
    p.write_text(text)
    os.chmod(p, mode)
    return p


def _configure(node: Node, **keys: Path | str) -> None:
    with open(node.config, "a") as fh:  # the [collector] table is the file's last
        for k, v in keys.items():
            fh.write(f'{k} = "{v}"\n')


def _get(
    url: str, token: str | None = None, scheme: str = "Bearer", ctx: ssl.SSLContext | None = None
) -> tuple[int, Any, str]:
    """(status, headers, body) of GET url; an HTTP error is an answer too."""
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"{scheme} {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def _self_signed(d: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    d.mkdir(parents=True, exist_ok=True)
    cert_p, key_p = d / "node.crt", d / "node.key"
    cert_p.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_p.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    os.chmod(key_p, 0o600)
    return cert_p, key_p


def test_with_a_token_file_a_scrape_without_the_token_is_401_and_with_it_is_the_cycle(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
    _configure(node, metrics_token_file=_token_file(tmp_path / "etc"))
    node.hook("prolog", 361, SLURM_JOB_GPUS="1")
    cg.add_job("361", cpus="0-3")
    with caplog.at_level(logging.DEBUG, logger="cocaq"):
        c = Collector(load_config(node.config, {}))
        try:
            c.sample()
            _busy_cycle(c, clock, rapl, cg, {"361": 4_000_000})
            url = f"http://127.0.0.1:{port}/metrics"
            for token, scheme in [
                (None, ""),
                ("wrong", "Bearer"),
                (TOKEN[:-1], "Bearer"),
                (TOKEN + "x", "Bearer"),
                (TOKEN, "Basic"),
                (TOKEN, "Token"),
                ("", "Bearer"),
            ]:
                status, headers, body = _get(url, token, scheme)
                assert status == 401, (token, scheme)
                assert headers["WWW-Authenticate"] == "Bearer"
                assert "alice" not in body and "361" not in body and "metrics_token_file" in body
            status, _h, body = _get(f"http://127.0.0.1:{port}/anything", None)  # every path is behind it
            assert status == 401
            for scheme in ("Bearer", "bearer"):
                status, _h, body = _get(url, TOKEN, scheme)
                assert status == 200 and 'job_id="361"' in body and 'user="alice"' in body
        finally:
            c.close()
    assert any("bearer token required" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if TOKEN in r.getMessage()], "the token is never logged"


def test_a_token_file_others_can_read_or_reach_through_a_users_link_stops_the_start(tmp_path: Path) -> None:
    """One line, exit 2, before anything is sampled; never the token in the message. Also with --once
    (which serves nothing), so that a check run finds it."""
    listen = f"127.0.0.1:{free_port()}"
    good = _token_file(tmp_path / "good")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    user_link = tmp_path / "user-link"
    user_link.symlink_to(good)
    os.lchown(user_link, NOBODY, NOBODY)
    users_file = _token_file(tmp_path / "users")
    os.chown(users_file, NOBODY, NOBODY)
    cases: list[tuple[str, Path, str]] = [
        ("group-readable", _token_file(tmp_path / "g", mode=0o640), "chmod 600"),
        ("world-readable", _token_file(tmp_path / "w", mode=0o604), "chmod 600"),
        ("group-writable", _token_file(tmp_path / "gw", mode=0o620), "chmod 600"),
        ("a user's link", user_link, "symbolic link owned by uid 65534"),
        ("a user's file", users_file, "owned by uid 65534"),
        ("missing", tmp_path / "nope", "cannot open"),
        ("a directory", tmp_path, "not a regular file"),
        ("a FIFO", fifo, "not a regular file"),
        ("empty", _token_file(tmp_path / "e", ""), "must hold one token"),
        ("two lines", _token_file(tmp_path / "2", f"{TOKEN}\n{TOKEN}\n"), "must hold one token"),
        ("a space", _token_file(tmp_path / "s", "two words"), "must hold one token"),
        ("too long", _token_file(tmp_path / "l", "x" * 5000), "must hold one token"),
        ("binary", _token_file(tmp_path / "b", "tok\x00en\x7f"), "must hold one token"),
    ]
    for what, path, says in cases:
        node, _r, _c = _node(tmp_path / what.replace(" ", "_").replace("'", ""), listen)
        _configure(node, metrics_token_file=path)
        runs = [["collector", "--once", "--no-ship"]]
        if what == "group-readable":  # the daemon too (it would run on and on if it started)
            runs.append(["collector", "--no-ship", "--interval", "1"])
        for args in runs:
            r = run_cocaq(args, env=cocaq_env(node))
            assert r.code == 2, (what, args, r.code, r.err)
            line = r.err.strip()
            assert line.startswith("cocaq: error: config: collector.metrics_token_file:"), (what, line)
            assert says in line and "\n" not in line and "Traceback" not in r.err, (what, line)
            assert TOKEN not in r.err and "two words" not in r.err, what
            assert not (node.spool / "collector.db").exists(), what  # refused before it started
    # root's own link to a good file, and a good file: they start
    root_link = tmp_path / "root-link"
    root_link.symlink_to(good)
    for path in (good, root_link):
        node, _r, _c = _node(tmp_path / f"ok-{path.name}", listen)
        _configure(node, metrics_token_file=path)
        r = run_cocaq(["collector", "--once", "--no-ship"], env=cocaq_env(node))
        assert r.code == 0, (path, r.err)


def test_tls_and_the_token_over_https(tmp_path: Path, clock: Clock) -> None:
    port = free_port()
    cert, key = _self_signed(tmp_path / "tls")
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
    _configure(
        node,
        metrics_token_file=_token_file(tmp_path / "etc"),
        metrics_tls_cert_file=cert,
        metrics_tls_key_file=key,
    )
    node.hook("prolog", 371, SLURM_JOB_GPUS="1")
    cg.add_job("371")
    c = Collector(load_config(node.config, {}))
    try:
        c.sample()
        _busy_cycle(c, clock, rapl, cg, {"371": 1_000_000})
        ctx = ssl.create_default_context(cafile=str(cert))
        url = f"https://127.0.0.1:{port}/metrics"
        assert _get(url, None, ctx=ctx)[0] == 401
        status, _h, body = _get(url, TOKEN, ctx=ctx)
        assert status == 200 and 'job_id="371"' in body
        # plain HTTP to it, a client that connects and says nothing, one that fails the handshake:
        # none of them gets the series, and the server goes on serving
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            _get(f"http://127.0.0.1:{port}/metrics", TOKEN)
        idle = socket.create_connection(("127.0.0.1", port), timeout=5)
        with pytest.raises(urllib.error.URLError) as refused:
            _get(url, TOKEN, ctx=ssl.create_default_context())  # (not our CA)
        assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
        assert _get(url, TOKEN, ctx=ctx)[0] == 200
        idle.close()
    finally:
        c.close()


def test_tls_files_that_do_not_pass_stop_the_start(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path / "tls")
    other_cert, _other_key = _self_signed(tmp_path / "other")
    open_key = tmp_path / "open.key"
    open_key.write_bytes(key.read_bytes())
    os.chmod(open_key, 0o644)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    listen = f"127.0.0.1:{free_port()}"
    for what, c, k, says in [
        ("a readable key", cert, open_key, "collector.metrics_tls_key_file:"),
        ("not PEM", garbage, key, "not a certificate and its unencrypted key"),
        ("a key that is not the cert's", other_cert, key, "not a certificate and its unencrypted key"),
        ("missing", tmp_path / "nope.crt", key, "collector.metrics_tls_cert_file:"),
    ]:
        node, _r, _c = _node(tmp_path / what.replace(" ", "_").replace("'", ""), listen)
        _configure(node, metrics_tls_cert_file=c, metrics_tls_key_file=k)
        r = run_cocaq(["collector", "--once", "--no-ship"], env=cocaq_env(node))
        line = r.err.strip()
        assert r.code == 2 and says in line and "\n" not in line and "Traceback" not in r.err, (what, r.err)
        assert "PRIVATE KEY" not in r.err
    # one without the other: the loader says so
    node, _r, _c = _node(tmp_path / "half", listen)
    _configure(node, metrics_tls_cert_file=cert)
    r = run_cocaq(["collector", "--once", "--no-ship"], env=cocaq_env(node))
    assert r.code == 2 and "metrics_tls_cert_file and metrics_tls_key_file go together" in r.err, r.err


def test_a_real_prometheus_scrapes_with_the_credentials_file_over_tls_and_is_refused_without(
    tmp_path: Path, clock: Clock
) -> None:
    port = free_port()
    cert, key = _self_signed(tmp_path / "tls")
    token = _token_file(tmp_path / "etc")
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
    _configure(node, metrics_token_file=token, metrics_tls_cert_file=cert, metrics_tls_key_file=key)
    node.hook("prolog", 381, SLURM_JOB_GPUS="1")
    cg.add_job("381")
    c = Collector(load_config(node.config, {}))
    try:
        c.sample()
        _busy_cycle(c, clock, rapl, cg, {"381": 1_000_000})
        target = {"static_configs": [{"targets": [f"127.0.0.1:{port}"]}], "scheme": "https"}
        tls = {"tls_config": {"ca_file": str(cert)}}
        scrape = [
            {"job_name": "with", **target, **tls, "authorization": {"type": "Bearer", "credentials_file": str(token)}},
            {"job_name": "without", **target, **tls},
            {"job_name": "plain-http", "static_configs": target["static_configs"],
             "authorization": {"type": "Bearer", "credentials_file": str(token)}},
        ]  # fmt: skip
        with Prometheus(tmp_path / "prom", scrape) as prom:
            got = prom.wait_for('cocaq_job_gpu_power_watts{job="with",job_id="381"}')
            assert got[0]["metric"]["user"] == "alice"
            deadline = time.monotonic() + 30
            while True:
                health = {
                    t["labels"]["job"]: (t["health"], t.get("lastError", ""))
                    for t in prom.api("targets")["activeTargets"]
                }
                if all(h != "unknown" for h, _ in health.values()) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert health["with"][0] == "up"
            assert health["without"][0] == "down" and "401" in health["without"][1], health
            assert health["plain-http"][0] == "down", health
            assert not prom.query('cocaq_job_gpu_power_watts{job!="with"}')
    finally:
        c.close()


def test_off_by_default_and_the_unprotected_endpoint_still_serves(tmp_path: Path, clock: Clock) -> None:
    """No token file: as before (the docs say what that exposes)."""
    port = free_port()
    node, rapl, cg = _node(tmp_path, f"127.0.0.1:{port}")
    cfg = load_config(node.config, {})
    assert cfg.collector.metrics_token_file is None and cfg.collector.metrics_tls_cert_file is None
    node.hook("prolog", 391, SLURM_JOB_GPUS="1")
    cg.add_job("391")
    c = Collector(cfg)
    try:
        c.sample()
        _busy_cycle(c, clock, rapl, cg, {"391": 1_000_000})
        status, _h, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and 'job_id="391"' in body
    finally:
        c.close()
