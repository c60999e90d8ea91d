"""`cocaq user`/`lab` as scripts call them (JSON, CSV) load no SQLAlchemy, ORM, Alembic or rich.

The login-node commands must start fast; `python -X importtime` lists every module the real process
imports, so a stray import anywhere on the path (cocaq.cli.app, config, footprint, dbapi, render) fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.conftest import ROOT, run_cocaq

HEAVY = ("sqlalchemy", "alembic", "rich", "pandas", "pyarrow")
ANALYSIS = ("pandas", "pyarrow", "cocaq.frames")  # cocaq[analysis]: cocaq.frames and `cocaq export` only


def _imported(args: list[str], env: dict[str, str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cocaq", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


@pytest.mark.parametrize(
    "args",
    [
        ["user", "alice", "--since", "30d", "--format", "json"],
        ["user", "alice", "--since", "30d", "--format", "csv", "--from-jobs"],
        ["lab", "lab_a", "--since", "2w", "--format", "json"],
    ],
)
def test_json_and_csv_paths_import_no_sqlalchemy(
    engine: Engine, cli_env: dict[str, str], args: list[str]
) -> None:
    from datetime import UTC, datetime, timedelta

    from cocaq.accounting.importer import import_records
    from cocaq.config import Config
    from cocaq.slurm.record import JobRecord

    url = engine.url.render_as_string(hide_password=False)
    start = datetime.now(UTC) - timedelta(days=1)  # alice and lab_a exist: a name never seen is an error
    rec = JobRecord(job_id="1", job_id_raw=1, user_name="alice", account="lab_a", submit_time=start,
                    start_time=start, end_time=start + timedelta(hours=1), elapsed_s=3600.0, state="COMPLETED",
                    cluster="c", node_list="n1", n_nodes=1, alloc_cpus=1)  # fmt: skip
    import_records(engine, [rec], Config(database_url=url), source="sacct-json")
    env = dict(cli_env, COCAQ_DATABASE_URL=url)
    mods = _imported(args, env)
    assert {"cocaq.cli.app", "cocaq.footprint.totals", "cocaq.db.dbapi"} <= mods  # (the listing works)
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY or m in ("cocaq.db.schema", "cocaq.db.engine"))
    assert heavy == [], heavy
    # the other commands' modules load when those commands are named (cocaq.cli.app.LazyGroup)
    assert not {"cocaq.cli.report", "cocaq.cli.mail", "cocaq.cli.carbon", "cocaq.cli.scheduler"} & mods
    # nor the estimating, which the ledger's source names used to bring (cocaq.accounting.sources)
    assert not {"cocaq.accounting.estimate", "cocaq.accounting.calibrate", "cocaq.carbon.zones"} & mods
    # only the driver the URL names: for PostgreSQL psycopg2 (fast to import), not psycopg 3 as well
    if engine.dialect.name == "postgresql":
        assert "psycopg2" in mods and "psycopg" not in mods and "sqlite3" not in mods
    else:
        assert "sqlite3" in mods and not {"psycopg", "psycopg2"} & mods


def test_user_lab_and_job_import_no_pandas(engine: Engine, cli_env: dict[str, str]) -> None:
    """Every output of `cocaq user`, `lab` and `job` (tables too): no pandas, pyarrow or cocaq.frames,
    which only `cocaq export` and notebooks load."""
    from datetime import UTC, datetime, timedelta

    from cocaq.accounting.importer import import_records
    from cocaq.config import Config
    from tests.builders import job

    url = engine.url.render_as_string(hide_password=False)
    import_records(engine, [job(1, datetime.now(UTC) - timedelta(days=1), account="lab_a")], Config(database_url=url),
                   source="sacct-json")  # fmt: skip
    env = dict(cli_env, COCAQ_DATABASE_URL=url)
    for args in (["user", "alice"], ["user", "alice", "-o", "csv"], ["lab", "lab_a"], ["job", "1"],
                 ["job", "1", "-o", "json"]):  # fmt: skip
        mods = _imported(args, env)
        assert "cocaq.cli.app" in mods and not set(ANALYSIS) & mods, (args, set(ANALYSIS) & mods)
    assert "cocaq.frames" in _imported(["export", "jobs", "-u", "alice"], env)  # (the listing sees it)


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_bad_urls_and_missing_databases_are_one_line_errors(
    cli_env: dict[str, str], tmp_path: Path, driver: str
) -> None:
    cli_env = dict(cli_env, COCAQ_TEST_PG_DRIVER=driver)
    missing = tmp_path / "nope" / "cocaq.sqlite"
    cases = [
        ("not a url", 2, "not a database URL"),
        ("mysql://u:pw@h/db", 2, "unsupported database"),
        (f"sqlite:///{missing}", 3, "run `cocaq db upgrade`"),
        ("postgresql+psycopg://u:s3cret@127.0.0.1:1/x?connect_timeout=bad", 3, "cannot connect to database"),
    ]
    for url, code, message in cases:
        r = run_cocaq(["user", "alice", "--format", "json"], dict(cli_env, COCAQ_DATABASE_URL=url))
        assert r.code == code and message in r.err, (url, r.err)
        assert "Traceback" not in r.err and r.err.strip().count("\n") == 0 and "s3cret" not in r.err
    assert not missing.parent.exists()  # a read-only command leaves nothing behind
