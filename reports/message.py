"""Building one report e-mail with the stdlib `email` package.

Layout: multipart/alternative of a text/plain part and an HTML part; with images, the HTML part becomes
multipart/related and each PNG is attached inline under its Content-ID (the HTML refers to
`cid:NAME`). Every header value that can come from data (subject, display names) has its control
characters turned into spaces first, so a name or subject with CR/LF cannot add a header.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, getaddresses, make_msgid
from typing import TYPE_CHECKING

from cocaq.addresses import looks_like_address

if TYPE_CHECKING:
    from cocaq.config import Mail

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_CID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")


def clean_header_text(text: str, limit: int = 500) -> str:
    """One line of header text: control characters (CR, LF, TAB...) become one space; trimmed, bounded."""
    return " ".join(_CONTROLS.sub(" ", text).split())[:limit]


def parse_sender(from_address: str | None) -> Address:
    """The configured From (`addr` or `Name <addr>`), or cocaq@ this host's FQDN when none is configured."""
    if not from_address:
        host = socket.getfqdn() or "localhost"
        addr = f"cocaq@{host}"
        if not looks_like_address(addr):
            addr = "cocaq@localhost"
        return Address(display_name="cocaq", addr_spec=addr)
    ((name, addr),) = getaddresses([from_address])  # validated at config load: one address
    return Address(display_name=clean_header_text(name), addr_spec=addr)


def opt_out_address(mail: Mail, contact: str | None = None) -> str:
    """Where "unsubscribe" requests go: `[mail] reply_to`, else `[reports] contact` when it is an address,
    else the sender. An admin then opts the user out (`cocaq mail opt-out USER`)."""
    if mail.reply_to:
        return parse_sender(mail.reply_to).addr_spec
    if contact and looks_like_address(contact.strip()):
        return contact.strip()
    return parse_sender(mail.from_address).addr_spec


def unsubscribe_header(mail: Mail, user: str | None, contact: str | None = None) -> str:
    """The List-Unsubscribe header for a recipient: `[mail] list_unsubscribe`, or by default a mailto: to
    `opt_out_address` asking to unsubscribe this user, so that every report carries one (mail clients show
    an "Unsubscribe" button for it)."""
    from urllib.parse import quote

    from cocaq.addresses import list_unsubscribe_header

    if mail.list_unsubscribe:
        return list_unsubscribe_header(mail.list_unsubscribe, user)
    to = opt_out_address(mail, contact)
    return f"<mailto:{to}?subject={quote('unsubscribe ' + (user or ''), safe='')}>"


def new_message_id(sender: Address) -> str:
    """A fresh `<...@domain>` Message-ID whose domain is the sender's (so it is ours to make unique)."""
    return make_msgid(idstring="cocaq", domain=sender.domain or "localhost")


def build_message(
    *,
    sender: Address,
    to: str,
    subject: str,
    text: str,
    html: str | None = None,
    images: Sequence[tuple[str, bytes]] = (),
    message_id: str,
    to_name: str | None = None,
    date: datetime | None = None,
    list_unsubscribe: str | None = None,
    reply_to: str | None = None,
) -> EmailMessage:
    """One message, ready for any transport. Raises ValueError on a bad address, Content-ID or image."""
    if not looks_like_address(to):
        raise ValueError(f"not an e-mail address: {to!r}")
    if images and html is None:
        raise ValueError("inline images need an HTML part to show them")
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = Address(display_name=clean_header_text(to_name or ""), addr_spec=to)
    msg["Subject"] = clean_header_text(subject, limit=250)
    msg["Date"] = format_datetime(date or datetime.now(UTC))
    msg["Message-ID"] = clean_header_text(message_id)
    # RFC 3834: tells vacation responders and ticket systems not to answer.
    msg["Auto-Submitted"] = "auto-generated"
    if reply_to:
        msg["Reply-To"] = parse_sender(reply_to)
    if list_unsubscribe:
        msg["List-Unsubscribe"] = clean_header_text(list_unsubscribe, limit=900)
    msg.set_content(text)
    if html is None:
        return msg
    msg.add_alternative(html, subtype="html")
    if images:
        html_part = next(p for p in msg.iter_parts() if p.get_content_type() == "text/html")
        seen: set[str] = set()
        for cid, png in images:
            if not _CID_RE.fullmatch(cid) or cid in seen:
                raise ValueError(f"image Content-ID {cid!r}: expected a unique name (letters, digits, . _ -)")
            if not png.startswith(PNG_MAGIC):
                raise ValueError(f"image {cid!r} is not a PNG")
            seen.add(cid)
            html_part.add_related(
                png,
                maintype="image",
                subtype="png",
                cid=f"<{cid}>",
                disposition="inline",
                filename=f"{cid}.png",
            )
    return msg
