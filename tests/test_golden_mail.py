"""Golden files: one e-mail of each kind cocaq sends, as sent, so that a template change shows as a diff.

The kinds: a user's monthly report, a lab's, the admins' (`cocaq report send`, reports/batch.py), a job
e-mail (reports/jobmail.py) and an idle-GPU alert (reports/alerts.py), each driven through its sending
entry point into a recording transport, on SQLite, from fixed data at fixed dates (test_report_data's
March 2025; test_job_mail's and test_alerts' 20 November 2026). A message is kept as its headers and each
part's decoded content, with what changes on every send masked: the Date, Message-IDs, MIME boundaries
and Content-IDs (numbered in order), and images (their type only).

After a deliberate change of an e-mail, rewrite the files with `COCAQ_UPDATE_GOLDEN=1 pytest
tests/test_golden_mail.py` and review their diff.
"""

from __future__ import annotations

import difflib
import email
import email.policy
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from cocaq.db import migrate
from cocaq.db.engine import make_engine
from cocaq.db.schema import AggregatorState
from cocaq.reports.alerts import send_idle_alerts
from cocaq.reports.batch import send_month
from cocaq.reports.jobmail import send_job_mail
from tests import test_alerts, test_job_mail
from tests.builders import config_toml
from tests.mailkit import mail_toml
from tests.test_report_data import MONTH, build_month, config

GOLDEN = Path(__file__).parent / "data" / "golden"
UPDATE = "COCAQ_UPDATE_GOLDEN"
KINDS = ("user", "lab", "admin", "job", "alert")
THROUGH = datetime(2025, 4, 2, 6, 0, tzinfo=UTC)


class Recording:
    """A transport that keeps each message (and its envelope recipient) instead of sending it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, EmailMessage]] = []

    def send(self, msg: EmailMessage, sender: str, to: str) -> str:
        self.sent.append((to, msg))
        return "recorded"

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "recording"


def normalised(sent: EmailMessage) -> str:
    """The message as it goes on the wire, parsed back, as a readable text: headers, then each part's
    decoded content; volatile bits masked (and the codecarbon version its intensity source names)."""
    msg = email.message_from_bytes(sent.as_bytes(), policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    seen: dict[str, dict[str, str]] = {"boundary": {}, "cid": {}}

    def mask(kind: str, value: str) -> str:
        names = seen[kind]
        return names.setdefault(value, f"{kind.upper()}-{len(names) + 1}")

    def text(s: str) -> str:
        s = re.sub(r"cid:([^\"'\s>]+)", lambda m: "cid:" + seen["cid"].get(m.group(1), m.group(1)), s)
        return re.sub(r"codecarbon \d+(\.\d+)*", "codecarbon <VERSION>", s)

    # the Content-IDs first, so that the HTML's cid: references read the same names
    for part in msg.walk():
        if part["Content-ID"]:
            mask("cid", str(part["Content-ID"]).strip("<>"))
    out: list[str] = []
    for depth, part in _parts(msg):
        pad = "  " * depth
        out.append(f"{pad}=== {part.get_content_type()}")
        for k, v in part.items():
            v = str(v)
            if k.lower() == "date":
                v = "<DATE>"
            elif k.lower() in ("message-id", "in-reply-to", "references"):
                v = re.sub(r"<[^>]*>", "<MESSAGE-ID>", v)
            elif k.lower() == "content-id":
                v = "<" + mask("cid", v.strip("<>")) + ">"
            v = re.sub(r'boundary="([^"]+)"', lambda m: f'boundary="{mask("boundary", m.group(1))}"', v)
            out.append(f"{pad}{k}: {text(v)}")
        if part.is_multipart():
            continue
        if part.get_content_maintype() == "text":
            out.append("")
            out += [pad + line for line in text(part.get_content()).splitlines()]
        else:
            out.append(f"{pad}<{part.get_content_type()} payload>")
        out.append("")
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"


def _parts(msg: EmailMessage, depth: int = 0) -> Iterator[tuple[int, EmailMessage]]:
    yield depth, msg
    if msg.is_multipart():
        for p in msg.iter_parts():
            yield from _parts(p, depth + 1)  # type: ignore[arg-type]


def _engine(tmp: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp / 'cocaq.sqlite'}")
    migrate.upgrade(engine)
    return engine


def _month_mails(tmp: Path) -> dict[str, EmailMessage]:
    """test_report_data's March 2025 through `cocaq report send`: alice's, lab_a's and the admins' e-mail."""
    engine = _engine(tmp)
    url = engine.url.render_as_string(hide_password=False)
    reports = config_toml(
        base=False,
        reports={"admins": ["admin@example.org"], "lab_heads": {"lab_a": ["head-a@example.org"]}},
    )
    cfg = config(tmp, url, mail_toml(None, address_template="{user}@example.org") + reports)
    build_month(engine, cfg)
    with engine.begin() as c:  # the aggregator last ran on 2 April (not now): "Data through 2 Apr 2025"
        c.execute(update(AggregatorState).where(AggregatorState.name == "jobs").values(watermark=THROUGH))
    rec = Recording()
    send_month(engine, cfg, MONTH, transport=rec)
    engine.dispose()
    got = dict(rec.sent)
    return {
        "user": got["alice@example.org"],
        "lab": got["head-a@example.org"],
        "admin": got["admin@example.org"],
    }


def _job_mail(tmp: Path) -> EmailMessage:
    """test_job_mail's first case: alice asked for job e-mail, her job 7001 ended 40 minutes ago."""
    engine = _engine(tmp)
    cfg = test_job_mail.make_cfg(tmp, engine.url.render_as_string(hide_password=False), None)
    test_job_mail.users(engine, {"name": "alice", "job_email": True})
    test_job_mail.load(engine, cfg, test_job_mail.rec(7001, test_job_mail.NOW - timedelta(minutes=40)))
    rec = Recording()
    send_job_mail(engine, cfg, now=test_job_mail.NOW, window=test_job_mail.WINDOW, transport=rec)
    engine.dispose()
    ((_, msg),) = rec.sent
    return msg


def _alert(tmp: Path) -> EmailMessage:
    """test_alerts' first case: job 8001 on two GPUs, idle for its last three hours."""
    engine = _engine(tmp)
    cfg = test_alerts.make_cfg(tmp, engine.url.render_as_string(hide_password=False), None)
    now = test_alerts.NOW
    start = now - timedelta(hours=4)
    test_alerts.load(engine, cfg, test_alerts.job(8001, start, name="jupyter"))
    idle = test_alerts.idle_from(now - timedelta(hours=3))
    test_alerts.samples(engine, 8001, start, now, {g: idle for g in test_alerts.TWO})
    rec = Recording()
    send_idle_alerts(engine, cfg, now=now, transport=rec)
    engine.dispose()
    ((_, msg),) = rec.sent
    return msg


def rendered(tmp: Path) -> dict[str, str]:
    """Each kind's e-mail, normalised."""
    (tmp / "month").mkdir()
    (tmp / "job").mkdir()
    (tmp / "alert").mkdir()
    msgs = {**_month_mails(tmp / "month"), "job": _job_mail(tmp / "job"), "alert": _alert(tmp / "alert")}
    return {k: normalised(m) for k, m in msgs.items()}


@pytest.fixture(scope="module")
def mails(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return rendered(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("kind", KINDS)
def test_mail_matches_golden_file(mails: dict[str, str], kind: str) -> None:
    path = GOLDEN / f"{kind}.txt"
    got = mails[kind]
    if os.environ.get(UPDATE) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
        return
    assert path.exists(), f"{path} is missing: run `{UPDATE}=1 pytest tests/test_golden_mail.py` to write it"
    want = path.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True), got.splitlines(keepends=True), str(path), "rendered now"
            )
        )
        pytest.fail(
            f"the {kind} e-mail differs from {path}; if the change is meant, rewrite the golden files with "
            f"`{UPDATE}=1 pytest tests/test_golden_mail.py` and review their diff:\n{diff}"
        )
