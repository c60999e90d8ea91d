"""Reports written to files instead of sent: each e-mail as `STEM.html` (its HTML with the charts inlined,
for a browser) and `STEM.eml` (the message as it would be sent, for a mail client), under a file name made
safe from user and account names, addressed as it would be.

Both `cocaq report --out` and the demo write reports this way; it lives with the reports, not with either
command, so that neither front-end borrows the other's helpers.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from cocaq.config import Config
    from cocaq.reports.render import Rendered

log = logging.getLogger("cocaq.reports")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def file_stem(*parts: str) -> str:
    """A file name from report parts (user and account names may hold anything)."""
    return "-".join(_UNSAFE.sub("_", p).strip("._") or "_" for p in parts)


def write_email(
    out_dir: Path,
    stem: str,
    r: Rendered,
    cfg: Config,
    to: str,
    *,
    date: datetime | None = None,
    user: str | None = None,
) -> list[Path]:
    """`stem.html` (the e-mail's HTML with its charts inlined, for a browser) and `stem.eml` (the message as
    it would be sent, from reports.message.build_message)."""
    from cocaq.reports.message import build_message, new_message_id, parse_sender, unsubscribe_header
    from cocaq.reports.render import inline_images

    out_dir.mkdir(parents=True, exist_ok=True)
    sender = parse_sender(cfg.mail.from_address)
    msg = build_message(
        sender=sender,
        to=to,
        subject=r.subject,
        text=r.text,
        html=r.html,
        images=r.images,
        message_id=new_message_id(sender),
        date=date,
        list_unsubscribe=unsubscribe_header(cfg.mail, user or to, cfg.reports.contact),
        reply_to=cfg.mail.reply_to,
    )
    html_path, eml_path = out_dir / f"{stem}.html", out_dir / f"{stem}.eml"
    html_path.write_text(inline_images(r.html, r.images), encoding="utf-8")
    eml_path.write_bytes(bytes(msg))
    return [html_path, eml_path]


def user_address(engine: Engine, cfg: Config, user: str) -> str:
    """Where a user's report would go, or a placeholder for a file nobody sends (--out only)."""
    from cocaq.reports.recipients import AddressBook
    from cocaq.reports.transport import MailError

    try:
        found = AddressBook.load(engine, cfg.mail, [user]).for_user(user).address
    except MailError as exc:
        log.warning("%s", exc)
        found = None
    return found or f"{file_stem(user)}@example.invalid"
