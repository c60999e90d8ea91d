"""Job footprint e-mails at the end of a job, for the jobs that asked or wasted energy, in digests.

Which jobs: those that asked, and those that wasted energy.

* Asked: a user with `users.job_email` set, or a job whose Slurm comment holds `cocaq:notify`
  (`NOTIFY_TOKEN`, any case, anywhere in the comment: `#SBATCH --comment "cocaq:notify"`).
* Wasted, asked or not: a finished job whose energy that did no useful work,
  `cocaq.accounting.ledger.waste(state, jobs.energy_j, job_metrics.idle_gpu_energy_j).total` (its idle GPUs,
  and all
  of the rest of a job that failed, ran out of memory or was cancelled; never the time-limit part, which
  is possibly lost), reached
  `[reports] job_email_waste_kwh` (0: off). Its e-mail says why it came (`render.waste_reason`) and how
  to stop these e-mails. A job's idle GPU energy is known once the aggregator has derived its metrics;
  until then only its state can make it wasted.

Opted-out users (`users.opted_out`, `[mail] opt_out_file`) get none. While an e-mail study runs
(`[study]`, cocaq.study.assign), users in its hold-out arm get none either: their digests are made as
usual, so that each job is decided once, and recorded as `skipped` in the ledger with the reason instead
of being sent (a digest made before the study began and not sent yet is held back the same way).

When a job is ready (`ready`): its energy is final (`data.job_footprint`: the job is not open, its state
is a final Slurm state, and every measured node record is the epilog's final one) and the aggregator has
derived its metrics since it last changed (the carbon intensity over its run, GPU use, embodied CO2), or
`METRICS_WAIT` has passed since it ended (a stopped aggregator does not hold the e-mail back for ever).
A job whose node records never became final (an epilog record lost with its node) is sent `STALE_AFTER`
its end, marked as not final, rather than never.

Digests, so that an array of 500 tasks is one e-mail: a user's ready jobs wait until the oldest of them
ended `[reports] job_digest_minutes` (30) ago; then all of that user's ready jobs (up to
`MAX_JOBS_PER_DIGEST`, oldest first) become one digest.

Exactly once per job, in two committed steps:

1. Bind: the digest's jobs are written to `job_notices` (job_pk is the primary key) with the digest's key
   `digest_at` (the time it was made), in one transaction. A job is bound once: a run that races another
   for the same job fails on the key, rolls its whole digest back and leaves those jobs to the other.
   The digest's content is from then on fixed: its bound jobs, read back from `job_notices`.
2. Send: the digest goes through `deliver` as kind "job" with period_start = `digest_at`, so the ledger
   (`sent_reports`, which keeps the user name) makes its sending exactly once, crash or not (in-doubt
   rows per `[mail] in_doubt`). A digest is open until its ledger row is `sent` (or `skipped`: held
   back by the study): each run sends the open
   ones again (a crash before sending, a server that was down, the daily throttle), for `RETRY_FOR`; then
   it is left, visible in `sent_reports` as failed or sending.

A user with an open digest gets no new one until it is sent: their new jobs wait, and go together in the
next digest. So no job is ever in two digests, none is dropped while its digest can still go, and a
crash between the steps loses nothing: bound jobs are found again through their open digest.

Jobs that ended more than `LOOKBACK` ago are not considered (turning `job_email` on does not mail a
year of jobs; the scheduler's catch-up covers the same week).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, and_, exists, false, func, insert, or_, select
from sqlalchemy.exc import IntegrityError

from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.units import J_PER_KWH

if TYPE_CHECKING:
    from cocaq.reports.data import JobReport
    from cocaq.reports.deliver import DeliverySummary, Outgoing
    from cocaq.reports.transport import Transport

log = logging.getLogger("cocaq.reports")

KIND = "job"
NOTIFY_TOKEN = "cocaq:notify"
LOOKBACK = timedelta(days=7)
METRICS_WAIT = timedelta(hours=2)
STALE_AFTER = timedelta(hours=6)
RETRY_FOR = timedelta(days=7)
MAX_JOBS_PER_DIGEST = 100


def digest_window(cfg: Config) -> timedelta:
    """`[reports] job_digest_minutes` (30 by default; 0 sends each job as soon as it is ready)."""
    return timedelta(minutes=cfg.reports.job_digest_minutes)


def ready(rep: JobReport, now: datetime) -> bool:
    """Whether a job's e-mail can go now (see the module doc)."""
    from cocaq.slurm.record import FINAL_STATES

    if rep.end is None or rep.is_open:
        return False
    ended = now - rep.end
    if rep.final:
        return rep.metrics_current or ended >= METRICS_WAIT
    return rep.state.split(" ")[0] in FINAL_STATES and ended >= STALE_AFTER


@dataclass
class JobMailSummary:
    """What one run did; `line()` for the scheduler's run log and the CLI."""

    considered: int = 0  # jobs that asked or wasted energy, ended within LOOKBACK, not yet in a digest
    not_ready: int = 0  # energy not final yet, or metrics not derived yet
    in_window: int = 0  # ready, waiting for the digest window of their user
    waiting_open: int = 0  # ready, waiting for their user's open digest to go first
    new_digests: int = 0
    new_jobs: int = 0  # bound to the new digests
    unasked_jobs: int = 0  # of those, the jobs that go for their wasted energy alone
    open_digests: int = 0  # digests handed to deliver this run (new ones included)
    no_address: int = 0  # users left out before binding (no address or opted out in the file)
    opted_out: int = 0
    held_out: int = 0  # digests not sent: their user is in the study's hold-out arm (recorded `skipped`)
    raced: int = 0  # digests rolled back: another run bound some of their jobs first
    dry_run: bool = False
    delivery: DeliverySummary | None = None

    @property
    def status(self) -> str:
        return "error" if self.delivery is not None and self.delivery.stopped else "ok"

    def line(self) -> str:
        if self.dry_run:
            head = (
                f"job e-mails (dry run): {self.new_digests} new digest(s) of {self.new_jobs} job(s) "
                f"and {self.open_digests - self.new_digests} earlier digest(s) would go"
            )
        else:
            head = (
                f"job e-mails: {self.new_digests} new digest(s) of {self.new_jobs} job(s), "
                f"{self.open_digests} digest(s) to send"
            )
        if self.unasked_jobs:
            head += f" ({self.unasked_jobs} unasked, for their wasted energy)"
        parts = [head]
        waits = []
        if self.not_ready:
            waits.append(f"{self.not_ready} not final yet")
        if self.in_window:
            waits.append(f"{self.in_window} in the digest window")
        if self.waiting_open:
            waits.append(f"{self.waiting_open} behind an unsent digest")
        if waits:
            parts.append("jobs waiting: " + ", ".join(waits))
        left = []
        if self.opted_out:
            left.append(f"{self.opted_out} opted out")
        if self.no_address:
            left.append(f"{self.no_address} without an address")
        if left:
            parts.append("users left out: " + ", ".join(left))
        if self.held_out:
            parts.append(f"{self.held_out} digest(s) held back for the e-mail study's hold-out")
        if self.raced:
            parts.append(f"{self.raced} digest(s) left to a concurrent run")
        if self.delivery is not None:
            parts.append(self.delivery.line())
        return "; ".join(parts)


def _asked() -> Any:
    """SQL: the job (jobs, with its users row outer-joined) asked for its e-mail."""
    from cocaq.db.schema import Job, User

    return or_(
        User.job_email.is_(True),
        func.lower(func.coalesce(Job.comment, "")).contains(NOTIFY_TOKEN, autoescape=True),
    )


def _wasted(cfg: Config) -> Any:
    """SQL: `cocaq.accounting.ledger.waste(state, energy, idle).total >= [reports] job_email_waste_kwh`
    (false at 0).

    The total is the whole energy of a job that failed, ran out of memory or was cancelled (its idle part
    plus the rest), else its idle GPU energy capped at its energy; so with a threshold t > 0 it reaches t
    exactly when the energy does and, for any other job, its idle GPU energy does too. A job that hit its
    time limit is no such job: that part is possibly lost (it may have saved a checkpoint), not wasted."""
    from cocaq.accounting.ledger import CERTAIN, states
    from cocaq.db.schema import Job, JobMetrics
    from cocaq.db.sqlfuncs import first_word

    kwh = cfg.reports.job_email_waste_kwh
    if kwh <= 0:
        return false()
    t = kwh * J_PER_KWH
    ended_badly = first_word(Job.state).in_(sorted(s for o in CERTAIN for s in states(o)))
    return and_(Job.energy_j >= t, or_(ended_badly, func.coalesce(JobMetrics.idle_gpu_energy_j, 0.0) >= t))


def _wanted_jobs(engine: Engine, cfg: Config, now: datetime) -> list[tuple[int, str, datetime, bool]]:
    """(job pk, user, end, asked) of the jobs that asked for an e-mail or wasted energy, ended within
    LOOKBACK, in no digest yet."""
    from cocaq.db.schema import Job, JobMetrics, JobNotice, User

    J, U, N, M = Job, User, JobNotice, JobMetrics
    asked = _asked()
    q = (
        select(J.id, J.user_name, J.end_time, asked)
        .select_from(J)
        .outerjoin(U, U.name == J.user_name)
        .outerjoin(M, M.job_pk == J.id)
        .where(
            J.end_time >= now - LOOKBACK,
            J.end_time <= now,
            J.is_open.is_(False),
            or_(asked, _wasted(cfg)),
            or_(U.opted_out.is_(None), U.opted_out.is_(False)),
            ~exists().where(N.job_pk == J.id),
        )
        .order_by(J.user_name, J.end_time, J.id)
    )
    with engine.connect() as conn:
        return [
            (int(pk), str(u), as_utc(end), bool(a)) for pk, u, end, a in conn.execute(q) if end is not None
        ]


def unasked_jobs(engine: Engine, pks: list[int]) -> set[int]:
    """Of these jobs, those that did not ask for their e-mail (they go for their wasted energy)."""
    from cocaq.db.schema import Job, User

    q = (
        select(Job.id)
        .select_from(Job)
        .outerjoin(User, User.name == Job.user_name)
        .where(Job.id.in_(pks), ~_asked())
    )
    with engine.connect() as conn:
        return {int(pk) for pk in conn.execute(q).scalars()}


def _open_digests(engine: Engine, now: datetime) -> list[tuple[str, datetime]]:
    """(user, digest_at) of the digests made within RETRY_FOR whose ledger row is not `sent`."""
    from cocaq.db.schema import JobNotice, SentReport

    N, S = JobNotice, SentReport
    sent = exists().where(
        S.kind == KIND,
        S.user_name == N.user_name,
        S.period_start == N.digest_at,
        S.status.in_(("sent", "skipped")),
    )
    q = (
        select(N.user_name, N.digest_at)
        .where(N.digest_at >= now - RETRY_FOR, ~sent)
        .group_by(N.user_name, N.digest_at)
        .order_by(N.digest_at, N.user_name)
    )
    with engine.connect() as conn:
        return [(str(u), as_utc(at)) for u, at in conn.execute(q)]


def _bind(engine: Engine, user: str, pks: list[int], now: datetime) -> datetime | None:
    """Bind the jobs to a new digest of `user` in one transaction; its key, or None if a run raced us."""
    from cocaq.db.schema import JobNotice as N

    try:
        with engine.begin() as conn:
            at = now
            while conn.execute(
                select(func.count()).where(N.user_name == user, N.digest_at == at)
            ).scalar_one():
                at += timedelta(microseconds=1)  # never the key of an earlier digest
            conn.execute(insert(N), [{"job_pk": pk, "user_name": user, "digest_at": at} for pk in pks])
            return at
    except IntegrityError:
        return None


def digest_jobs(engine: Engine, user: str, digest_at: datetime) -> list[int]:
    """The jobs bound to a digest, in the order they ended."""
    from cocaq.db.schema import Job, JobNotice

    q = (
        select(JobNotice.job_pk)
        .join(Job, Job.id == JobNotice.job_pk)
        .where(JobNotice.user_name == user, JobNotice.digest_at == digest_at)
        .order_by(Job.end_time, Job.id)
    )
    with engine.connect() as conn:
        return [int(pk) for pk in conn.execute(q).scalars()]


def send_job_mail(
    engine: Engine,
    cfg: Config,
    *,
    now: datetime | None = None,
    window: timedelta | None = None,
    transport: Transport | None = None,
    dry_run: bool = False,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> JobMailSummary:
    """Bind the users' due ready jobs into digests, then send every open digest (see the module doc).

    `now` is the time the run judges by (default: the clock); `window` overrides the digest window.
    `dry_run` binds and sends nothing and says what would go.
    """
    from cocaq.reports.job_report import job_footprint
    from cocaq.reports.recipients import AddressBook
    from cocaq.study.assign import hold_out, record_skips

    now = as_utc(now) if now is not None else clock()
    window = digest_window(cfg) if window is None else window
    s = JobMailSummary(dry_run=dry_run)
    wanted = _wanted_jobs(engine, cfg, now)
    s.considered = len(wanted)
    opened = _open_digests(engine, now)
    busy = {u for u, _ in opened}
    reports: dict[int, JobReport] = {}
    by_user: dict[str, list[tuple[int, datetime]]] = defaultdict(list)
    unasked = {pk for pk, _, _, a in wanted if not a}
    with engine.connect() as conn:
        for pk, user, end, _ in wanted:
            rep = job_footprint(conn, cfg, pk)
            if not ready(rep, now):
                s.not_ready += 1
                continue
            reports[pk] = rep
            by_user[user].append((pk, end))
    due: dict[str, list[int]] = {}
    for user, jobs in by_user.items():
        if user in busy:
            s.waiting_open += len(jobs)
        elif min(end for _, end in jobs) > now - window:
            s.in_window += len(jobs)
        else:
            due[user] = [pk for pk, _ in jobs[:MAX_JOBS_PER_DIGEST]]
    book = AddressBook.load(engine, cfg.mail, set(due) | busy)
    hold = None
    if due or opened:
        opted = [u for u in set(due) | busy if book.for_user(u).opted_out]
        hold = hold_out(engine, cfg, now, set(due) | busy, opted_out=opted, dry_run=dry_run)
    made: list[tuple[str, datetime]] = []
    for user, pks in sorted(due.items()):
        rcpt = book.for_user(user)
        if rcpt.address is None:
            s.no_address += 1
            log.warning("mail: job e-mail for %s not made: %s", user, rcpt.problem)
            continue
        if rcpt.opted_out:
            s.opted_out += 1
            continue
        if dry_run and hold is not None and user in hold:
            s.held_out += 1
            continue
        if dry_run:
            s.new_digests += 1
            s.new_jobs += len(pks)
            s.unasked_jobs += len(unasked.intersection(pks))
            continue
        at = _bind(engine, user, pks, now)
        if at is None:
            s.raced += 1
            continue
        s.new_digests += 1
        s.new_jobs += len(pks)
        s.unasked_jobs += len(unasked.intersection(pks))
        made.append((user, at))
    todo = opened + made
    if hold is not None:
        held = [(u, at) for u, at in todo if u in hold]
        todo = [(u, at) for u, at in todo if u not in hold]
        # Held back exactly where `deliver` would send it to the same user e-mailed (an open digest of a
        # user who has opted out or lost their address since it was made, or whose jobs were deleted,
        # goes to nobody), so that the ledger's first contact means the same in both arms.
        held = [(u, at) for u, at in held
                if book.for_user(u).deliverable and (dry_run or digest_jobs(engine, u, at))]  # fmt: skip
        s.held_out += len(held)
        if not dry_run:
            rows = [(KIND, str(book.for_user(u).address), u, at, at) for u, at in held]
            record_skips(engine, hold, rows, now)
    s.open_digests = len(todo) + (s.new_digests if dry_run else 0)
    if dry_run or not todo:
        if s.held_out:
            log.info("%s", s.line())
        return s

    def build() -> Iterator[Outgoing]:
        from cocaq.reports.deliver import Outgoing
        from cocaq.reports.render import render_jobs

        for user, at in todo:
            pks = digest_jobs(engine, user, at)
            if not pks:
                continue  # its jobs were deleted
            with engine.connect() as conn:
                reps = [reports.get(pk) or job_footprint(conn, cfg, pk) for pk in pks]
            r = render_jobs(reps, cfg, unasked=unasked_jobs(engine, pks))
            yield Outgoing.of(KIND, at, at, r, user=user)

    from cocaq.reports.deliver import deliver

    s.delivery = deliver(engine, cfg, build(), transport=transport)
    log.info("%s", s.line())
    return s
