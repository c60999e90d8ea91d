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

    @property
    def deliverable(self) -> bool:
        """Whether `deliver` would send this recipient a message now: an address and no opt-out."""
        return self.address is not None and not self.opted_out


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
        book = cls(mail, cls.load_users(engine, names))
        if mail.address_map:
            book.address_map, problems = load_address_map(mail.address_map)
            book.problems += problems
        if mail.opt_out_file:
            book.opt_out, problems = load_opt_out(mail.opt_out_file)
            book.problems += problems
        for p in book.problems:
            log.warning("mail: %s", p)
        return book

    @staticmethod
    def load_users(engine: Engine, names: Iterable[str]) -> dict[str, tuple[str | None, str | None, bool]]:
        """The users rows of `names`: email, full name, opted out."""
        users: dict[str, tuple[str | None, str | None, bool]] = {}
        wanted = sorted(set(names))
        with engine.connect() as conn:
            for i in range(0, len(wanted), 500):
                rows = conn.execute(
                    select(User.name, User.email, User.full_name, User.opted_out).where(
                        User.name.in_(wanted[i : i + 500])
                    )
                )
                for name, email, full_name, opted_out in rows:
                    users[name] = (email, full_name, bool(opted_out))
        return users

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


# --- who an opt-out names -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Named:
    """A user an `opt-out` argument names, where their reports go, and whether cocaq has seen them."""

    user: str
    address: str | None
    source: str  # where `address` comes from (Recipient.source)
    seen: bool  # with jobs, a users row or a line in the address map


def _name_problem(name: str) -> str | None:
    if not name or len(name) > 64 or not name.isprintable() or any(c.isspace() for c in name):
        return "is not a user name (1 to 64 printable characters, no spaces)"
    return None


def _seen(conn: Connection, names: Iterable[str]) -> set[str]:
    """Which of `names` have jobs or a users row (each an indexed lookup: jobs may be millions of rows)."""
    from cocaq.db.schema import Job

    found = set()
    for n in set(names):
        if conn.execute(select(User.name).where(User.name == n)).first() is not None or (
            conn.execute(select(Job.user_name).where(Job.user_name == n).limit(1)).first() is not None
        ):
            found.add(n)
    return found


def _template_user(template: str | None, address: str) -> str | None:
    """The user name the `{user}` template would turn into `address` (case aside), or None."""
    if not template:
        return None
    head, _, tail = template.partition("{user}")
    low = address.lower()
    if len(low) <= len(head) + len(tail) or not (low.startswith(head.lower()) and low.endswith(tail.lower())):
        return None
    middle = address[len(head) : len(address) - len(tail)]
    return middle if _name_problem(middle) is None and "@" not in middle else None


def _close_names(conn: Connection, book: AddressBook, name: str) -> list[str]:
    """Users cocaq knows whose names are close to `name` (for the error on a typo); only on that path."""
    from difflib import get_close_matches

    from cocaq.db.schema import Job

    known = set(book.address_map)
    known |= {n for (n,) in conn.execute(select(User.name))}
    known |= {n for (n,) in conn.execute(select(Job.user_name).distinct())}
    return get_close_matches(name, sorted(known), n=3, cutoff=0.7)


def _did_you_mean(conn: Connection, book: AddressBook, name: str) -> str:
    close = _close_names(conn, book, name)
    return f"did you mean {' or '.join(close)}? " if close else ""


def resolve_named(engine: Engine, mail: Mail, args: Iterable[str], *, force: bool) -> list[tuple[str, Named]]:
    """(argument, user) for each user the arguments name, or a UsageError on the first that names none.

    A name is a user cocaq has seen (jobs, users, the address map), or with `force` one not seen yet. An
    address names the users whose reports go there, as `AddressBook.for_user` finds it (users.email, then
    the map, then the template): where the map and the template disagree, the map wins as it does when
    sending, and an address two users are mailed at names both. An address nobody is mailed at is refused,
    even with `force` unless the template makes it for a user not seen yet. Nothing is resolved halfway:
    the caller writes only when every argument resolved.
    """
    from cocaq.errors import UsageError

    args = list(args)
    out: list[tuple[str, Named]] = []
    with engine.connect() as conn:
        book = AddressBook.load(engine, mail, [])
        for arg in args:
            if "@" not in arg:
                problem = _name_problem(arg)
                if problem:
                    raise UsageError(f"mail: {arg!r} {problem}")
                seen = arg in book.address_map or bool(_seen(conn, [arg]))
                if not seen and not force:
                    raise UsageError(
                        f"mail: no user {arg!r} (no jobs, no users row, not in the address map): "
                        f"{_did_you_mean(conn, book, arg)}--force takes a user not seen yet"
                    )
                book = _with(engine, book, [arg])
                r = book.for_user(arg)
                out.append((arg, Named(arg, r.address, r.source, seen)))
                continue
            text = arg.strip()
            if not looks_like_address(text):
                raise UsageError(f"mail: {arg!r} is not an e-mail address nor a user name")
            addr = normalise_address(text)
            candidates = {u for u, a in book.address_map.items() if a.lower() == addr.lower()}
            for name, email in conn.execute(select(User.name, User.email).where(User.email.is_not(None))):
                if email and normalise_address(email).lower() == addr.lower():
                    candidates.add(name)
            guess = _template_user(mail.address_template, addr)
            guesses = {guess, guess.lower()} if guess else set()
            known = _seen(conn, candidates | guesses) | set(book.address_map)
            candidates |= guesses & known
            book = _with(engine, book, candidates)
            hits = sorted(u for u in candidates if (book.for_user(u).address or "").lower() == addr.lower())
            if hits:
                out += [
                    (arg, Named(u, book.for_user(u).address, book.for_user(u).source, True)) for u in hits
                ]
                continue
            elsewhere = [(u, book.for_user(u)) for u in sorted(candidates)]
            if elsewhere:
                where = "; ".join(
                    f"{u}'s go to {r.address or 'no address'} ({r.source})" for u, r in elsewhere
                )
                names = ", ".join(u for u, _ in elsewhere)
                raise UsageError(f"mail: no reports go to {addr} ({where}): give the user's name ({names})")
            if guess is not None and force:
                out.append((arg, Named(guess, addr, "address_template", False)))
                continue
            if guess is not None:
                raise UsageError(
                    f"mail: no user {guess!r} has jobs or a users row, and no line of the address map "
                    f"gives {addr}: {_did_you_mean(conn, book, guess)}--force takes a user not seen yet"
                )
            how = (
                f"it is not of the address template's form ({mail.address_template})"
                if mail.address_template
                else "there is no address template"
            )
            raise UsageError(
                f"mail: no user's reports go to {addr} (not in users.email nor the address map, and {how}): "
                "give the user's name"
            )
    return out


def _with(engine: Engine, book: AddressBook, names: Iterable[str]) -> AddressBook:
    """`book` with the users rows of `names` as well (the files are read once)."""
    more = AddressBook.load_users(engine, set(names) - set(book.users))
    book.users.update(more)
    return book
