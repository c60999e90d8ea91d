"""Reports written to files instead of sent: each e-mail as `STEM.html` (its HTML with the charts inlined,
for a browser) and `STEM.eml` (the message as it would be sent, for a mail client), under a file name made
safe from user and account names, addressed as it would be.

Both `cocaq report --out` and the demo write reports this way; it lives with the reports, not with either
command, so that neither front-end borrows the other's helpers.

Reports hold users' names and figures (the admin's, everyone's), so every report file cocaq writes,
these and the batch's archive (`[reports] archive_dir`), goes through `write_private`: created 0640 less
the umask (never wider, not even for a moment: the mode is given to open(), not set after) and renamed
into place; the directories it makes are 0750 less the umask.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from cocaq.config import Config
    from cocaq.reports.render import Rendered

log = logging.getLogger("cocaq.reports")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
FILE_MODE, DIR_MODE = 0o640, 0o750  # the most a report file or its directory gets; the umask takes more


def make_dirs(directory: Path) -> None:
    """`mkdir -p` with DIR_MODE for each directory it makes (Path.mkdir gives parents the default)."""
    missing = []
    d = directory
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another run
            os.mkdir(d, DIR_MODE)


def write_private(path: Path, data: str | bytes) -> None:
    """`data` into `path`, created FILE_MODE less the umask and renamed over any file there, so that a
    reader never sees half a report and an older, wider file is replaced by a narrower one."""
    make_dirs(path.parent)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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

    make_dirs(out_dir)
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
    write_private(html_path, inline_images(r.html, r.images))
    write_private(eml_path, bytes(msg))
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
