"""The metrics endpoint's bearer token and TLS (`[collector] metrics_token_file`, `metrics_tls_*_file`).

The collector runs as root and its endpoint names every running job's user, account and job id, so the
files that guard it are read as secrets: a regular file owned by root or by the collector's own user,
neither group- nor world-readable (the key and the token), reached through no link that someone else
owns, read from one descriptor (what is checked is what is read) and bounded. A problem is a ConfigError
(one line; the collector refuses to start rather than serve without the protection asked for); the token
itself is never in a message or a log line. Standard library only (imported whenever metrics_listen is
set, also by `cocaq collector --once`, which checks the files and serves nothing).
"""

from __future__ import annotations

import hmac
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cocaq.errors import ConfigError

if TYPE_CHECKING:
    import ssl

MAX_TOKEN = 4096
MAX_PEM = 1 << 20  # a certificate chain or key larger than 1 MiB is not one

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _trusted_uid(uid: int) -> bool:
    return uid in (0, os.geteuid())


def open_checked(key: str, path: str, *, secret: bool) -> int:
    """An open descriptor on `path` after the checks above (`secret`: also no group/other permission)."""
    where = f"config: collector.{key}: {path}"
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) and not _trusted_uid(st.st_uid):
            raise ConfigError(
                f"{where}: a symbolic link owned by uid {st.st_uid} (only root's or the collector's own)"
            )
        # O_NONBLOCK: a FIFO put there answers the checks below instead of hanging the start
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{where}: not a regular file")
        if not _trusted_uid(st.st_uid):
            raise ConfigError(f"{where}: owned by uid {st.st_uid} (only root's or the collector's own)")
        if secret and st.st_mode & 0o077:
            raise ConfigError(
                f"{where}: mode {stat.S_IMODE(st.st_mode):04o} lets others read it (chmod 600 {path})"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_fd(fd: int, limit: int) -> bytes:
    """Up to `limit` + 1 bytes (so that a longer file is seen to be so)."""
    chunks: list[bytes] = []
    n = 0
    while n <= limit:
        b = os.read(fd, limit + 1 - n)
        if not b:
            break
        chunks.append(b)
        n += len(b)
    return b"".join(chunks)


def read_token(path: str) -> bytes:
    """The bearer token: one line of 1 to 4096 visible ASCII characters (what an HTTP header carries)."""
    fd = open_checked("metrics_token_file", path, secret=True)
    try:
        raw = _read_fd(fd, MAX_TOKEN + 2)
    except OSError as exc:
        raise ConfigError(
            f"config: collector.metrics_token_file: {path}: cannot read: {exc.strerror}"
        ) from None
    finally:
        os.close(fd)
    token = raw.strip()
    if not token or len(token) > MAX_TOKEN or not all(0x21 <= c <= 0x7E for c in token):
        raise ConfigError(
            f"config: collector.metrics_token_file: {path} must hold one token"
            f" (1 to {MAX_TOKEN} visible ASCII characters, no spaces, one line)"
        )
    return token


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context with the certificate chain and its key (TLS 1.2 and later), both read through
    the checked descriptors (/proc/self/fd): no path is opened twice."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    cert_fd = open_checked("metrics_tls_cert_file", cert, secret=False)
    try:
        key_fd = open_checked("metrics_tls_key_file", key, secret=True)
        try:
            for k, fd in (("metrics_tls_cert_file", cert_fd), ("metrics_tls_key_file", key_fd)):
                if os.fstat(fd).st_size > MAX_PEM:
                    raise ConfigError(f"config: collector.{k}: larger than {MAX_PEM} bytes: not a PEM file")
            try:
                ctx.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}", password=b"")
            except (ssl.SSLError, OSError) as exc:
                why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
                raise ConfigError(
                    f"config: collector: metrics_tls_cert_file {cert} and metrics_tls_key_file {key}:"
                    f" not a certificate and its unencrypted key: {why}"
                ) from None
        finally:
            os.close(key_fd)
    finally:
        os.close(cert_fd)
    return ctx


@dataclass(frozen=True)
class Auth:
    """What guards the endpoint: a token (None: none) and a TLS context (None: plain HTTP)."""

    token: bytes | None = None
    tls: ssl.SSLContext | None = None

    def allows(self, authorization: str | None) -> bool:
        """Whether a request's Authorization header carries the token (constant-time compare)."""
        if self.token is None:
            return True
        scheme, _, given = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip(" \t").encode("latin-1", "replace"), self.token
        )

    def guard(self, app: WsgiApp) -> WsgiApp:
        """`app` behind the token: 401 with `WWW-Authenticate: Bearer` without it (every path)."""
        if self.token is None:
            return app

        def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if self.allows(environ.get("HTTP_AUTHORIZATION")):
                return app(environ, start_response)
            body = b"send `Authorization: Bearer <token>` ([collector] metrics_token_file)\n"
            start_response(
                "401 Unauthorized",
                [
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("Content-Length", str(len(body))),
                    ("WWW-Authenticate", "Bearer"),
                ],
            )
            return [body]

        return guarded


def load(token_file: str | None, cert_file: str | None, key_file: str | None) -> Auth:
    """The endpoint's guard from the config (ConfigError, one line, for any file that does not pass)."""
    token = read_token(token_file) if token_file else None
    tls = tls_context(cert_file, key_file) if cert_file and key_file else None
    return Auth(token, tls)
