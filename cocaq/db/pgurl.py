"""A cocaq database URL as a libpq conninfo URI, for the paths that skip SQLAlchemy (the collector's
shipper, `cocaq user`).

SQLAlchemy reads a URL's user name up to the first `:` and its password up to the first `@`, and
unquotes both; libpq ends the credentials at the first `/` as well. So a password with a `/` in it (or
a `%` that SQLAlchemy takes literally), which SQLAlchemy accepts, would reach libpq as a different
host and database. Both are quoted again here, whole, so that both libraries see the same URL.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

# scheme://[user[:password]@]rest, as sqlalchemy.engine.url splits it
URL_PARTS = re.compile(
    r"(?P<scheme>[\w+]+)://(?:(?P<user>[^:/@]*)(?::(?P<password>[^@]*))?@)?(?P<rest>.*)", re.S
)


def conninfo(url: str) -> str:
    """postgresql://USER:PASSWORD@rest, with USER and PASSWORD percent-encoded as libpq reads them."""
    m = URL_PARTS.fullmatch(url.strip())
    if m is None:
        return url.strip()
    if m["user"] is None:
        return f"postgresql://{m['rest']}"
    cred = quote(unquote(m["user"]), safe="")
    if m["password"] is not None:
        cred += ":" + quote(unquote(m["password"]), safe="")
    return f"postgresql://{cred}@{m['rest']}"
