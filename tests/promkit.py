"""A real Prometheus server for the tests (Debian's `prometheus` package, which `scripts/test.sh` installs).

`Prometheus(tmp, scrape_configs)` writes a prometheus.yml, starts the server on a free loopback port with
its TSDB under `tmp`, and waits until it is ready; `query` and `query_range` go through its HTTP API, so
PromQL is checked by Prometheus itself. Without the binaries the tests that need them fail and say why
(COCAQ_SKIP_PROMETHEUS=1 skips them instead, for a machine without Debian's packages).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`, or fail (skip with COCAQ_SKIP_PROMETHEUS=1) saying why."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if found:
        return found
    why = f"{name} is not installed: scripts/test.sh installs Debian's prometheus package (as root)"
    if os.environ.get("COCAQ_SKIP_PROMETHEUS") == "1":
        pytest.skip(why)
    pytest.fail(why + "; COCAQ_SKIP_PROMETHEUS=1 skips these tests")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PromError(Exception):
    """Prometheus refused a query (bad PromQL): its error type and message."""


class Prometheus:
    """One Prometheus server; use as a context manager (it is stopped and its data removed at exit)."""

    def __init__(self, tmp: Path, scrape_configs: list[dict[str, Any]], scrape_interval: str = "1s") -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": scrape_configs,
        }
        self.config = tmp / "prometheus.yml"
        self.config.write_text(json.dumps(conf, indent=1))  # YAML is a superset of JSON
        self.log = tmp / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        check = subprocess.run(
            [binary("promtool"), "check", "config", str(self.config)], capture_output=True, text=True
        )
        assert check.returncode == 0, f"promtool refused the test's config:\n{check.stdout}{check.stderr}"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary("prometheus"),
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise AssertionError(f"prometheus did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; the `data` of a success, else PromError with Prometheus' own message."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PromError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (or a scalar's one-element list)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets_up(self) -> list[dict[str, Any]]:
        return [t for t in self.api("targets")["activeTargets"] if t.get("health") == "up"]

    def wait_for(self, expr: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll an instant query until it returns something."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.query(expr)
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no result for {expr!r} in {timeout_s} s; targets: {self.api('targets')}"
                )
            time.sleep(0.5)


def promtool_check_metrics(text: str) -> str:
    """`promtool check metrics` on an exposition: its complaints ("" when clean)."""
    r = subprocess.run(
        [binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    return (r.stdout + r.stderr).strip() if r.returncode != 0 or r.stdout.strip() or r.stderr.strip() else ""
