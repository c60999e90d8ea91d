"""Sending a batch of report e-mails exactly once each, and saying in one line what happened.

For each message, in order: find the address (recipients.py), skip it if the ledger says it was sent
(unless `force`), skip it if the user opted out or reached `max_per_user_per_day`, claim it in the
ledger (`sending`, with its Message-ID, committed), send it (transient failures retried with exponential
backoff), and record `sent` or `failed` (committed) before the next one starts. A permanent refusal
fails that message only; a server that stays unreachable, or a TLS or login failure, stops the batch
(the other messages would fail the same way) and the summary says how many were not attempted.

In doubt: a row found `sending` was claimed by a run that stopped before recording the outcome (crash,
kill, power loss). Most of that window is the SMTP conversation itself, before the server accepted
anything, so the message most likely did not arrive; only a crash in the few milliseconds between the
server's 250 and our commit means it did. `[mail] in_doubt = "resend"` (the default) therefore sends it
again, with the *same* Message-ID, and logs a warning naming it: a missing report is worse than a rare
duplicate, and a duplicate with the same Message-ID is recognisable (mail clients and many servers
drop it; the outbox transport simply rewrites the same file, so there it is exactly once).
`in_doubt = "skip"` never sends twice: it warns, counts the message as in doubt and leaves the row for
an admin (`force` sends it again).

Rows found `failed` are tried again (with their Message-ID) by the next run: they were not delivered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine

from cocaq.config import Config
from cocaq.reports.message import build_message, new_message_id, parse_sender
from cocaq.reports.recipients import AddressBook, Recipient, sent_today
from cocaq.reports.sent_mail import FAILED, SENDING, SENT, Entry, Ledger
from cocaq.reports.transport import MailError, SendError, Transport, make_transport

log = logging.getLogger("cocaq.reports")

MAX_RETRY_DELAY_S = 300.0


@dataclass(frozen=True)
class Outgoing:
    """One report e-mail to send: to a user (address looked up) or to a given address (labs, admins)."""

    kind: str  # user-monthly, user-weekly, lab-monthly, job, admin... (sent_reports.kind, 32 chars)
    period_start: datetime  # timezone-aware; with kind and recipient, what makes it "the same report"
    period_end: datetime
    subject: str
    text: str
    html: str | None = None
    images: Sequence[tuple[str, bytes]] = ()  # (Content-ID, PNG bytes); the HTML shows them as cid:ID
    user: str | None = None
    address: str | None = None

    def __post_init__(self) -> None:
        if (self.user is None) == (self.address is None):
            raise ValueError("Outgoing: give exactly one of user and address")
        if self.period_start.tzinfo is None or self.period_end.tzinfo is None:
            raise ValueError("Outgoing: period_start and period_end must be timezone-aware")
        if not self.kind or len(self.kind) > 32:
            raise ValueError(f"Outgoing: kind {self.kind!r}: 1 to 32 characters")

    def who(self) -> str:
        return self.user if self.user is not None else str(self.address)

    @classmethod
    def of(cls, kind: str, start: datetime, end: datetime, rendered: Any, **who: str) -> Outgoing:
        """From a rendered message (reports.render.Rendered: subject, text, html, images) and
        `user=` or `address=`."""
        r = rendered
        return cls(kind, start, end, r.subject, r.text, r.html, r.images, **who)


@dataclass
class DeliverySummary:
    """What a batch did; `line()` says it in one line (the scheduler and the CLI print that)."""

    sent: int = 0
    already_sent: int = 0
    opted_out: int = 0
    throttled: int = 0
    failed: int = 0
    no_address: int = 0
    in_doubt: int = 0  # found `sending` from an earlier run (resent or left, per [mail] in_doubt)
    in_doubt_resent: bool = True
    not_attempted: int = 0
    stopped: str | None = None
    transport: str = ""
    failures: list[tuple[str, str]] = field(default_factory=list)  # (recipient, reason)
    problems: list[str] = field(default_factory=list)  # bad lines of the address map and opt-out file

    def line(self) -> str:
        parts = [
            f"{self.sent} sent",
            f"{self.already_sent} already sent",
            f"{self.opted_out} opted out",
            f"{self.throttled} throttled",
            f"{self.failed} failed",
        ]
        if self.no_address:
            parts.append(f"{self.no_address} without an address")
        if self.in_doubt:
            how = "sent again with the same Message-ID" if self.in_doubt_resent else "not sent again"
            parts.append(f"{self.in_doubt} in doubt from an interrupted run ({how})")
        if self.problems:
            parts.append(f"{len(self.problems)} bad line(s) in the address/opt-out files")
        text = "mail: " + ", ".join(parts)
        if self.transport:
            text += f" ({self.transport})"
        if self.stopped:
            text += f"; stopped: {self.stopped} ({self.not_attempted} not attempted)"
        return text

    def lines(self) -> list[str]:
        """The summary, then each failure and each bad file line (for a terminal)."""
        return (
            [self.line()]
            + [f"  failed: {who}: {why}" for who, why in self.failures]
            + [f"  {p}" for p in self.problems]
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "sent",
                "already_sent",
                "opted_out",
                "throttled",
                "failed",
                "no_address",
                "in_doubt",
                "not_attempted",
                "stopped",
                "transport",
            )
        } | {"failures": [list(f) for f in self.failures], "problems": list(self.problems)}

    def __str__(self) -> str:
        return self.line()


def deliver(
    engine: Engine,
    cfg: Config,
    items: Iterable[Outgoing],
    *,
    transport: Transport | None = None,
    force: bool = False,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    sleep: Callable[[float], None] = time.sleep,
) -> DeliverySummary:
    """Send each item at most once per (kind, recipient, period_start), recording each before the next.

    `force` sends again what the ledger says was sent (with a new Message-ID); it does not override
    opt-outs or the throttle. `transport` defaults to the configured one (and is then closed here).
    KeyboardInterrupt and SystemExit go straight through: the message being sent stays `sending`.
    """
    items = list(items)
    mail = cfg.mail
    book = AddressBook.load(engine, mail, (i.user for i in items if i.user is not None))
    tr: Any = transport if transport is not None else make_transport(cfg)
    summary = DeliverySummary(
        transport=tr.describe(), problems=list(book.problems), in_doubt_resent=mail.in_doubt == "resend"
    )
    job = _Batch(engine, cfg, book, tr, summary, force, clock, sleep)
    try:
        for n, item in enumerate(items):
            try:
                job.one(item)
            except MailError as exc:
                summary.stopped = str(exc).removeprefix("mail: ")
                summary.not_attempted = len(items) - n - 1
                log.error(
                    "mail: batch stopped: %s; %d message(s) not attempted",
                    summary.stopped,
                    summary.not_attempted,
                )
                break
    finally:
        if transport is None:
            tr.close()
    log.info("%s", summary.line())
    return summary


class _Batch:
    """The per-message steps of `deliver`, sharing the batch's ledger, transport and summary."""

    def __init__(
        self,
        engine: Engine,
        cfg: Config,
        book: AddressBook,
        transport: Transport,
        summary: DeliverySummary,
        force: bool,
        clock: Callable[[], datetime],
        sleep: Callable[[float], None],
    ) -> None:
        self.engine = engine
        self.mail = cfg.mail
        self.contact = cfg.reports.contact
        self.book = book
        self.transport = transport
        self.summary = summary
        self.force = force
        self.clock = clock
        self.sleep = sleep
        self.ledger = Ledger(engine)
        self.sender = parse_sender(cfg.mail.from_address)

    def one(self, item: Outgoing) -> None:
        s = self.summary
        rcpt = (
            self.book.for_user(item.user)
            if item.user is not None
            else self.book.for_address(str(item.address))
        )
        if rcpt.address is None:
            s.no_address += 1
            log.warning("mail: %s for %s not sent: %s", item.kind, item.who(), rcpt.problem)
            return
        addr = rcpt.address
        entry = self.ledger.get(item.kind, addr, item.period_start)
        if entry is not None and entry.status == SENT and not self.force:
            s.already_sent += 1
            log.debug(
                "mail: %s %s for %s already sent (%s)", item.kind, _period(item), addr, entry.message_id
            )
            return
        if rcpt.opted_out:
            s.opted_out += 1
            log.info("mail: %s for %s not sent: opted out", item.kind, item.who())
            return
        message_id = self._message_id(item, addr, entry)
        if message_id is None:
            return
        limit = self.mail.max_per_user_per_day
        if limit:
            with self.engine.connect() as conn:
                count = sent_today(conn, addr, self.clock(), kind=item.kind, period_start=item.period_start)
            if count >= limit:
                s.throttled += 1
                log.warning(
                    "mail: %s for %s held back: %d message(s) to %s in the last 24 h "
                    "(max_per_user_per_day = %d)",
                    item.kind,
                    item.who(),
                    count,
                    addr,
                    limit,
                )
                return
        try:
            msg = build_message(
                sender=self.sender,
                to=addr,
                to_name=rcpt.display_name,
                subject=item.subject,
                text=item.text,
                html=item.html,
                images=item.images,
                message_id=message_id,
                date=self.clock(),
                list_unsubscribe=self._unsubscribe(rcpt),
                reply_to=self.mail.reply_to,
            )
        except ValueError as exc:
            self._failed(addr, f"cannot build the message: {exc}")
            return
        row_id = self.ledger.claim(
            item.kind, addr, item.period_start, item.period_end, message_id, self.clock(), entry, item.user
        )
        if row_id is None:
            s.already_sent += 1
            log.warning("mail: %s for %s: another run is sending it; left to that run", item.kind, addr)
            return
        self._send(item, addr, msg, row_id)

    def _message_id(self, item: Outgoing, addr: str, entry: Entry | None) -> str | None:
        """The Message-ID to send with: a new one, or the earlier one for an in-doubt or failed row."""
        if entry is None or self.force:
            return new_message_id(self.sender)
        if entry.status == SENDING:
            self.summary.in_doubt += 1
            if self.mail.in_doubt == "skip":
                log.warning(
                    "mail: %s %s for %s may have been sent by an interrupted run (%s, Message-ID %s); "
                    "not sent again (in_doubt = 'skip'; --force sends it)",
                    item.kind,
                    _period(item),
                    addr,
                    _when(entry.sent_at),
                    entry.message_id,
                )
                return None
            log.warning(
                "mail: %s %s for %s may have been sent by an interrupted run (%s); sending it again with "
                "the same Message-ID %s, which may arrive twice",
                item.kind,
                _period(item),
                addr,
                _when(entry.sent_at),
                entry.message_id,
            )
        return entry.message_id or new_message_id(self.sender)

    def _unsubscribe(self, rcpt: Recipient) -> str:
        from cocaq.reports.message import unsubscribe_header

        return unsubscribe_header(self.mail, rcpt.user or rcpt.address, self.contact)

    def _send(self, item: Outgoing, addr: str, msg: Any, row_id: int) -> None:
        attempts = self.mail.retry_attempts
        for attempt in range(1, attempts + 1):
            try:
                note = self.transport.send(msg, self.sender.addr_spec, addr)
            except SendError as exc:
                if exc.permanent:
                    self._failed(addr, str(exc), row_id)
                    return
                if attempt == attempts:
                    reason = f"{exc} (gave up after {attempts} attempts)"
                    self._failed(addr, reason, row_id)
                    if exc.connection:  # the server, not this message: the rest would fail alike
                        raise MailError(f"mail: {reason}") from None
                    return
                delay = min(self.mail.retry_base_delay_s * 2 ** (attempt - 1), MAX_RETRY_DELAY_S)
                log.warning(
                    "mail: %s for %s: %s; attempt %d of %d, next in %.3g s",
                    item.kind,
                    addr,
                    exc,
                    attempt,
                    attempts,
                    delay,
                )
                self.sleep(delay)
            except MailError as exc:
                self._failed(addr, str(exc).removeprefix("mail: "), row_id)
                raise
            else:
                self.ledger.finish(row_id, SENT, self.clock())
                self.summary.sent += 1
                log.info(
                    "mail: %s %s for %s: %s (%s)", item.kind, _period(item), addr, note, msg["Message-ID"]
                )
                return

    def _failed(self, addr: str, reason: str, row_id: int | None = None) -> None:
        if row_id is not None:
            self.ledger.finish(row_id, FAILED, None, reason)
        self.summary.failed += 1
        self.summary.failures.append((addr, reason))
        log.warning("mail: not sent to %s: %s", addr, reason)


def _period(item: Outgoing) -> str:
    return f"{item.period_start:%Y-%m-%d}"


def _when(t: datetime | None) -> str:
    return f"since {t:%Y-%m-%d %H:%M:%S} UTC" if t else "time unknown"
