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
@click.option("--undo", is_flag=True, help="Opt them back in (as `cocaq mail opt-in`).")
@click.option("--force", is_flag=True, help="Take a user cocaq has not seen yet (no jobs, no users row).")
@click.pass_obj
def mail_opt_out(obj: Ctx, users: tuple[str, ...], undo: bool, force: bool) -> None:
    """Send these users no more report e-mails (what an "unsubscribe" reply asks for); --undo reverses it.

    USERS are user names or addresses: an address stands for the user(s) whose reports go there (users.email,
    the address map, the template). Recorded in the database (users.opted_out), which every sender reads;
    the `[mail] opt_out_file`, if any, applies as well. A name cocaq has never seen (a typo) or an address
    nobody is mailed at is refused and nothing is written; --force takes a user not seen yet.
    """
    _set_opted_out(obj, users, opted_out=not undo, force=force)


@mail.command("opt-in")
@click.argument("users", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Take a user cocaq has not seen yet (no jobs, no users row).")
@click.pass_obj
def mail_opt_in(obj: Ctx, users: tuple[str, ...], force: bool) -> None:
    """Send these users report e-mails again (undoes `cocaq mail opt-out`); names or addresses, as there."""
    _set_opted_out(obj, users, opted_out=False, force=force)


def _set_opted_out(obj: Ctx, args: tuple[str, ...], *, opted_out: bool, force: bool) -> None:
    """Resolve every argument to its users first (one bad one writes nothing), then set users.opted_out."""
    from sqlalchemy import insert, select, update

    from cocaq.db.schema import User
    from cocaq.reports.recipients import load_opt_out, resolve_named

    engine = obj.engine()
    named = resolve_named(engine, obj.cfg.mail, args, force=force)
    listed: set[str] = set()
    if not opted_out and obj.cfg.mail.opt_out_file:
        listed = load_opt_out(obj.cfg.mail.opt_out_file)[0]
    lines: dict[str, str] = {}
    with engine.begin() as conn:
        for _, n in named:
            if n.user in lines:
                continue
            was = conn.execute(select(User.opted_out).where(User.name == n.user)).first()
            if was is None:
                conn.execute(insert(User).values(name=n.user, opted_out=opted_out))
            else:
                conn.execute(update(User).where(User.name == n.user).values(opted_out=opted_out))
            where = n.address or "no address"
            if n.address and n.source != "users.email":
                where += f", by the {n.source.replace('_', ' ')}"
            if not n.seen:
                where += "; not seen yet"
            same = was is not None and bool(was[0]) == opted_out
            if opted_out:
                lines[n.user] = (
                    f"mail: user {n.user} ({where}) was already opted out"
                    if same
                    else f"mail: opted out user {n.user} ({where}): no more report e-mails"
                )
            else:
                line = (
                    f"mail: user {n.user} ({where}) was not opted out"
                    if same
                    else f"mail: opted back in user {n.user} ({where})"
                )
                hit = {n.user.lower(), (n.address or "").lower()} & listed
                if hit:
                    line += f"; still listed in {obj.cfg.mail.opt_out_file} (as {', '.join(sorted(hit))})"
                lines[n.user] = line
    for line in lines.values():
        click.echo(line, err=True)
