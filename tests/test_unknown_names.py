"""A user, lab or cluster nowhere in the database is a typo: every command that takes one refuses it
with exit 2 and the reason (as `cocaq user NOSUCH` does), never an empty answer with exit 0 (issue 32).
Run as real processes on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cocaq
from tests.test_cli import CONFIG, DUMP

MONTH = ["--month", "2026-11"]
WINDOW = ["-S", "2026-11-01", "-E", "2026-12-01"]


@pytest.fixture
def env(cli_env: dict[str, str], migrated_db_url: str, tmp_path: Path) -> dict[str, str]:
    cfg = tmp_path / "cocaq.toml"
    cfg.write_text(CONFIG)
    e = dict(cli_env, COCAQ_DATABASE_URL=migrated_db_url, COCAQ_CONFIG=str(cfg))
    (tmp_path / "dump.txt").write_text(DUMP)
    r = run_cocaq(["import", "sacct", "--file", str(tmp_path / "dump.txt")], e)
    assert r.code == 0, r.err
    return e


def test_every_command_refuses_a_name_nowhere_in_the_database(env: dict[str, str], tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "reports")]
    user, lab, cluster = "no user 'NOSUCH'", "no lab 'NOSUCH'", "no cluster named 'NOSUCH'"
    cases = [
        (["models", *WINDOW, "-u", "NOSUCH"], user),
        (["models", *WINDOW, "-A", "NOSUCH"], lab),
        (["models", *WINDOW, "-M", "NOSUCH"], cluster),
        (["report", "user", "NOSUCH", *MONTH, *out], user),
        (["report", "lab", "NOSUCH", *MONTH, *out], lab),
        (["report", "send", *MONTH, "-M", "NOSUCH", "--dry-run"], cluster),
        (["export", "jobs", *WINDOW, "-u", "NOSUCH"], user),
        (["export", "models", *WINDOW, "-A", "NOSUCH"], lab),
        (["export", "rollups", *WINDOW, "-M", "NOSUCH"], cluster),
        (["job", "10", "-M", "NOSUCH"], cluster),
        (["watch", "10", "-M", "NOSUCH", "-n", "1"], cluster),
    ]
    for args, reason in cases:
        r = run_cocaq(args, env)
        assert (r.code, r.out) == (2, ""), (args, r.code, r.out, r.err)
        assert r.err.startswith(f"cocaq: error: {reason}") and len(r.err.splitlines()) == 1, (args, r.err)
    assert not (tmp_path / "reports").exists(), "no report written for a name that is nowhere"


def test_a_known_name_with_nothing_in_the_window_is_no_error(env: dict[str, str], tmp_path: Path) -> None:
    """carol and lab_b exist (a job in November): an empty window or no model metadata answers, exit 0."""
    empty = ["-S", "2020-01-01", "-E", "2020-02-01"]
    r = run_cocaq(["models", *WINDOW, "-u", "carol"], env)
    assert r.code == 0 and "No job with model metadata ended in this window." in r.out, r.err
    r = run_cocaq(["models", *empty, "-A", "lab_b", "-M", "hal"], env)
    assert r.code == 0, r.err
    r = run_cocaq(["export", "jobs", *empty, "-u", "carol"], env)
    assert r.code == 0 and r.out.startswith("cluster,job_id,"), r.err
    r = run_cocaq(["report", "user", "carol", "--month", "2020-01", "--out", str(tmp_path)], env)
    assert r.code == 0 and r.out.strip().endswith(".eml"), r.err
    r = run_cocaq(["job", "10", "-M", "hal", "-o", "json"], env)
    assert r.code == 0, r.err


def test_the_api_answers_404_with_the_reason(env: dict[str, str]) -> None:
    """The read API says the same (404, which its client turns into exit 2) for /v1/models, /v1/jobs,
    /v1/live and /v1/export: a login node's `cocaq models -u NOSUCH` is refused as the database's is."""
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from cocaq.api.client import payload_for
    from cocaq.api.server import create_app
    from cocaq.config_load import load_config

    cfg = load_config(Path(env["COCAQ_CONFIG"]), {"COCAQ_DATABASE_URL": env["COCAQ_DATABASE_URL"]})
    cfg = replace(cfg, api=replace(cfg.api, admin_users=("root",)))
    # the credential names the request; uid 0 (root) is an admin here
    with TestClient(create_app(cfg, decode=lambda cred: (0, payload_for("GET", cred)))) as client:

        def get(path: str, **params: str) -> tuple[int, str]:
            r = client.get(path, params=params, headers={"Authorization": f"MUNGE {path}"})
            return r.status_code, str(r.json().get("detail", ""))

        since = {"since": "2026-11-01T00:00:00+00:00", "until": "2026-12-01T00:00:00+00:00"}
        code, detail = get("/v1/models", **since, user="NOSUCH")
        assert code == 404 and detail.startswith("no user 'NOSUCH'"), (code, detail)
        code, detail = get("/v1/models", **since, account="NOSUCH")
        assert code == 404 and detail.startswith("no lab 'NOSUCH'"), (code, detail)
        for path, params in (
            ("/v1/models", {"cluster": "NOSUCH"}),
            ("/v1/jobs/10", {"cluster": "NOSUCH"}),
            ("/v1/live", {"jobs": "10", "cluster": "NOSUCH"}),
            ("/v1/export/jobs", {"cluster": "NOSUCH"}),
        ):
            code, detail = get(path, **params)
            assert code == 404 and detail.startswith("no cluster named 'NOSUCH'"), (path, code, detail)
        assert get("/v1/export/jobs", **since, user="NOSUCH")[0] == 404
        assert get("/v1/models", **since, user="carol")[0] == 200
        assert get("/v1/jobs/10", cluster="hal")[0] == 200
