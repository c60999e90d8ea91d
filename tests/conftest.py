"""Real databases for the tests: a fresh SQLite file and a fresh PostgreSQL database per test module."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from cocaq.db import migrate
from cocaq.db.engine import make_engine

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
PG_ADMIN_URL = os.environ.get("COCAQ_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def _pg_url(dbname: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{dbname}"


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect():
            pass
    except Exception as exc:  # the test command starts PostgreSQL; not finding it is a failure
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {exc}")
    yield engine
    engine.dispose()


def new_database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'cocaq.sqlite'}"
    admin: Engine = request.getfixturevalue("pg_admin")
    name = f"cocaq_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    request.addfinalizer(drop)
    return _pg_url(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind."""
    return new_database(request.param, tmp_path, request)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A migrated database of each kind."""
    eng = make_engine(db_url)
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """time.time under the test's control (tests.nodekit.Clock): step it with `clock.now += 10`."""
    from tests.nodekit import Clock

    c = Clock()
    monkeypatch.setattr(time, "time", c)
    yield c


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running the real `cocaq` process: no site config, a private data dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg-data")
    env["COCAQ_CONFIG"] = str(tmp_path / "no-such-config.toml")
    env.pop("COCAQ_CONFIG")
    env["HOME"] = str(tmp_path)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cocaq(
    args: list[str], env: dict[str, str], stdin: bytes | None = None, cwd: Path | None = None
) -> Result:
    """Run `python -m cocaq ARGS` as a separate process, as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "cocaq", *args],
        env=env,
        input=stdin,
        capture_output=True,
        cwd=cwd or ROOT,
        timeout=300,
        check=False,
    )
    return Result(
        proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests on the Slurm 25.11 cluster go last: scripts/test.sh builds that Slurm (and pyslurm) in
    the background while the rest of the suite runs, and these wait for the build."""

    def needs_2511(item: pytest.Item) -> bool:
        return "[25.11" in item.nodeid or item.nodeid.startswith("tests/test_slurm_backends.py")

    items[:] = [i for i in items if not needs_2511(i)] + [i for i in items if needs_2511(i)]
