"""`cocaq report send` (reports/batch.py) on SQLite and PostgreSQL, through a real SMTP server (aiosmtpd).

The month is test_report_data's March 2025 (six users with jobs, two labs, two clusters), built once per
database kind; each test starts from an empty ledger and users table. Messages are counted and parsed
at the server; the ledger is read back from the database.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, insert, select, update

from cocaq.config import Config
from cocaq.db.engine import make_engine
from cocaq.db.schema import JobNotice, SentReport, User
from cocaq.reports import batch
from cocaq.reports.batch import kind_for, send_month
from cocaq.reports.sent_mail import first_reports
from cocaq.reports.transport import make_transport
from cocaq.reports.user_report import users_month
from tests.conftest import migrated_database, run_cocaq
from tests.mailkit import SmtpServer, mail_toml
from tests.test_report_data import MONTH, build_month, config

USERS = ["alice", "bob", "carol", "dave", "erin", "frank"]  # everyone with jobs in March 2025
HEADS = {"lab_a": ["head-a@example.org"], "lab_b": ["head-b@example.org", "deputy-b@example.org"]}
ADMINS = ["admin@example.org"]


@dataclass
class Month:
    engine: Engine
    url: str
    tmp: Path


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def month_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Month]:
    tmp = tmp_path_factory.mktemp(f"send-{request.param}")
    url = migrated_database(request.param, tmp, request)
    engine = make_engine(url)
    build_month(engine, config(tmp, url))
    yield Month(engine, url, tmp)
    engine.dispose()


@pytest.fixture
def db(month_db: Month) -> Iterator[Month]:
    yield month_db
    with month_db.engine.begin() as c:
        for t in (SentReport, JobNotice, User):
            c.execute(delete(t))


@pytest.fixture
def server() -> Iterator[SmtpServer]:
    with SmtpServer() as s:
        yield s


def reports_toml(archive: Path | None = None) -> str:
    heads = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in HEADS.items())
    out = f'[reports]\nadmins = ["{ADMINS[0]}"]\n'
    if archive is not None:
        archive.mkdir(parents=True, exist_ok=True)
        out += f'archive_dir = "{archive}"\n'
    return out + "[reports.lab_heads]\n" + heads + "\n"


def make_cfg(
    db: Month, tmp_path: Path, server: SmtpServer | None, archive: Path | None = None, **mail: Any
) -> Config:
    mail.setdefault("address_template", "{user}@example.org")
    return config(tmp_path, db.url, mail_toml(server, **mail) + reports_toml(archive))


def by_rcpt(server: SmtpServer) -> dict[str, list[EmailMessage]]:
    out: dict[str, list[EmailMessage]] = {}
    for m in server.messages:
        for r in m.rcpt_tos:
            out.setdefault(r, []).append(m.message)
    return out


def ledger(engine: Engine) -> list[tuple[str, str, str | None, str]]:
    t = SentReport
    with engine.connect() as c:
        rows = c.execute(select(t.kind, t.recipient, t.user_name, t.status).order_by(t.kind, t.recipient))
        return [tuple(r) for r in rows]  # type: ignore[misc]


def text_of(msg: EmailMessage) -> str:
    return msg.get_body(("plain",)).get_content()  # type: ignore[union-attr,no-any-return]


def check_images(msg: EmailMessage) -> int:
    """Every `cid:` the HTML shows is an inline PNG part of the message; how many."""
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    cids = re.findall(r"cid:([A-Za-z0-9._-]+)", html)
    for cid in cids:
        (img,) = [p for p in msg.walk() if p["Content-ID"] == f"<{cid}>"]
        assert img.get_content_type() == "image/png" and img.get_content().startswith(b"\x89PNG")  # type: ignore[attr-defined]
    return len(set(cids))


# --- the whole month, exactly once ---------------------------------------------------------------------------


def test_month_sent_once_and_parsed_back(db: Month, tmp_path: Path, server: SmtpServer) -> None:
    cfg = make_cfg(db, tmp_path, server)
    s = send_month(db.engine, cfg, MONTH)
    assert s.status == "ok" and s.stopped is None
    users, labs, admin = (s.sections[k].delivery for k in ("users", "labs", "admin"))
    assert (users.sent, labs.sent, admin.sent) == (6, 3, 1), s.line()
    assert s.line().startswith("report send 2025-03: users: 6 sent, 0 already sent, 0 failed; labs: 3 sent")
    got = by_rcpt(server)
    assert sorted(got) == sorted(
        [f"{u}@example.org" for u in USERS] + HEADS["lab_a"] + HEADS["lab_b"] + ADMINS
    )
    assert all(len(v) == 1 for v in got.values())
    with db.engine.connect() as c:
        months = users_month(c, cfg, MONTH)
    for u in USERS:
        (msg,) = got[f"{u}@example.org"]
        assert msg["From"] == "HPC reports <hpc@example.org>" and msg["Auto-Submitted"] == "auto-generated"
        assert "2025" in msg["Subject"] or "March" in msg["Subject"], msg["Subject"]
        text = text_of(msg)
        kwh = months[u].totals.energy_kwh
        assert any(f in text for f in numbers(kwh)), (u, kwh, text[:600])
        assert check_images(msg) >= 1
    (lab_b,) = got["head-b@example.org"]
    assert "lab_b" in lab_b["Subject"] + text_of(lab_b)
    (adm,) = got["admin@example.org"]
    assert "interactive report" in text_of(adm) and "archive_dir" in text_of(adm)
    rows = ledger(db.engine)
    assert ("user-monthly", "alice@example.org", "alice", "sent") in rows
    assert ("lab:lab_b", "deputy-b@example.org", None, "sent") in rows
    assert ("admin-monthly", "admin@example.org", None, "sent") in rows
    assert len(rows) == 10 and all(r[3] == "sent" for r in rows)
    with db.engine.connect() as c:
        first = first_reports(c)
    assert sorted(first) == USERS and all(t.tzinfo is not None for t in first.values())


def numbers(x: float) -> list[str]:
    """The ways a report may print a kWh figure."""
    out = {f"{x:,.0f}", f"{x:,.1f}", f"{x:,.2f}", f"{x:.0f}", f"{x:.1f}", f"{x:.2f}", f"{x:,.3g}", f"{x:.3g}"}
    return sorted(out)


def test_rerun_is_a_no_op_and_renders_nothing(
    db: Month, tmp_path: Path, server: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_cfg(db, tmp_path, server)
    send_month(db.engine, cfg, MONTH)
    before = ledger(db.engine)
    import cocaq.reports.render as render

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("a re-run rendered a report")

    for name in ("render_user_month", "render_lab_month", "render_admin_email", "render_admin_html"):
        monkeypatch.setattr(render, name, boom)
    s = send_month(db.engine, cfg, MONTH)
    assert s.line().startswith(
        "report send 2025-03: users: 0 sent, 6 already sent, 0 failed; labs: 0 sent, 3 already sent"
    ), s.line()
    assert len(server.messages) == 10 and ledger(db.engine) == before
    monkeypatch.undo()
    # --force sends again (new Message-IDs), only what is asked for.
    s = send_month(db.engine, cfg, MONTH, force=True, only=["admin"])
    assert s.sections["admin"].delivery.sent == 1 and not s.sections["users"].ran
    assert len(server.messages) == 11


@pytest.mark.parametrize("after_accept", [False, True])
def test_crash_mid_batch_then_rerun_sends_only_the_missing(
    db: Month, tmp_path: Path, server: SmtpServer, monkeypatch: pytest.MonkeyPatch, after_accept: bool
) -> None:
    monkeypatch.setattr(batch, "CHUNK", 2)  # the crash lands in the second chunk
    cfg = make_cfg(db, tmp_path, server)
    inner = make_transport(cfg)

    class Crash:
        calls = 0

        def describe(self) -> str:
            return "crashing"

        def close(self) -> None:
            inner.close()

        def send(self, msg: EmailMessage, sender: str, to: str) -> str:
            self.calls += 1
            if self.calls == 4:
                if after_accept:
                    inner.send(msg, sender, to)
                raise KeyboardInterrupt
            return inner.send(msg, sender, to)

    with pytest.raises(KeyboardInterrupt):
        send_month(db.engine, cfg, MONTH, transport=Crash())
    inner.close()
    assert len(server.messages) == 3 + after_accept
    statuses = sorted(r[3] for r in ledger(db.engine))
    assert statuses == ["sending", "sent", "sent", "sent"]
    s = send_month(db.engine, cfg, MONTH)
    users = s.sections["users"].delivery
    assert (users.sent, users.already_sent, users.in_doubt) == (3, 3, 1), s.line()
    got = by_rcpt(server)
    # Each user once; the one in doubt twice only if the server had taken it before the crash (the
    # default [mail] in_doubt = "resend"), then with the same Message-ID.
    dupes = {r: v for r, v in got.items() if len(v) > 1}
    if after_accept:
        ((_, (a, b)),) = dupes.items()
        assert a["Message-ID"] == b["Message-ID"]
    else:
        assert dupes == {}
    assert sorted(got) == sorted(
        [f"{u}@example.org" for u in USERS] + HEADS["lab_a"] + HEADS["lab_b"] + ADMINS
    )
    assert all(r[3] == "sent" for r in ledger(db.engine))
    assert send_month(db.engine, cfg, MONTH).sections["users"].delivery.sent == 0


def test_worker_processes_render_the_same_messages(
    db: Month, tmp_path: Path, server: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large batches are rendered by worker processes: the same messages, in the same order."""
    cfg = make_cfg(db, tmp_path, server)
    send_month(db.engine, cfg, MONTH, only=["users"])
    here = [(m.rcpt_tos, text_of(m.message)) for m in server.messages]
    monkeypatch.setattr(batch, "PARALLEL_MIN", 1)
    monkeypatch.setattr(batch, "AHEAD", 2)
    monkeypatch.setattr(batch.os, "cpu_count", lambda: 3)
    assert batch.render_workers(6) == 2
    s = send_month(db.engine, cfg, MONTH, only=["users"], force=True)
    assert s.sections["users"].delivery.sent == 6
    assert [(m.rcpt_tos, text_of(m.message)) for m in server.messages[6:]] == here


def test_preferences_and_opt_outs(db: Month, tmp_path: Path, server: SmtpServer) -> None:
    optout = tmp_path / "opt-out.txt"
    optout.write_text("# asked on 2025-02-11\nerin\n")
    cfg = make_cfg(db, tmp_path, server, opt_out_file=str(optout))
    with db.engine.begin() as c:
        for row in (
            {"name": "bob", "opted_out": True},
            {"name": "carol", "monthly_email": False},
            {"name": "dave", "email": "dave@lab.example.org"},
            {"name": "frank", "email": "not an address"},
        ):
            c.execute(insert(User).values(**row))
    s = send_month(db.engine, cfg, MONTH, only=["users"])
    assert s.sections["users"].words(False) == (
        "users: 2 sent, 0 already sent, 2 opted out, 1 monthly e-mail off, 1 without an address, 0 failed"
    )
    assert sorted(by_rcpt(server)) == ["alice@example.org", "dave@lab.example.org"]
    assert "labs: not asked for" in s.line()
    # Turned back on: the next run sends carol's, and only hers.
    with db.engine.begin() as c:
        c.execute(update(User).where(User.name == "carol").values(monthly_email=True))
    s = send_month(db.engine, cfg, MONTH, only=["users"])
    assert s.sections["users"].delivery.sent == 1 and len(server.messages) == 3


def test_dry_run_and_cluster(db: Month, tmp_path: Path, server: SmtpServer) -> None:
    cfg = make_cfg(db, tmp_path, server)
    s = send_month(db.engine, cfg, MONTH, dry_run=True)
    assert s.line() == (
        "report send 2025-03 (dry run: nothing sent): users: 6 to send, 0 already sent; "
        "labs: 3 to send, 0 already sent; admin: 1 to send, 0 already sent"
    )
    assert server.messages == [] and ledger(db.engine) == []
    # One cluster's reports are not the whole site's: their own ledger kind.
    s = send_month(db.engine, cfg, MONTH, cluster="d", only=["users"])
    assert s.sections["users"].delivery.sent == 2  # alice and frank ran on d
    assert {r[0] for r in ledger(db.engine)} == {kind_for("user-monthly", "d")} == {"user-monthly@d"}
    s = send_month(db.engine, cfg, MONTH, only=["users"])
    assert s.sections["users"].delivery.sent == 6


def test_admin_html_archived(
    db: Month, tmp_path: Path, server: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "archive"
    cfg = make_cfg(db, tmp_path, server, archive=archive)
    s = send_month(db.engine, cfg, MONTH, only=["admin"])
    path = archive / "admin-2025-03.html"
    assert s.archive == str(path) and path.read_text().lstrip().lower().startswith("<!doctype html")
    (msg,) = by_rcpt(server)["admin@example.org"]
    assert str(path) in text_of(msg) and str(path) in msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    # Sent and archived: a re-run computes nothing. With the file gone, it is written again, not sent.
    import cocaq.reports.render as render

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("recomputed")

    with monkeypatch.context() as mp:
        mp.setattr(render, "render_admin_html", boom)
        assert send_month(db.engine, cfg, MONTH, only=["admin"]).sections["admin"].delivery.already_sent == 1
    path.unlink()
    s = send_month(db.engine, cfg, MONTH, only=["admin"])
    assert path.exists() and s.sections["admin"].delivery.sent == 0 and len(server.messages) == 1


def test_server_down_stops_then_rerun_sends_all(db: Month, tmp_path: Path) -> None:
    from tests.mailkit import free_port

    cfg = make_cfg(db, tmp_path, None, smtp_host="127.0.0.1", smtp_port=free_port(), retry_attempts=2)
    s = send_month(db.engine, cfg, MONTH)
    assert s.status == "error" and "stopped:" in s.line()
    assert s.sections["users"].delivery.not_attempted == 5 and s.sections["labs"].delivery.not_attempted == 3
    with SmtpServer() as server:
        cfg = make_cfg(db, tmp_path, server)
        s = send_month(db.engine, cfg, MONTH)
        assert s.status == "ok" and s.sections["users"].delivery.sent == 6, s.line()
        assert len(server.messages) == 10


# --- the command ---------------------------------------------------------------------------------------------


def test_cli(db: Month, tmp_path: Path, server: SmtpServer, cli_env: dict[str, str]) -> None:
    p = tmp_path / "cocaq.toml"
    make_cfg(db, tmp_path, server)  # writes tmp_path/c.toml
    p.write_text((tmp_path / "c.toml").read_text())
    env = dict(cli_env, COCAQ_CONFIG=str(p))
    r = run_cocaq(["report", "send", "--month", "2025-03", "--only", "users", "--dry-run"], env)
    assert r.code == 0 and r.err.startswith(
        "report send 2025-03 (dry run: nothing sent): users: 6 to send"
    ), r.err
    r = run_cocaq(["report", "send", "--month", "2025-03"], env)
    assert r.code == 0 and r.err.count("\n") == 1, r.err
    assert r.err.startswith("report send 2025-03: users: 6 sent"), r.err
    r = run_cocaq(["report", "send", "--month", "2025-03"], env)
    assert r.code == 0 and "users: 0 sent, 6 already sent" in r.err and len(server.messages) == 10
    r = run_cocaq(["report", "send", "--month", "March"], env)
    assert r.code == 2 and "expected a month like" in r.err and "Traceback" not in r.err


# --- the files it writes hold everyone's names and figures: never wider than 0640 -----------------------------


def _cocaq_umask(args: list[str], env: dict[str, str], umask: int) -> Any:
    """`python -m cocaq ARGS` as run_cocaq does, under `umask` (a cron job's or an admin's shell's)."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "cocaq", *args], env=env, capture_output=True, text=True, timeout=300,
        check=False, umask=umask,
    )  # fmt: skip


def _modes(root: Path) -> dict[str, int]:
    import stat

    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
def test_archive_and_out_files_are_0640_at_most_whatever_the_umask(
    db: Month, tmp_path: Path, server: SmtpServer, cli_env: dict[str, str], umask: int
) -> None:
    archive = tmp_path / "archive"
    make_cfg(db, tmp_path, server, archive=archive)
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "c.toml"))
    old = archive / "admin-2025-03.html"
    old.write_text("an archive written before, 0644")
    old.chmod(0o644)
    r = _cocaq_umask(["report", "send", "--month", "2025-03", "--only", "admin", "--force"], env, umask)
    assert r.returncode == 0 and "admin: 1 sent" in r.stderr, r.stderr
    f, d = 0o640 & ~umask, 0o750 & ~umask
    assert _modes(archive) == {"admin-2025-03.html": f}  # replaced (no temp file left), and narrowed
    out = tmp_path / "out" / "deeper"  # created by --out, parents too
    for args in (["admin"], ["user", "alice"], ["lab", "lab_a"]):
        r = _cocaq_umask(["report", *args, "--month", "2025-03", "--out", str(out)], env, umask)
        assert r.returncode == 0, r.stderr
    got = _modes(tmp_path / "out")
    assert got.pop("deeper") == d
    assert len(got) == 7 and set(got.values()) == {f}, got  # admin page + 3 x (.html, .eml)
    assert _modes(tmp_path)["out"] == d
