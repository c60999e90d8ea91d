"""The tests' migrated databases are copies of a template (tests/conftest.py): a copy must be what running
every migration on an empty database gives, schema, rows and alembic version, or the shortcut would test
a schema that no site has."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, make_url, text

from cocaq.db import migrate
from cocaq.db.engine import make_engine
from tests.conftest import migrated_database, new_database

_CONSTRAINT = re.compile(r"\s*(CONSTRAINT|PRIMARY KEY|UNIQUE|FOREIGN KEY|CHECK)\b")


def _table_clauses_sorted(statement: str) -> str:
    """A CREATE TABLE with its columns in order and its table constraints sorted: Alembic's batch mode
    (SQLite's ALTER) writes the constraints of a rebuilt table in an order that differs from one fresh
    migration to the next, in one process too, and SQLite gives that order no meaning."""
    if not statement.startswith("CREATE TABLE") or "\n" not in statement:
        return statement
    head, *body, tail = statement.split("\n")
    clauses = [line.rstrip().removesuffix(",").rstrip() for line in body]
    columns = [c for c in clauses if not _CONSTRAINT.match(c)]
    constraints = sorted(c for c in clauses if _CONSTRAINT.match(c))
    return "\n".join([head, *columns, *constraints, tail])


def _dump(url: str) -> str:
    """Everything in the database as SQL text: schema, rows, the alembic version."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        con = sqlite3.connect(str(u.database))
        try:
            pragmas = [con.execute(f"PRAGMA {p}").fetchone() for p in ("journal_mode", "user_version")]
            # (sorted: the order of a table's indexes in sqlite_master is the order the batch mode made them)
            return "\n".join([repr(pragmas), *sorted(_table_clauses_sorted(s) for s in con.iterdump())])
        finally:
            con.close()
    pg_dump = shutil.which("pg_dump")
    if pg_dump is None:
        pytest.fail("pg_dump is not on PATH (Debian: postgresql-client, which PostgreSQL's server pulls in)")
    args = [pg_dump, "--no-owner", "--no-privileges", "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432)]
    args += ["-U", u.username or "postgres", str(u.database)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120).stdout
    # pg_dump 15.14 and later fence the script with a random \restrict key
    return "\n".join(line for line in out.splitlines() if not line.startswith(("\\restrict", "\\unrestrict")))


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_copy_is_a_fresh_migration(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    (tmp_path / "fresh").mkdir()
    (tmp_path / "copy").mkdir()
    fresh_url = new_database(kind, tmp_path / "fresh", request)
    fresh = make_engine(fresh_url)
    migrate.upgrade(fresh)
    fresh.dispose()
    copy_url = migrated_database(kind, tmp_path / "copy", request)

    fresh_dump, copy_dump = _dump(fresh_url), _dump(copy_url)
    assert "CREATE TABLE" in fresh_dump and "alembic_version" in fresh_dump
    assert copy_dump == fresh_dump
    copy = make_engine(copy_url)
    try:
        head = ScriptDirectory.from_config(migrate.alembic_config(copy)).get_current_head()
        assert head is not None and migrate.current_revision(copy) == head
    finally:
        copy.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_copies_are_independent(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A test's rows stay in its own copy: the next copy starts without them."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_engine(migrated_database(kind, tmp_path / "a", request))
    try:
        with a.begin() as c:
            c.execute(text("INSERT INTO clusters (name) VALUES ('only-in-a')"))
            assert c.execute(text("SELECT count(*) FROM clusters WHERE name = 'only-in-a'")).scalar_one() == 1
    finally:
        a.dispose()
    b = make_engine(migrated_database(kind, tmp_path / "b", request))
    try:
        with b.connect() as c:
            assert c.execute(text("SELECT count(*) FROM clusters WHERE name = 'only-in-a'")).scalar_one() == 0
    finally:
        b.dispose()


def test_db_url_alone_is_empty(db_url: str) -> None:
    eng = make_engine(db_url)
    try:
        assert inspect(eng).get_table_names() == []
    finally:
        eng.dispose()


def test_db_url_with_engine_is_the_engines_migrated_database(db_url: str, engine: Engine) -> None:
    assert make_url(db_url) == engine.url
    assert migrate.current_revision(engine) is not None
    assert "jobs" in inspect(engine).get_table_names()


def test_migrated_db_url_is_db_url_migrated(db_url: str, migrated_db_url: str) -> None:
    assert migrated_db_url == db_url
    eng = make_engine(migrated_db_url)
    try:
        assert migrate.current_revision(eng) is not None
    finally:
        eng.dispose()
