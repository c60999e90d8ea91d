"""Where the web app's figures come from: the read API, asked as the user, and nothing else.

Two ways to ask it, one answer. `ApiReader` is what the login-node commands use (cocaq.api.client: a
fresh MUNGE credential of the process's own uid per request), for the app in Open OnDemand, which runs
as the user. `LocalReader` runs the same API application inside this process, for a site whose users may
read the database directly (and for the demo): each request goes through the API's own routing,
validation and rules of who may see what, as the user the app vouches for, so the page can show nothing
the API would refuse that user. Neither adds a way to authenticate.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlencode

if TYPE_CHECKING:
    from cocaq.config import Config


@dataclass(frozen=True)
class Refused(Exception):
    """The API's no: its HTTP status (400, 403, 404, 503) and its one-line reason."""

    status: int
    reason: str

    def __str__(self) -> str:
        return self.reason


class Reader(Protocol):
    user: str

    def get(self, parts: tuple[str, ...], params: Mapping[str, Any] | None = None) -> Any:
        """GET /v1/<parts> as the user: the JSON answer, or Refused."""
        ...


class ApiReader:
    """The read API at `[api] url`, with the user's own MUNGE credential (the app runs as them)."""

    def __init__(self, cfg: Config) -> None:
        self.api = cfg.api
        self.user = pwd.getpwuid(os.getuid()).pw_name

    def get(self, parts: tuple[str, ...], params: Mapping[str, Any] | None = None) -> Any:
        from cocaq.api.client import ApiBadInput, ApiNotFound, ApiRefused, ApiUnreachable, get

        try:
            return get(self.api, parts, params)
        except ApiNotFound as exc:
            raise Refused(404, str(exc)) from None
        except ApiBadInput as exc:
            raise Refused(400, _reason(str(exc))) from None
        except ApiRefused as exc:
            raise Refused(403, _reason(str(exc))) from None
        except ApiUnreachable as exc:
            raise Refused(503, str(exc)) from None


def _reason(text: str) -> str:
    """`https://api:8443: 403: alice may not ...` -> `alice may not ...` (the client names the server)."""
    _, sep, rest = text.partition(": ")
    code, sep2, reason = rest.partition(": ")
    return reason if sep and sep2 and code.isdigit() else text


class LocalReader:
    """The read API's application in this process, asked as `user` (default: the process's own)."""

    def __init__(self, cfg: Config, user: str | None = None, *, app: Any = None) -> None:
        self.user = user if user is not None else pwd.getpwuid(os.getuid()).pw_name
        self.app = app if app is not None else local_app(cfg)

    def get(self, parts: tuple[str, ...], params: Mapping[str, Any] | None = None) -> Any:
        import asyncio

        from cocaq.api.client import payload_for

        path = "/v1/" + "/".join(parts)
        raw = "/v1/" + "/".join(quote(p, safe="") for p in parts)
        query = urlencode({k: _param(v) for k, v in (params or {}).items() if v is not None})
        # what the in-process caller reads (local_app): this user, for this very request
        cred = f"{self.user} {payload_for('GET', path).decode()}"
        status, body = asyncio.run(_asgi_get(self.app, path, raw, query, cred))
        try:
            data = json.loads(body)
        except ValueError:
            raise Refused(502, f"the API answered {status} with no JSON") from None
        if status == 200:
            return data
        raise Refused(400 if status == 422 else status, _detail(data, status))


def local_app(cfg: Config) -> Any:
    """The read API's app over `cfg`'s database, whose callers are the users this process vouches for
    (its own, or the one a trusted proxy names): the API's own rules of who may see what apply, by name
    (`[api] admin_users`, `lab_heads`; admin groups for local accounts). This app object is never
    served: only LocalReader in this process reaches it."""
    from fastapi import HTTPException, Request

    from cocaq.api import deps
    from cocaq.api.client import payload_for
    from cocaq.api.server import create_app

    def no_munge(cred: str) -> tuple[int, bytes]:
        raise HTTPException(401, "the in-process API takes no MUNGE credential")

    def vouched(request: Request) -> deps.Caller:
        name, _, payload = request.headers.get("authorization", "").removeprefix("MUNGE ").partition(" ")
        if not name or payload.encode() != payload_for(request.method, request.url.path):
            raise HTTPException(401, "not a request this process made")
        try:
            pw = pwd.getpwnam(name)
        except KeyError:  # a name only the database knows (the demo's users): by name alone
            pw = pwd.struct_passwd((name, "x", -1, -1, "", "/", "/bin/false"))
        return deps.caller_for(cfg.api, pw)

    # (this module's annotations are text; FastAPI must see the real class to hand over the request)
    vouched.__annotations__ = {"request": Request, "return": deps.Caller}
    app = create_app(cfg, decode=no_munge)
    app.dependency_overrides[deps.caller] = vouched
    return app


def _param(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _detail(data: Any, status: int) -> str:
    detail = data.get("detail") if isinstance(data, dict) else None
    if isinstance(detail, list):  # FastAPI's validation errors
        said = [d for d in detail if isinstance(d, dict)]
        return "; ".join(f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" for d in said)
    return str(detail or f"the API answered {status}")


async def _asgi_get(app: Any, path: str, raw: str, query: str, cred: str) -> tuple[int, bytes]:
    """One GET through the ASGI app, as an HTTP server would hand it over."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": raw.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"host", b"cocaq-web"), (b"authorization", f"MUNGE {cred}".encode())],
        "client": ("127.0.0.1", 0),
        "server": ("cocaq-web", 80),
    }
    status, chunks = 500, []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


class Remembered:
    """A reader that keeps each answer for `ttl_s` (at most `size` of them): a user going back from a
    job to their footprint is not made to wait for the same figures again. The figures change only as
    accounting is imported (the footer says when), so a minute old is as fresh as the page claims."""

    def __init__(self, reader: Reader, ttl_s: float = 60.0, size: int = 64) -> None:
        import threading
        from collections import OrderedDict

        self.reader, self.user, self.ttl_s, self.size = reader, reader.user, ttl_s, size
        self._kept: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, parts: tuple[str, ...], params: Mapping[str, Any] | None = None) -> Any:
        import time

        key = json.dumps([parts, sorted((k, _param(v)) for k, v in (params or {}).items() if v is not None)])
        now = time.monotonic()
        with self._lock:
            hit = self._kept.get(key)
            if hit is not None and now - hit[0] < self.ttl_s:
                self._kept.move_to_end(key)
                return hit[1]
        got = self.reader.get(parts, params)  # (a refusal is not kept: asked again, it is asked again)
        with self._lock:
            self._kept[key] = (now, got)
            self._kept.move_to_end(key)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return got
