"""The web app's WSGI plumbing: who the user is, the routes, and the headers every answer carries.

Who: in Open OnDemand the app runs as the user in their own per-user server, so the user is this
process's uid and the figures come through the read API with their own MUNGE credential (or the API's
app in this process, where the site lets users read the database). Behind a reverse proxy
(`cocaq web --trust-proxy-user`), the proxy's REMOTE_USER, which only a site that turned it on trusts.
Either way, the name never comes from the URL: a page is always the user's own, and a lab or a job in
the URL is one the API decides whether they may see.

Safe by construction: GET and HEAD only (the app changes nothing, so there is no request to forge: its
forms are GET forms that only choose what to show); a request another site makes from a page (a
script, an image, a fetch: `Sec-Fetch-Site: cross-site` and not a navigation) is refused, so no other
site can read or embed a user's figures; a Content-Security-Policy allows scripts from this app's own
static files only (chart data travels in inert JSON blocks, never in a script); every user string is
escaped by Jinja2's autoescape.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from cocaq.web.http import Answer, HttpError, Request
from cocaq.web.reader import Reader, Refused

if TYPE_CHECKING:
    from cocaq.config import Config

StartResponse = Callable[..., Any]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'self'; base-uri 'none'"
)
SECURITY_HEADERS = [
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "SAMEORIGIN"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
]
MAX_QUERY = 4096  # bytes of query string: more is no form of ours


Handler = Callable[[Request, re.Match[str]], Answer]


class WebApp:
    """The WSGI application. `readers(environ)` says who asks and how their figures are read."""

    def __init__(self, cfg: Config, readers: Callable[[dict[str, Any]], Reader]) -> None:
        from cocaq.web import pages

        self.cfg = cfg
        self.readers = readers
        self.routes: list[tuple[re.Pattern[str], Handler]] = [
            (re.compile(pattern), handler) for pattern, handler in pages.routes(cfg)
        ]

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            answer = self._answer(environ, method)
        except HttpError as exc:
            answer = self._error(environ, exc.status, exc.reason)
        headers = [("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body)))]
        headers += SECURITY_HEADERS + list(answer.headers)
        if not any(k == "Cache-Control" for k, _ in answer.headers):
            headers.append(("Cache-Control", "private, no-store"))  # a user's own figures
        start_response(f"{answer.status} {_REASONS.get(answer.status, 'Error')}", headers)
        return [b"" if method == "HEAD" else answer.body]

    def _answer(self, environ: dict[str, Any], method: str) -> Answer:
        if method not in ("GET", "HEAD"):
            raise HttpError(405, f"{method} is not served here: the app only shows figures")
        if _cross_site(environ):
            raise HttpError(403, "a request from another site's page: open the app's pages directly")
        raw_q = environ.get("QUERY_STRING", "")
        if len(raw_q) > MAX_QUERY:
            raise HttpError(414, "query string too long")
        path = _path(environ)
        for pattern, handler in self.routes:
            m = pattern.fullmatch(path)
            if m:
                req = self._request(environ, path, raw_q)
                try:
                    return handler(req, m)
                except Refused as exc:
                    raise HttpError(exc.status, exc.reason) from None
        raise HttpError(404, f"no page {path[:80]!r}")

    def _request(self, environ: dict[str, Any], path: str, raw_q: str) -> Request:
        query = {k: v[-1] for k, v in parse_qs(raw_q, keep_blank_values=True, max_num_fields=40).items()}
        environ["cocaq.template_dir"] = self.cfg.reports.template_dir
        try:
            reader = self.readers(environ)
        except Refused as exc:
            raise HttpError(exc.status, exc.reason) from None
        return Request(environ, path, query, environ.get("SCRIPT_NAME", "").rstrip("/"), reader)

    def _error(self, environ: dict[str, Any], status: int, reason: str) -> Answer:
        from cocaq.web import render

        extra: tuple[tuple[str, str], ...] = (("Allow", "GET, HEAD"),) if status == 405 else ()
        return render.error(self.cfg, environ.get("SCRIPT_NAME", "").rstrip("/"), status, reason, extra)


def _cross_site(environ: dict[str, Any]) -> bool:
    """Fetch Metadata's resource isolation: another site's page may link here (a navigation), never
    load a page, a download or a script of it as a resource."""
    site = environ.get("HTTP_SEC_FETCH_SITE", "")
    if site != "cross-site":
        return False
    return not (
        environ.get("HTTP_SEC_FETCH_MODE") == "navigate"
        and environ.get("HTTP_SEC_FETCH_DEST") in ("document", None, "")
    )


def _path(environ: dict[str, Any]) -> str:
    """PATH_INFO as text (WSGI hands it over as latin-1 of the raw bytes)."""
    raw = environ.get("PATH_INFO", "") or "/"
    try:
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise HttpError(400, "the path is not UTF-8") from None


_REASONS = {200: "OK", 304: "Not Modified", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 414: "URI Too Long", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable"}  # fmt: skip
