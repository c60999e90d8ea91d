"""GET /metrics: the site's figures for Prometheus (cocaq.api.site_metrics), off by default, and the
bearer token it may require."""

import hmac
from datetime import UTC, datetime

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from cocaq.api.deps import Context
from cocaq.errors import ConfigError

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, ctx: Context) -> Response:
    """No MUNGE (Prometheus cannot make it): labs' totals only, behind a bearer token if one is set."""
    from cocaq.api import site_metrics

    if not ctx.cfg.api.metrics:
        raise HTTPException(404, "metrics are off: set [api] metrics = true")
    if ctx.metrics_token is not None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), ctx.metrics_token):
            raise HTTPException(
                401, "send `Authorization: Bearer <token>` ([api] metrics_token_file)",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip

    def read() -> site_metrics.Site:
        with ctx.pool.db() as db, ctx.engine().connect() as conn:
            return site_metrics.read_site(db, conn, ctx.cfg, datetime.now(UTC))

    body, content_type = site_metrics.exposition(read, request.headers.get("accept"))
    return Response(body, media_type=content_type)


def metrics_token(path: str | None) -> bytes | None:
    """The bearer token GET /metrics requires, read once at start (None: no file configured)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            token = f.read(4097).strip()
    except OSError as exc:
        raise ConfigError(f"[api] metrics_token_file: cannot read {path}: {exc.strerror or exc}") from None
    if not token or len(token) > 4096 or b"\n" in token:
        raise ConfigError(f"[api] metrics_token_file: {path} must hold one token (1 to 4096 bytes, one line)")
    return token
