"""Alerts while a job runs: a user whose running job holds GPUs that do nothing hears it while it runs.

Which running jobs idle, and what an alert about one says, is `reports.idle_jobs`; its wording is
`reports.render`. This module decides who gets an alert and sends each exactly once:

Who gets what: at most one idle alert per job, ever (`job_alerts`, primary key (job, kind)); at most
one alert per user in `[alerts] throttle_hours` (the user's job with the most idle GPU time goes first,
the others wait; they go when the throttle allows, if they still idle); never to opted-out users
(`users.opted_out`, `[mail] opt_out_file`); none at all with `[alerts] idle_gpu = false`. While an
e-mail study runs (`[study]`, cocaq.study.assign), users in its hold-out arm get none: their alerts are
bound as usual (one per job, within the throttle) and recorded as `skipped` in the ledger with the reason
instead of being sent.

Exactly once, in two committed steps, as job e-mails (reports/jobmail.py):

1. Bind: the alert is written to `job_alerts` with its key `alerted_at` (the run's time) and what it says
   (`detail`), in one transaction that also checks the throttle (on PostgreSQL under a per-user advisory
   lock, on SQLite under the database's write lock, taken by the insert). A run that races another for
   the same job fails on the primary key and leaves the alert to the other; one that races it for
   another job of the same user finds the other's alert within the throttle and rolls back.
2. Send: through `deliver` as kind "idle-gpu" with period_start = `alerted_at`: the ledger
   (`sent_reports`) makes it go once. An alert not sent yet (crash, server down, daily throttle) is
   sent again by the next runs while its job still runs, for `RETRY_FOR`; the runs of the first
   `LEAVE_TO_BINDER` after its binding leave it to the run that bound it, which may be sending it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Engine,
    exists,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError

from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import Cluster, Job, JobAlert, SentReport
from cocaq.errors import UsageError
from cocaq.reports.idle_jobs import KIND, Candidate, IdleAlert, describe, find_idle
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

if TYPE_CHECKING:
    from cocaq.reports.deliver import DeliverySummary, Outgoing
    from cocaq.reports.transport import Transport

log = logging.getLogger("cocaq.reports")

RETRY_FOR = timedelta(hours=12)  # an unsent alert is tried again this long, while its job runs
# An unsent alert younger than this is left to the run that bound it (which may be sending it now): one
# taken up meanwhile would look in doubt and be sent twice ([mail] in_doubt = "resend").
LEAVE_TO_BINDER = timedelta(minutes=4)
_RACED, _THROTTLED = "raced", "throttled"


def _alert_from_row(row: Any, detail: dict[str, Any], cfg: Config) -> IdleAlert:
    """An alert as bound: its job's row and the detail stored with it."""
    return IdleAlert(
        pk=int(row.id),
        job_id=str(row.job_id),
        name=row.name,
        user=str(row.user_name),
        cluster=str(row.cluster),
        partition=row.partition,
        account=row.account,
        gpus=int(detail.get("gpus") or row.alloc_gpus or 0),
        devices=tuple((str(n), str(d)) for n, d in detail.get("devices", [])),
        start=as_utc(datetime.fromisoformat(detail["start"])),
        last=as_utc(datetime.fromisoformat(detail["last"])),
        at_least=bool(detail.get("at_least")),
        from_job_start=bool(detail.get("from_job_start")),
        energy_kwh=float(detail.get("energy_j") or 0.0) / J_PER_KWH,
        co2_kg=float(detail["co2_g"]) / G_PER_KG if detail.get("co2_g") is not None else None,
        threshold_pct=float(detail.get("threshold_pct", cfg.aggregate.idle_gpu_util_pct)),
        interactive=bool(detail.get("interactive")),
        job_start=as_utc(row.start_time),
        time_limit_h=float(row.time_limit_s) / S_PER_HOUR if row.time_limit_s else None,
        alerted_at=as_utc(row.alerted_at),
    )


def bound_alert(engine: Engine, cfg: Config, job_pk: int) -> IdleAlert | None:
    """The idle alert bound to a job, as it will be (or was) sent; None if there is none."""
    A, J = JobAlert, Job
    q = (
        select(
            J.id,
            J.job_id,
            J.name,
            J.user_name,
            Cluster.name.label("cluster"),
            J.partition,
            J.account,
            J.alloc_gpus,
            J.start_time,
            J.time_limit_s,
            A.alerted_at,
            A.detail,
        )
        .join(J, J.id == A.job_pk)
        .join(Cluster, Cluster.id == J.cluster_id)
        .where(A.job_pk == job_pk, A.kind == KIND)
    )
    with engine.connect() as conn:
        row = conn.execute(q).first()
    if row is None or not row.detail:
        return None
    return _alert_from_row(row, dict(row.detail), cfg)


# --- the run -------------------------------------------------------------------------------------------


@dataclass
class AlertSummary:
    """What one pass did; `line()` for the scheduler's run log and the CLI."""

    enabled: bool = True
    dry_run: bool = False
    cluster: str | None = None
    idle_jobs: int = 0  # running jobs found idle long enough, not alerted on yet
    new: int = 0  # alerts bound this run (dry run: that would be)
    open: int = 0  # alerts handed to deliver (new ones and earlier unsent ones)
    throttled: int = 0  # idle jobs waiting: their user had an alert within throttle_hours
    opted_out: int = 0  # idle jobs of opted-out users
    no_address: int = 0  # idle jobs of users without an address
    raced: int = 0  # left to a concurrent run that bound them (or another alert of their user) first
    held_out: int = 0  # alerts not sent: their user is in the study's hold-out arm (recorded `skipped`)
    alerts: list[IdleAlert] = field(default_factory=list)  # the new ones
    delivery: DeliverySummary | None = None

    @property
    def status(self) -> str:
        if not self.enabled:
            return "skipped"
        return "error" if self.delivery is not None and self.delivery.stopped else "ok"

    def line(self) -> str:
        where = f" -M {self.cluster}" if self.cluster else ""
        if not self.enabled:
            return "idle-GPU alerts are off ([alerts] idle_gpu = false)"
        if self.dry_run:
            head = (
                f"idle-GPU alerts{where} (dry run): {self.new} new alert(s) and "
                f"{self.open} earlier unsent alert(s) would go"
            )
        else:
            head = f"idle-GPU alerts{where}: {self.new} new, {self.open} to send"
        parts = [head, f"{self.idle_jobs} idle job(s) found"]
        left = []
        if self.throttled:
            left.append(f"{self.throttled} throttled (one alert per user per throttle_hours)")
        if self.opted_out:
            left.append(f"{self.opted_out} of opted-out users")
        if self.no_address:
            left.append(f"{self.no_address} of users without an address")
        if self.raced:
            left.append(f"{self.raced} left to a concurrent run")
        if self.held_out:
            left.append(f"{self.held_out} held back for the e-mail study's hold-out")
        if left:
            parts.append("not alerted: " + ", ".join(left))
        if self.delivery is not None:
            parts.append(self.delivery.line())
        return "; ".join(parts)

    def lines(self) -> list[str]:
        """Each new alert (what it says), then the summary line."""
        verb = "would alert" if self.dry_run else "alert"
        return [f"{verb} {a.line()}" for a in self.alerts] + [self.line()]


def _cluster_id(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        cid = conn.execute(select(Cluster.id).where(Cluster.name == name)).scalar()
    if cid is None:
        raise UsageError(f"no cluster named {name!r} in the database")
    return int(cid)


def _open_alerts(engine: Engine, now: datetime, cluster_id: int | None) -> list[tuple[int, str, datetime]]:
    """(job, user, alerted_at) of the alerts bound within RETRY_FOR (and not in the last
    LEAVE_TO_BINDER), not sent, whose job still runs."""
    A, J, S = JobAlert, Job, SentReport
    sent = exists().where(
        S.kind == KIND,
        S.user_name == A.user_name,
        S.period_start == A.alerted_at,
        S.status.in_(("sent", "skipped")),
    )
    q = (
        select(A.job_pk, A.user_name, A.alerted_at)
        .join(J, J.id == A.job_pk)
        .where(
            A.kind == KIND,
            A.alerted_at >= now - RETRY_FOR,
            A.alerted_at <= now - LEAVE_TO_BINDER,
            J.is_open.is_(True),
            ~sent,
        )
        .order_by(A.alerted_at, A.job_pk)
    )
    if cluster_id is not None:
        q = q.where(J.cluster_id == cluster_id)
    with engine.connect() as conn:
        return [(int(pk), str(u), as_utc(at)) for pk, u, at in conn.execute(q)]


def _recently_alerted(engine: Engine, users: Sequence[str], after: datetime) -> set[str]:
    """The users with an alert (of any kind) bound after `after`."""
    out: set[str] = set()
    names = sorted(set(users))
    with engine.connect() as conn:
        for i in range(0, len(names), 500):
            q = (
                select(JobAlert.user_name)
                .where(JobAlert.user_name.in_(names[i : i + 500]), JobAlert.alerted_at > after)
                .distinct()
            )
            out.update(str(u) for u in conn.execute(q).scalars())
    return out


def _user_lock_key(user: str) -> int:
    """A signed 64-bit advisory lock key for a user's alerts (PostgreSQL)."""
    digest = hashlib.blake2b(f"cocaq-alerts:{user}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _Throttled(Exception):
    pass


def _bind(engine: Engine, alert: IdleAlert, now: datetime, throttle: timedelta) -> datetime | str:
    """Write the alert to job_alerts in one transaction; its key, or _RACED / _THROTTLED (rolled back).

    The insert comes first: on SQLite it takes the write lock, so what the checks read after it is
    current; on PostgreSQL a per-user advisory lock, held to the commit, orders the runs.
    """
    A = JobAlert
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _user_lock_key(alert.user)})
            at = now
            conn.execute(
                insert(A).values(
                    job_pk=alert.pk, kind=KIND, user_name=alert.user, alerted_at=at, detail=alert.detail()
                )
            )
            # Never the key of another alert of this user: the ledger would take the two for one message.
            while conn.execute(
                select(func.count()).where(
                    A.user_name == alert.user, A.kind == KIND, A.alerted_at == at, A.job_pk != alert.pk
                )
            ).scalar_one():
                at += timedelta(microseconds=1)
                conn.execute(update(A).where(A.job_pk == alert.pk, A.kind == KIND).values(alerted_at=at))
            if throttle > timedelta(0):
                others = conn.execute(
                    select(func.count()).where(
                        A.user_name == alert.user, A.job_pk != alert.pk, A.alerted_at > at - throttle
                    )
                ).scalar_one()
                if others:
                    raise _Throttled
            return at
    except IntegrityError:
        return _RACED
    except _Throttled:
        return _THROTTLED


def send_idle_alerts(
    engine: Engine,
    cfg: Config,
    *,
    now: datetime | None = None,
    cluster: str | None = None,
    transport: Transport | None = None,
    dry_run: bool = False,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> AlertSummary:
    """One pass: find running jobs whose GPUs all idle, bind an alert for each (within the throttle and
    opt-outs), then send every unsent alert (see the module doc).

    `now` is the time the pass judges by (default: the clock); `cluster` limits it to one cluster's jobs;
    `dry_run` binds and sends nothing and says what would go.
    """
    from cocaq.reports.recipients import AddressBook
    from cocaq.study.assign import hold_out, record_skips

    now = as_utc(now) if now is not None else clock()
    s = AlertSummary(dry_run=dry_run, cluster=cluster)
    if not cfg.alerts.idle_gpu:
        s.enabled = False
        return s
    cid = _cluster_id(engine, cluster) if cluster is not None else None
    opened = _open_alerts(engine, now, cid)
    with engine.connect() as conn:
        found = find_idle(conn, cfg, now, cluster_id=cid)
    s.idle_jobs = len(found)
    by_user: dict[str, list[Candidate]] = defaultdict(list)
    for c in found:
        by_user[c.user].append(c)
    throttle = timedelta(hours=cfg.alerts.throttle_hours)
    recent = _recently_alerted(engine, list(by_user), now - throttle) if throttle > timedelta(0) else set()
    whom = set(by_user) | {u for _, u, _ in opened}
    book = AddressBook.load(engine, cfg.mail, whom)
    hold = None
    if whom:
        opted = [u for u in whom if book.for_user(u).opted_out]
        hold = hold_out(engine, cfg, now, whom, opted_out=opted, dry_run=dry_run)
    chosen: list[Candidate] = []
    for user, cands in sorted(by_user.items()):
        rcpt = book.for_user(user)
        if rcpt.address is None:
            s.no_address += len(cands)
            log.warning("mail: idle-GPU alert for %s not made: %s", user, rcpt.problem)
            continue
        if rcpt.opted_out:
            s.opted_out += len(cands)
            continue
        if throttle > timedelta(0):
            if user in recent:
                s.throttled += len(cands)
                continue
            cands = sorted(cands, key=lambda c: (-c.gpu_idle_s, c.pk))
            s.throttled += len(cands) - 1
            cands = cands[:1]
        chosen.extend(cands)
    made: list[tuple[int, str, datetime]] = []
    for c in chosen:
        alert = describe(engine, cfg, c, now)
        if dry_run and hold is not None and c.user in hold:
            s.held_out += 1
            continue
        if dry_run:
            s.new += 1
            s.alerts.append(alert)
            continue
        at = _bind(engine, alert, now, throttle)
        if at == _RACED:
            s.raced += 1
            continue
        if at == _THROTTLED:
            s.raced += 1  # another run alerted this user meanwhile
            continue
        assert isinstance(at, datetime)
        s.new += 1
        s.alerts.append(_with_key(alert, at))
        made.append((c.pk, c.user, at))
    todo = opened + made
    if hold is not None:
        held = [(pk, u, at) for pk, u, at in todo if u in hold]
        todo = [(pk, u, at) for pk, u, at in todo if u not in hold]
        # Held back exactly where `deliver` would send it to the same user e-mailed (an open alert of a
        # user who has opted out or lost their address since it was bound, or whose job was deleted,
        # goes to nobody), so that the ledger's first contact means the same in both arms.
        held = [(pk, u, at) for pk, u, at in held if book.for_user(u).deliverable
                and (dry_run or bound_alert(engine, cfg, pk) is not None)]  # fmt: skip
        s.held_out += len(held)
        if not dry_run:
            rows = [(KIND, str(book.for_user(u).address), u, at, at) for _, u, at in held]
            record_skips(engine, hold, rows, now)
    s.open = len(todo)
    if dry_run or not todo:
        log.info("%s", s.line())
        return s

    def build() -> Iterator[Outgoing]:
        from cocaq.reports.deliver import Outgoing
        from cocaq.reports.render import render_idle_alert

        for pk, user, at in todo:
            a = bound_alert(engine, cfg, pk)
            if a is None:
                continue  # its job was deleted
            yield Outgoing.of(KIND, at, at, render_idle_alert(a, cfg), user=user)

    from cocaq.reports.deliver import deliver

    s.delivery = deliver(engine, cfg, build(), transport=transport)
    log.info("%s", s.line())
    return s


def _with_key(a: IdleAlert, at: datetime) -> IdleAlert:
    return replace(a, alerted_at=at)
