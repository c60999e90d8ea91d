"""cocaq.db.pgurl: the URL libpq is given names the same user, password, host and database as the URL
SQLAlchemy reads, whatever the password holds (libpq's own parser decides)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import make_url

from cocaq.db.pgurl import conninfo

PASSWORDS = [
    "plain",
    "a/b",
    "x y",
    "p%41ss",
    'q"uote',
    "back\\slash",
    "col:on",
    "at@sign",
    "\u00e9t\u00e9",
    "/:@%",
]
ENCODINGS: list[Callable[[str], str]] = [
    lambda s: quote(s, safe=""),
    quote,
]  # quote keeps "/", as Jinja's urlencode


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("encode", ENCODINGS, ids=["all", "keeps-slash"])
def test_libpq_reads_what_sqlalchemy_reads(password: str, encode: Callable[[str], str]) -> None:
    url = f"postgresql+psycopg://writer:{encode(password)}@db.example.org:6432/cocaq?sslmode=require"
    assert make_url(url).password == password
    got = conninfo_to_dict(conninfo(url))
    assert (got["user"], got["password"], got["host"], got["port"], got["dbname"], got["sslmode"]) == (
        "writer", password, "db.example.org", "6432", "cocaq", "require",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("postgresql://db.example.org/cocaq", {"host": "db.example.org", "dbname": "cocaq"}),
        (
            "postgresql+psycopg://cocaq@/cocaq?host=/run/postgresql",
            {"user": "cocaq", "host": "/run/postgresql"},
        ),
        ("postgres://u:p@h/d", {"user": "u", "password": "p", "host": "h", "dbname": "d"}),
    ],
)
def test_urls_without_a_password_or_with_a_socket(url: str, want: dict[str, str]) -> None:
    got = conninfo_to_dict(conninfo(url))
    assert {k: got.get(k) for k in want} == want
