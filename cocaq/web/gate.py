"""A key for `cocaq web` serving one's own figures on a port: whoever can reach a port on a shared
login node is not the user, so the first visit must bring the key `cocaq web` printed (as Jupyter's
token), which becomes a cookie (HttpOnly, SameSite=Strict: no other site's page can send it)."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

COOKIE = "cocaq_key"


class KeyGate:
    def __init__(self, app: Callable[..., Iterable[bytes]], key: str | None = None) -> None:
        self.app = app
        self.key = key or secrets.token_urlsafe(24)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        jar = SimpleCookie(environ.get("HTTP_COOKIE", ""))
        held = jar[COOKIE].value if COOKIE in jar else ""
        if held and hmac.compare_digest(held, self.key):
            return self.app(environ, start_response)
        pairs = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        given = next((v for k, v in pairs if k == "key"), "")
        if given and hmac.compare_digest(given, self.key):
            rest = urlencode([(k, v) for k, v in pairs if k != "key"])
            where = (
                environ.get("SCRIPT_NAME", "")
                + (environ.get("PATH_INFO") or "/")
                + (f"?{rest}" if rest else "")
            )
            cookie = f"{COOKIE}={self.key}; HttpOnly; SameSite=Strict; Path=/"
            start_response(
                "303 See Other", [("Location", where), ("Set-Cookie", cookie), ("Content-Length", "0")]
            )
            return [b""]
        body = b"Open the link `cocaq web` printed (it carries the key to these pages).\n"
        start_response(
            "403 Forbidden",
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]
