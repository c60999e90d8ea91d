"""The e-mail study's design (cocaq.study.assign): the draw, the arms kept in `study_arms`, and the
hold-out arm getting no e-mail while the study runs, on SQLite and PostgreSQL.

Jobs are imported as `cocaq import sacct` writes them and rolled up by the aggregator; e-mails go to a
real SMTP server (aiosmtpd) and are counted there; the ledger is read back from the database.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, insert, select, update

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.schema import DailyRollup, SentReport, StudyArm, User
from cocaq.errors import UsageError
from cocaq.reports.alerts import send_idle_alerts
from cocaq.reports.batch import send_month
from cocaq.reports.jobmail import send_job_mail
from cocaq.slurm.record import JobRecord
from cocaq.study import assign as sa
from tests import builders
from tests.builders import config
from tests.conftest import run_cocaq
from tests.mailkit import SmtpServer, mail_toml
from tests.test_alerts import TWO, idle_from, samples

START = "2026-11"  # the study's first month; the baseline is August to October
T0 = datetime(2026, 11, 1, 0, 30, tzinfo=UTC)
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
USERS = ["alice", "bob", "carol", "dave", "erin", "frank"]


@pytest.fixture
def server() -> Iterator[SmtpServer]:
    with SmtpServer() as s:
        yield s


def make_cfg(
    tmp_path: Path, url: str, server: SmtpServer | None = None, *, name: str = "cocaq.toml", **study: Any
) -> Config:
    study = {"start": START, "seed": 7, "holdout_share": 0.2, **study}
    return config(
        tmp_path, url, mail_toml(server, address_template="{user}@example.org"), name=name,
        cluster={"carbon_zone": "FRA", "pue": 1.2}, collector={"interval_s": 60},
        aggregate={"idle_gpu_util_pct": 5}, alerts={"idle_minutes": 60, "throttle_hours": 24},
        study={k: v for k, v in study.items() if v is not None},
    )  # fmt: skip


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def job(raw: int, user: str, start: datetime, hours: float, gpus: int = 1, **kw: Any) -> JobRecord:
    return builders.job(raw, start, hours, user=user, account="lab_a", gpus=gpus, queued=timedelta(minutes=1),
                        name=f"train-{raw}", **kw)  # fmt: skip


def load(engine: Engine, cfg: Config, records: list[JobRecord], aggregate: bool = True) -> None:
    import_records(engine, records, cfg, source="sacct-json")
    if aggregate:
        run_aggregate(engine, cfg)


def arms(engine: Engine, key: str = "2026-11/seed 7") -> dict[str, tuple[str, int, float, datetime]]:
    """user -> (arm, stratum, GPU-hours before, assigned_at) of the study's rows."""
    A = StudyArm
    with engine.connect() as c:
        rows = c.execute(select(A.user_name, A.arm, A.stratum, A.gpu_hours_before, A.assigned_at)
                         .where(A.study == key))  # fmt: skip
        return {r[0]: (r[1], r[2], round(r[3], 6), r[4]) for r in rows}


def draw_now(engine: Engine, cfg: Config, now: datetime, **kw: Any) -> sa.AssignSummary:
    with engine.begin() as c:
        return sa.assign(c, cfg, now, **kw)


# --- the draw itself ------------------------------------------------------------------------------------


def test_draw_is_stable_and_uniform() -> None:
    # Known values: SHA-256 of "seed:user", the first 53 bits (module doc); any machine, any Python.
    assert sa.draw(1, "alice") == 0.29961116527222964
    assert sa.draw(1, "bob") == 0.17543523580017983
    assert sa.draw(7, "alice") == 0.5845461100182635
    assert sa.draw(7, "bob") == 0.26868360736246544
    xs = [sa.draw(3, f"u{i}") for i in range(20000)]
    assert all(0.0 <= x < 1.0 for x in xs)
    assert sum(xs) / len(xs) == pytest.approx(0.5, abs=0.01)
    assert sum(x < 0.2 for x in xs) / len(xs) == pytest.approx(0.2, abs=0.01)


def test_strata_and_split_balance_each_stratum_and_the_total() -> None:
    # 200 users: 36 without GPU-hours, 164 with (41 per quartile)
    hours = {f"u{i:03d}": 0.0 if i < 36 else float(i) for i in range(200)}
    st = sa.strata(hours)
    assert Counter(st.values()) == {0: 36, 1: 41, 2: 41, 3: 41, 4: 41}
    assert st["u036"] == 1 and st["u199"] == 4  # by rank: the lightest and the heaviest
    for share, seed in ((0.2, 7), (0.25, 1), (0.33, 11), (0.5, 2)):
        arm = sa.split(st, seed, share)
        held = Counter(st[u] for u, a in arm.items() if a == sa.HOLDOUT)
        for s, n in Counter(st.values()).items():
            assert abs(held[s] - share * n) < 1, (share, s, held[s], n)
        assert sum(held.values()) == int(share * 200 + 0.5)
        # within a stratum the hold-out are the lowest draws
        for s in range(5):
            members = sorted((u for u in st if st[u] == s), key=lambda u: sa.draw(seed, u))
            assert {u for u in members if arm[u] == sa.HOLDOUT} == set(members[: held[s]])
    # the same draw whatever order the users come in
    assert sa.split(dict(reversed(list(st.items()))), 7, 0.2) == sa.split(st, 7, 0.2)


# --- in the database ------------------------------------------------------------------------------------


def baseline(engine: Engine, cfg: Config) -> None:
    """12 users in the baseline (August to October): u00-u02 with CPU jobs only, u03-u11 with 1 to 9 GPU-hours
    (u11's split by the baseline's end); old-timer only in July (before it); newbie only from November."""
    recs = [job(100 + i, f"u{i:02d}", datetime(2026, 9, 1 + i, 8, tzinfo=UTC), 2.0, gpus=0) for i in range(3)]
    recs += [
        job(100 + i, f"u{i:02d}", datetime(2026, 8, 3 + i, 8, tzinfo=UTC), i - 2.0) for i in range(3, 11)
    ]
    recs.append(job(111, "u11", datetime(2026, 10, 31, 20, tzinfo=UTC), 8.0, gpus=3))  # 4 h in, 4 after
    recs.append(job(120, "old-timer", datetime(2026, 7, 10, tzinfo=UTC), 5.0))
    recs.append(job(121, "newbie", datetime(2026, 11, 2, tzinfo=UTC), 5.0))
    load(engine, cfg, recs)


def test_assign_from_the_baseline_then_joiners(engine: Engine, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, url_of(engine), holdout_share=0.25)
    baseline(engine, cfg)
    s = draw_now(engine, cfg, T0, users=[])
    assert s.first_draw and s.added == 12, s.line()
    got = arms(engine)
    assert set(got) == {f"u{i:02d}" for i in range(12)}  # not old-timer, and newbie not asked about
    assert {u: got[u][2] for u in got} == {
        **{f"u{i:02d}": 0.0 for i in range(3)}, **{f"u{i:02d}": i - 2.0 for i in range(3, 11)}, "u11": 12.0,
    }  # fmt: skip
    strata = {u: got[u][1] for u in got}
    assert Counter(strata.values()) == {0: 3, 1: 3, 2: 2, 3: 2, 4: 2}  # 9 with GPU-hours: 9 * i // 9 ranks
    assert strata["u03"] == 1 and strata["u11"] == 4
    assert sum(a == "hold-out" for a, *_ in got.values()) == 3  # R(0.25 x 12)
    assert all(at == T0 for *_, at in got.values())
    # The same from the jobs where the aggregator has rolled up nothing
    with engine.begin() as c:
        c.execute(delete(DailyRollup))
        assert sa.baseline_hours(c, datetime(2026, 8, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)) == (
            pytest.approx({u: h for u, (_, _, h, _) in got.items()})
        )
        c.rollback()
    # A re-run adds nobody and changes nothing; the CLI's sweep finds the newbie, a joiner.
    later = T0 + timedelta(days=3)
    s = draw_now(engine, cfg, later, users=[])
    assert (s.first_draw, s.added, arms(engine)) == (False, 0, got)
    s = draw_now(engine, cfg, later)
    assert s.added == 1 and s.already == 1, s.line()  # u11's job ran into November
    new = arms(engine)
    assert new["newbie"][:3] == ("hold-out" if sa.draw(7, "newbie") < 0.25 else "emailed", -1, 0.0)
    assert new["newbie"][3] == later and {u: new[u] for u in got} == got
    # A changed share, or another run, leaves every row as drawn: only users not drawn yet are added.
    cfg2 = replace(cfg, study=replace(cfg.study, holdout_share=0.5))
    load(engine, cfg2, [job(122, "late", datetime(2026, 11, 25, tzinfo=UTC), 1.0)], aggregate=False)
    s = draw_now(engine, cfg2, later + timedelta(days=30))
    assert s.added == 1 and s.already == 2, s.line()
    after = arms(engine)
    assert {u: after[u] for u in new} == new
    assert after["late"][0] == ("hold-out" if sa.draw(7, "late") < 0.5 else "emailed")
    # Another study (another seed) is drawn apart, and leaves this one alone.
    cfg3 = replace(cfg, study=replace(cfg.study, seed=8))
    assert draw_now(engine, cfg3, later).first_draw
    assert arms(engine) == after and len(arms(engine, "2026-11/seed 8")) == 12 + 2


def test_opted_out_users_keep_their_arm(engine: Engine, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, url_of(engine))
    baseline(engine, cfg)
    with engine.begin() as c:
        c.execute(insert(User).values(name="u04", opted_out=True))
    s = draw_now(engine, cfg, T0, opted_out=["u05"])
    assert s.opted_out == 2
    with engine.begin() as c:
        c.execute(insert(User).values(name="u06", opted_out=True))
    draw_now(engine, cfg, T0 + timedelta(days=1))
    with engine.connect() as c:
        seen = dict(c.execute(select(StudyArm.user_name, StudyArm.opted_out_at)
                              .where(StudyArm.opted_out_at.is_not(None))).all())  # fmt: skip
    assert seen == {"u04": T0, "u05": T0, "u06": T0 + timedelta(days=1)}
    # drawn as everyone is: the arms are those of the baseline's draw, opt-outs or not
    got = {u: v for u, v in arms(engine).items() if v[1] >= 0}  # not newbie, who joined since
    hours = {u: h for u, (_, _, h, _) in got.items()}
    assert {u: a for u, (a, *_) in got.items()} == sa.split(sa.strata(hours), 7, 0.2)


def test_window() -> None:
    study = builders.default_config().study
    w = sa.window(replace(study, start="2026-11", end="2027-01", baseline_months=3))
    assert (w.baseline_start, w.start, w.end) == (
        datetime(2026, 8, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC),
    )  # fmt: skip
    assert not w.running(datetime(2026, 10, 31, 23, 59, tzinfo=UTC)) and w.running(
        datetime(2027, 1, 31, tzinfo=UTC)
    )
    assert not w.running(datetime(2027, 2, 1, tzinfo=UTC))
    assert sa.window(replace(study, start="2026-01", baseline_months=2)).baseline_start.month == 11
    with pytest.raises(UsageError, match=r"^no study configured: set \[study\] start$"):
        sa.window(study)


# --- the hold-out gets no e-mail ------------------------------------------------------------------------

REASON = "study hold-out (2026-11/seed 7)"


def team(engine: Engine, cfg: Config, month: int = 10, **user: Any) -> None:
    """USERS with jobs in `month` of 2026 (the baseline: 1 to 6 GPU-hours), each with `user` in their
    users row."""
    with engine.begin() as c:
        c.execute(insert(User), [{"name": u, **user} for u in USERS])
    load(engine, cfg, [job(200 + i, u, datetime(2026, month, 5 + i, 8, tzinfo=UTC), i + 1.0)
                       for i, u in enumerate(USERS)])  # fmt: skip


def split_arms(engine: Engine, key: str = "2026-11/seed 7") -> tuple[set[str], set[str]]:
    got = arms(engine, key)
    held = {u for u, (a, *_) in got.items() if a == "hold-out"}
    return held, set(got) - held


def to(users: set[str]) -> set[str]:
    return {f"{u}@example.org" for u in users}


def rcpts(server: SmtpServer) -> list[str]:
    return sorted(r for m in server.messages for r in m.rcpt_tos)


def ledger(engine: Engine, kind: str) -> dict[str, tuple[str, str | None]]:
    """user -> (status, error) of the kind's rows (one per user here)."""
    t = SentReport
    with engine.connect() as c:
        rows = c.execute(select(t.user_name, t.status, t.error).where(t.kind == kind)).all()
    assert len(rows) == len({r[0] for r in rows})
    return {str(r[0]): (r[1], r[2]) for r in rows}


def test_monthly_reports_held_back_during_the_study_only(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    cfg = make_cfg(tmp_path, url_of(engine), server, holdout_share=0.5, end="2026-11")
    team(engine, cfg)
    with engine.begin() as c:
        c.execute(update(User).where(User.name == "frank").values(opted_out=True))
    load(engine, cfg, [job(300 + i, u, datetime(2026, 11, 5 + i, 8, tzinfo=UTC), 1.0)
                       for i, u in enumerate(USERS)])  # fmt: skip
    # October's reports go on the 1st of November, the study's first month: the draw is made then.
    first = datetime(2026, 11, 1, 6, tzinfo=UTC)
    s = send_month(engine, cfg, datetime(2026, 10, 1, tzinfo=UTC), now=first, only=["users"])
    held, emailed = split_arms(engine)
    assert len(held) == 3 and held - {"frank"} and emailed - {"frank"}, (held, emailed)
    assert all(at == first for *_, at in arms(engine).values())
    assert rcpts(server) == sorted(to(emailed - {"frank"}))
    assert s.sections["users"].skipped[REASON] == len(held - {"frank"}), s.line()
    assert REASON in s.line()
    rows = ledger(engine, "user-monthly")
    assert rows == {u: ("skipped", REASON) for u in held - {"frank"}} | {
        u: ("sent", None) for u in emailed - {"frank"}
    }
    with engine.connect() as c:
        opted = c.execute(select(StudyArm.opted_out_at).where(StudyArm.user_name == "frank")).scalar_one()
    assert opted == first  # frank opted out: kept in the arm drawn, recorded apart
    # The weekly retry during the study sends nothing more and records nothing twice.
    s = send_month(
        engine, cfg, datetime(2026, 10, 1, tzinfo=UTC), now=first + timedelta(days=8), only=["users"]
    )
    assert s.sections["users"].delivery.sent == 0 and len(server.messages) == len(emailed - {"frank"})
    assert ledger(engine, "user-monthly") == rows
    # November's reports go in December, after the end month: to everyone (frank still opted out).
    server.messages.clear()
    s = send_month(engine, cfg, datetime(2026, 11, 1, tzinfo=UTC), now=datetime(2026, 12, 1, 6, tzinfo=UTC),
                   only=["users"])  # fmt: skip
    assert rcpts(server) == sorted(to(set(USERS) - {"frank"})), s.line()
    assert REASON not in s.line()


def test_a_monthly_report_is_held_back_only_where_it_would_have_gone(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    """The hold-out's `skipped` row is recorded exactly where the same user e-mailed would be sent the
    report, so that first_contacts means the same in both arms: not for a user whose only job ended as
    the month began (its hours all in the month before; Slurm's end a few seconds into the month puts
    the user among the month's candidates, not among those with jobs in it)."""
    cfg = make_cfg(tmp_path, url_of(engine), server, holdout_share=0.5)
    team(engine, cfg)
    draw_now(engine, cfg, T0)
    held, emailed = split_arms(engine)
    h, e = sorted(held)[0], sorted(emailed)[0]
    nov1 = datetime(2026, 11, 1, tzinfo=UTC)
    edge = [job(700 + i, u, nov1 - timedelta(hours=2), 2.0, end=nov1 + timedelta(seconds=30))
            for i, u in enumerate((h, e))]  # fmt: skip
    rest = [job(710 + i, u, datetime(2026, 11, 10 + i, 8, tzinfo=UTC), 1.0)
            for i, u in enumerate(sorted(set(USERS) - {h, e}))]  # fmt: skip
    load(engine, cfg, edge + rest)
    s = send_month(engine, cfg, nov1, now=datetime(2026, 12, 1, 6, tzinfo=UTC), only=["users"])
    assert rcpts(server) == sorted(to(emailed - {e})), s.line()
    assert ledger(engine, "user-monthly") == {u: ("skipped", REASON) for u in held - {h}} | {
        u: ("sent", None) for u in emailed - {e}
    }
    assert s.sections["users"].skipped[REASON] == len(held) - 1, s.line()
    with engine.connect() as c:
        first = sa.first_contacts(c, cfg.study, "2026-11/seed 7")
    assert set(first) == set(USERS) - {h, e}


def test_job_mail_held_back_and_recorded(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    """A study of October (the machine's clock allows no job after today: it is the past here)."""
    cfg = make_cfg(tmp_path, url_of(engine), server, holdout_share=0.5, start="2026-10", end="2026-10")
    team(engine, cfg, 9, job_email=True)
    oct20 = datetime(2026, 10, 20, 12, tzinfo=UTC)
    load(engine, cfg, [job(400 + i, u, oct20 - timedelta(hours=2), 1.0) for i, u in enumerate(USERS)])
    s = send_job_mail(engine, cfg, now=oct20, window=timedelta(minutes=30))
    held, emailed = split_arms(engine, "2026-10/seed 7")
    assert held and emailed
    assert rcpts(server) == sorted(to(emailed)), s.line()
    assert s.held_out == len(held) and "held back for the e-mail study" in s.line(), s.line()
    reason = "study hold-out (2026-10/seed 7)"
    assert ledger(engine, "job") == {u: ("skipped", reason) for u in held} | {
        u: ("sent", None) for u in emailed
    }
    # Held-back digests are closed: a later run neither sends nor records them again.
    s = send_job_mail(engine, cfg, now=oct20 + timedelta(minutes=10), window=timedelta(minutes=30))
    assert (s.open_digests, s.held_out, len(server.messages)) == (0, 0, len(emailed)), s.line()
    # After the end month, the hold-out's jobs are mailed again.
    u = sorted(held)[0]
    load(engine, cfg, [job(499, u, NOW - timedelta(hours=2), 1.0)])
    s = send_job_mail(engine, cfg, now=NOW, window=timedelta(minutes=30))
    assert rcpts(server) == sorted(to(emailed) | to({u})), s.line()


def test_alerts_held_back_and_recorded(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    from tests.test_alerts import job as running_job

    cfg = make_cfg(tmp_path, url_of(engine), server, holdout_share=0.5)
    team(engine, cfg)
    draw_now(engine, cfg, T0)
    held, emailed = split_arms(engine)
    h, e = sorted(held)[0], sorted(emailed)[0]
    start = NOW - timedelta(hours=3)
    load(engine, cfg, [running_job(501, start, user=h), running_job(502, start, user=e)], aggregate=False)
    for raw in (501, 502):
        samples(engine, raw, start, NOW, {g: idle_from(NOW - timedelta(hours=2)) for g in TWO})
    s = send_idle_alerts(engine, cfg, now=NOW)
    assert rcpts(server) == [f"{e}@example.org"], s.line()
    assert s.held_out == 1 and s.new == 2 and "held back for the e-mail study" in s.line(), s.line()
    assert ledger(engine, "idle-gpu") == {h: ("skipped", REASON), e: ("sent", None)}
    # The held-back alert is closed, not retried while its job runs
    s = send_idle_alerts(engine, cfg, now=NOW + timedelta(minutes=10))
    assert (s.open, s.held_out, len(server.messages)) == (0, 0, 1), s.line()


class Refused:
    """A transport whose server refuses every message for good (the ledger records each as failed)."""

    def send(self, msg: Any, sender: str, to: str) -> str:
        from cocaq.reports.transport import SendError

        raise SendError("550 mailbox unavailable", permanent=True)

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "refusing"


def opted_out_since(engine: Engine, users: set[str]) -> None:
    with engine.begin() as c:
        c.execute(update(User).where(User.name.in_(users)).values(opted_out=True))


def test_an_open_job_mail_of_a_user_who_opted_out_since_is_held_back_nowhere(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    """A digest made before the study that did not go, of a user who has opted out since: the e-mailed
    user's is not sent (deliver sees the opt-out), so the hold-out's is not recorded as held back either
    (first_contacts means the same in both arms)."""
    cfg = make_cfg(tmp_path, url_of(engine), server, holdout_share=0.5, start="2026-12")
    team(engine, cfg, job_email=True)
    draw_now(engine, cfg, datetime(2026, 12, 1, tzinfo=UTC))
    held, emailed = split_arms(engine, "2026-12/seed 7")
    h, e = sorted(held)[0], sorted(emailed)[0]
    nov30 = datetime(2026, 11, 30, 18, tzinfo=UTC)
    load(engine, cfg, [job(800, h, nov30, 1.0), job(801, e, nov30, 1.0)])
    s = send_job_mail(engine, cfg, now=nov30 + timedelta(hours=3), window=timedelta(minutes=30),
                      transport=Refused())  # fmt: skip
    assert s.new_digests == 2 and s.delivery is not None and s.delivery.failed == 2, s.line()
    opted_out_since(engine, {h, e})
    s = send_job_mail(engine, cfg, now=datetime(2026, 12, 1, 6, tzinfo=UTC), window=timedelta(minutes=30))
    assert s.held_out == 0 and not server.messages, s.line()
    assert ledger(engine, "job") == {
        h: ("failed", "550 mailbox unavailable"),
        e: ("failed", "550 mailbox unavailable"),
    }
    with engine.connect() as c:
        assert sa.first_contacts(c, cfg.study, "2026-12/seed 7") == {}


def test_an_open_alert_of_a_user_who_opted_out_since_is_held_back_nowhere(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    """The same for an idle-GPU alert bound before the study that did not go."""
    cfg = make_cfg(tmp_path, url_of(engine), server, holdout_share=0.5, start="2026-12")
    team(engine, cfg)
    draw_now(engine, cfg, datetime(2026, 12, 1, tzinfo=UTC))
    held, emailed = split_arms(engine, "2026-12/seed 7")
    h, e = sorted(held)[0], sorted(emailed)[0]
    start, t1 = datetime(2026, 11, 30, 20, tzinfo=UTC), datetime(2026, 11, 30, 23, tzinfo=UTC)
    running = [builders.job(raw, start, 3.0, user=u, account="lab_a", gpus=2, cpus=8, running=True,
                            cpu_s=None, node_list="n[1-2]", n_nodes=2, name=f"train-{raw}")
               for raw, u in ((901, h), (902, e))]  # fmt: skip
    load(engine, cfg, running, aggregate=False)
    for raw in (901, 902):
        samples(engine, raw, start, t1, {g: idle_from(start + timedelta(hours=1)) for g in TWO})
    s = send_idle_alerts(engine, cfg, now=t1, transport=Refused())
    assert s.new == 2 and s.delivery is not None and s.delivery.failed == 2, s.line()
    opted_out_since(engine, {h, e})
    s = send_idle_alerts(engine, cfg, now=t1 + timedelta(minutes=90))  # the study has begun
    assert s.held_out == 0 and not server.messages, s.line()
    assert ledger(engine, "idle-gpu") == {
        h: ("failed", "550 mailbox unavailable"),
        e: ("failed", "550 mailbox unavailable"),
    }
    with engine.connect() as c:
        assert sa.first_contacts(c, cfg.study, "2026-12/seed 7") == {}


def test_before_the_start_nothing_is_held_back_or_drawn(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    cfg = make_cfg(tmp_path, url_of(engine), server, start="2026-12")
    team(engine, cfg, job_email=True)
    load(engine, cfg, [job(600 + i, u, NOW - timedelta(hours=2), 1.0) for i, u in enumerate(USERS)])
    s = send_job_mail(engine, cfg, now=NOW, window=timedelta(minutes=30))
    assert rcpts(server) == sorted(to(set(USERS))) and s.held_out == 0, s.line()
    assert arms(engine, "2026-12/seed 7") == {}


# --- the commands ---------------------------------------------------------------------------------------


def test_cli_assign_and_status(engine: Engine, tmp_path: Path, cli_env: dict[str, str]) -> None:
    import json

    cfg = make_cfg(tmp_path, url_of(engine), holdout_share=0.25)
    baseline(engine, cfg)
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "cocaq.toml"))
    r = run_cocaq(["study", "status"], env)
    assert r.code == 0 and "study 2026-11/seed 7: from 2026-11 (no end month set)" in r.out, r.err
    assert "not drawn yet" in r.out
    r = run_cocaq(["study", "assign"], env)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "study 2026-11/seed 7: drew 13 user(s) (3 hold-out, 10 e-mailed), 0 drawn before", (
        r.out
    )
    assert any(line.split()[:2] == ["-1", "joined"] for line in lines)  # newbie
    got = arms(engine)
    assert len(got) == 13
    r = run_cocaq(["study", "assign"], env)
    assert r.code == 0 and r.out.startswith("study 2026-11/seed 7: added 0 user(s)"), r.out
    assert arms(engine) == got
    r = run_cocaq(["study", "status", "--format", "json"], env)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["study"] == "2026-11/seed 7" and doc["start"] == "2026-11" and doc["end"] is None
    by_arm = Counter(a for a, *_ in got.values())
    for arm in ("emailed", "hold-out"):
        assert doc["arms"][arm]["users"] == by_arm[arm]
        assert doc["arms"][arm]["by_stratum"] == {
            str(s): n for s, n in sorted(Counter(st for a, st, *_ in got.values() if a == arm).items())
        }
        assert doc["arms"][arm]["opted_out"] == 0
    assert doc["primary"] == "idle_gpu_hours_share" and doc["primary_declared"].startswith("declared at the")
    r = run_cocaq(["study", "status"], dict(env, COLUMNS="60"))
    assert r.code == 0 and "hold-out" in r.out and "opted out (kept in arm)" in r.out, r.out
    assert "primary outcome: idle_gpu_hours_share (declared at the study's first draw" in " ".join(
        r.out.split()
    )
    assert max(len(line) for line in r.out.splitlines()) <= 60
    # No study configured: one line.
    (tmp_path / "plain.toml").write_text(config_toml_without_study(url_of(engine)))
    r = run_cocaq(["study", "status"], dict(env, COCAQ_CONFIG=str(tmp_path / "plain.toml")))
    assert r.code != 0 and r.err.strip().endswith("no study configured: set [study] start"), r.err
    assert len(r.err.strip().splitlines()) == 1


def config_toml_without_study(url: str) -> str:
    return builders.config_toml(url)


def test_a_report_sent_by_hand_is_held_back_too(
    engine: Engine, tmp_path: Path, server: SmtpServer, cli_env: dict[str, str]
) -> None:
    cfg = make_cfg(tmp_path, url_of(engine), server, holdout_share=0.5)
    team(engine, cfg)
    draw_now(engine, cfg, T0)
    held, emailed = split_arms(engine)
    h, e = sorted(held)[0], sorted(emailed)[0]
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "cocaq.toml"))
    r = run_cocaq(["report", "user", h, "--month", "2026-10", "--send", "--force"], env)
    assert r.code != 0 and f"{h} is in the hold-out of the e-mail study 2026-11/seed 7: not sent" in r.err, (
        r.err
    )
    assert len(r.err.strip().splitlines()) == 1 and not server.messages
    r = run_cocaq(["report", "user", e, "--month", "2026-10", "--send"], env)
    assert r.code == 0, r.err
    assert rcpts(server) == [f"{e}@example.org"]


# --- the seed: drawn at random unless the config gives one, kept with the study, shown to admins only ---------


def _unshare_works() -> bool:
    import shutil
    import subprocess

    return (
        bool(shutil.which("unshare"))
        and subprocess.run(["unshare", "--user", "true"], capture_output=True, check=False).returncode == 0
    )


def as_plain_user(args: list[str], env: dict[str, str]) -> Any:
    """`cocaq ARGS` as a user who is no admin: in a user namespace of its own the process is nobody (uid
    65534, no group of [api] admin_groups), while the kernel still checks files against its real ids, so it
    reads the same config and database (SQLite included) as the test."""
    import subprocess
    import sys

    from tests.conftest import Result

    p = subprocess.run(["unshare", "--user", sys.executable, "-m", "cocaq", *args], env=env,
                       capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    return Result(p.returncode, p.stdout, p.stderr)


def stored_seed(engine: Engine, key: str = START) -> int:
    from cocaq.db.schema import StudySeed

    with engine.connect() as c:
        return int(c.execute(select(StudySeed.seed).where(StudySeed.study == key)).scalar_one())


def draws(engine: Engine, key: str = START) -> dict[str, float]:
    with engine.connect() as c:
        return dict(c.execute(select(StudyArm.user_name, StudyArm.draw).where(StudyArm.study == key)).all())  # type: ignore[arg-type]


needs_unshare = pytest.mark.skipif(
    not _unshare_works(), reason="needs unprivileged user namespaces (unshare)"
)


@needs_unshare
def test_no_seed_in_the_config_draws_a_random_one_kept_with_the_study(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    import json

    from cocaq.db import migrate
    from cocaq.db.engine import make_engine
    from tests.conftest import new_database

    cfg = make_cfg(tmp_path, url_of(engine), seed=None, holdout_share=0.25)
    baseline(engine, cfg)
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "cocaq.toml"))
    r = run_cocaq(["study", "assign"], env)
    assert r.code == 0 and r.out.startswith(f"study {START}: drew 13 user(s) ("), r.out + r.err
    assert "its seed was drawn at random and kept with the study" in r.out
    seed = stored_seed(engine)
    assert seed.bit_length() > 64 and str(seed) not in r.out + r.err  # not 1, not printed by assign
    # The stored seed reproduces the draw: each number, and the baseline's arms.
    got, numbers = arms(engine, START), draws(engine)
    assert numbers == {u: sa.draw(seed, u) for u in got}
    base = {u: v for u, v in got.items() if v[1] >= 0}
    assert {u: a for u, (a, *_) in base.items()} == sa.split(
        sa.strata({u: v[2] for u, v in base.items()}), seed, 0.25
    )
    # A joiner is drawn with the same seed; no new seed is drawn.
    load(engine, cfg, [job(130, "late", datetime(2026, 11, 25, tzinfo=UTC), 1.0)], aggregate=False)
    r = run_cocaq(["study", "assign"], env)
    assert r.code == 0 and r.out.startswith(f"study {START}: added 1 user(s)"), r.out
    assert stored_seed(engine) == seed and draws(engine)["late"] == sa.draw(seed, "late")
    assert arms(engine, START)["late"][:2] == ("hold-out" if sa.draw(seed, "late") < 0.25 else "emailed", -1)
    # Admins (root here) see the seed; a plain user sees neither it nor the arms' numbers.
    r = run_cocaq(["study", "status"], env)
    assert r.code == 0 and f"seed {seed} (drawn at random)" in " ".join(r.out.split()), r.out
    assert json.loads(run_cocaq(["study", "status", "-o", "json"], env).out)["seed"] == seed
    for fmt in ("table", "json"):
        r = as_plain_user(["study", "status", "-o", fmt], env)
        assert r.code == 0 and str(seed) not in r.out + r.err, r.out + r.err
        assert f"study {START}" in r.out or f'"study": "{START}"' in r.out, r.out
    assert "seed drawn at random (shown to admins)" in " ".join(
        as_plain_user(["study", "status"], env).out.split()
    )
    assert json.loads(as_plain_user(["study", "status", "-o", "json"], env).out)["seed"] is None
    # ... unless [api] admin_users names them, as the read API does.
    text = (tmp_path / "cocaq.toml").read_text()
    (tmp_path / "admins.toml").write_text(text + '\n[api]\nadmin_users = ["nobody"]\n')
    r = as_plain_user(["study", "status"], dict(env, COCAQ_CONFIG=str(tmp_path / "admins.toml")))
    assert r.code == 0 and f"seed {seed}" in " ".join(r.out.split()), r.out + r.err
    # Another site with the same users and jobs, no seed either: another seed, another draw.
    other = tmp_path / "site2"
    other.mkdir()
    url2 = new_database(engine.dialect.name, other, request)
    engine2 = make_engine(url2)
    try:
        migrate.upgrade(engine2)
        cfg2 = make_cfg(other, url2, seed=None, holdout_share=0.25)
        baseline(engine2, cfg2)
        r = run_cocaq(["study", "assign"], dict(env, COCAQ_CONFIG=str(other / "cocaq.toml")))
        assert r.code == 0, r.err
        seed2, numbers2 = stored_seed(engine2), draws(engine2)
        assert seed2 != seed and set(numbers2) == set(numbers) - {"late"}
        assert all(numbers2[u] != numbers[u] for u in numbers2)
    finally:
        engine2.dispose()


def test_a_study_drawn_with_the_old_default_seed_keeps_it(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # Drawn before random seeds, when an unset [study] seed meant 1: its key names seed 1.
    old = make_cfg(tmp_path, url_of(engine), name="old.toml", seed=1)
    baseline(engine, old)
    draw_now(engine, old, T0, users=[])
    before = arms(engine, f"{START}/seed 1")
    cfg = make_cfg(tmp_path, url_of(engine), seed=None)  # the same config after the upgrade: no seed
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "cocaq.toml"))
    r = run_cocaq(["study", "assign"], env)
    assert r.code == 0 and r.out.startswith(f"study {START}/seed 1: added 1 user(s)"), r.out + r.err
    after = arms(engine, f"{START}/seed 1")
    assert {u: after[u] for u in before} == before and after["newbie"][1] == -1
    assert draws(engine, f"{START}/seed 1")["newbie"] == sa.draw(1, "newbie")
    with engine.connect() as c:
        assert c.execute(select(StudyArm.study).distinct()).scalars().all() == [f"{START}/seed 1"]
    r = run_cocaq(["study", "status"], env)
    assert r.code == 0 and f"study {START}/seed 1:" in r.out and "seed 1" in r.out, r.out
    assert cfg.study.seed is None


# --- when the study first reached each user, and what it is judged by ------------------------------------


def test_first_contacts_are_the_first_study_email_sent_or_held_back(engine: Engine, tmp_path: Path) -> None:
    """An e-mailed user's first study e-mail delivered, a held-out user's first one held back; not failed
    sends, not e-mails before the study (the report of a month that ended before it, wherever the
    scheduler's timezone put its end), not after its end, not labs' or other studies' rows."""
    cfg = make_cfg(tmp_path, url_of(engine), end="2026-12")
    key = "2026-11/seed 7"
    start = datetime(2026, 11, 1, tzinfo=UTC)
    arm_rows = [("ann", "emailed"), ("bob", "emailed"), ("cat", "hold-out"), ("dan", "emailed"),
                ("eve", "hold-out"), ("fay", "emailed")]  # fmt: skip
    with engine.begin() as c:
        c.execute(insert(StudyArm), [
            {"study": key, "user_name": u, "arm": a, "stratum": 1, "gpu_hours_before": 1.0, "draw": 0.5,
             "assigned_at": start} for u, a in arm_rows
        ])  # fmt: skip

        def row(user: str | None, sent: datetime, status: str = "sent", kind: str = "user-monthly",
                period: tuple[datetime, datetime] = (datetime(2026, 10, 1, tzinfo=UTC), start),
                error: str | None = None) -> dict[str, Any]:  # fmt: skip
            return {"kind": kind, "recipient": f"{user}-{sent:%d%H%M}-{kind}@x", "user_name": user,
                    "period_start": period[0], "period_end": period[1], "sent_at": sent, "status": status,
                    "message_id": None, "error": error}  # fmt: skip

        held = sa.hold_out_reason(key)
        ledger = [
            # ann: a send that failed, then the report of October delivered on 1 November, a job e-mail later
            row("ann", start + timedelta(hours=5), "failed", error="550"),
            row("ann", start + timedelta(hours=6)),
            row("ann", start + timedelta(days=3), kind="job", period=(start + timedelta(days=3),) * 2),
            # bob: the report of September (before the study), then a job e-mail in it
            row("bob", datetime(2026, 10, 1, 6, tzinfo=UTC), period=(datetime(2026, 9, 1, tzinfo=UTC),) * 2),
            row("bob", start + timedelta(days=9, hours=2), kind="job", period=(start,) * 2),
            # cat: held back (the hold-out's reason), and a skip of another reason before it
            row("cat", start + timedelta(hours=1), "skipped", error="study hold-out (2026-05/seed 3)"),
            row("cat", start + timedelta(days=2), "skipped", kind="idle-gpu", error=held),
            # dan: a site east of UTC whose report of October went at 22:30 UTC on 31 October, its month
            # having ended at 22:00 UTC (not held back from a hold-out user then: not a study e-mail)
            row("dan", start - timedelta(minutes=90),
                period=(datetime(2026, 9, 30, 22, tzinfo=UTC), start - timedelta(hours=2))),
            # eve: held back, but the row is a lab's (no user); fay: only after the study's end
            row(None, start + timedelta(hours=1), "skipped", kind="lab", error=held),
            row("fay", datetime(2027, 1, 1, 6, tzinfo=UTC), period=(datetime(2026, 12, 1, tzinfo=UTC),) * 2),
            row("zed", start + timedelta(hours=1)),  # never drawn
        ]  # fmt: skip
        c.execute(insert(SentReport), ledger)
    with engine.connect() as c:
        got = sa.first_contacts(c, cfg.study, key)
    assert got == {"ann": start + timedelta(hours=6), "bob": start + timedelta(days=9, hours=2),
                   "cat": start + timedelta(days=2)}  # fmt: skip
    # the study months start the first whole UTC day after
    from cocaq.study.analysis import exposure_days

    assert exposure_days(got)["ann"] == datetime(2026, 11, 2, tzinfo=UTC)


def test_the_primary_outcome_is_kept_at_the_first_draw(engine: Engine, tmp_path: Path) -> None:
    """The first draw keeps `[study] primary`; a config that names another later does not change what the
    study is judged by, and the report says so."""
    cfg = make_cfg(tmp_path, url_of(engine), primary="co2_per_user")
    baseline(engine, cfg)
    draw_now(engine, cfg, datetime(2026, 11, 1, 2, tzinfo=UTC))
    later = replace(cfg, study=replace(cfg.study, primary="idle_gpu_hours_share"))
    with engine.begin() as c:
        sa.assign(c, later, datetime(2026, 11, 20, tzinfo=UTC))  # a later run keeps what was kept
        kept = sa.protocol(c, later.study, "2026-11/seed 7")
    assert kept.primary == "co2_per_user" and kept.declared_at == datetime(2026, 11, 1, 2, tzinfo=UTC)
    words = kept.words()
    assert words.startswith("declared at the study's first draw, 2026-11-01, before any of its e-mails")
    assert "the config now names idle_gpu_hours_share, which the study does not take" in words
    # a study drawn by an older cocaq gets its row at the next run, and says so
    upgraded = sa.Protocol("co2_per_user", datetime(2026, 11, 20, tzinfo=UTC), "co2_per_user",
                           datetime(2026, 11, 1, 2, tzinfo=UTC))  # fmt: skip
    assert upgraded.words() == (
        "kept with the study on 2026-11-20, after its first draw on 2026-11-01 (an older cocaq)"
    )
    with pytest.raises(Exception, match=r"study\.primary: expected one of idle_gpu_energy_share"):
        make_cfg(tmp_path, url_of(engine), name="bad.toml", primary="idle_share")


def test_the_first_draw_blocks_each_stratum_by_baseline_co2(engine: Engine, tmp_path: Path) -> None:
    """Within a stratum, users ranked by baseline CO2 (heaviest first) in runs of 5 at a share of 0.2, one
    held out per run; the block is kept, and the report's re-draws keep to it."""
    hours = {f"h{i:02d}": 10.0 + i for i in range(20)}
    stratum = {u: 1 for u in hours}
    co2 = {u: float(100 - i) for i, u in enumerate(sorted(hours))}  # h00 the heaviest
    block = sa.blocks(stratum, co2, 0.2)
    assert [block[f"h{i:02d}"] for i in range(20)] == [i // 5 for i in range(20)]
    for seed in range(30):
        arms = sa.split(stratum, seed, 0.2, block)
        held = Counter(block[u] for u, a in arms.items() if a == sa.HOLDOUT)
        assert held == {0: 1, 1: 1, 2: 1, 3: 1}  # the four heaviest never two in the hold-out
    assert (sa.block_size(0.2), sa.block_size(0.3), sa.block_size(0.5), sa.block_size(0.05)) == (5, 3, 2, 20)
    # the study's first draw stores the blocks; joiners have none
    cfg = make_cfg(tmp_path, url_of(engine))
    baseline(engine, cfg)
    draw_now(engine, cfg, T0)
    with engine.connect() as c:
        rows = c.execute(select(StudyArm.user_name, StudyArm.stratum, StudyArm.block)).all()
    drawn = [r for r in rows if r[1] >= 0]
    assert drawn and all(r[2] is not None for r in drawn)
    from cocaq.study.analysis import _cells, arms_frame

    with engine.connect() as c:
        frame = arms_frame(c, "2026-11/seed 7")
    cells = _cells(frame)
    assert len(set(cells)) == len({(r[1], r[2]) for r in rows})
