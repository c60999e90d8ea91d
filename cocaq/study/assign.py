"""Who is in which arm of the e-mail study, drawn once and kept (`study_arms`), and who is held out now.

The draw, documented so that anyone can redo it:

* The seed: `[study] seed` where the config gives one (the study is then "START/seed N", and anyone who
  knows the seed can redo the draw); else 128 random bits (`secrets`) picked by the study's first draw
  and kept in `study_seeds` (the study is then "START"), so that the draw cannot be computed from the
  config or the code, and joiners and the report use the same. It is shown to admins only. A study
  drawn before seeds were random, with the old default seed 1 ("START/seed 1"), keeps it.
* Each user's number is `draw(seed, user)`: the first 8 bytes of SHA-256 of the UTF-8 text
  f"{seed}:{user}", as a big-endian integer, shifted right by 11 bits and divided by 2**53: uniform in
  [0, 1), the same on every machine and Python version (no `random`, no hash randomisation).
* The baseline is the `[study] baseline_months` whole UTC months before the start month S. Its users are
  those with a job in it; their GPU-hours there (daily_rollups; from the jobs themselves where the
  aggregator has rolled up none of those days) put them in a stratum: 0 for none, 1 to 4 for the
  quartiles of those with some (ranked by GPU-hours, ties by name), so that heavy users are balanced.
* Within each stratum (0 to 4 in turn), users sorted by their number: the first k are hold-out, the rest
  e-mailed, where k = R(share x (users so far, this stratum included)) - R(share x (users before it)) and
  R rounds half up. So the hold-out count of a stratum is within one of share x its users, and the total
  is exactly R(share x all).
* Everyone first seen after that (a user with no job in the baseline, found with a job since S or about
  to be sent an e-mail) is a joiner: stratum -1, hold-out iff their number < share.

When: the draw is made when the study's start month has begun and a sender (monthly, job or alert
e-mail) or `cocaq study assign` first runs, so that the baseline is complete; `cocaq study assign` may
also make it earlier, from the baseline so far (users who first run a job after that are joiners).
A row, once written, never changes while the study runs (a re-run, or a changed `holdout_share`, only
adds users not drawn yet); rows of another study (another start month or seed) are left alone. A user
who opted out of the e-mails (`users.opted_out`, or the `[mail] opt_out_file` as the senders see it)
keeps their arm; `opted_out_at` records when that was first seen.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, exists, func, or_, select, update

from cocaq.config import STUDY_ARMS, Config, Study
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import DailyRollup, Job, SentReport, StudyArm, StudySeed, User
from cocaq.errors import UsageError
from cocaq.units import G_PER_KG, S_PER_HOUR

EMAILED, HOLDOUT = STUDY_ARMS
JOINER = -1  # the stratum of users first seen after the draw
QUARTILES = 4
NO_STUDY = "no study configured: set [study] start"
_CHUNK = 500  # names per IN (...) list
SEED_BITS = 128  # a random seed: too many to try them all against the arms users can tell they are in
LEGACY_SEED = 1  # what an unset [study] seed meant before seeds were random


def draw(seed: int, user: str) -> float:
    """The user's uniform number in [0, 1) for this seed (see the module doc: stable everywhere)."""
    digest = hashlib.sha256(f"{seed}:{user}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / 2**53


def _round(x: float) -> int:
    """Half up (Python's round() goes to even, which the documented rule does not)."""
    return math.floor(x + 0.5)


# --- the study's months ------------------------------------------------------------------------------------


def month_start(label: str, add: int = 0) -> datetime:
    """The first instant (UTC) of `YYYY-MM`, `add` months on."""
    y, m = (int(x) for x in label.split("-"))
    n = y * 12 + (m - 1) + add
    return datetime(n // 12, n % 12 + 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class StudyId:
    """The configured study as the database knows it: its key in study_arms and its seed."""

    key: str
    seed: int | None  # None: random, and not drawn yet (the first draw picks it)
    random: bool  # picked at random and kept in study_seeds (shown to admins only), not the config's


def study_id(conn: Connection, study: Study) -> StudyId:
    """The config's seed; else the random one kept with the study; else, for a study drawn with the old
    default seed, that; else a random one to be picked by the first draw (module doc)."""
    if study.start is None:
        raise UsageError(NO_STUDY)
    if study.seed is not None:
        return StudyId(f"{study.start}/seed {study.seed}", study.seed, False)
    kept = conn.execute(select(StudySeed.seed).where(StudySeed.study == study.start)).scalar()
    if kept is not None:
        return StudyId(study.start, int(kept), True)
    legacy = f"{study.start}/seed {LEGACY_SEED}"
    if conn.execute(select(exists().where(StudyArm.study == legacy))).scalar():
        return StudyId(legacy, LEGACY_SEED, False)
    return StudyId(study.start, None, True)


def _pick_seed(conn: Connection, sid: StudyId, now: datetime) -> StudyId:
    """The study's random seed, picked and kept now unless a concurrent first draw kept one first."""
    row = {"study": sid.key, "seed": str(secrets.randbits(SEED_BITS)), "drawn_at": now}
    _insert_ignore(conn, StudySeed.__table__, [row])
    kept = conn.execute(select(StudySeed.seed).where(StudySeed.study == sid.key)).scalar_one()
    return StudyId(sid.key, int(kept), True)


@dataclass(frozen=True)
class Window:
    """The study's instants: baseline [baseline_start, start), study [start, end) (end None: open)."""

    baseline_start: datetime
    start: datetime
    end: datetime | None

    def running(self, now: datetime) -> bool:
        return self.start <= now and (self.end is None or now < self.end)


def window(study: Study) -> Window:
    if study.start is None:
        raise UsageError(NO_STUDY)
    return Window(
        month_start(study.start, -study.baseline_months),
        month_start(study.start),
        month_start(study.end, 1) if study.end is not None else None,
    )


def running(study: Study, now: datetime) -> bool:
    """Whether the study holds e-mails back at `now`: from its start month to its end month inclusive."""
    return study.start is not None and window(study).running(as_utc(now))


# --- the baseline ------------------------------------------------------------------------------------------


def _chunks(names: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(names), _CHUNK):
        yield names[i : i + _CHUNK]


def baseline_hours(
    conn: Connection, lo: datetime, hi: datetime, users: Sequence[str] | None = None
) -> dict[str, float]:
    """user -> GPU-hours in [lo, hi) of every user with a job there (or of `users` only, those with one).

    From daily_rollups (whole UTC days, as the reports read them); where the aggregator has rolled up
    none of those days, from the jobs with the same window share (cocaq.accounting.window)."""
    R = DailyRollup
    in_window = (R.day >= lo, R.day < hi)
    if conn.execute(select(exists().where(*in_window))).scalar():
        q = select(R.user_name, func.sum(R.gpu_hours)).where(*in_window, R.jobs > 0).group_by(R.user_name)
        out: dict[str, float] = {}
        for part in _chunks(sorted(users)) if users is not None else [None]:
            qq = q if part is None else q.where(R.user_name.in_(part))
            out.update({str(u): float(h or 0.0) for u, h in conn.execute(qq)})
        return out
    return _jobs_hours(conn, lo, hi, users)


def _jobs_hours(
    conn: Connection, lo: datetime, hi: datetime, users: Sequence[str] | None
) -> dict[str, float]:
    from cocaq.accounting.window import overlap, share

    J = Job
    q = select(J.user_name, J.start_time, J.elapsed_s, J.alloc_gpus).where(
        J.start_time.is_not(None), J.start_time < hi, or_(J.end_time >= lo, J.end_time.is_(None))
    )
    lo_s, hi_s = lo.timestamp(), hi.timestamp()
    out: dict[str, float] = {}
    for part in _chunks(sorted(users)) if users is not None else [None]:
        qq = q if part is None else q.where(J.user_name.in_(part))
        for u, t0, el, gpus in conn.execute(qq):
            if t0 is None:
                continue
            t = as_utc(t0).timestamp()
            e = max(float(el or 0.0), 0.0)
            if share(t, e, lo_s, hi_s) > 0:
                out[str(u)] = out.get(str(u), 0.0) + (gpus or 0) * overlap(t, e, lo_s, hi_s) / S_PER_HOUR
    return out


def strata(hours: Mapping[str, float]) -> dict[str, int]:
    """0 for no GPU-hours, else 1 to 4: the quartile of the user's rank among those with some."""
    out = {u: 0 for u, h in hours.items() if h <= 0}
    ranked = sorted((h, u) for u, h in hours.items() if h > 0)
    for i, (_, u) in enumerate(ranked):
        out[u] = 1 + QUARTILES * i // len(ranked)
    return out


def block_size(share: float) -> int:
    """Users per block of the draw: one held out per block at the configured share (5 at 0.2)."""
    return max(2, _round(1.0 / share))


def blocks(stratum: Mapping[str, int], co2: Mapping[str, float], share: float) -> dict[str, int]:
    """Each user's block within their stratum: the stratum's users ranked by baseline CO2, heaviest first
    (ties by name), cut into runs of block_size(share). A few heavy users make most of the per-user CO2's
    swings from month to month; blocked, each run of them puts its share into the hold-out, and chance
    cannot put two of the heaviest into an arm of 30 (docs/study.md, The draw)."""
    size = block_size(share)
    out: dict[str, int] = {}
    for s in sorted(set(stratum.values())):
        members = sorted((u for u, v in stratum.items() if v == s), key=lambda u: (-co2.get(u, 0.0), u))
        for i, u in enumerate(members):
            out[u] = i // size
    return out


def split(
    stratum: Mapping[str, int], seed: int, share: float, block: Mapping[str, int] | None = None
) -> dict[str, str]:
    """Each user's arm: within each stratum (and each block of it, where `block` gives one) the lowest
    draws are hold-out, the rounding carried across strata and blocks so that the total is R(share x N)
    (module doc)."""
    arms: dict[str, str] = {}
    before = 0
    cells = sorted({(v, block.get(u, 0) if block is not None else 0) for u, v in stratum.items()})
    for cell in cells:
        members = sorted(
            (u for u, v in stratum.items() if (v, block.get(u, 0) if block is not None else 0) == cell),
            key=lambda u: (draw(seed, u), u),
        )
        k = _round(share * (before + len(members))) - _round(share * before)
        before += len(members)
        for i, u in enumerate(members):
            arms[u] = HOLDOUT if i < k else EMAILED
    return arms


def baseline_co2(conn: Connection, lo: datetime, hi: datetime) -> dict[str, float]:
    """user -> kg of CO2 in [lo, hi) from daily_rollups (empty where the aggregator rolled up none)."""
    R = DailyRollup
    q = select(R.user_name, func.sum(R.co2_g)).where(R.day >= lo, R.day < hi).group_by(R.user_name)
    return {str(u): float(g or 0.0) / G_PER_KG for u, g in conn.execute(q)}


# --- the draw ----------------------------------------------------------------------------------------------


@dataclass
class AssignSummary:
    """What `assign` added: (arm, stratum) -> users, and whether it made the study's first draw."""

    key: str
    first_draw: bool = False
    random_seed: bool = False  # the study's seed is a random one (study_seeds), not the config's
    drawn: Counter[tuple[str, int]] = field(default_factory=Counter)
    already: int = 0  # users found drawn before
    opted_out: int = 0  # users found opted out for the first time

    @property
    def added(self) -> int:
        return sum(self.drawn.values())

    def line(self) -> str:
        by_arm = Counter[str]()
        for (arm, _), n in self.drawn.items():
            by_arm[arm] += n
        what = "drew" if self.first_draw else "added"
        text = (
            f"study {self.key}: {what} {self.added} user(s) ({by_arm[HOLDOUT]} hold-out, "
            f"{by_arm[EMAILED]} e-mailed), {self.already} drawn before"
        )
        if self.opted_out:
            text += f", {self.opted_out} found opted out"
        return text


def _insert_ignore(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> list[Any]:
    """Insert the rows, leaving any whose key is there (a concurrent run drew it: the same row); the
    primary keys of those that went in."""
    if not rows:
        return []
    from sqlalchemy.dialects import postgresql, sqlite

    dialect: Any = postgresql if conn.dialect.name == "postgresql" else sqlite
    # RETURNING says what went in (an executemany's rowcount is not reliable on every driver)
    stmt = dialect.insert(table).on_conflict_do_nothing().returning(*table.primary_key.columns)
    return [r for i in range(0, len(rows), _CHUNK) for r in conn.execute(stmt, rows[i : i + _CHUNK]).all()]


def _users_since(conn: Connection, start: datetime) -> list[str]:
    """Users with a job submitted, running or ended since `start`."""
    J = Job
    q = select(J.user_name).where(or_(J.end_time >= start, J.end_time.is_(None), J.submit_time >= start))
    return sorted({str(u) for u in conn.execute(q.distinct()).scalars() if u})


def _drawn(conn: Connection, key: str, names: Sequence[str]) -> set[str]:
    out: set[str] = set()
    for part in _chunks(names):
        q = select(StudyArm.user_name).where(StudyArm.study == key, StudyArm.user_name.in_(part))
        out.update(conn.execute(q).scalars())
    return out


def assign(
    conn: Connection,
    cfg: Config,
    now: datetime,
    *,
    users: Iterable[str] | None = None,
    opted_out: Iterable[str] = (),
) -> AssignSummary:
    """Draw the study's users not drawn yet (the whole baseline, the first time) and note opt-outs.

    `users`: the users about to be e-mailed (a sender's); None: everyone with a job since the start
    month. `opted_out`: users a sender found opted out (the opt-out file; `users.opted_out` is read
    here). Idempotent; the caller commits.
    """
    study = cfg.study
    w = window(study)
    sid = study_id(conn, study)
    if sid.seed is None:
        sid = _pick_seed(conn, sid, now)
    assert sid.seed is not None
    key, seed, share = sid.key, sid.seed, study.holdout_share
    s = AssignSummary(key, random_seed=sid.random)
    rows: list[dict[str, Any]] = []

    def row(user: str, arm: str, stratum: int, hours: float, block: int | None = None) -> dict[str, Any]:
        return {"study": key, "user_name": user, "arm": arm, "stratum": stratum, "block": block,
                "gpu_hours_before": hours, "draw": draw(seed, user), "assigned_at": now}  # fmt: skip

    taken: set[str] = set()
    if not conn.execute(select(exists().where(StudyArm.study == key))).scalar():
        s.first_draw = True
        hours = baseline_hours(conn, w.baseline_start, w.start)
        stratum = strata(hours)
        co2 = baseline_co2(conn, w.baseline_start, w.start) or hours  # (no rollups: GPU-hours rank them)
        block = blocks(stratum, co2, share)
        arms = split(stratum, seed, share, block)
        rows += [row(u, arms[u], stratum[u], hours[u], block[u]) for u in sorted(hours)]
        taken = set(hours)
    seen = sorted({u for u in (users if users is not None else _users_since(conn, w.start)) if u} - taken)
    drawn = _drawn(conn, key, seen)
    s.already = len(drawn) if not s.first_draw else 0
    joiners = [u for u in seen if u not in drawn]
    if joiners:
        hours = baseline_hours(conn, w.baseline_start, w.start, joiners)
        for u in joiners:
            rows.append(row(u, HOLDOUT if draw(seed, u) < share else EMAILED, JOINER, hours.get(u, 0.0)))
    added = {str(u) for _, u in _insert_ignore(conn, StudyArm.__table__, rows)}
    s.drawn.update((r["arm"], r["stratum"]) for r in rows if r["user_name"] in added)
    s.already += len(rows) - len(added)  # a concurrent run drew them first
    s.opted_out = note_opted_out(conn, key, now, opted_out)
    keep_protocol(conn, key, cfg.study, now)
    return s


@dataclass(frozen=True)
class Protocol:
    """What a study is judged by, as kept at its first draw (study_protocols)."""

    primary: str
    declared_at: datetime | None  # None: not kept (the config's choice is used)
    configured: str  # `[study] primary` now
    drawn_at: datetime | None = None  # the study's first draw

    def words(self) -> str:
        """How the primary outcome was declared, for the report."""
        if self.declared_at is None:
            return "named by [study] primary, not yet kept with the study: its next draw keeps it"
        when = f"{self.declared_at:%Y-%m-%d}"
        if self.drawn_at is None or self.declared_at <= self.drawn_at + timedelta(minutes=1):
            said = f"declared at the study's first draw, {when}, before any of its e-mails"
        else:
            drawn = f"{self.drawn_at:%Y-%m-%d}"
            said = f"kept with the study on {when}, after its first draw on {drawn} (an older cocaq)"
        if self.configured != self.primary:
            said += (
                f"; the config now names {self.configured}, which the study does not take: a primary outcome "
                "chosen once results can be seen is no longer pre-declared"
            )
        return said


def keep_protocol(conn: Connection, key: str, study: Study, now: datetime) -> None:
    """Keep the study's primary outcome with it, once: at its first draw, or for a study drawn before
    protocols were kept, at the first draw or e-mail run since (dated then)."""
    from cocaq.db.schema import StudyProtocol

    row = {"study": key, "primary_outcome": study.primary, "declared_at": as_utc(now)}
    _insert_ignore(conn, StudyProtocol.__table__, [row])


def protocol(conn: Connection, study: Study, key: str) -> Protocol:
    from cocaq.db.schema import StudyProtocol

    P = StudyProtocol
    row = conn.execute(select(P.primary_outcome, P.declared_at).where(P.study == key)).first()
    first = conn.execute(select(func.min(StudyArm.assigned_at)).where(StudyArm.study == key)).scalar()
    drawn = as_utc(first) if first is not None else None
    if row is None:
        return Protocol(study.primary, None, study.primary, drawn)
    return Protocol(str(row[0]), as_utc(row[1]), study.primary, drawn)


def note_opted_out(conn: Connection, key: str, now: datetime, users: Iterable[str] = ()) -> int:
    """Set `opted_out_at` of the study's users opted out (users.opted_out, or `users`) where unset."""
    A = StudyArm
    base = update(A).where(A.study == key, A.opted_out_at.is_(None)).values(opted_out_at=now)
    flagged = select(User.name).where(User.opted_out.is_(True))
    n = conn.execute(base.where(A.user_name.in_(flagged))).rowcount or 0
    for part in _chunks(sorted(set(users))):
        n += conn.execute(base.where(A.user_name.in_(part))).rowcount or 0
    return n


# --- the senders' side -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HoldOut:
    """The users a sender must not e-mail now, and the reason its ledger records for them."""

    key: str
    users: frozenset[str]

    @property
    def reason(self) -> str:
        return hold_out_reason(self.key)

    def __contains__(self, user: object) -> bool:
        return user in self.users


def hold_out(
    engine: Engine,
    cfg: Config,
    now: datetime,
    users: Iterable[str],
    *,
    opted_out: Iterable[str] = (),
    dry_run: bool = False,
    judged_at: datetime | None = None,
) -> HoldOut | None:
    """None when no study runs at `judged_at` (default `now`); else, after drawing those of `users` not
    drawn yet (so that no e-mail goes to a user before their draw), the hold-out among them. A dry run
    draws and forgets."""
    if not running(cfg.study, judged_at if judged_at is not None else now):
        return None
    names = sorted(set(users))
    with engine.connect() as conn:
        key = assign(conn, cfg, as_utc(now), users=names, opted_out=opted_out).key
        held: set[str] = set()
        for part in _chunks(names):
            q = select(StudyArm.user_name).where(
                StudyArm.study == key, StudyArm.arm == HOLDOUT, StudyArm.user_name.in_(part)
            )
            held.update(conn.execute(q).scalars())
        if dry_run:
            conn.rollback()
        else:
            conn.commit()
    return HoldOut(key, frozenset(held))


def record_skips(
    engine: Engine,
    hold: HoldOut,
    items: Iterable[tuple[str, str, str, datetime, datetime]],
    now: datetime,
) -> int:
    """Record each e-mail held back, (kind, address, user, period_start, period_end), as a `skipped`
    sent_reports row with the reason in `error`; a row already there is left as it is. How many new."""
    rows = [
        {"kind": k, "recipient": a, "user_name": u, "period_start": p0, "period_end": p1, "sent_at": now,
         "status": "skipped", "error": hold.reason, "message_id": None}
        for k, a, u, p0, p1 in items
    ]  # fmt: skip
    with engine.begin() as conn:
        return len(_insert_ignore(conn, SentReport.__table__, rows))


def hold_out_reason(key: str) -> str:
    """What the ledger records for an e-mail held back from a hold-out user of study `key`."""
    return f"study hold-out ({key})"


def first_contacts(conn: Connection, study: Study, key: str) -> dict[str, datetime]:
    """user -> when the study first reached them: an e-mailed user's first study e-mail delivered
    (`sent_reports` sent), a held-out user's first e-mail held back (`skipped`, the hold-out's reason).

    Both are the moment cocaq had an e-mail for the user while the study ran, which is set by what the
    user did before any e-mail of the study could act on them (a month with jobs, a job asked about, a
    job found idle), so it is the same in either arm and the arms stay comparable from it. A study
    e-mail is one a hold-out user would have been denied: sent while the study ran, or a monthly report
    judged when its month ended, if that is later (cocaq.reports.batch). Users never reached have no
    entry (no job since the start, no address, opted out before any e-mail)."""
    w = window(study)
    S, A = SentReport, StudyArm
    judged = or_(S.sent_at >= w.start, and_(S.kind.like("user-monthly%"), S.period_end >= w.start))
    sent = and_(A.arm == EMAILED, S.status == "sent", judged)
    if w.end is not None:
        sent = and_(sent, S.sent_at < w.end)
    held = and_(A.arm == HOLDOUT, S.status == "skipped", S.error == hold_out_reason(key))
    q = (
        select(S.user_name, func.min(S.sent_at))
        .join(A, and_(A.user_name == S.user_name, A.study == key))
        .where(S.sent_at.is_not(None), or_(sent, held))
        .group_by(S.user_name)
    )
    return {str(u): as_utc(t) for u, t in conn.execute(q) if t is not None}


# --- what `cocaq study status` shows -----------------------------------------------------------------------


@dataclass
class StudyStatus:
    key: str
    start: str
    end: str | None
    baseline_months: int
    holdout_share: float
    seed: int | None  # None: random and not drawn yet
    random: bool  # the seed was picked at random: shown to admins only (as_dict(seed=False) leaves it out)
    running: bool
    drawn_at: datetime | None
    arms: dict[str, dict[int, int]]  # arm -> stratum -> users
    opted_out: dict[str, int]  # arm -> users found opted out
    primary: str = ""  # the outcome the study is judged by (as kept at its first draw)
    declared: str = ""  # how it was declared, in words

    def total(self, arm: str) -> int:
        return sum(self.arms.get(arm, {}).values())

    def as_dict(self, *, seed: bool = True) -> dict[str, Any]:
        """For JSON; `seed` False: the seed None (a random seed is for admins' eyes only)."""
        return {
            "study": self.key,
            "start": self.start,
            "end": self.end,
            "baseline_months": self.baseline_months,
            "holdout_share": self.holdout_share,
            "seed": self.seed if seed else None,
            "seed_random": self.random,
            "running": self.running,
            "drawn_at": self.drawn_at.isoformat() if self.drawn_at else None,
            "primary": self.primary,
            "primary_declared": self.declared,
            "arms": {
                arm: {
                    "users": self.total(arm),
                    "opted_out": self.opted_out.get(arm, 0),
                    "by_stratum": {str(k): v for k, v in sorted(self.arms.get(arm, {}).items())},
                }
                for arm in STUDY_ARMS
            },
        }


def status(conn: Connection, cfg: Config, now: datetime) -> StudyStatus:
    """The configured study's arms as drawn so far (nothing drawn: empty arms)."""
    study = cfg.study
    w = window(study)
    sid = study_id(conn, study)
    A = StudyArm
    arms: dict[str, dict[int, int]] = {a: {} for a in STUDY_ARMS}
    q = select(A.arm, A.stratum, func.count()).where(A.study == sid.key).group_by(A.arm, A.stratum)
    for arm, stratum, n in conn.execute(q):
        arms.setdefault(str(arm), {})[int(stratum)] = int(n)
    q2 = select(A.arm, func.count()).where(A.study == sid.key, A.opted_out_at.is_not(None)).group_by(A.arm)
    opted = {str(a): int(n) for a, n in conn.execute(q2)}
    first = conn.execute(select(func.min(A.assigned_at)).where(A.study == sid.key)).scalar()
    kept = protocol(conn, study, sid.key)
    return StudyStatus(
        sid.key, str(study.start), study.end, study.baseline_months, study.holdout_share, sid.seed,
        sid.random, w.running(as_utc(now)), as_utc(first) if first is not None else None, arms, opted,
        kept.primary, kept.words(),
    )  # fmt: skip
