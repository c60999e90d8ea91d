"""Who gets a report: a user's address, whether they opted out, and whether they had enough mail today.

A user's address, first found wins:

1. `users.email`, where set (an address users gave themselves beats anything guessed);
2. the `[mail] address_map` file: CSV `user,address` or TOML `user = "address"`, one per line;
3. the `[mail] address_template` (`{user}@example.org`).

A user is opted out by `users.opted_out` or by being listed (by name or address) in `opt_out_file`.
Bad lines of either file are reported with their line numbers and skipped; the rest is used.
"""

from __future__ import annotations

import csv
import io
import logging
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Connection, Engine, and_, func, not_, select

from cocaq.addresses import apply_address_template, looks_like_address, normalise_address
from cocaq.config import Mail
from cocaq.db.schema import SentReport, User
from cocaq.reports.transport import MailError

log = logging.getLogger("cocaq.reports")

# Rows that may have reached the recipient count towards the throttle; failed ones did not.
THROTTLED_STATUSES = ("sent", "sending")


def _read_lines(path: Path, what: str) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise MailError(f"mail: {what} {path}: no such file") from None
    except PermissionError:
        raise MailError(f"mail: {what} {path}: permission denied") from None
    except UnicodeDecodeError as exc:
        raise MailError(f"mail: {what} {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise MailError(f"mail: {what} {path}: {exc.strerror or exc}") from None


def _map_entry(user: str, addr: str) -> str | None:
    """Why a user,address pair is unusable, or None."""
    if not user or any(c.isspace() for c in user):
        return f"user name {user!r} is empty or has spaces"
    if not looks_like_address(addr):
        return f"{addr!r} is not an e-mail address"
    return None


def load_address_map(path: str | Path) -> tuple[dict[str, str], list[str]]:
    """user -> address from a CSV (`user,address`) or TOML (`user = "address"`) file, and its problems.

    Parsed line by line, both formats, so that each bad line is reported with its number and skipped
    while the good lines are still used (one TOML syntax error would otherwise lose the whole file).
    A later line for the same user wins, and says so. Blank lines and `#` comments are ignored; a CSV
    may start with a `user,address` header.
    """
    p = Path(path)
    lines = _read_lines(p, "address_map")
    is_toml = p.suffix.lower() == ".toml"
    mapping: dict[str, str] = {}
    where: dict[str, int] = {}
    problems: list[str] = []
    for no, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if is_toml:
            try:
                item = tomllib.loads(line)
            except tomllib.TOMLDecodeError:
                problems.append(f'{p}: line {no}: expected user = "address", got {line[:80]!r}')
                continue
            if len(item) != 1 or not isinstance(next(iter(item.values())), str):
                problems.append(f'{p}: line {no}: expected user = "address", got {line[:80]!r}')
                continue
            ((user, addr),) = item.items()
        else:
            row = next(csv.reader(io.StringIO(line)), [])
            if len(row) != 2:
                problems.append(f"{p}: line {no}: expected user,address, got {line[:80]!r}")
                continue
            user, addr = row
            if no == 1 and user.strip().lower() in ("user", "name", "login") and not looks_like_address(addr):
                continue  # a header
        user, addr = user.strip(), addr.strip()
        problem = _map_entry(user, addr)
        if problem:
            problems.append(f"{p}: line {no}: {problem}")
            continue
        if user in mapping:
            problems.append(f"{p}: line {no}: {user} is also on line {where[user]}; line {no} is used")
        mapping[user] = normalise_address(addr)
        where[user] = no
    return mapping, problems


def load_opt_out(path: str | Path) -> tuple[set[str], list[str]]:
    """User names and addresses (lower-cased) from an opt-out file: one per line, `#` comments."""
    p = Path(path)
    entries: set[str] = set()
    problems: list[str] = []
    for no, raw in enumerate(_read_lines(p, "opt_out_file"), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if any(c.isspace() for c in line):
            problems.append(f"{p}: line {no}: expected one user name or address, got {line[:80]!r}")
            continue
        entries.add(line.lower())
    return entries, problems


@dataclass(frozen=True)
class Recipient:
    """Where one report goes, and why there (for logs and `cocaq mail` output)."""

    user: str | None
    address: str | None  # None: no usable address
    source: str  # users.email, address_map, address_template, given, none
    display_name: str | None = None
    opted_out: bool = False
    problem: str | None = None


@dataclass
class AddressBook:
    """Addresses and opt-outs for a batch, read once: the users rows it needs and the two files."""

    mail: Mail
    users: dict[str, tuple[str | None, str | None, bool]] = field(default_factory=dict)
    address_map: dict[str, str] = field(default_factory=dict)
    opt_out: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, engine: Engine, mail: Mail, names: Iterable[str]) -> AddressBook:
        book = cls(mail)
        wanted = sorted(set(names))
        with engine.connect() as conn:
            for i in range(0, len(wanted), 500):
                rows = conn.execute(
                    select(User.name, User.email, User.full_name, User.opted_out).where(
                        User.name.in_(wanted[i : i + 500])
                    )
                )
                for name, email, full_name, opted_out in rows:
                    book.users[name] = (email, full_name, bool(opted_out))
        if mail.address_map:
            book.address_map, problems = load_address_map(mail.address_map)
            book.problems += problems
        if mail.opt_out_file:
            book.opt_out, problems = load_opt_out(mail.opt_out_file)
            book.problems += problems
        for p in book.problems:
            log.warning("mail: %s", p)
        return book

    def is_opted_out(self, user: str | None, address: str | None) -> bool:
        if user is not None and (
            self.users.get(user, (None, None, False))[2] or user.lower() in self.opt_out
        ):
            return True
        return address is not None and address.lower() in self.opt_out

    def for_user(self, user: str) -> Recipient:
        email, full_name, _ = self.users.get(user, (None, None, False))
        opted = self.is_opted_out(user, None)
        if email and email.strip():
            if looks_like_address(email.strip()):
                addr = normalise_address(email)
                return Recipient(user, addr, "users.email", full_name, opted or self.is_opted_out(None, addr))
            # A bad address the user (or an admin) typed is not silently replaced by a guessed one.
            return Recipient(
                user, None, "users.email", full_name, opted, f"users.email of {user!r} is not an address"
            )
        if user in self.address_map:
            addr = self.address_map[user]
            return Recipient(user, addr, "address_map", full_name, opted or self.is_opted_out(None, addr))
        if self.mail.address_template:
            found = apply_address_template(self.mail.address_template, user)
            if found:
                return Recipient(
                    user, found, "address_template", full_name, opted or self.is_opted_out(None, found)
                )
            return Recipient(user, None, "address_template", full_name, opted, f"{user!r} makes no address")
        return Recipient(
            user,
            None,
            "none",
            full_name,
            opted,
            f"no address for {user!r} (users.email, address_map, template)",
        )

    def for_address(self, address: str) -> Recipient:
        if not looks_like_address(address.strip()):
            return Recipient(None, None, "given", problem=f"{address!r} is not an e-mail address")
        addr = normalise_address(address)
        return Recipient(None, addr, "given", opted_out=self.is_opted_out(None, addr))


def sent_today(conn: Connection, recipient: str, now: datetime, *, kind: str, period_start: datetime) -> int:
    """Messages to `recipient` in the 24 h before `now` (sent, or possibly sent), not counting this one."""
    this_one = and_(SentReport.kind == kind, SentReport.period_start == period_start)
    q = select(func.count()).where(
        SentReport.recipient == recipient,
        SentReport.status.in_(THROTTLED_STATUSES),
        SentReport.sent_at >= now - timedelta(days=1),
        not_(this_one),
    )
    return int(conn.execute(q).scalar_one())
