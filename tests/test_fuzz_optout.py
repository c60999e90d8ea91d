"""`cocaq mail opt-out` / `opt-in` arguments fuzzed (Hypothesis), on SQLite and PostgreSQL (issue 33).

The invariants: an argument resolves to users cocaq has seen (or, with --force, one plausible user
name), never to a user named by an address, a control character or a space; an address resolves only
to users whose reports go there; anything else is a one-line UsageError, in-process and through the
real CLI, and nothing is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, insert, select

from cocaq.accounting.importer import import_records
from cocaq.addresses import looks_like_address, normalise_address
from cocaq.config import Mail
from cocaq.db.engine import make_engine
from cocaq.db.schema import User
from cocaq.errors import UsageError
from cocaq.reports.recipients import AddressBook, resolve_named
from tests import builders
from tests.builders import write_config
from tests.conftest import migrated_database, run_cocaq
from tests.mailkit import mail_toml

BUDGET = settings(
    max_examples=int(os.environ.get("COCAQ_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
SEEN = {"dave", "Eve", "frank", "erin", "x.y-1"}
TEMPLATES = ["{user}@example.org", "hpc-{user}@Example.ORG", "{user}+cocaq@mail.example.org"]
HOSTILE = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="dave@.example-org{}+ \t\n\x00\x1bE", max_size=30),
    st.builds(lambda u, t: t.format(user=u), st.text(max_size=12), st.sampled_from(TEMPLATES)),
    st.sampled_from(
        [
            "", "@", "@@", "dave@@example.org", "dave@example.org.", "{user}@example.org", "dave@example.org\n",
            "DAVE@EXAMPLE.ORG", "eve@example.org", "\ud800@example.org", "dave\x00", "a" * 65, "a" * 64,
            "x" * 65 + "@example.org", "hpc-@example.org", "hpc-hpc-dave@example.org", "frank@example.org",
            "-", "--", "'; DROP TABLE users; --", "../dave", "dave@lab.example", "erin@lab.example",
        ]
    ),
)  # fmt: skip


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Path]]:
    """dave, Eve, frank and x.y-1 with jobs; erin only in the address map (at lab.example); one config file."""
    tmp = tmp_path_factory.mktemp(f"optout-{request.param}")
    url = migrated_database(request.param, tmp, request)
    engine = make_engine(url)
    amap = tmp / "map.csv"
    amap.write_text("erin,erin@lab.example\nfrank,frank@lab.example\n")
    extra = mail_toml(address_template=TEMPLATES[0], address_map=str(amap))
    cfg = builders.config(tmp, url, extra)
    t0 = datetime(2025, 3, 3, tzinfo=UTC)
    users = ["dave", "Eve", "frank", "x.y-1"]
    import_records(
        engine, [builders.job(i + 1, t0, user=u) for i, u in enumerate(users)], cfg, source="sacct-json"
    )
    write_config(tmp / "cocaq.toml", url, extra)
    yield engine, tmp
    engine.dispose()


def users_rows(engine: Engine) -> dict[str, bool]:
    with engine.connect() as c:
        return {n: bool(o) for n, o in c.execute(select(User.name, User.opted_out))}


@BUDGET
@given(arg=HOSTILE, template=st.sampled_from(TEMPLATES), force=st.booleans())
@example(arg="eve@example.org", template=TEMPLATES[0], force=False)
@example(arg="hpc-dave@example.org", template=TEMPLATES[1], force=False)
@example(arg="frank@example.org", template=TEMPLATES[0], force=True)
def test_an_argument_names_seen_users_or_is_refused(
    site: tuple[Engine, Path], arg: str, template: str, force: bool
) -> None:
    engine, tmp = site
    mail = replace(Mail(), address_template=template, address_map=str(tmp / "map.csv"))
    before = users_rows(engine)
    try:
        named = resolve_named(engine, mail, [arg], force=force)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc).isprintable(), str(exc)
        return
    finally:
        assert users_rows(engine) == before  # resolving writes nothing
    assert named, arg
    book = AddressBook.load(engine, mail, [n.user for _, n in named])
    for _, n in named:
        assert n.user and len(n.user) <= 64 and n.user.isprintable(), n
        assert "@" not in n.user and not any(c.isspace() for c in n.user), n
        assert n.seen == (n.user in SEEN), n
        assert n.seen or force, n
        if "@" in arg:
            assert looks_like_address(arg.strip()), arg
            assert (n.address or "").lower() == normalise_address(arg).lower(), (n, arg)
            if n.seen:
                assert (book.for_user(n.user).address or "").lower() == normalise_address(arg).lower()
        else:
            assert n.user == arg


@pytest.mark.parametrize(
    "args",
    [
        ["dave\x1b[2J"], ["\udcff@example.org"], ["da\udcffve"], ["dave@example.org", "nobody@elsewhere.org"], ["frank@example.org"],
        ["--force", "d@ve@example.org"], ["--force", "x" * 65], ["--undo", "@"], ["--", "-"], ["eve"],
    ],
)  # fmt: skip
def test_the_cli_refuses_in_one_line_and_writes_nothing(
    site: tuple[Engine, Path], cli_env: dict[str, str], args: list[str]
) -> None:
    engine, tmp = site
    before = users_rows(engine)
    env = dict(cli_env, COCAQ_CONFIG=str(tmp / "cocaq.toml"))
    r = run_cocaq(["mail", "opt-out", *args], env)
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert users_rows(engine) == before


def test_found_examples(site: tuple[Engine, Path]) -> None:
    """Cases worth keeping: a case-folded address finds its user; Eve's template address is hers."""
    engine, tmp = site
    mail = replace(Mail(), address_template=TEMPLATES[0], address_map=str(tmp / "map.csv"))
    assert [n.user for _, n in resolve_named(engine, mail, ["DAVE@EXAMPLE.ORG"], force=False)] == ["dave"]
    assert [n.user for _, n in resolve_named(engine, mail, ["Eve@example.org"], force=False)] == ["Eve"]
    with engine.begin() as c:  # the one row this module writes, gone again after
        c.execute(insert(User).values(name="zed", email="zed@home.example"))
    try:
        assert [n.user for _, n in resolve_named(engine, mail, ["ZED@Home.Example"], force=False)] == ["zed"]
    finally:
        with engine.begin() as c:
            c.execute(delete(User).where(User.name == "zed"))
