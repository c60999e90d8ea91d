"""Real databases for the tests: a fresh SQLite file and a fresh PostgreSQL database per test module.

A migrated database is a copy of a template migrated once per test process (PostgreSQL `CREATE DATABASE
... TEMPLATE`, SQLite a file copy): running every migration for each of the suite's ~1,000 migrated
databases took minutes. tests/test_test_databases.py holds that a copy equals a fresh migration.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from cocaq.db import migrate
from cocaq.db.engine import make_engine
from cocaq.db.partitions import ensure_sample_partitions

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
    return _pg_url(_pg_database(request))


def _pg_database(request: pytest.FixtureRequest, template: str | None = None) -> str:
    """A new PostgreSQL database (empty, or a copy of `template`), dropped when `request` ends; its name."""
    admin: Engine = request.getfixturevalue("pg_admin")
    name = f"cocaq_test_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"{copy}'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    request.addfinalizer(drop)
    return name


@dataclass(frozen=True)
class Template:
    """A database migrated to head once per process; `made` is when (the samples' monthly partitions)."""

    kind: str
    where: str  # the SQLite file, or the PostgreSQL database's name
    made: datetime


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    path = tmp_path_factory.mktemp("template") / "cocaq.sqlite"
    eng = make_engine(f"sqlite:///{path}")
    migrate.upgrade(eng)
    eng.dispose()
    # WAL mode: closing the last connection folds the log into the file, so the file alone is the database
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert not leftovers, f"the SQLite template left {leftovers} beside it: a file copy would miss them"
    return Template("sqlite", str(path), datetime.now(UTC))


@pytest.fixture(scope="session")
def pg_template(pg_admin: Engine) -> Iterator[Template]:
    name = f"cocaq_test_template_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        eng = make_engine(_pg_url(name))
        migrate.upgrade(eng)
        eng.dispose()  # CREATE DATABASE ... TEMPLATE refuses a template with open connections
        yield Template("postgresql", name, datetime.now(UTC))
    finally:
        with pg_admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def copy_template(template: Template, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A new database copied from `template`, its URL; PostgreSQL's is dropped when `request` ends."""
    if template.kind == "sqlite":
        path = tmp_path / "cocaq.sqlite"
        if path.exists():
            raise FileExistsError(f"{path} exists: one database per directory")
        shutil.copyfile(template.where, path)
        return f"sqlite:///{path}"
    url = _pg_url(_pg_database(request, template.where))
    now = datetime.now(UTC)
    if (now.year, now.month) != (template.made.year, template.made.month):
        # migrate.upgrade makes the samples' partitions from the current month on: past a month boundary,
        # make the ones a fresh migration would make now
        eng = make_engine(url)
        ensure_sample_partitions(eng, now, months_ahead=2)
        eng.dispose()
    return url


def migrated_database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """What `new_database` then `migrate.upgrade` give, as a copy of the process's template."""
    template: Template = request.getfixturevalue("sqlite_template" if kind == "sqlite" else "pg_template")
    return copy_template(template, tmp_path, request)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind; a migrated one when the test uses `engine` or `migrated_db_url` (a
    copy of the template, as running `cocaq db upgrade` on the empty one would give)."""
    if {"engine", "migrated_db_url"} & set(request.fixturenames):
        return migrated_database(request.param, tmp_path, request)
    return new_database(request.param, tmp_path, request)


@pytest.fixture
def migrated_db_url(db_url: str) -> str:
    """`db_url`, migrated: for tests that drive the `cocaq` process and would otherwise start one more just
    for `cocaq db upgrade` (which tests/test_cli.py and the module-scoped sites still run)."""
    return db_url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A migrated database of each kind (`db_url` made it a copy of the migrated template)."""
    eng = make_engine(db_url)
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
    # COLUMNS and LINES too: pytest-xdist's workers have them set (80 x 24), which a user's piped command
    # does not; a test about the width sets COLUMNS itself
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("COCAQ_") and k not in ("COLUMNS", "LINES")
    }
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


def built_demo(tmp: Path, *args: str) -> tuple[dict[str, str], str]:
    """`cocaq demo --out TMP/demo ARGS` into a SQLite file of its own, as the modules that read the demo's
    site build it: the environment it ran with (none of the caller's COCAQ_* or terminal size, HOME and
    XDG_DATA_HOME in `tmp`), for their own `cocaq` runs, and the database's URL."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("COCAQ_") and k not in ("COLUMNS", "LINES")
    }
    url = f"sqlite:///{tmp / 'demo.sqlite'}"
    env.update(HOME=str(tmp), XDG_DATA_HOME=str(tmp / "xdg"), COCAQ_DATABASE_URL=url, PYTHONUNBUFFERED="1")
    r = run_cocaq(["demo", "--out", str(tmp / "demo"), *args], env, cwd=tmp)
    assert r.code == 0, r.err
    return env, url


@dataclass
class DemoSite:
    """The demo's site a module built (`built_demo`), and `cocaq` run against it."""

    dir: Path
    env: dict[str, str]
    cfg: Any  # cocaq.config.Config
    cfg_path: Path

    def cocaq(self, *args: str, columns: int | None = None) -> Result:
        env = dict(self.env, COLUMNS=str(columns)) if columns else self.env
        return run_cocaq(["--config", str(self.cfg_path), *args], env, cwd=self.dir)

    def json(self, *args: str) -> Any:
        """`cocaq ARGS -o json`, read (no [api] url: the CLI reads the demo's database directly)."""
        r = self.cocaq(*args, "-o", "json")
        assert r.code == 0, r.err
        return json.loads(r.out)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the real Slurm clusters' tests each on one worker (tests/parallel.py)."""
    if config.pluginmanager.hasplugin("xdist"):
        from tests.parallel import Plugin

        config.pluginmanager.register(Plugin(), "cocaq-parallel")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests on the Slurm 25.11 cluster go last: scripts/test.sh builds that Slurm (and pyslurm) in
    the background while the rest of the suite runs, and these wait for the build."""

    def needs_2511(item: pytest.Item) -> bool:
        return "[25.11" in item.nodeid or item.nodeid.startswith("tests/test_slurm_backends.py")

    items[:] = [i for i in items if not needs_2511(i)] + [i for i in items if needs_2511(i)]
