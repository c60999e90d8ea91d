"""`cocaq serve`: the read API on the head node (cocaq.api.server), under uvicorn."""

from __future__ import annotations

import click

from cocaq.cli.app import Ctx


@click.command()
@click.option("--host", default=None, help="Address to listen on (config [api] host, 127.0.0.1).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (config [api] port, 8470).")
@click.pass_obj
def serve(obj: Ctx, host: str | None, port: int | None) -> None:
    """Serve the read API that `cocaq user` uses on login nodes (MUNGE authentication; docs/api.md).

    TLS: set [api] tls_cert and tls_key to terminate it here, or put a reverse proxy in front and listen
    on 127.0.0.1 only. The OpenAPI document is at /openapi.json.
    """
    import uvicorn

    from cocaq.api.server import create_app
    from cocaq.db.engine import make_engine, require_schema

    cfg = obj.cfg
    require_schema(make_engine(cfg.database_url))  # a one-line error now rather than 503s later
    a = cfg.api
    app = create_app(cfg)
    uvicorn.run(
        app,
        host=host or a.host,
        port=port or a.port,
        ssl_certfile=a.tls_cert,
        ssl_keyfile=a.tls_key,
        log_level="info" if obj.verbose else "warning",
        proxy_headers=False,
        server_header=False,
    )
