"""The read API's client side: what `cocaq user` & co. use on login nodes when `[api] url` is set.

Standard library only (and cocaq.api.munge): a login node's `cocaq user` imports no database driver. Each
request carries a fresh MUNGE credential whose payload names it (cocaq.api.server checks both).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from cocaq.errors import CocaqError

PAYLOAD_PREFIX = "cocaq-api"


class ApiRefused(CocaqError):
    """The API said no (401/403/4xx): its one-line reason."""

    exit_code = 5


class ApiNotFound(ApiRefused):
    """The API knows no such user, lab, cluster or job (404): exit 2, as the CLI says it without one."""

    exit_code = 2


class ApiBadInput(ApiRefused):
    """The API refused a parameter (400, 422: a time out of range, say): exit 2, as the CLI says it."""

    exit_code = 2


class ApiUnreachable(CocaqError):
    """No answer from the API (down, wrong URL, TLS): the database may be tried by those who can."""

    exit_code = 3


def payload_for(method: str, path: str) -> bytes:
    """What a credential for this request carries: `cocaq-api GET /v1/users/alice`."""
    return f"{PAYLOAD_PREFIX} {method.upper()} {path}".encode()


def get(api: Any, path_parts: tuple[str, ...], params: Mapping[str, Any] | None = None) -> Any:
    """GET `/v1/<parts>` with a MUNGE credential; the JSON answer, or ApiRefused / ApiUnreachable."""
    import urllib.error
    import urllib.request

    from cocaq.api import munge

    path = "/v1/" + "/".join(path_parts)
    quoted = "/v1/" + "/".join(quote(p, safe="") for p in path_parts)
    query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
    url = api.url.rstrip("/") + quoted + (f"?{query}" if query else "")
    try:
        cred = munge.encode(payload_for("GET", path), socket=api.munge_socket)
    except munge.MungeError as exc:
        raise ApiUnreachable(f"cannot make a MUNGE credential for the API: {exc}") from None
    req = urllib.request.Request(
        url, headers={"Authorization": f"MUNGE {cred}", "Accept": "application/json"}
    )
    context = None
    if url.startswith("https://"):
        import ssl

        context = ssl.create_default_context(cafile=api.ca_file)
    try:
        with urllib.request.urlopen(req, timeout=api.timeout_s, context=context) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("detail")
        except (ValueError, AttributeError):
            detail = None
        if isinstance(detail, list):  # FastAPI's validation errors
            detail = "; ".join(str(d.get("msg", d)) for d in detail if isinstance(d, dict))
        if exc.code == 404 and detail and detail != "Not Found":  # (not a route: an old server)
            raise ApiNotFound(str(detail)) from None
        if exc.code in (400, 422):
            raise ApiBadInput(f"{api.url}: {exc.code}: {detail or exc.reason}") from None
        raise ApiRefused(f"{api.url}: {exc.code}: {detail or exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ApiUnreachable(f"cannot reach the API at {api.url}: {reason}") from None
