"""Job e-mails at job end (reports/jobmail.py), on SQLite and PostgreSQL, through a real SMTP server.

Jobs are imported as `cocaq import sacct` writes them, measured node records are written as the collector
ships them, and the aggregator derives their metrics; the run's "now" is passed in, so a digest window
passes without waiting. Messages are counted and parsed at the server (aiosmtpd).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, update

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.db.schema import Cluster, Job, JobNotice, NodeEnergy, Sample, SentReport, User
from cocaq.reports import jobmail, wording
from cocaq.reports.job_report import job_footprint
from cocaq.reports.jobmail import send_job_mail
from cocaq.reports.transport import make_transport
from cocaq.slurm.record import JobRecord
from tests import builders
from tests.builders import config
from tests.mailkit import SmtpServer, mail_toml

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=30)


@pytest.fixture
def server() -> Iterator[SmtpServer]:
    with SmtpServer() as s:
        yield s


def make_cfg(tmp_path: Path, url: str, server: SmtpServer | None, **mail: Any) -> Config:
    """Cluster c in FRA (PUE 1.2); `mail`: [mail] keys (to `server`, if one)."""
    mail.setdefault("address_template", "{user}@example.org")
    return config(
        tmp_path,
        url,
        mail_toml(server, **mail),
        name="cocaq.toml",
        cluster={"carbon_zone": "FRA", "pue": 1.2},
    )


@pytest.fixture
def setup(engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer) -> tuple[Engine, Config]:
    return engine, make_cfg(tmp_path, db_url, server)


def rec(
    raw: int,
    end: datetime,
    *,
    user: str = "alice",
    hours: float = 1.0,
    comment: str | None = None,
    running: bool = False,
    gpus: int = 1,
    state: str = "COMPLETED",
) -> JobRecord:
    """`user`'s job train-RAW in lab_a on n1 that ran `hours` up to `end` (or runs still)."""
    return builders.job(
        raw, end - timedelta(hours=hours), hours, user=user, account="lab_a", gpus=gpus, state=state,
        running=running, end=end, queued=timedelta(minutes=1), name=f"train-{raw}", comment=comment,
    )  # fmt: skip


def load(engine: Engine, cfg: Config, *records: JobRecord, aggregate: bool = True) -> None:
    import_records(engine, list(records), cfg, source="sacct-json")
    if aggregate:
        run_aggregate(engine, cfg)


def node_record(engine: Engine, raw: int, start: datetime, *, final: bool) -> None:
    """A measured GPU record of the job on n1, as the collector (running) or the epilog (final) ships it."""
    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "c")).scalar_one()
        c.execute(
            insert(NodeEnergy).values(
                cluster_id=cid, node="n1", job_id=str(raw), job_start=start, component="gpu",
                device="GPU-0", source="nvml", method="measured", energy_j=3.6e6, t0=start,
                t1=start + timedelta(minutes=30), final=final,
            )
        )  # fmt: skip


def users(engine: Engine, *rows: dict[str, Any]) -> None:
    with engine.begin() as c:
        for r in rows:
            c.execute(insert(User).values(**r))


def pk_of(engine: Engine, raw: int) -> int:
    with engine.connect() as c:
        return int(c.execute(select(Job.id).where(Job.job_id_raw == raw)).scalar_one())


def notices(engine: Engine) -> dict[int, tuple[str, datetime]]:
    """job raw id -> (user, digest key)."""
    with engine.connect() as c:
        rows = c.execute(
            select(Job.job_id_raw, JobNotice.user_name, JobNotice.digest_at).join(
                Job, Job.id == JobNotice.job_pk
            )
        ).all()
    return {int(r[0]): (r[1], r[2]) for r in rows}


def job_ids_in(msg: EmailMessage) -> set[str]:
    """The job ids the text part names (`job 1234`, `Job 1234`, `1234` in a job line)."""
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    return set(re.findall(r"\b(7\d{3})\b", text))


def run(engine: Engine, cfg: Config, now: datetime = NOW, **kw: Any) -> jobmail.JobMailSummary:
    kw.setdefault("window", WINDOW)
    return send_job_mail(engine, cfg, now=now, **kw)


# --- who asked, and when it goes ---------------------------------------------------------------------------


def test_by_preference_once_parsed_back(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    users(engine, {"name": "alice", "job_email": True}, {"name": "bob", "job_email": False})
    load(engine, cfg, rec(7001, NOW - timedelta(minutes=40)), rec(7002, NOW - timedelta(hours=1), user="bob"))
    s = run(engine, cfg)
    assert (s.new_digests, s.new_jobs, s.considered) == (1, 1, 1), s.line()
    assert s.delivery is not None and s.delivery.sent == 1
    (m,) = server.messages
    msg = m.message
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert m.rcpt_tos == ["alice@example.org"] and "7001" in msg["Subject"] + text
    assert job_ids_in(msg) == {"7001"}
    with engine.connect() as c:
        rep = job_footprint(c, cfg, pk_of(engine, 7001))
    assert rep.final and rep.metrics_current
    assert wording.kwh(rep.energy_kwh) in text, text[:800]
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    for cid in re.findall(r'src="cid:([^"]+)"', html):
        (img,) = [p for p in msg.walk() if p["Content-ID"] == f"<{cid}>"]
        assert img.get_content_type() == "image/png"
    with engine.connect() as c:
        row = c.execute(select(SentReport.kind, SentReport.user_name, SentReport.status)).one()
    assert tuple(row) == ("job", "alice", "sent")
    # Again, and later: nothing more for this job.
    assert run(engine, cfg).new_digests == 0
    assert run(engine, cfg, NOW + timedelta(hours=3)).open_digests == 0
    assert len(server.messages) == 1 and list(notices(engine)) == [7001]


def test_by_comment_token_any_case(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    load(
        engine,
        cfg,
        rec(7011, NOW - timedelta(minutes=45), user="bob", comment="sweep 3 COCAQ:Notify please"),
        rec(7012, NOW - timedelta(minutes=45), user="bob", comment="cocaq notify"),  # not the token
        rec(7013, NOW - timedelta(minutes=45), user="carol"),
    )
    s = run(engine, cfg)
    assert (s.new_digests, s.new_jobs) == (1, 1), s.line()
    (m,) = server.messages
    assert m.rcpt_tos == ["bob@example.org"] and job_ids_in(m.message) == {"7011"}


def test_not_sent_before_the_energy_is_final(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    users(engine, {"name": "alice", "job_email": True})
    end = NOW - timedelta(minutes=40)
    # Still running; ended but the epilog's record not in yet; ended, all final.
    load(
        engine,
        cfg,
        rec(7021, end, running=True),
        rec(7022, end),
        rec(7023, end),
    )
    node_record(engine, 7022, end - timedelta(hours=1), final=False)
    s = run(engine, cfg)
    assert (s.not_ready, s.new_jobs) == (1, 1), s.line()  # 7021 is open: not even considered
    assert job_ids_in(server.messages[0].message) == {"7023"}
    # The epilog's final record arrives: 7022 goes, alone, in the next digest.
    with engine.begin() as c:
        c.execute(update(NodeEnergy).values(final=True))
    s = run(engine, cfg, NOW + timedelta(minutes=5))
    assert (s.new_digests, s.new_jobs) == (1, 1), s.line()
    assert [job_ids_in(m.message) for m in server.messages] == [{"7023"}, {"7022"}]


def test_waits_for_metrics_then_sends_without(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    users(engine, {"name": "alice", "job_email": True})
    end = NOW - timedelta(minutes=40)
    load(engine, cfg, rec(7031, end), aggregate=False)
    s = run(engine, cfg)
    assert (s.not_ready, s.new_digests) == (1, 0) and server.messages == []
    # The aggregator did not run: after METRICS_WAIT the e-mail goes with what is known.
    s = run(engine, cfg, end + jobmail.METRICS_WAIT + timedelta(minutes=1))
    assert s.new_jobs == 1 and len(server.messages) == 1


def test_lost_epilog_record_still_sent_after_stale_after(
    setup: tuple[Engine, Config], server: SmtpServer
) -> None:
    engine, cfg = setup
    users(engine, {"name": "alice", "job_email": True})
    end = NOW - timedelta(minutes=40)
    load(engine, cfg, rec(7041, end))
    node_record(engine, 7041, end - timedelta(hours=1), final=False)  # never becomes final
    assert run(engine, cfg, end + timedelta(hours=5)).new_jobs == 0
    assert run(engine, cfg, end + jobmail.STALE_AFTER + timedelta(minutes=1)).new_jobs == 1
    (m,) = server.messages
    text = m.message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "not final" in text.lower() and "no epilog record" in text, text


def test_opted_out_gets_none(setup: tuple[Engine, Config], tmp_path: Path, server: SmtpServer) -> None:
    engine, cfg = setup
    optout = tmp_path / "opt-out.txt"
    optout.write_text("carol\n")
    cfg = make_cfg(tmp_path, str(engine.url.render_as_string(hide_password=False)), server,
                   opt_out_file=str(optout))  # fmt: skip
    users(
        engine,
        {"name": "alice", "job_email": True, "opted_out": True},
        {"name": "carol", "job_email": True},
    )
    load(engine, cfg, rec(7051, NOW - timedelta(hours=1)), rec(7052, NOW - timedelta(hours=1), user="carol"))
    s = run(engine, cfg)
    assert (s.considered, s.opted_out, s.new_digests) == (1, 1, 0), s.line()
    assert server.messages == [] and notices(engine) == {}


# --- digests ---------------------------------------------------------------------------------------------


def test_many_jobs_one_digest_each_job_once(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    users(engine, {"name": "alice", "job_email": True}, {"name": "bob", "job_email": True})
    t0 = NOW - timedelta(minutes=20)
    load(
        engine,
        cfg,
        *[rec(7100 + i, t0 + timedelta(minutes=2 * i)) for i in range(5)],  # within 10 minutes
        rec(7200, t0, user="bob"),
    )
    s = run(engine, cfg)  # the oldest ended 20 minutes ago: inside the window
    assert (s.in_window, s.new_digests) == (6, 0) and server.messages == []
    s = run(engine, cfg, t0 + WINDOW + timedelta(seconds=1))
    assert (s.new_digests, s.new_jobs) == (2, 6), s.line()
    by_rcpt = {m.rcpt_tos[0]: job_ids_in(m.message) for m in server.messages}
    assert by_rcpt == {"alice@example.org": {f"{7100 + i}" for i in range(5)}, "bob@example.org": {"7200"}}
    # A job that ends later goes in a later digest, never again with the first five.
    load(engine, cfg, rec(7105, t0 + WINDOW + timedelta(minutes=5)))
    later = t0 + WINDOW + timedelta(minutes=5)
    assert run(engine, cfg, later + timedelta(minutes=10)).new_digests == 0  # its own window
    s = run(engine, cfg, later + WINDOW + timedelta(seconds=1))
    assert (s.new_digests, s.new_jobs) == (1, 1)
    assert job_ids_in(server.messages[-1].message) == {"7105"}
    n = notices(engine)
    assert sorted(n) == [7100, 7101, 7102, 7103, 7104, 7105, 7200]
    assert len({n[j] for j in n}) == 3  # three digests: alice twice, bob once
    with engine.connect() as c:
        rows = c.execute(select(SentReport.user_name, SentReport.status, SentReport.period_start)).all()
    assert sorted((u, st) for u, st, _ in rows) == [("alice", "sent"), ("alice", "sent"), ("bob", "sent")]
    assert {at for _, _, at in rows} == {n[j][1] for j in n}


class Crash:
    """A transport that dies (KeyboardInterrupt) on its first message, before or after the server took it."""

    def __init__(self, inner: Any, after_accept: bool) -> None:
        self.inner, self.after_accept = inner, after_accept

    def describe(self) -> str:
        return "crashing"

    def close(self) -> None:
        self.inner.close()

    def send(self, msg: EmailMessage, sender: str, to: str) -> str:
        if self.after_accept:
            self.inner.send(msg, sender, to)
        raise KeyboardInterrupt


@pytest.mark.parametrize("after_accept", [False, True])
def test_crash_then_rerun_each_job_once(
    setup: tuple[Engine, Config], server: SmtpServer, after_accept: bool
) -> None:
    engine, cfg = setup
    users(engine, {"name": "alice", "job_email": True})
    load(engine, cfg, rec(7301, NOW - timedelta(hours=1)), rec(7302, NOW - timedelta(minutes=50)))
    crash = Crash(make_transport(cfg), after_accept)
    with pytest.raises(KeyboardInterrupt):
        run(engine, cfg, transport=crash)
    crash.close()
    bound = notices(engine)
    assert sorted(bound) == [7301, 7302]  # bound before the send: the digest's content is fixed
    # A job that became ready meanwhile waits behind the unsent digest, not in it.
    load(engine, cfg, rec(7303, NOW - timedelta(minutes=45)))
    s = run(engine, cfg, NOW + timedelta(minutes=5))
    assert (s.new_digests, s.open_digests, s.waiting_open) == (0, 1, 1), s.line()
    assert s.delivery is not None and (s.delivery.sent, s.delivery.in_doubt) == (1, 1)
    ids = [job_ids_in(m.message) for m in server.messages]
    # The same digest (same jobs, same Message-ID) went once more only if the crash came after the server
    # took it: the in-doubt case, sent again by default ([mail] in_doubt = "resend").
    assert ids == ([{"7301", "7302"}] * 2 if after_accept else [{"7301", "7302"}])
    assert len({m.message["Message-ID"] for m in server.messages}) == 1
    s = run(engine, cfg, NOW + timedelta(minutes=10))
    assert (s.new_digests, s.new_jobs) == (1, 1) and job_ids_in(server.messages[-1].message) == {"7303"}
    assert notices(engine)[7301] == bound[7301] and len(set(notices(engine).values())) == 2


def test_throttled_digest_stays_open_and_new_jobs_wait(
    setup: tuple[Engine, Config], tmp_path: Path, server: SmtpServer
) -> None:
    engine, cfg = setup
    cfg = make_cfg(tmp_path, engine.url.render_as_string(hide_password=False), server, max_per_user_per_day=1)
    users(engine, {"name": "alice", "job_email": True})
    load(engine, cfg, rec(7401, NOW - timedelta(hours=2)))
    assert run(engine, cfg).delivery.sent == 1  # type: ignore[union-attr]
    load(engine, cfg, rec(7402, NOW - timedelta(minutes=50)))
    s = run(engine, cfg, NOW + timedelta(minutes=5))
    assert s.new_digests == 1 and s.delivery is not None and s.delivery.throttled == 1
    load(engine, cfg, rec(7403, NOW - timedelta(minutes=40)))
    s = run(engine, cfg, NOW + timedelta(minutes=10))
    assert (s.new_digests, s.open_digests, s.waiting_open) == (0, 1, 1), s.line()
    assert len(server.messages) == 1
    n = notices(engine)
    assert 7403 not in n and n[7402] != n[7401]


def test_digest_window_from_the_config(
    engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer
) -> None:
    """`[reports] job_digest_minutes`: 30 by default; 0 sends each job as soon as it is ready."""
    cfg = make_cfg(tmp_path, db_url, server)
    assert jobmail.digest_window(cfg) == timedelta(minutes=30)
    users(engine, {"name": "alice", "job_email": True})
    load(engine, cfg, rec(7601, NOW - timedelta(minutes=3)))
    assert send_job_mail(engine, cfg, now=NOW).in_window == 1
    (tmp_path / "cocaq.toml").write_text(
        (tmp_path / "cocaq.toml").read_text() + "[reports]\njob_digest_minutes = 0\n"
    )
    cfg = load_config(tmp_path / "cocaq.toml", environ={})
    assert send_job_mail(engine, cfg, now=NOW).new_jobs == 1 and len(server.messages) == 1


def test_dry_run_binds_and_sends_nothing(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    users(engine, {"name": "alice", "job_email": True})
    load(engine, cfg, rec(7501, NOW - timedelta(hours=1)))
    s = run(engine, cfg, dry_run=True)
    assert (s.new_digests, s.new_jobs) == (1, 1) and "dry run" in s.line()
    assert server.messages == [] and notices(engine) == {}
    assert pk_of(engine, 7501) > 0


# --- jobs that wasted energy, asked for or not ----------------------------------------------------------


def waste_cfg(tmp_path: Path, engine: Engine, server: SmtpServer, kwh: float | None, **mail: Any) -> Config:
    """The test config with `[reports] job_email_waste_kwh` (None: the default, 5 kWh)."""
    cfg = make_cfg(tmp_path, engine.url.render_as_string(hide_password=False), server, **mail)
    if kwh is None:
        return cfg
    p = tmp_path / "cocaq.toml"
    p.write_text(p.read_text() + f"[reports]\njob_email_waste_kwh = {kwh}\n")
    return load_config(p, environ={})


def idle_samples(engine: Engine, raw: int, start: datetime, hours: float, power: float = 300.0) -> None:
    """The collector's samples of an allocated GPU doing nothing (0% utilisation), every minute."""
    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "c")).scalar_one()
        rows = []
        for i in range(int(hours * 60) + 1):
            base = {"ts": start + timedelta(minutes=i), "cluster_id": cid, "node": "n1", "source": "nvml",
                    "device": f"GPU-{raw}", "job_id": str(raw)}  # fmt: skip
            rows += [
                {**base, "metric": "power_w", "value": power},
                {**base, "metric": "util_pct", "value": 0.0},
            ]
        c.execute(insert(Sample), rows)


def text_of(msg: EmailMessage) -> str:
    return msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]


def html_of(msg: EmailMessage) -> str:
    """The HTML part, its entities decoded (`job&#39;s` -> `job's`)."""
    return html.unescape(msg.get_body(("html",)).get_content())  # type: ignore[union-attr]


def test_wasteful_jobs_mailed_unasked_saying_why(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    """bob asked for nothing: his job that failed and his job whose GPU idled go (one digest), each
    saying why; his job that wasted nothing does not."""
    cfg = waste_cfg(tmp_path, engine, server, 1.0)
    end = NOW - timedelta(hours=1)
    load(
        engine,
        cfg,
        rec(7701, end, user="bob", hours=2, gpus=4, state="FAILED"),  # 3.2 kWh of GPUs (TDP), all wasted
        rec(7702, end, user="bob", hours=4),
        rec(7703, end, user="bob", hours=1),
        aggregate=False,
    )
    idle_samples(engine, 7702, end - timedelta(hours=4), 4)  # 300 W for 4 h: 1.2 kWh idle
    run_aggregate(engine, cfg)
    s = run(engine, cfg)
    assert (s.considered, s.new_digests, s.new_jobs, s.unasked_jobs) == (2, 1, 2, 2), s.line()
    assert "(2 unasked, for their wasted energy)" in s.line()
    (m,) = server.messages
    msg = m.message
    assert m.rcpt_tos == ["bob@example.org"] and job_ids_in(msg) == {"7701", "7702"}
    for body in (text_of(msg), html_of(msg)):
        assert "2 of these jobs are here unasked" in body, body[:1500]
        assert re.search(
            r"[\d.]+ kWh of this job's energy did no useful work: it failed after 2 h \([\d.]+ kWh\)", body
        )
        assert "did no useful work: its GPUs sat idle for 4 GPU-hours (1.2 kWh)." in body, body
        assert 'Don\'t want these e-mails? Reply with "unsubscribe"' in body
    assert run(engine, cfg, NOW + timedelta(hours=1)).considered == 0  # each job once


def test_waste_threshold_default_and_zero(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    end = NOW - timedelta(hours=1)
    load(
        engine,
        waste_cfg(tmp_path, engine, server, None),
        rec(7711, end, user="bob", hours=2, gpus=4, state="TIMEOUT"),  # about 3.3 kWh
        rec(7712, end, user="carol", hours=4, gpus=4, state="OUT_OF_MEMORY"),  # about 6.5 kWh
    )
    cfg = waste_cfg(tmp_path, engine, server, 0)  # off: only jobs that asked
    s = run(engine, cfg)
    assert (s.considered, s.new_digests) == (0, 0) and server.messages == [], s.line()
    cfg = waste_cfg(tmp_path, engine, server, None)  # 5 kWh
    assert cfg.reports.job_email_waste_kwh == 5.0
    s = run(engine, cfg)
    assert (s.considered, s.new_jobs, s.unasked_jobs) == (1, 1, 1), s.line()
    (m,) = server.messages
    assert m.rcpt_tos == ["carol@example.org"] and job_ids_in(m.message) == {"7712"}
    text = text_of(m.message)
    assert "Why you get this e-mail: you did not ask for it, but" in text, text
    assert re.search(r"did no useful work: it ran out of memory after 4 h \([\d.]+ kWh\)\.", text), text
    assert "Jobs whose wasted energy reaches 5 kWh get one." in text


def test_wasteful_jobs_of_opted_out_users_not_mailed(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    optout = tmp_path / "opt-out.txt"
    optout.write_text("carol\n")
    cfg = waste_cfg(tmp_path, engine, server, 1.0, opt_out_file=str(optout))
    users(engine, {"name": "bob", "opted_out": True})
    end = NOW - timedelta(hours=1)
    load(
        engine,
        cfg,
        rec(7721, end, user="bob", hours=2, gpus=4, state="FAILED"),
        rec(7722, end, user="carol", hours=2, gpus=4, state="CANCELLED"),
    )
    s = run(engine, cfg)
    assert (s.considered, s.opted_out, s.new_digests) == (1, 1, 0), s.line()
    assert server.messages == [] and notices(engine) == {}


def test_asked_and_wasteful_jobs_share_a_digest(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    """dave asked for one job (its comment); his other job failed and wasted energy: one digest, and only
    the unasked job says why it is there."""
    engine, cfg = setup
    assert cfg.reports.job_email_waste_kwh == 5.0
    end = NOW - timedelta(hours=1)
    load(
        engine,
        cfg,
        rec(7731, end, user="dave", comment="cocaq:notify"),
        rec(7732, end, user="dave", hours=4, gpus=4, state="FAILED"),
        rec(7733, end, user="dave", hours=4, gpus=4, comment="cocaq:notify", state="FAILED"),
    )
    s = run(engine, cfg)
    assert (s.new_digests, s.new_jobs, s.unasked_jobs) == (1, 3, 1), s.line()
    (m,) = server.messages
    text = text_of(m.message)
    assert job_ids_in(m.message) == {"7731", "7732", "7733"}
    assert "one of these jobs is here unasked" in text and text.count("Why this job is here:") == 1
    why = text.split("Why this job is here:")[1].split("\n")[0]
    assert "it failed after 4 h" in why
    assert text.index("JOB 7732") < text.index("Why this job is here:") < text.index("JOB 7731")
    assert "Don't want these e-mails?" in text
