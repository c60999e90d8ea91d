"""The WSGI entry points: `application` for Open OnDemand's Passenger (ood/passenger_wsgi.py) and any
WSGI server, and `proxied` for a site that runs the app behind a reverse proxy it trusts.

`application` reads the configuration as the CLI does (`$COCAQ_CONFIG`, else /etc/cocaq/cocaq.toml)
on its first request, and serves the one user the process runs as (OOD starts a per-user server as the
user): through the read API with their MUNGE credential where `[api] url` is set, else the API's app in
this process over the database the site lets them read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cocaq.config import Config
    from cocaq.web.app import WebApp
    from cocaq.web.reader import Reader


# What a proxied app keeps per user (at most `users` of them): a page makes 2-3 API requests, and a heavy
# user's footprint answer is ~160 KB (the precision suggestion's 10,000 job ids).
ANSWERS_PER_USER = 16


def own_user_app(cfg: Config, user: str | None = None) -> WebApp:
    """The app for the process's own user (Open OnDemand, `cocaq web` on one's own machine); `user`:
    another's view, only for who reads the database directly anyway (`cocaq user NAME` shows them the
    same: an admin, the demo), never through the API, which vouches only for the caller's own uid."""
    from cocaq.errors import UsageError
    from cocaq.web.app import WebApp
    from cocaq.web.reader import ApiReader, LocalReader, Remembered

    if user is not None and cfg.api.url:
        raise UsageError("--user: only where this machine reads the database directly (no [api] url)")
    reader: Reader = Remembered(ApiReader(cfg) if cfg.api.url else LocalReader(cfg, user))
    return WebApp(cfg, lambda environ: reader)


def proxied(cfg: Config, header: str | None = None, users: int = 32) -> WebApp:
    """The app behind a reverse proxy that authenticates users: the site's explicit choice (`cocaq web
    --trust-proxy-user`), which must let nothing but the proxy reach it. The user is the WSGI server's
    REMOTE_USER, or, with `header` (X-Remote-User, say), that request header, which the proxy must set
    on every request and overwrite if a client sent it. The name must be a local user's, exactly (no
    realm is cut off: alice@OTHER.REALM is nobody here). It reads the database directly, as that user
    (MUNGE can vouch only for the uid a process runs as). Each user's answers are remembered for a minute
    as `own_user_app` remembers its one user's, in a reader of their own (the last `users` users): one
    user's figures are never another's."""
    import pwd
    from collections import OrderedDict

    from cocaq.web.app import WebApp
    from cocaq.web.reader import LocalReader, Refused, Remembered, local_app

    app = local_app(cfg)
    key = "REMOTE_USER" if header is None else "HTTP_" + header.upper().replace("-", "_")
    kept: OrderedDict[str, Remembered] = OrderedDict()
    lock = threading.Lock()

    def reader(environ: dict[str, Any]) -> Reader:
        name = str(environ.get(key) or "")
        if not name:
            raise Refused(403, f"no user: the proxy in front of this app must authenticate and set {key}")
        try:
            pwd.getpwnam(name)
        except KeyError:
            raise Refused(403, f"{name[:64]!r} is not a user here") from None
        with lock:
            mine = kept.get(name)
            if mine is None:
                mine = kept[name] = Remembered(LocalReader(cfg, name, app=app), size=ANSWERS_PER_USER)
            kept.move_to_end(name)
            while len(kept) > users:
                kept.popitem(last=False)
        return mine

    return WebApp(cfg, reader)


class _Lazy:
    """The app made on its first request, so that importing this module (Passenger does, at start)
    needs no configuration yet and a bad one shows as the first request's error, not a dead server."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make, self._lock = make, threading.Lock()
        self._app: Any = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    self._app = self._make()
        return self._app(environ, start_response)


def _from_config() -> WebApp:
    from cocaq.config_load import load_config

    return own_user_app(load_config())


application = _Lazy(_from_config)
