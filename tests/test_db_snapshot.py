"""The login-node connections' snapshots (cocaq.db.dbapi.Db): one per command, a new one per pooled request
and per `cocaq watch` refresh, always read-only, and PostgreSQL's JIT off for every one of them.

Found measuring the web app (issue 38): `SET LOCAL jit = off` lasted only for a connection's first
transaction, so the read API's pooled connections compiled the advice's statements from their second
request on; and psycopg 3's autocommit connection, once rolled back, read each later statement in a
snapshot of its own. Both drivers and SQLite, on real databases.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from cocaq.api.pool import Pool
from cocaq.db.dbapi import connect
from cocaq.errors import DatabaseError


@pytest.fixture(params=["psycopg2", "psycopg"])
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("COCAQ_TEST_PG_DRIVER", request.param)
    yield str(request.param)


def _add(engine: Engine, name: str) -> None:
    with engine.begin() as c:
        c.execute(text("INSERT INTO clusters (name) VALUES (:n)"), {"n": name})


def _names(db: object) -> set[str]:
    return {r[0] for r in db.rows("SELECT name FROM clusters")}  # type: ignore[attr-defined]


def test_one_snapshot_until_renewed_then_a_new_one_read_only(engine: Engine, driver: str) -> None:
    url = engine.url.render_as_string(hide_password=False)
    with connect(url) as db:
        before = _names(db)
        _add(engine, "later")
        assert _names(db) == before  # the command's one snapshot: a row written since is not in it
        for round_ in range(2):  # twice: the second renewal starts from a renewed snapshot
            db.renew()
            assert "later" in _names(db), round_
            if db.dialect == "postgresql":
                assert db.rows("SHOW jit") == [("off",)], f"{driver}, snapshot {round_ + 2}"
                assert db.rows("SHOW transaction_isolation") == [("repeatable read",)]
            _add(engine, f"after-{round_}")
            assert f"after-{round_}" not in _names(db)  # repeatable read again, not a statement each
            if db.dialect == "postgresql":  # (SQLite's reader is one by convention: the demo's own file)
                with pytest.raises(DatabaseError, match="read-only transaction"):
                    db.rows("INSERT INTO clusters (name) VALUES ('from-a-reader')")
                db.renew()  # (the failed statement ended that transaction: a new one, as the pool does)


def test_a_pooled_connection_gets_a_new_snapshot_and_no_jit_per_request(engine: Engine, driver: str) -> None:
    url = engine.url.render_as_string(hide_password=False)
    pool = Pool(url, size=1)  # one connection: the second request reuses the first's (not on SQLite)
    try:
        with pool.db() as db:
            first = id(db)
            assert "pooled" not in _names(db)
        _add(engine, "pooled")
        with pool.db() as db:
            assert "pooled" in _names(db)
            if db.dialect == "postgresql":
                assert id(db) == first, "the pool reuses its connection"
                assert db.rows("SHOW jit") == [("off",)], driver
                assert db.rows("SHOW transaction_read_only") == [("on",)], driver
            _add(engine, "pooled-2")
            assert "pooled-2" not in _names(db), "one snapshot for the whole request"
    finally:
        pool.close()
