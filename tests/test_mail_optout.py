"""`cocaq mail opt-out` / `opt-in` through the real CLI, on SQLite and PostgreSQL (issue 33, point 3).

An address opts out the user whose reports go there (users.email, the address map, the template: the
order cocaq.reports.recipients reads them in); a name must be a user cocaq has seen (jobs, users, the
address map) unless --force; anything else is one line and exit 2, and nothing is written.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select

from cocaq.accounting.importer import import_records
from cocaq.config_load import load_config
from cocaq.db.schema import User
from cocaq.reports.recipients import AddressBook
from tests import builders
from tests.builders import write_config
from tests.conftest import Result, run_cocaq
from tests.mailkit import mail_toml

T0 = datetime(2025, 3, 3, 9, tzinfo=UTC)
WITH_JOBS = ["dave", "frank", "gina", "ivan"]


@pytest.fixture
def site(engine: Engine, db_url: str, tmp_path: Path, cli_env: dict[str, str]) -> dict[str, str]:
    """Users with jobs, one users.email, an address map that disagrees with the template for two."""
    amap = tmp_path / "addresses.csv"
    # carol has no jobs yet but is in the file; erin's line gives her frank's template address;
    # gina's line sends her mail elsewhere than the template would.
    amap.write_text(
        "user,address\ncarol,c.jones@uni.example\nerin,frank@example.org\ngina,gina@lab.example\n"
    )
    extra = mail_toml(address_template="{user}@example.org", address_map=str(amap))
    cfg_path = write_config(tmp_path / "cocaq.toml", db_url, extra)
    cfg = builders.config(tmp_path, db_url, extra)
    recs = [builders.job(100 + i, T0, user=u) for i, u in enumerate(WITH_JOBS)]
    import_records(engine, recs, cfg, source="sacct-json")
    with engine.begin() as c:
        c.execute(insert(User).values(name="ivan", email="ivan@home.example"))
    return dict(cli_env, COCAQ_CONFIG=str(cfg_path))


def opted(engine: Engine) -> dict[str, bool]:
    with engine.connect() as c:
        return {n: bool(o) for n, o in c.execute(select(User.name, User.opted_out))}


def one_line_error(r: Result, *words: str) -> None:
    assert r.code == 2, (r.code, r.out, r.err)
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert r.err.startswith("cocaq: error: "), r.err
    for w in words:
        assert w in r.err, r.err


def test_an_address_opts_out_its_user_not_a_user_named_by_it(engine: Engine, site: dict[str, str]) -> None:
    r = run_cocaq(["mail", "opt-out", "dave@example.org"], site)
    assert r.code == 0, r.err
    assert "opted out user dave (dave@example.org" in r.err, r.err
    assert opted(engine) == {"dave": True, "ivan": False}  # no user named "dave@example.org"
    book = AddressBook.load(engine, load_config(site["COCAQ_CONFIG"], environ={}).mail, ["dave"])
    assert book.for_user("dave").opted_out
    # The domain is not case-sensitive, nor (for matching) the local part: Dave@EXAMPLE.org is dave's.
    r = run_cocaq(["mail", "opt-in", "Dave@EXAMPLE.org"], site)
    assert r.code == 0 and "opted back in user dave (dave@example.org" in r.err, r.err
    assert opted(engine)["dave"] is False


def test_addresses_from_the_file_and_users_email(engine: Engine, site: dict[str, str]) -> None:
    r = run_cocaq(["mail", "opt-out", "c.jones@uni.example", "ivan@home.example"], site)
    assert r.code == 0, r.err
    assert "opted out user carol (c.jones@uni.example" in r.err, r.err
    assert "opted out user ivan (ivan@home.example" in r.err, r.err
    assert opted(engine) == {"carol": True, "ivan": True}
    # ivan's mail goes to users.email: the template's ivan@example.org is nobody's mailbox.
    r = run_cocaq(["mail", "opt-out", "--undo", "ivan@example.org"], site)
    one_line_error(r, "ivan@example.org", "ivan@home.example")


def test_an_address_two_users_receive_opts_out_both(engine: Engine, site: dict[str, str]) -> None:
    # frank@example.org is frank's by the template and erin's by the address map: both are mailed there.
    r = run_cocaq(["mail", "opt-out", "frank@example.org"], site)
    assert r.code == 0, r.err
    assert "opted out user erin (frank@example.org" in r.err and "opted out user frank" in r.err, r.err
    assert opted(engine) == {"erin": True, "frank": True, "ivan": False}


def test_an_address_where_the_file_sends_elsewhere_is_refused(engine: Engine, site: dict[str, str]) -> None:
    # The template would make gina@example.org, but gina's line in the map sends her reports elsewhere.
    r = run_cocaq(["mail", "opt-out", "gina@example.org", "--force"], site)
    one_line_error(r, "gina@example.org", "gina@lab.example", "give the user's name (gina)")
    assert opted(engine) == {"ivan": False}
    assert run_cocaq(["mail", "opt-out", "gina@lab.example"], site).code == 0
    assert opted(engine)["gina"] is True


@pytest.mark.parametrize("arg", ["dvae", "davd@example.org"])
def test_typos_are_refused_and_force_takes_a_user_not_seen_yet(
    engine: Engine, site: dict[str, str], arg: str
) -> None:
    r = run_cocaq(["mail", "opt-out", "dave", arg], site)  # all or nothing: dave is not opted out either
    one_line_error(r, repr(arg.partition("@")[0]) if "@" not in arg else arg, "--force", "dave")
    assert opted(engine) == {"ivan": False}
    r = run_cocaq(["mail", "opt-out", "--force", arg], site)
    assert r.code == 0, r.err
    name = arg.partition("@")[0]
    assert f"opted out user {name} ({name}@example.org" in r.err and "not seen yet" in r.err, r.err
    assert opted(engine) == {name: True, "ivan": False}


def test_an_address_no_user_can_have_is_refused_even_forced(engine: Engine, site: dict[str, str]) -> None:
    for args in (["nobody@elsewhere.org"], ["--force", "nobody@elsewhere.org"], ["--undo", "x@uni.example"]):
        r = run_cocaq(["mail", "opt-out", *args], site)
        one_line_error(r, "@")
    assert opted(engine) == {"ivan": False}


@pytest.mark.parametrize(
    "arg",
    ["dave smith", " ", "dave\nbob", "@example.org", "dave@", "a" * 65, "dave@exa mple.org", "d\x1b[2J"],
)
def test_not_a_name_nor_an_address(engine: Engine, site: dict[str, str], arg: str) -> None:
    one_line_error(run_cocaq(["mail", "opt-out", arg], site))
    assert opted(engine) == {"ivan": False}
