"""`cocaq mail`: checking the mail set-up (the sending is in cocaq.reports). Errors are one line."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import click

from cocaq.errors import UsageError

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx

TEST_TEXT = """\
This is a test message from cocaq on {host}, sent with `cocaq mail test`.

It went through: {transport}.
If you can read it, cocaq's report e-mails can reach {to}.
"""

TEST_HTML = """\
<!DOCTYPE html>
<html><body>
<p>This is a test message from <b>cocaq</b> on {host}, sent with <code>cocaq mail test</code>.</p>
<p>It went through: {transport}.<br>If you can read it, cocaq's report e-mails can reach {to}.</p>
</body></html>
"""


@click.group("mail")
def mail() -> None:
    """E-mail delivery of reports: check the configured transport ([mail] in the config)."""


@mail.command("test")
@click.option("--to", "to", required=True, help="The address to send the test message to.")
@click.pass_obj
def mail_test(obj: Ctx, to: str) -> None:
    """Send one small test message through the configured transport (SMTP or outbox), right now.

    Not recorded and not throttled; no database needed. Exit codes: 0 sent, 2 bad address or config,
    5 not sent (connection refused, TLS failure, login refused, message refused), with one line saying why.
    """
    from html import escape

    from cocaq.addresses import looks_like_address, normalise_address
    from cocaq.reports.message import build_message, new_message_id, parse_sender
    from cocaq.reports.transport import MailError, SendError, make_transport

    if not looks_like_address(to.strip()):
        raise UsageError(f"--to {to!r}: expected an e-mail address like alice@example.org")
    addr = normalise_address(to)
    cfg = obj.cfg
    transport = make_transport(cfg)
    sender = parse_sender(cfg.mail.from_address)
    host = socket.getfqdn()
    what = transport.describe()
    msg = build_message(
        sender=sender,
        to=addr,
        subject=f"cocaq test message from {host}",
        text=TEST_TEXT.format(host=host, transport=what, to=addr),
        html=TEST_HTML.format(host=escape(host), transport=escape(what), to=escape(addr)),
        message_id=new_message_id(sender),
    )
    try:
        note = transport.send(msg, sender.addr_spec, addr)
    except SendError as exc:
        raise MailError(f"mail: test message to {addr} not sent: {exc}") from None
    finally:
        transport.close()
    click.echo(f"mail: test message to {addr} {note} (via {what}; Message-ID {msg['Message-ID']})", err=True)


@mail.command("opt-out")
@click.argument("users", nargs=-1, required=True)
@click.option("--undo", is_flag=True, help="Opt them back in.")
@click.pass_obj
def mail_opt_out(obj: Ctx, users: tuple[str, ...], undo: bool) -> None:
    """Send these users no more report e-mails (what an "unsubscribe" reply asks for); --undo reverses it.

    Recorded in the database (users.opted_out), which every sender reads; the `[mail] opt_out_file`, if
    any, applies as well.
    """
    from sqlalchemy import insert, select, update

    from cocaq.db.schema import User

    for u in users:
        if not u.strip() or any(c.isspace() for c in u) or len(u) > 64:
            raise UsageError(f"{u!r} is not a user name")
    with obj.engine().begin() as conn:
        for u in users:
            if conn.execute(select(User.name).where(User.name == u)).first() is None:
                conn.execute(insert(User).values(name=u, opted_out=not undo))
            else:
                conn.execute(update(User).where(User.name == u).values(opted_out=not undo))
    what = "opted back in" if undo else "opted out: no more report e-mails"
    click.echo(f"mail: {', '.join(users)} {what}", err=True)
