"""Sending batches exactly once, on SQLite and PostgreSQL, through a real SMTP server (aiosmtpd).

Messages are counted and parsed at the server; the ledger (`sent_reports`) is read back from the
database. A crash is a transport that raises KeyboardInterrupt or SystemExit in the middle of a batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, update

from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.db.schema import SentReport, User
from cocaq.reports.deliver import DeliverySummary, Outgoing, deliver
from cocaq.reports.sent_mail import Ledger
from cocaq.reports.transport import SmtpTransport, make_transport
from tests.mailkit import PNG_1X1, SmtpServer, free_port, mail_toml

OCT = datetime(2026, 10, 1, tzinfo=UTC)
NOV = datetime(2026, 11, 1, tzinfo=UTC)
USERS = ["alice", "bob", "carol", "dave", "erin"]


@pytest.fixture
def server() -> Iterator[SmtpServer]:
    with SmtpServer() as s:
        yield s


def make_cfg(tmp_path: Path, server: SmtpServer | None, **keys: Any) -> Config:
    keys.setdefault("address_template", "{user}@example.org")
    p = tmp_path / "cocaq.toml"
    p.write_text(mail_toml(server, **keys))
    return load_config(p, environ={})


def report(user: str, start: datetime = OCT, kind: str = "user-monthly", **kw: Any) -> Outgoing:
    end = (start + timedelta(days=32)).replace(day=1)
    return Outgoing(
        kind=kind,
        period_start=start,
        period_end=end,
        subject=kw.pop("subject", f"Your footprint, {start:%B %Y}"),
        text=f"Hello {user}, plain text.",
        html=f'<p>Hello {user}</p><img src="cid:chart">',
        images=[("chart", PNG_1X1)],
        user=user,
        **kw,
    )


def batch(users: list[str] = USERS, start: datetime = OCT) -> list[Outgoing]:
    return [report(u, start) for u in users]


def ledger_rows(engine: Engine) -> dict[str, tuple[str, str | None, str | None]]:
    """recipient -> (status, message_id, error) for every row (`recipient kind period` unless October's
    user-monthly report)."""
    t = SentReport
    with engine.connect() as c:
        rows = c.execute(select(t.recipient, t.status, t.message_id, t.error, t.period_start, t.kind)).all()
    out = {}
    for r in rows:
        key = r.recipient
        if (r.kind, r.period_start) != ("user-monthly", OCT):
            key += f" {r.kind} {r.period_start:%Y-%m-%d}"
        out[key] = (r.status, r.message_id, r.error)
    return out


def add_users(engine: Engine, *rows: dict[str, Any]) -> None:
    with engine.begin() as c:
        for r in rows:
            c.execute(insert(User).values(**r))


def rcpts(server: SmtpServer) -> list[str]:
    return [r for m in server.messages for r in m.rcpt_tos]


def no_sleep(delay: float) -> None:
    pass


# --- sending, exactly once --------------------------------------------------------------------------------


def test_batch_is_sent_recorded_and_parses_back(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    cfg = make_cfg(tmp_path, server, list_unsubscribe="mailto:hpc@example.org?subject=unsubscribe%20{user}")
    s = deliver(engine, cfg, batch())
    assert (s.sent, s.already_sent, s.failed) == (5, 0, 0)
    assert s.line() == (
        f"mail: 5 sent, 0 already sent, 0 opted out, 0 throttled, 0 failed (smtp 127.0.0.1:{server.port} (none))"
    )
    assert rcpts(server) == [f"{u}@example.org" for u in USERS]
    rows = ledger_rows(engine)
    for received in server.messages:
        msg = received.message
        to = msg["To"].addresses[0].addr_spec
        status, mid, error = rows[to]
        assert (status, error) == ("sent", None) and msg["Message-ID"] == mid
        assert msg["From"] == "HPC reports <hpc@example.org>" and received.mail_from == "hpc@example.org"
        assert msg["Subject"] == "Your footprint, October 2026" and msg["Auto-Submitted"] == "auto-generated"
        user = to.split("@")[0]
        assert msg["List-Unsubscribe"] == f"<mailto:hpc@example.org?subject=unsubscribe%20{user}>"
        assert msg.get_body(("plain",)).get_content().strip() == f"Hello {user}, plain text."  # type: ignore[union-attr]
        assert f"<p>Hello {user}</p>" in msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
        (img,) = [p for p in msg.walk() if p["Content-ID"] == "<chart>"]
        assert img.get_content_type() == "image/png" and img.get_content() == PNG_1X1  # type: ignore[attr-defined]
    with engine.connect() as c:
        sent_at = c.execute(select(SentReport.sent_at)).scalars().all()
    assert all(t is not None and t.tzinfo is not None for t in sent_at)


def test_resending_is_a_no_op_and_force_resends(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    cfg = make_cfg(tmp_path, server)
    deliver(engine, cfg, batch())
    first = ledger_rows(engine)
    s = deliver(engine, cfg, batch())
    assert (s.sent, s.already_sent) == (0, 5) and len(server.messages) == 5
    assert ledger_rows(engine) == first
    # Another period (or kind) is another report.
    s = deliver(engine, cfg, [report("alice", NOV), report("alice", OCT, kind="user-weekly")])
    assert s.sent == 2 and len(server.messages) == 7
    s = deliver(engine, cfg, batch(["alice", "bob"]), force=True)
    assert (s.sent, s.already_sent) == (2, 0) and rcpts(server)[-2:] == [
        "alice@example.org",
        "bob@example.org",
    ]
    again = ledger_rows(engine)
    # A forced resend is a new message: a new Message-ID, recorded.
    assert again["alice@example.org"][1] != first["alice@example.org"][1]
    assert server.messages[-2].message["Message-ID"] == again["alice@example.org"][1]
    assert again["carol@example.org"] == first["carol@example.org"]


def test_each_message_is_committed_before_the_next_is_sent(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    """At each send, the ledger (read on another connection) holds this message as `sending` with its
    Message-ID and every earlier one as `sent`."""
    cfg = make_cfg(tmp_path, server)
    inner = make_transport(cfg)
    seen: list[dict[str, tuple[str, str | None, str | None]]] = []

    class Checking:
        def describe(self) -> str:
            return "checking"

        def close(self) -> None:
            inner.close()

        def send(self, msg: EmailMessage, sender: str, to: str) -> str:
            rows = ledger_rows(engine)
            seen.append(rows)
            assert rows[to] == ("sending", msg["Message-ID"], None)
            assert all(st == "sent" for r, (st, _, _) in rows.items() if r != to)
            assert len(rows) == len(seen)
            return inner.send(msg, sender, to)

    transport = Checking()
    s = deliver(engine, cfg, batch(), transport=transport)
    transport.close()
    assert s.sent == 5 and len(seen) == 5


class Crash:
    """A transport that dies at message number `at` (0-based): before it is sent, or just after the server
    accepted it (the window between SMTP acceptance and our commit)."""

    def __init__(
        self, inner: SmtpTransport | Any, at: int, exc: type[BaseException], after_accept: bool
    ) -> None:
        self.inner, self.at, self.exc, self.after_accept = inner, at, exc, after_accept
        self.calls = 0

    def describe(self) -> str:
        return "crashing"

    def close(self) -> None:
        self.inner.close()

    def send(self, msg: EmailMessage, sender: str, to: str) -> str:
        n, self.calls = self.calls, self.calls + 1
        if n == self.at:
            if self.after_accept:
                self.inner.send(msg, sender, to)
            raise self.exc()
        return str(self.inner.send(msg, sender, to))


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_crash_mid_batch_then_rerun_sends_only_the_missing(
    engine: Engine,
    tmp_path: Path,
    server: SmtpServer,
    caplog: pytest.LogCaptureFixture,
    exc: type[BaseException],
) -> None:
    cfg = make_cfg(tmp_path, server)
    crash = Crash(make_transport(cfg), at=2, exc=exc, after_accept=False)
    with pytest.raises(exc):
        deliver(engine, cfg, batch(), transport=crash)
    crash.close()
    assert rcpts(server) == ["alice@example.org", "bob@example.org"]
    rows = ledger_rows(engine)
    assert [rows[f"{u}@example.org"][0] for u in ("alice", "bob", "carol")] == ["sent", "sent", "sending"]
    assert "dave@example.org" not in rows
    caplog.set_level(logging.WARNING, logger="cocaq")
    s = deliver(engine, cfg, batch())
    assert (s.sent, s.already_sent, s.in_doubt) == (3, 2, 1)
    assert "1 in doubt from an interrupted run (sent again with the same Message-ID)" in s.line()
    # Every user got exactly one message: nothing went twice, nothing was lost.
    assert sorted(rcpts(server)) == sorted(f"{u}@example.org" for u in USERS)
    assert {st for st, _, _ in ledger_rows(engine).values()} == {"sent"}
    assert "carol@example.org may have been sent by an interrupted run" in caplog.text
    # The in-doubt message went out under the Message-ID recorded before the crash.
    assert server.recorder.to("carol@example.org")[0]["Message-ID"] == rows["carol@example.org"][1]


def test_crash_after_the_server_accepted_resends_with_the_same_message_id_and_warns(
    engine: Engine, tmp_path: Path, server: SmtpServer, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg(tmp_path, server)
    crash = Crash(make_transport(cfg), at=2, exc=KeyboardInterrupt, after_accept=True)
    with pytest.raises(KeyboardInterrupt):
        deliver(engine, cfg, batch(), transport=crash)
    crash.close()
    assert len(server.messages) == 3 and ledger_rows(engine)["carol@example.org"][0] == "sending"
    caplog.set_level(logging.WARNING, logger="cocaq")
    s = deliver(engine, cfg, batch())
    assert (s.sent, s.already_sent, s.in_doubt) == (3, 2, 1)
    # The one duplicate the crash window allows: announced, and with the same Message-ID so that it can be
    # recognised (and dropped by clients that dedupe).
    copies = server.recorder.to("carol@example.org")
    assert len(copies) == 2 and copies[0]["Message-ID"] == copies[1]["Message-ID"]
    assert "sending it again with the same Message-ID" in caplog.text and "may arrive twice" in caplog.text
    assert len(server.messages) == 6


def test_in_doubt_skip_never_sends_twice(
    engine: Engine, tmp_path: Path, server: SmtpServer, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg(tmp_path, server, in_doubt="skip")
    crash = Crash(make_transport(cfg), at=1, exc=SystemExit, after_accept=True)
    with pytest.raises(SystemExit):
        deliver(engine, cfg, batch(["alice", "bob", "carol"]), transport=crash)
    crash.close()
    caplog.set_level(logging.WARNING, logger="cocaq")
    s = deliver(engine, cfg, batch(["alice", "bob", "carol"]))
    assert (s.sent, s.already_sent, s.in_doubt) == (1, 1, 1)
    assert "1 in doubt from an interrupted run (not sent again)" in s.line()
    assert (
        "bob@example.org may have been sent by an interrupted run" in caplog.text and "--force" in caplog.text
    )
    assert rcpts(server) == ["alice@example.org", "bob@example.org", "carol@example.org"]
    assert Ledger(engine).in_doubt()[0][1] == "bob@example.org"
    s = deliver(engine, cfg, batch(["bob"]), force=True)
    assert s.sent == 1 and Ledger(engine).in_doubt() == []


# --- SMTP errors ----------------------------------------------------------------------------------------


def test_transient_451_is_retried_with_backoff(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    cfg = make_cfg(tmp_path, server, retry_attempts=4, retry_base_delay_s=0.01)
    server.recorder.defer_data = 2  # 451 at DATA, twice
    server.recorder.defer_rcpt["carol@example.org"] = 1  # and 451 at RCPT once for carol
    delays: list[float] = []
    s = deliver(engine, cfg, batch(["alice", "bob", "carol"]), sleep=delays.append)
    assert (s.sent, s.failed) == (3, 0)
    assert delays == [0.01, 0.02, 0.01]  # exponential per message: 1x, 2x; then carol's first retry
    assert rcpts(server) == ["alice@example.org", "bob@example.org", "carol@example.org"]
    assert {st for st, _, _ in ledger_rows(engine).values()} == {"sent"}


def test_transient_until_the_attempts_run_out_fails_that_message_only(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    cfg = make_cfg(tmp_path, server, retry_attempts=3)
    server.recorder.defer_rcpt["bob@example.org"] = 99
    s = deliver(engine, cfg, batch(["alice", "bob", "carol"]), sleep=no_sleep)
    assert (s.sent, s.failed) == (2, 1)
    status, _, error = ledger_rows(engine)["bob@example.org"]
    assert status == "failed" and "451" in str(error) and "gave up after 3 attempts" in str(error)


def test_permanent_550_fails_one_address_and_the_others_go(
    engine: Engine, tmp_path: Path, server: SmtpServer
) -> None:
    cfg = make_cfg(tmp_path, server)
    server.recorder.reject.add("bob@example.org")
    delays: list[float] = []
    s = deliver(engine, cfg, batch(), sleep=delays.append)
    assert (s.sent, s.failed) == (4, 1) and delays == []  # a 5xx is not retried
    assert rcpts(server) == [f"{u}@example.org" for u in USERS if u != "bob"]
    status, mid, error = ledger_rows(engine)["bob@example.org"]
    assert status == "failed" and mid is not None
    assert error is not None and error.startswith("bob@example.org refused by") and "550" in error
    assert "1 failed" in s.line() and s.failures == [("bob@example.org", error)]
    assert s.lines()[1] == f"  failed: bob@example.org: {error}"
    # The next run tries the failed one again (it was not delivered), with its Message-ID.
    server.recorder.reject.clear()
    s = deliver(engine, cfg, batch())
    assert (s.sent, s.already_sent) == (1, 4)
    assert server.recorder.to("bob@example.org")[0]["Message-ID"] == mid


def test_unreachable_server_stops_the_batch(engine: Engine, tmp_path: Path) -> None:
    port = free_port()
    cfg = make_cfg(tmp_path, None, smtp_host="127.0.0.1", smtp_port=port, retry_attempts=2)
    s = deliver(engine, cfg, batch(), sleep=no_sleep)
    assert (s.sent, s.failed, s.not_attempted) == (0, 1, 4)
    assert s.stopped == f"cannot connect to 127.0.0.1:{port}: connection refused (gave up after 2 attempts)"
    assert s.line().endswith("(4 not attempted)")
    assert ledger_rows(engine)["alice@example.org"][0] == "failed" and len(ledger_rows(engine)) == 1
    with SmtpServer() as server:  # the server is back: everything goes, once
        s = deliver(engine, replace(cfg, mail=replace(cfg.mail, smtp_port=server.port)), batch())
        assert s.sent == 5 and len(server.messages) == 5


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
def test_wrong_password_stops_the_batch_and_is_never_logged(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = "S3cr3t-never-logged"
    monkeypatch.setenv("COCAQ_TEST_SMTP_PW", "wrong-" + password)
    caplog.set_level(logging.DEBUG)
    with SmtpServer(login=("cocaq", password)) as server:
        cfg = make_cfg(tmp_path, server, smtp_user="cocaq", smtp_password_env="COCAQ_TEST_SMTP_PW")
        s = deliver(engine, cfg, batch())
        assert server.messages == []
    assert s.stopped is not None and s.stopped.startswith("login as 'cocaq' refused") and s.not_attempted == 4
    error = ledger_rows(engine)["alice@example.org"][2]
    for text in (s.line(), "\n".join(s.lines()), caplog.text, str(error), repr(cfg)):
        assert password not in text


# --- addresses, opt-out, throttle, injection --------------------------------------------------------------


def test_address_sources_and_precedence(
    engine: Engine, tmp_path: Path, server: SmtpServer, caplog: pytest.LogCaptureFixture
) -> None:
    amap = tmp_path / "addresses.csv"
    amap.write_text("alice,alice@lab.example.org\nbob,bob@lab.example.org\ncarol;carol@lab.example.org\n")
    add_users(
        engine,
        {"name": "alice", "email": "Alice.Liddell@Wonderland.example.org", "full_name": "Alice Liddell"},
        {"name": "dave", "email": "not an address"},
        {"name": "erin", "email": None},
    )
    cfg = make_cfg(tmp_path, server, address_map=str(amap))
    caplog.set_level(logging.WARNING, logger="cocaq")
    lab = Outgoing(
        kind="lab-monthly",
        period_start=OCT,
        period_end=NOV,
        subject="l",
        text="t",
        address="PI@Lab.example.org",
    )
    s = deliver(engine, cfg, [*batch(), report("x y"), lab])
    assert rcpts(server) == [
        "Alice.Liddell@wonderland.example.org",  # users.email beats the map
        "bob@lab.example.org",  # the map beats the template
        "carol@example.org",  # carol's map line is malformed: the template
        "erin@example.org",  # users row without email: the template
        "PI@lab.example.org",  # a given address
    ]
    assert server.messages[0].message["To"] == "Alice Liddell <Alice.Liddell@wonderland.example.org>"
    # dave's users.email is broken: not replaced by a guess; "x y" cannot make an address.
    assert (s.sent, s.no_address) == (5, 2) and "2 without an address" in s.line()
    assert s.problems == [f"{amap}: line 3: expected user,address, got 'carol;carol@lab.example.org'"]
    assert "1 bad line(s) in the address/opt-out files" in s.line()
    assert f"{amap}: line 3" in caplog.text and "users.email of 'dave' is not an address" in caplog.text


def test_opt_out_by_column_and_by_file(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    add_users(engine, {"name": "alice", "opted_out": True}, {"name": "bob", "opted_out": False})
    opt = tmp_path / "opt-out.txt"
    opt.write_text("carol\nDAVE@example.org  # by address\n")
    cfg = make_cfg(tmp_path, server, opt_out_file=str(opt))
    s = deliver(engine, cfg, batch())
    assert (s.sent, s.opted_out) == (2, 3) and "3 opted out" in s.line()
    assert rcpts(server) == ["bob@example.org", "erin@example.org"]
    assert set(ledger_rows(engine)) == {"bob@example.org", "erin@example.org"}  # opt-outs leave no row
    s = deliver(engine, cfg, batch(), force=True)  # force does not override an opt-out
    assert (s.sent, s.opted_out) == (2, 3)


def test_throttle_counts_the_last_24_hours(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    cfg = make_cfg(tmp_path, server, max_per_user_per_day=2)
    weeks = [OCT + timedelta(days=7 * i) for i in range(4)]
    s = deliver(engine, cfg, [report("alice", w, kind="user-weekly") for w in weeks] + [report("bob")])
    assert (s.sent, s.throttled) == (3, 2) and "2 throttled" in s.line()
    assert rcpts(server).count("alice@example.org") == 2
    # A day later the held-back ones go (a re-run sends what is missing), still at most 2 a day.
    later = datetime.now(UTC) + timedelta(hours=25)
    s = deliver(engine, cfg, [report("alice", w, kind="user-weekly") for w in weeks], clock=lambda: later)
    assert (s.sent, s.already_sent, s.throttled) == (2, 2, 0)
    # A forced resend of a report does not count against itself; failed rows do not count at all.
    one = replace(cfg, mail=replace(cfg.mail, max_per_user_per_day=1))
    s = deliver(engine, one, [report("bob")], force=True)
    assert s.sent == 1
    assert deliver(engine, one, [report("bob", NOV)]).throttled == 1
    with engine.begin() as c:
        c.execute(update(SentReport).where(SentReport.recipient == "bob@example.org").values(status="failed"))
    assert deliver(engine, one, [report("bob", NOV)]).sent == 1


def test_header_injection_through_a_batch(engine: Engine, tmp_path: Path, server: SmtpServer) -> None:
    add_users(
        engine,
        {"name": "alice", "full_name": "Alice\r\nBcc: evil@example.com", "email": None},
        {"name": "bob", "email": "bob@example.org\r\nBcc: evil@example.com"},
    )
    cfg = make_cfg(tmp_path, server)
    items = [
        report("alice", subject="October\r\nBcc: evil@example.com\r\nX-Injected: 1"),
        report("bob"),
        report("carol\r\nBcc: evil@example.com"),
    ]
    s = deliver(engine, cfg, items)
    assert (s.sent, s.no_address) == (1, 2)
    assert rcpts(server) == ["alice@example.org"]  # and no evil@example.com anywhere in the envelope
    msg = server.messages[0].message
    assert "Bcc" not in msg and "X-Injected" not in msg
    assert msg["Subject"] == "October Bcc: evil@example.com X-Injected: 1"
    assert msg["To"].addresses[0].addr_spec == "alice@example.org"


def test_outbox_batch_is_exactly_once_even_when_in_doubt(engine: Engine, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, None, transport="outbox", outbox_dir=str(tmp_path / "outbox"))
    crash = Crash(make_transport(cfg), at=1, exc=KeyboardInterrupt, after_accept=True)
    with pytest.raises(KeyboardInterrupt):
        deliver(engine, cfg, batch(["alice", "bob", "carol"]), transport=crash)
    s = deliver(engine, cfg, batch(["alice", "bob", "carol"]))
    assert (s.sent, s.already_sent, s.in_doubt) == (
        2,
        1,
        1,
    ) and s.transport == f"outbox {tmp_path / 'outbox'}"
    files = sorted((tmp_path / "outbox").iterdir())
    assert len(files) == 3 and all(f.suffix == ".eml" for f in files)  # bob's file rewritten, not doubled
    mids = {v[1] for v in ledger_rows(engine).values()}
    assert {f.name.removesuffix(".eml") for f in files} == {str(m).strip("<>") for m in mids}


def test_summary_is_one_line_and_a_dict() -> None:
    s = DeliverySummary(sent=3, already_sent=2, opted_out=1, throttled=1, failed=1, transport="outbox /x")
    assert s.line() == "mail: 3 sent, 2 already sent, 1 opted out, 1 throttled, 1 failed (outbox /x)"
    assert str(s) == s.line() and s.as_dict()["sent"] == 3


def test_claims_are_compare_and_set(engine: Engine) -> None:
    """Two runs racing for one report: only one claim wins, on insert and on update."""
    ledger = Ledger(engine)
    now = datetime.now(UTC)
    first = ledger.claim("user-monthly", "a@example.org", OCT, NOV, "<1@x>", now, None)
    assert first is not None
    assert (
        ledger.claim("user-monthly", "a@example.org", OCT, NOV, "<2@x>", now, None) is None
    )  # lost the insert
    seen = ledger.get("user-monthly", "a@example.org", OCT)
    assert seen is not None and (seen.status, seen.message_id) == ("sending", "<1@x>")
    assert ledger.claim("user-monthly", "a@example.org", OCT, NOV, "<3@x>", now, seen) == first
    assert ledger.claim("user-monthly", "a@example.org", OCT, NOV, "<4@x>", now, seen) is None  # row moved on
    ledger.finish(first, "sent", now)
    got = ledger.get("user-monthly", "a@example.org", OCT)
    assert got is not None and (got.status, got.message_id, got.error) == ("sent", "<3@x>", None)
