"""`cocaq report send`: a month's user, lab and admin e-mails, each exactly once, re-runnable.

The order of work, and why:

1. Everything that needs no rendering is decided first, from the users with jobs in the month (one
   cheap query), the database and the address book: users who turned the monthly e-mail off
   (`users.monthly_email`), opted out, have no address, or whose report the ledger says was sent. So a
   re-run computes and renders nothing it will not send, and is a quick no-op.
2. The month's data for the users left, in one pass (`user_report.users_month`: a dozen statements for all
   users instead of a dozen per user).
3. Their messages are rendered lazily, in order, and handed to `deliver` in chunks of `CHUNK` messages:
   `deliver` records each message (`sending`, then `sent`) before the next, so a crash loses at most the
   rendering of a chunk or two, never a record, and memory holds that many messages (their PNG charts),
   not the month's. A re-run after a crash sends only what is missing. Large batches are rendered by
   worker processes while this one sends (`render_workers`): rendering is CPU-bound, sending mostly
   waits on the SMTP server and the ledger's commits.
4. Labs (to `[reports] lab_heads`), then the admin report (to `[reports] admins`). The admins' interactive
   HTML (plotly, a few MB) is not attached: it is written to `[reports] archive_dir` as
   `admin-YYYY-MM[-CLUSTER].html` (0640 less the umask: it names every user) and the e-mail says where;
   without an archive_dir it is not kept (the e-mail says `cocaq report admin --out DIR` makes it).

While an e-mail study runs (`[study]`, cocaq.study.assign), users drawn into its hold-out arm get no
user report: each one held back is recorded as a `skipped` ledger row with the reason ("study hold-out
(2026-09/seed 7)"), and users not drawn yet are drawn first. A report is held back exactly where it
would have been sent (jobs in the month as `users_month` counts them, an address, no opt-out), so that
the ledger's first contact with a user (cocaq.study.assign.first_contacts) means the same in both arms.
A report is judged at the later of the time it goes and the end of its month (UTC), so the report of
the month before the start is the first held back and that of the end month goes, whatever the
scheduler's timezone. Lab and admin reports are not held back.

Ledger keys (`sent_reports`: kind, recipient address, period_start = the month's UTC start): user
reports are kind `user-monthly`, labs `lab:ACCOUNT` (one head may lead several labs: the lab is in the
kind), the admin report `admin-monthly`; with `-M CLUSTER` the kind gets `@CLUSTER`, so one cluster's
reports do not stand for another's. Kinds longer than 32 characters end in a hash instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, select

from cocaq.config import Config
from cocaq.errors import UsageError

if TYPE_CHECKING:
    from cocaq.reports.data import AdminMonth, Month, UserMonth
    from cocaq.reports.deliver import DeliverySummary, Outgoing
    from cocaq.reports.recipients import AddressBook
    from cocaq.reports.render import Rendered
    from cocaq.reports.transport import Transport

log = logging.getLogger("cocaq.reports")

SECTIONS = ("users", "labs", "admin")
USER_KIND = "user-monthly"
ADMIN_KIND = "admin-monthly"
LAB_KIND = "lab"
CHUNK = 100  # messages rendered ahead of sending: bounds memory and what a crash throws away
_KIND_MAX = 32


def kind_for(base: str, cluster: str | None = None, lab: str | None = None) -> str:
    """The ledger kind: `base[:LAB][@CLUSTER]`, hashed to fit sent_reports.kind (32 characters)."""
    k = base + (f":{lab}" if lab is not None else "") + (f"@{cluster}" if cluster is not None else "")
    if len(k) <= _KIND_MAX:
        return k
    digest = hashlib.sha1(k.encode()).hexdigest()
    return f"{base}#{digest}"[:_KIND_MAX]


@dataclass
class Section:
    """One part of the batch: what was sent (merged `deliver` summaries) and what was left out before."""

    name: str
    delivery: DeliverySummary
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> count, beyond deliver's own
    planned: int = 0  # messages handed to deliver (dry run: that would be)
    ran: bool = True

    def words(self, dry_run: bool) -> str:
        d = self.delivery
        if not self.ran:
            return f"{self.name}: not asked for"
        parts = [f"{self.planned} to send" if dry_run else f"{d.sent} sent"]
        parts.append(f"{d.already_sent} already sent")
        if d.opted_out:
            parts.append(f"{d.opted_out} opted out")
        parts += [f"{n} {why}" for why, n in sorted(self.skipped.items())]
        if d.no_address:
            parts.append(f"{d.no_address} without an address")
        if d.throttled:
            parts.append(f"{d.throttled} throttled")
        if d.in_doubt:
            parts.append(f"{d.in_doubt} in doubt from an interrupted run")
        if not dry_run:
            parts.append(f"{d.failed} failed")
        if d.stopped:
            parts.append(f"stopped: {d.stopped} ({d.not_attempted} not attempted)")
        return f"{self.name}: " + ", ".join(parts)


@dataclass
class SendSummary:
    """What `send_month` did, in one line (`line()`); `status` is for the scheduler's run log."""

    month: str
    cluster: str | None
    dry_run: bool
    sections: dict[str, Section]
    transport: str = ""
    archive: str | None = None  # where the admin HTML was written
    problems: list[str] = field(default_factory=list)

    @property
    def stopped(self) -> str | None:
        return next((s.delivery.stopped for s in self.sections.values() if s.delivery.stopped), None)

    @property
    def status(self) -> str:
        return "error" if self.stopped else "ok"

    def total(self, attr: str) -> int:
        return sum(int(getattr(s.delivery, attr)) for s in self.sections.values())

    def line(self) -> str:
        where = f" -M {self.cluster}" if self.cluster else ""
        head = f"report send {self.month}{where}{' (dry run: nothing sent)' if self.dry_run else ''}"
        parts = [s.words(self.dry_run) for s in self.sections.values()]
        text = head + ": " + "; ".join(parts)
        if self.archive:
            text += f"; admin HTML: {self.archive}"
        if self.problems:
            text += f"; {len(self.problems)} bad line(s) in the address/opt-out files"
        if self.transport and not self.dry_run:
            text += f" ({self.transport})"
        return text

    def lines(self) -> list[str]:
        out = [self.line()]
        for s in self.sections.values():
            out += [f"  failed: {who}: {why}" for who, why in s.delivery.failures]
        return out + [f"  {p}" for p in self.problems]


def _merge(into: DeliverySummary, part: DeliverySummary) -> None:
    for k in ("sent", "already_sent", "opted_out", "throttled", "failed", "no_address", "in_doubt"):
        setattr(into, k, getattr(into, k) + getattr(part, k))
    into.failures += part.failures
    if part.stopped and not into.stopped:
        into.stopped = part.stopped
        into.not_attempted += part.not_attempted


def _chunks(items: Iterable[Outgoing], n: int) -> Iterator[list[Outgoing]]:
    chunk: list[Outgoing] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Sender:
    """Shares one transport (one SMTP connection) and the stop condition across the batch's sections."""

    def __init__(
        self,
        engine: Engine,
        cfg: Config,
        transport: Transport | None,
        force: bool,
        dry_run: bool,
        now: datetime | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.engine, self.cfg, self.force, self.dry_run = engine, cfg, force, dry_run
        self.now = now if now is not None else datetime.now(UTC)  # what the study's months are judged by
        self.clock = clock if clock is not None else lambda: datetime.now(UTC)  # what deliver stamps
        self._given = transport
        self._transport: Any = transport
        self.stopped = False

    def transport(self) -> Any:
        if self._transport is None:
            from cocaq.reports.transport import make_transport

            self._transport = make_transport(self.cfg)
        return self._transport

    def close(self) -> None:
        if self._given is None and self._transport is not None:
            self._transport.close()

    def send(self, section: Section, count: int, make: Callable[[], Iterator[Outgoing]]) -> None:
        """Deliver `count` messages that `make()` renders lazily, CHUNK at a time."""
        section.planned += count
        if self.dry_run or count == 0:
            return
        if self.stopped:
            section.delivery.not_attempted += count
            return
        from cocaq.reports.deliver import deliver

        done = 0
        for chunk in _chunks(make(), CHUNK):
            part = deliver(
                self.engine, self.cfg, chunk, transport=self.transport(), force=self.force, clock=self.clock
            )
            done += len(chunk)
            _merge(section.delivery, part)
            if part.stopped:
                self.stopped = True
                section.delivery.not_attempted += count - done
                return


def _sent_recipients(engine: Engine, kind: str, period_start: datetime) -> set[str]:
    from cocaq.db.schema import SentReport as T

    with engine.connect() as conn:
        q = select(T.recipient).where(T.kind == kind, T.period_start == period_start, T.status == "sent")
        return set(conn.execute(q).scalars())


def _new_summary(transport: str) -> DeliverySummary:
    from cocaq.reports.deliver import DeliverySummary

    return DeliverySummary(transport=transport)


def send_month(
    engine: Engine,
    cfg: Config,
    month_start: date | datetime,
    *,
    cluster: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    only: Sequence[str] | None = None,
    transport: Transport | None = None,
    now: datetime | None = None,
    clock: Callable[[], datetime] | None = None,
) -> SendSummary:
    """Send the month's reports (all sections, or `only` some), exactly once each; see the module doc.

    `force` sends again what the ledger says was sent (not to opted-out users). `dry_run` reads and
    decides but renders, writes and sends nothing. `transport` defaults to the configured one. `now`
    (default: the clock) is when the e-mails go, for the study's hold-out. `clock` (default: the
    machine's) is the time each message is stamped with as it goes (its Date, its ledger row): a
    replay of past months (cocaq.demo.study) gives one that says then.
    """
    from cocaq.reports.data import Month

    wanted = tuple(only) if only else SECTIONS
    for s in wanted:
        if s not in SECTIONS:
            raise UsageError(f"--only {s!r}: expected one of {', '.join(SECTIONS)}")
    if cluster is not None:  # a typo: refused (exit 2), not a month with nothing to send
        from cocaq.reports.queries import cluster_id_of

        with engine.connect() as conn:
            cluster_id_of(conn, cluster)
    month = Month.of(date(month_start.year, month_start.month, 1))
    sender = _Sender(engine, cfg, transport, force, dry_run, now, clock)
    what = "" if dry_run else sender.transport().describe()
    sections = {name: Section(name, _new_summary(what), ran=name in wanted) for name in SECTIONS}
    summary = SendSummary(month.label, cluster, dry_run, sections, transport=what)
    try:
        if "users" in wanted:
            book = _send_users(sender, month, cluster, sections["users"])
            summary.problems = list(book.problems)
        if "labs" in wanted:
            _send_labs(sender, month, cluster, sections["labs"])
        if "admin" in wanted:
            summary.archive = _send_admin(sender, month, cluster, sections["admin"])
    finally:
        sender.close()
    log.info("%s", summary.line())
    return summary


# --- users ------------------------------------------------------------------------------------------------


def _month_users(engine: Engine, month: Month, cluster: str | None) -> list[str]:
    """Users with a job that may have run in the month: `queries.month_jobs`' condition, a little wider
    (its share-of-hours test is left to `users_month`). Cheap, so that a re-run with nothing left to
    send never computes the month."""
    from sqlalchemy import or_

    from cocaq.db.schema import Cluster, Job

    q = (
        select(Job.user_name)
        .where(
            Job.start_time < month.end,
            Job.start_time.is_not(None),
            or_(Job.end_time > month.start, Job.end_time.is_(None), Job.start_time >= month.start),
        )
        .distinct()
    )
    if cluster is not None:
        q = q.where(Job.cluster_id == select(Cluster.id).where(Cluster.name == cluster).scalar_subquery())
    with engine.connect() as conn:
        return sorted(conn.execute(q).scalars())


def _send_users(sender: _Sender, month: Month, cluster: str | None, section: Section) -> AddressBook:
    from cocaq.db.schema import User
    from cocaq.reports.recipients import AddressBook
    from cocaq.reports.user_report import users_month
    from cocaq.study.assign import hold_out, record_skips

    engine, cfg = sender.engine, sender.cfg
    names = _month_users(engine, month, cluster)
    off: set[str] = set()
    with engine.connect() as conn:
        for i in range(0, len(names), 500):
            q = select(User.name).where(User.name.in_(names[i : i + 500]), User.monthly_email.is_(False))
            off.update(conn.execute(q).scalars())
    book = AddressBook.load(engine, cfg.mail, names)
    kind = kind_for(USER_KIND, cluster)
    sent = set() if sender.force else _sent_recipients(engine, kind, month.start)
    # Decided before the month is computed, for every user with a job that may have run in it (so a
    # job that ended as the month began may put a user in these counts); users_month settles the rest,
    # the hold-out's included.
    d = section.delivery
    opted = [u for u in names if book.for_user(u).opted_out]
    # judged when the report goes, or when its month ends if that is later: the report of the month before
    # the study is the first one held back, wherever the scheduler's timezone puts the 1st
    at = max(sender.now, month.end)
    hold = hold_out(engine, cfg, sender.now, names, opted_out=opted, dry_run=sender.dry_run, judged_at=at)
    held: dict[str, str] = {}  # hold-out user -> address: held back if the month has jobs of theirs
    candidates: list[str] = []
    for u in names:
        if u in off:
            section.skipped["monthly e-mail off"] += 1
            continue
        rcpt = book.for_user(u)
        if rcpt.address is None:
            d.no_address += 1
            log.warning("mail: %s for %s not sent: %s", kind, u, rcpt.problem)
        elif rcpt.address in sent:
            d.already_sent += 1
        elif rcpt.opted_out:
            d.opted_out += 1
        elif hold is not None and u in hold:
            held[u] = rcpt.address
        else:
            candidates.append(u)
    months: dict[str, UserMonth] = {}
    asked = candidates + sorted(held)
    if asked:
        whole = len(asked) == len(names)
        with engine.connect() as conn:
            months = users_month(conn, cfg, month.start, cluster=cluster, users=None if whole else asked)
            conn.rollback()

    def due(u: str) -> bool:
        return u in months and months[u].totals.jobs > 0

    # A hold-out user's report is held back exactly where the same user e-mailed would be sent one
    # (not for a job that only ended as the month began): the ledger's first contact means the same in
    # both arms (cocaq.study.assign.first_contacts).
    skips = [(kind, a, u, month.start, month.end) for u, a in sorted(held.items()) if due(u)]
    if hold is not None and skips:
        section.skipped[hold.reason] += len(skips)
        if not sender.dry_run:
            record_skips(engine, hold, skips, sender.now)
    todo = [u for u in candidates if due(u)]
    keep = set(todo)
    for u in list(months):
        if u not in keep:
            del months[u]  # the rest is rendered from here; what is left out is not kept

    def render() -> Iterator[Outgoing]:
        yield from _rendered_users(todo, months, cfg, kind, month)

    sender.send(section, len(todo), render)
    return book


PARALLEL_MIN = 200  # messages: fewer are rendered in this process (a worker's start-up costs ~1 s)
AHEAD = CHUNK  # messages rendered ahead by the workers while this process sends


def render_user(m: UserMonth, cfg: Config) -> Rendered:
    """One user's e-mail (module-level: worker processes call it by name)."""
    from cocaq.reports.render import render_user_month
    from cocaq.reports.suggest import suggest_for_user

    return render_user_month(m, suggest_for_user(m, cfg), cfg)


def render_workers(n: int) -> int:
    """Worker processes for rendering `n` messages: none for a small batch or a one-CPU host, else
    one per spare CPU (this process sends meanwhile), at most 4."""
    cpus = os.cpu_count() or 1
    return 0 if n < PARALLEL_MIN or cpus < 2 else min(4, cpus - 1)


def _rendered_users(
    todo: Sequence[str], months: dict[str, UserMonth], cfg: Config, kind: str, month: Month
) -> Iterator[Outgoing]:
    """The users' messages in order, rendered here or by worker processes (charts and templates are
    CPU-bound: on a multi-core head node they overlap with the sending, which waits on SMTP and the
    database). At most AHEAD messages are rendered ahead, so memory stays bounded."""
    from cocaq.reports.deliver import Outgoing

    def outgoing(u: str, r: Rendered) -> Outgoing:
        return Outgoing.of(kind, month.start, month.end, r, user=u)

    workers = render_workers(len(todo))
    if not workers:
        for u in todo:
            yield outgoing(u, render_user(months.pop(u), cfg))
        return
    import multiprocessing
    from collections import deque
    from concurrent.futures import Future, ProcessPoolExecutor

    # spawn, not fork: this process holds database connections and a logging set-up
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        pending: deque[tuple[str, Future[Rendered]]] = deque()
        queue = iter(todo)
        try:
            for u in queue:
                pending.append((u, pool.submit(render_user, months.pop(u), cfg)))
                if len(pending) >= AHEAD:
                    break
            while pending:
                u, fut = pending.popleft()
                nxt = next(queue, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(render_user, months.pop(nxt), cfg)))
                yield outgoing(u, fut.result())
        finally:
            for _, fut in pending:
                fut.cancel()


# --- labs -------------------------------------------------------------------------------------------------


def _lab_accounts(engine: Engine, month: Month, cluster: str | None) -> set[str]:
    """Accounts with jobs in the month (from the rollups: one row per day, user, account, partition)."""
    from cocaq.db.schema import Cluster, DailyRollup

    R = DailyRollup
    q = select(R.account).where(R.day >= month.start, R.day < month.end).distinct()
    if cluster is not None:
        q = q.where(R.cluster_id == select(Cluster.id).where(Cluster.name == cluster).scalar_subquery())
    with engine.connect() as conn:
        return {a for a in conn.execute(q).scalars() if a is not None}


def _send_labs(sender: _Sender, month: Month, cluster: str | None, section: Section) -> None:
    engine, cfg = sender.engine, sender.cfg
    heads = cfg.reports.lab_heads
    active = _lab_accounts(engine, month, cluster)
    section.skipped["labs without a configured head"] += len(active - set(heads))
    todo: list[tuple[str, str, list[str]]] = []  # (account, kind, addresses)
    for account in sorted(heads):
        if account not in active:
            section.skipped["labs without jobs"] += 1
            continue
        kind = kind_for(LAB_KIND, cluster, lab=account)
        sent = set() if sender.force else _sent_recipients(engine, kind, month.start)
        addrs = [a for a in heads[account] if a not in sent]
        section.delivery.already_sent += len(heads[account]) - len(addrs)
        if addrs:
            todo.append((account, kind, addrs))
    for k in [k for k, n in section.skipped.items() if n == 0]:
        del section.skipped[k]

    def render() -> Iterator[Outgoing]:
        from cocaq.reports.deliver import Outgoing
        from cocaq.reports.lab_report import lab_month
        from cocaq.reports.render import render_lab_month

        for account, kind, addrs in todo:
            with engine.connect() as conn:
                lm = lab_month(conn, cfg, account, month.start, cluster=cluster)
                conn.rollback()
            r = render_lab_month(lm, cfg)
            for a in addrs:
                yield Outgoing.of(kind, month.start, month.end, r, address=a)

    sender.send(section, sum(len(a) for _, _, a in todo), render)


# --- admins -----------------------------------------------------------------------------------------------


def archive_path(directory: str | os.PathLike[str], month: Month, cluster: str | None) -> Path:
    return Path(directory).expanduser() / f"admin-{month.label}{'-' + cluster if cluster else ''}.html"


def first_reports(engine: Engine, cluster: str | None = None) -> dict[str, datetime]:
    """user -> when their first user-monthly report was sent, for the admin report's before/after
    comparison (the sent-mail record keeps whom each user report was for)."""
    from cocaq.reports import sent_mail

    with engine.connect() as conn:
        return sent_mail.first_reports(conn, kind_for(USER_KIND, cluster))


def build_admin_month(engine: Engine, cfg: Config, month_start: datetime, cluster: str | None) -> AdminMonth:
    """The admin report's month, with the before/after comparison when user reports have been sent
    (`cocaq report admin`; the batch builds its own on the connection it sends from)."""
    from cocaq.reports.admin_report import admin_month

    first = first_reports(engine, cluster)
    with engine.connect() as conn:
        return admin_month(
            conn,
            cfg,
            month_start,
            cluster,
            first_report=first or None,
            window_days=cfg.reports.before_after_days,
        )


def _send_admin(sender: _Sender, month: Month, cluster: str | None, section: Section) -> str | None:
    """The admin e-mail to each configured admin, and its interactive HTML into archive_dir."""
    from cocaq.reports import sent_mail

    engine, cfg = sender.engine, sender.cfg
    admins = list(cfg.reports.admins)
    archive_dir = cfg.reports.archive_dir
    kind = kind_for(ADMIN_KIND, cluster)
    sent = set() if sender.force else _sent_recipients(engine, kind, month.start)
    addrs = [a for a in admins if a not in sent]
    section.delivery.already_sent += len(admins) - len(addrs)
    if not admins:
        section.skipped["no [reports] admins configured"] += 1
    path = archive_path(archive_dir, month, cluster) if archive_dir else None
    # Nothing to send and the archive already there (or none wanted): nothing to compute either.
    archive_due = path is not None and (sender.force or not path.exists())
    if sender.dry_run or sender.stopped or not (addrs or archive_due):
        sender.send(section, len(addrs), lambda: iter(()))
        return str(path) if path is not None and path.exists() else None
    from cocaq.reports.admin_report import admin_month
    from cocaq.reports.deliver import Outgoing
    from cocaq.reports.files import write_private
    from cocaq.reports.render import render_admin_email, render_admin_html

    with engine.connect() as conn:
        am = admin_month(
            conn,
            cfg,
            month.start,
            cluster,
            first_report=sent_mail.first_reports(conn, kind_for(USER_KIND, cluster)),
            window_days=cfg.reports.before_after_days,
        )
        conn.rollback()
    r = render_admin_email(am, cfg)
    text, html = r.text, r.html
    if path is not None:
        write_private(path, render_admin_html(am, cfg))  # everyone's figures: 0640 at most
        note = f"The interactive report (charts to explore, tables to sort): {path}"
    else:
        note = (
            "The interactive report is not archived here ([reports] archive_dir is not set); "
            f"`cocaq report admin --month {month.label} --out DIR` writes it."
        )
    text = f"{text.rstrip()}\n\n{note}\n"
    html = _add_paragraph(html, note)

    def items() -> Iterator[Outgoing]:
        for a in addrs:
            yield Outgoing(
                kind=kind,
                period_start=month.start,
                period_end=month.end,
                subject=r.subject,
                text=text,
                html=html,
                images=r.images,
                address=a,
            )

    sender.send(section, len(addrs), items)
    return str(path) if path is not None else None


def _add_paragraph(html: str, note: str) -> str:
    """`note` as a last paragraph of the HTML body (or at the end when there is no </body>)."""
    p = f'<p style="font-size:90%;color:#555">{escape(note)}</p>\n'
    i = html.lower().rfind("</body>")
    return html[:i] + p + html[i:] if i >= 0 else html + p
