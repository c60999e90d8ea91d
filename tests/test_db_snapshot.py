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
from cocaq.db.alongside import Alongside
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
                with pytest.raises(DatabaseError, match=r"read-only transaction"):
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


def test_work_beside_reads_the_first_connections_snapshot(engine: Engine, driver: str) -> None:
    """cocaq.db.alongside: the second connection sees what the first one sees, not a row written since;
    its error reaches the caller; without a second connection (SQLite) the work runs on the first."""
    url = engine.url.render_as_string(hide_password=False)
    pool = Pool(url, size=2)
    try:
        with pool.db() as db, pool.spare() as other:
            before = _names(db)
            with Alongside(db, other, lambda d: (_add(engine, "written-meanwhile"), _names(d))[1]) as a:
                assert a.beside == (db.dialect == "postgresql")
                seen = a.result()
            assert seen == before  # (the work wrote a row, then read its connection's snapshot)
            assert "written-meanwhile" not in _names(db)
            failing = Alongside(db, other, lambda d: d.rows("SELECT * FROM no_such_table"))
            with failing, pytest.raises(DatabaseError, match=r"no_such_table|no cocaq schema|older"):
                failing.result()
    finally:
        pool.close()


def test_a_spare_connection_is_never_waited_for(engine: Engine) -> None:
    url = engine.url.render_as_string(hide_password=False)
    pool = Pool(url, size=1)
    try:
        with pool.db(), pool.spare() as other:
            assert other is None  # every slot taken: the request's statements run on its own connection
        with pool.spare() as other:
            assert (other is None) == (engine.dialect.name == "sqlite")
    finally:
        pool.close()


def test_every_session_reads_times_in_utc_whatever_the_servers_zone(engine: Engine, driver: str) -> None:
    """A site's PostgreSQL in another zone (here the database's own default, New York): cocaq's sessions
    are in UTC, and a timestamp comes back with datetime.UTC itself, the same instant as written."""
    from datetime import UTC, datetime

    from cocaq.db.engine import make_engine

    if engine.dialect.name != "postgresql":
        pytest.skip("a PostgreSQL session's zone")
    url = engine.url.render_as_string(hide_password=False)
    when = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)  # (a night the clocks change in Europe)
    with engine.begin() as c:
        c.execute(text(f"ALTER DATABASE \"{engine.url.database}\" SET TimeZone = 'America/New_York'"))
        c.execute(text("INSERT INTO clusters (name, created_at) VALUES ('tz', :t)"), {"t": when})
    engine.dispose()
    with connect(url) as db:
        assert db.rows("SHOW TimeZone") == [("UTC",)], driver
        got = db.rows("SELECT created_at FROM clusters WHERE name = 'tz'")[0][0]
        assert got == when and got.tzinfo is UTC, (driver, got)
        db.renew()
        assert db.rows("SHOW TimeZone") == [("UTC",)], driver
    fresh = make_engine(url)
    try:
        with fresh.connect() as c:
            assert c.execute(text("SHOW TimeZone")).scalar() == "UTC"
            got = c.execute(text("SELECT created_at FROM clusters WHERE name = 'tz'")).scalar()
            assert got == when and got.tzinfo is UTC
    finally:
        fresh.dispose()
