"""The COCAQ_* variables the repository's own scripts and tests use are not settings, and exporting them
does not break cocaq (issue 33, point 11); a typo of a setting is still refused in one line.

An admin who follows the Slurm/pyslurm build recipe exports `COCAQ_SLURM_SOURCE` and friends in the
shell they then run cocaq from. Every `COCAQ_*` name written anywhere in the repository is read here:
each is a setting, a variable the loader knows it does not own (cocaq.config_load), or one of the few
names that tests write on purpose as unknown.
"""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from cocaq import config_load as L
from cocaq.accounting.importer import import_records
from cocaq.errors import ConfigError
from tests import builders
from tests.conftest import ROOT, run_cocaq

NAME = re.compile(r"\bCOCAQ_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_])")
# Written on purpose as names nobody owns: a prefix in code, the unknown names tests expect refused, the
# SMTP password variable that `mail.smtp_password_env` names in the mail tests.
DELIBERATE = {"COCAQ_TEST", "COCAQ_FROB", "COCAQ_NO_SUCH_THING", "COCAQ_SMTP_PASSWORD"}
TYPOS = {
    "COCAQ_DATABSE_URL": "COCAQ_DATABASE_URL",
    "COCAQ_DATABASE_URI": "COCAQ_DATABASE_URL",
    "COCAQ_SLURM_BACKEND": "COCAQ_SLURM__BACKEND",
    "COCAQ_MAIL_TRANSPORT": "COCAQ_MAIL__TRANSPORT",
    "COCAQ_SLURM_SOURCES": "COCAQ_SLURM_SOURCE",
}
# Values as a script or an admin would set them (the rest get "1").
VALUES = {
    "COCAQ_SLURM_SOURCE": "/tmp/slurm-25.11.7.tar.gz",
    "COCAQ_SLURM_VERSION": "25.11",
    "COCAQ_DB_PASS": "s3cret",
    "COCAQ_TEST_PG_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "COCAQ_SLURM_USERS": "alice bob",
}


def repo_names() -> set[str]:
    """Every COCAQ_* name in the repository's files (git's list; a tree without git: every text file)."""
    try:
        files = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.split(b"\0")
        paths = [ROOT / f.decode() for f in files if f]
    except (OSError, subprocess.SubprocessError):
        paths = [p for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts]
    names: set[str] = set()
    for p in paths:
        if p.is_file() and not p.is_symlink() and p.stat().st_size < 2_000_000:
            names |= set(NAME.findall(p.read_text(encoding="utf-8", errors="replace")))
    return names


def not_settings(names: set[str]) -> set[str]:
    """The names that are not of a setting's shape (`COCAQ_SECTION__KEY` or a short form)."""
    return {n for n in names if "__" not in n and n not in L.ENV_SHORTHANDS}


def tool_env() -> dict[str, str]:
    names = not_settings(repo_names()) - DELIBERATE - set(TYPOS) - {"COCAQ_CONFIG"}
    return {n: VALUES.get(n, "1") for n in sorted(names)}


def test_every_name_in_the_repository_is_accounted_for() -> None:
    names = not_settings(repo_names()) - DELIBERATE - set(TYPOS)
    assert {"COCAQ_SLURM_SOURCE", "COCAQ_DB_PASS", "COCAQ_UPDATE_GOLDEN", "COCAQ_TEST_PG_URL"} <= names
    unknown = sorted(n for n in names if not L.is_not_a_setting(n))
    assert not unknown, (
        f"{unknown}: COCAQ_* variables that cocaq would refuse as unknown settings; a script's or "
        "test's own variable goes in cocaq/config_load.py's TOOL_ENV (or is named COCAQ_TEST_*)"
    )
    # The lists name only what is used, so they cannot grow into a place where typos hide.
    assert set(L.TOOL_ENV) <= names, sorted(set(L.TOOL_ENV) - names)


def test_all_of_them_exported_together_and_cocaq_still_works(
    engine: Engine, db_url: str, cli_env: dict[str, str]
) -> None:
    env = tool_env()
    L.load_config(None, environ=env)  # in-process: no ConfigError
    when = datetime.now(UTC) - timedelta(days=2)
    import_records(
        engine, [builders.job(1, when, user="dave")], builders.default_config(), source="sacct-json"
    )
    r = run_cocaq(["user", "dave", "--since", "30d"], dict(cli_env, **env, COCAQ_DATABASE_URL=db_url))
    assert r.code == 0, r.err
    assert "unknown setting" not in r.err and "Traceback" not in r.err and "dave" in r.out, r.err


@pytest.mark.parametrize(("typo", "meant"), sorted(TYPOS.items()))
def test_a_typo_of_a_setting_is_still_refused(
    typo: str, meant: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'none.sqlite'}"
    with pytest.raises(ConfigError, match=rf"{typo}: unknown setting"):
        L.load_config(None, environ={**tool_env(), typo: "1"})
    r = run_cocaq(["user", "dave"], dict(cli_env, **tool_env(), COCAQ_DATABASE_URL=db_url, **{typo: "x"}))
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert f"{typo}: unknown setting" in r.err and f"did you mean {meant}?" in r.err, r.err


def test_a_typo_of_a_key_is_refused_with_its_section() -> None:
    with pytest.raises(ConfigError, match=r"mail\.transportt: unknown key"):
        L.load_config(None, environ={**tool_env(), "COCAQ_MAIL__TRANSPORTT": "smtp"})
