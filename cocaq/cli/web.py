"""`cocaq web`: the web app (cocaq.web) outside Open OnDemand, on a port of this machine."""

from __future__ import annotations

import contextlib
import ipaddress

import click

from cocaq.cli.app import Ctx
from cocaq.errors import UsageError


@click.command()
@click.option("--listen", default="127.0.0.1:8088", show_default=True, help="HOST:PORT to listen on.")
@click.option(
    "--trust-proxy-user",
    is_flag=True,
    help="Serve every user a reverse proxy in front names (REMOTE_USER, or --user-header): only where "
    "the proxy authenticates users and nothing else can reach this port (docs/admin-guide.md).",
)
@click.option(
    "--user-header", default=None, help="With --trust-proxy-user: the request header naming the user."
)
@click.option(
    "--user",
    "as_user",
    default=None,
    help="Show this user's figures: only reading the database directly, as `cocaq user NAME` can (demo).",
)
@click.pass_obj
def web(obj: Ctx, listen: str, trust_proxy_user: bool, user_header: str | None, as_user: str | None) -> None:
    """Serve the web app: your own figures (behind a key this prints), or, with --trust-proxy-user,
    each user's behind a site's authenticating reverse proxy. Open OnDemand needs neither: it runs
    ood/passenger_wsgi.py as each user."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from cocaq.web.gate import KeyGate
    from cocaq.web.wsgi import own_user_app, proxied

    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--listen: expected HOST:PORT, got {listen!r}")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if as_user and trust_proxy_user:
        raise UsageError("--user: not with --trust-proxy-user (the proxy names each user)")
    if trust_proxy_user and not user_header:
        raise UsageError(
            "--trust-proxy-user: name the header the proxy sets with --user-header (X-Remote-User, say): "
            "this server gets no REMOTE_USER from a proxy"
        )
    if user_header and not trust_proxy_user:
        raise UsageError("--user-header: only with --trust-proxy-user")
    if trust_proxy_user and not loopback:
        raise UsageError(
            f"--trust-proxy-user: listen on a loopback address (127.0.0.1), not {host}: anyone who reaches "
            "the port could name any user"
        )
    app = proxied(obj.cfg, user_header) if trust_proxy_user else KeyGate(own_user_app(obj.cfg, as_user))

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            if obj.verbose:
                super().log_message(format, *args)

    httpd = make_server(host, int(port_text), app, server_class=Server, handler_class=Quiet)
    if isinstance(app, KeyGate):
        click.echo(f"cocaq web: open http://{listen}/?key={app.key}", err=True)
    else:
        click.echo(f"cocaq web: serving the users the proxy names, on http://{listen}/", err=True)
    with contextlib.suppress(KeyboardInterrupt):
        httpd.serve_forever()
