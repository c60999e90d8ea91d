"""Idle-GPU alerts while a job runs (reports/idle_jobs.py, reports/alerts.py), on SQLite and PostgreSQL,
through a real SMTP server.

Running jobs are imported as `cocaq import sacct` writes them and the collector's samples are written as
it ships them (every 60 s here, `[collector] interval_s = 60`); the pass's "now" is passed in. Messages
are counted and parsed at the server (aiosmtpd).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select

from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.schema import Cluster, Job, JobAlert, Sample, SentReport, User
from cocaq.reports import alerts, idle_jobs
from cocaq.reports.alerts import send_idle_alerts
from cocaq.slurm.record import JobRecord
from tests import builders
from tests.builders import config
from tests.conftest import run_cocaq
from tests.mailkit import SmtpServer, free_port, mail_toml

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
STEP = 60  # seconds between samples


@pytest.fixture
def server() -> Iterator[SmtpServer]:
    with SmtpServer() as s:
        yield s


def make_cfg(tmp_path: Path, url: str, server: SmtpServer | None, extra: str = "", **mail: Any) -> Config:
    """Cluster c in FRA, samples every 60 s, idle below 5 % for 60 min, one alert a day; `extra` TOML after
    the [alerts] table (one of its own replaces it); `mail`: [mail] keys (to `server`, if one)."""
    mail.setdefault("address_template", "{user}@example.org")
    return config(
        tmp_path, url, extra + mail_toml(server, **mail), name="cocaq.toml",
        cluster={"carbon_zone": "FRA", "pue": 1.2}, collector={"interval_s": 60},
        aggregate={"idle_gpu_util_pct": 5}, reports={"site_name": "HAL", "contact": "hpc-support@example.org"},
        alerts=None if "[alerts]" in extra else {"idle_minutes": 60, "throttle_hours": 24},
    )  # fmt: skip


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


@pytest.fixture
def setup(engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer) -> tuple[Engine, Config]:
    return engine, make_cfg(tmp_path, db_url, server)


def job(
    raw: int,
    start: datetime,
    *,
    user: str = "alice",
    gpus: int = 2,
    name: str | None = None,
    partition: str = "gpu",
    end: datetime | None = None,
) -> JobRecord:
    """A job as sacct shows it: running since `start`, or ended at `end`; on n[1-2], a one-day limit."""
    return builders.job(
        raw, start, ((end or NOW) - start).total_seconds() / 3600, user=user, account="lab_a",
        partition=partition, gpus=gpus, cpus=8, running=end is None, end=end, cpu_s=None,
        queued=timedelta(minutes=1), node_list="n[1-2]", n_nodes=2, name=name or f"train-{raw}",
        time_limit_s=24 * 3600,
    )  # fmt: skip


def load(engine: Engine, cfg: Config, *records: JobRecord) -> None:
    import_records(engine, list(records), cfg, source="sacct-json")


Reading = Callable[[datetime], tuple[float, float]]  # time -> (power W, utilisation %)


def samples(
    engine: Engine,
    raw: int,
    start: datetime,
    end: datetime,
    gpus: dict[tuple[str, str], Reading],
    *,
    skip: tuple[datetime, datetime] | None = None,
) -> None:
    """The collector's nvml samples of the job, every STEP seconds from `start` to `end` (both included),
    per (node, GPU); none within `skip`. A GPU is one job's at a time: its device is named GPU-RAW."""
    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "c")).scalar_one()
        rows = []
        n = int((end - start).total_seconds() // STEP)
        for (node, dev), reading in gpus.items():
            for i in range(n + 1):
                ts = start + timedelta(seconds=STEP * i)
                if skip is not None and skip[0] < ts < skip[1]:
                    continue
                p, u = reading(ts)
                base = {"ts": ts, "cluster_id": cid, "node": node, "source": "nvml",
                        "device": f"{dev}-{raw}", "job_id": str(raw)}  # fmt: skip
                rows.append({**base, "metric": "power_w", "value": p})
                rows.append({**base, "metric": "util_pct", "value": u})
                rows.append({**base, "metric": "mem_used_mb", "value": 1000.0})
        for i in range(0, len(rows), 5000):
            c.execute(insert(Sample), rows[i : i + 5000])


def idle_from(t0: datetime, power: float = 60.0, busy: float = 80.0, idle_util: float = 0.0) -> Reading:
    """Busy (250 W) before t0, idle (`power`, `idle_util`%) from t0 on."""
    return lambda ts: (250.0, busy) if ts < t0 else (power, idle_util)


def const(power: float, util: float) -> Reading:
    return lambda ts: (power, util)


TWO = (("n1", "GPU-aaaa1111"), ("n2", "GPU-bbbb2222"))


def users(engine: Engine, *rows: dict[str, Any]) -> None:
    with engine.begin() as c:
        for r in rows:
            c.execute(insert(User).values(**r))


def bound(engine: Engine) -> dict[int, tuple[str, datetime]]:
    """job raw id -> (user, alerted_at) of the idle alerts bound."""
    with engine.connect() as c:
        rows = c.execute(
            select(Job.job_id_raw, JobAlert.user_name, JobAlert.alerted_at)
            .join(Job, Job.id == JobAlert.job_pk)
            .where(JobAlert.kind == "idle-gpu")
        ).all()
    return {int(r[0]): (r[1], r[2]) for r in rows}


def text_of(msg: EmailMessage) -> str:
    return msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]


def html_of(msg: EmailMessage) -> str:
    return msg.get_body(("html",)).get_content()  # type: ignore[union-attr]


def run(engine: Engine, cfg: Config, now: datetime = NOW, **kw: Any) -> alerts.AlertSummary:
    return send_idle_alerts(engine, cfg, now=now, **kw)


# --- which jobs -----------------------------------------------------------------------------------------


def test_idle_job_alerted_once_with_what_it_cost(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    start = NOW - timedelta(hours=4)
    load(engine, cfg, job(8001, start, name="jupyter"))
    samples(engine, 8001, start, NOW, {g: idle_from(NOW - timedelta(hours=3)) for g in TWO})
    s = run(engine, cfg)
    assert (s.idle_jobs, s.new, s.open, s.status) == (1, 1, 1, "ok"), s.line()
    assert s.delivery is not None and s.delivery.sent == 1
    (m,) = server.messages
    msg = m.message
    assert m.rcpt_tos == ["alice@example.org"]
    assert (
        msg["Subject"].strip()
        == "[HAL] Job 8001 (jupyter): 2 GPUs idle for 3 h - scancel 8001 if you are done"
    )
    text, html = text_of(msg), html_of(msg)
    for body in (text, html):
        assert "scancel 8001" in body and "for 3 h" in body and "since the job started" not in body
        assert "360 Wh" in body, body  # 2 GPUs x 60 W x 3 h, the streak read back past the window
        assert "n1" in body and "n2" in body and "GPU-aaaa1111" in body
        assert "notebook" in body  # "jupyter" is an interactive name: release it, not debug it
        assert "unsubscribe" in body and "hpc-support@example.org" in body
    a = s.alerts[0]
    assert a.idle_s == 3 * 3600 and not a.at_least and a.interactive and a.nodes == ("n1", "n2")
    with engine.connect() as c:
        pue, g = c.execute(select(Job.pue, Job.carbon_g_per_kwh).where(Job.job_id_raw == 8001)).one()
    assert g and a.co2_kg == pytest.approx(0.36 * pue * g / 1000)  # at the job's own intensity and PUE
    with engine.connect() as c:
        row = c.execute(select(SentReport.kind, SentReport.user_name, SentReport.status)).one()
        (detail,) = c.execute(select(JobAlert.detail)).scalars()
    assert tuple(row) == ("idle-gpu", "alice", "sent")
    assert detail["energy_j"] == pytest.approx(0.36 * 3.6e6) and len(detail["devices"]) == 2
    # Again, and later while it still idles: never a second alert about the job.
    later = NOW + timedelta(minutes=30)
    samples(engine, 8001, NOW + timedelta(seconds=STEP), later, {g: const(60.0, 0.0) for g in TWO})
    for t in (NOW, later):
        s = run(engine, cfg, t)
        assert (s.idle_jobs, s.new, s.open) == (0, 0, 0), s.line()
    assert len(server.messages) == 1 and list(bound(engine)) == [8001]


def test_batch_job_gets_the_check_your_code_sentence(
    setup: tuple[Engine, Config], server: SmtpServer
) -> None:
    engine, cfg = setup
    start = NOW - timedelta(minutes=90)
    load(engine, cfg, job(8002, start, gpus=1))
    samples(engine, 8002, start + timedelta(minutes=1), NOW, {TWO[0]: const(55.0, 1.0)})
    s = run(engine, cfg)
    assert s.new == 1, s.line()
    a = s.alerts[0]
    assert a.from_job_start and not a.interactive and a.gpus == 1
    body = text_of(server.messages[0].message)
    assert "uses the GPUs" in body and "since the job started" in body and "notebook" not in body
    assert (
        server.messages[0]
        .message["Subject"]
        .strip()
        .startswith("[HAL] Job 8002 (train-8002): 1 GPU idle for 89 min")
    )


def test_not_alerted(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    """One busy GPU of two; idle for less than idle_minutes; samples that stopped long ago; a finished
    job; a gap in the samples that leaves too short a streak after it; fewer GPUs sampled than allocated."""
    engine, cfg = setup
    start = NOW - timedelta(hours=4)
    load(
        engine,
        cfg,
        job(8101, start),
        job(8102, start),
        job(8103, start),
        job(8104, start, end=NOW - timedelta(minutes=5)),
        job(8105, start),
        job(8106, start, gpus=3),
    )
    samples(engine, 8101, start, NOW, {TWO[0]: const(60.0, 0.0), TWO[1]: const(250.0, 50.0)})
    samples(engine, 8102, start, NOW, {g: idle_from(NOW - timedelta(minutes=40)) for g in TWO})
    samples(engine, 8103, start, NOW - timedelta(hours=1), {g: const(60.0, 0.0) for g in TWO})
    samples(engine, 8104, start, NOW - timedelta(minutes=5), {g: const(60.0, 0.0) for g in TWO})
    gap = (NOW - timedelta(minutes=50), NOW - timedelta(minutes=30))  # 20 min without samples
    samples(engine, 8105, start, NOW, {g: const(60.0, 0.0) for g in TWO}, skip=gap)
    samples(engine, 8106, start, NOW, {g: const(60.0, 0.0) for g in TWO})
    s = run(engine, cfg)
    assert (s.idle_jobs, s.new) == (0, 0), s.line()
    assert server.messages == [] and bound(engine) == {}
    # Its samples stopped an hour ago: not now; once they come again (still idle), it is.
    samples(
        engine, 8103, NOW - timedelta(minutes=59), NOW + timedelta(minutes=10), {g: const(60, 0) for g in TWO}
    )
    s = run(engine, cfg, NOW + timedelta(minutes=10))
    assert s.new == 1 and list(bound(engine)) == [8103], s.line()


@pytest.mark.parametrize(
    ("util", "idle_min", "alerted"),
    [
        (4.99, 60, True),
        (5.0, 60, False),  # at the threshold is not idle (as the aggregator counts it)
        (0.0, 61, True),
        (0.0, 60, True),  # a streak of exactly idle_minutes is enough
        (0.0, 59, False),
    ],
)
def test_edges(
    setup: tuple[Engine, Config], server: SmtpServer, util: float, idle_min: int, alerted: bool
) -> None:
    engine, cfg = setup
    start = NOW - timedelta(hours=3)
    load(engine, cfg, job(8201, start))
    t0 = NOW - timedelta(minutes=idle_min)  # the first idle sample; the one before is busy
    samples(engine, 8201, start, NOW, {g: idle_from(t0, idle_util=util) for g in TWO})
    s = run(engine, cfg)
    assert (s.new, len(server.messages)) == ((1, 1) if alerted else (0, 0)), s.line()
    if alerted:
        assert s.alerts[0].idle_s == idle_min * 60 and s.alerts[0].start == t0


def test_min_gpus(engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer) -> None:
    cfg = make_cfg(tmp_path, db_url, server, "[alerts]\nmin_gpus = 2\n")
    start = NOW - timedelta(hours=2)
    load(engine, cfg, job(8301, start, gpus=1), job(8302, start, gpus=2))
    samples(engine, 8301, start, NOW, {TWO[0]: const(60.0, 0.0)})
    samples(engine, 8302, start, NOW, {g: const(60.0, 0.0) for g in TWO})
    s = run(engine, cfg)
    assert s.new == 1 and list(bound(engine)) == [8302]


# --- who gets one, and how often ------------------------------------------------------------------------


def test_throttle_one_per_user_then_the_next(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    start = NOW - timedelta(hours=5)
    end = NOW + timedelta(hours=25)
    load(engine, cfg, job(8401, start), job(8402, start, gpus=1), job(8403, start, user="bob", gpus=1))
    samples(engine, 8401, start, end, {g: idle_from(NOW - timedelta(hours=2)) for g in TWO})
    samples(engine, 8402, start, end, {TWO[0]: idle_from(NOW - timedelta(hours=4))})
    samples(engine, 8403, start, end, {TWO[1]: idle_from(NOW - timedelta(hours=2))})
    s = run(engine, cfg)
    # alice's job with the most idle GPU time in the window the pass reads (2 GPUs against 1) goes first.
    assert (s.idle_jobs, s.new, s.throttled) == (3, 2, 1), s.line()
    assert sorted(bound(engine)) == [8401, 8403]
    assert "1 throttled" in s.line()
    # An hour later: alice's other job still waits.
    s = run(engine, cfg, NOW + timedelta(hours=1))
    assert (s.idle_jobs, s.new, s.throttled) == (1, 0, 1), s.line()
    # After throttle_hours it goes, saying how long it really idled (read back past the pass's window).
    t = NOW + timedelta(hours=24, minutes=5)
    s = run(engine, cfg, t)
    assert (s.new, s.throttled) == (1, 0), s.line()
    (a,) = s.alerts
    assert a.job_id == "8402" and a.start == NOW - timedelta(hours=4) and a.last == t
    msgs = [m.message for m in server.messages]
    assert [m["Subject"].strip().split(":")[0] for m in msgs] == ["[HAL] Job 8401 (train-8401)", "[HAL] Job 8403 (train-8403)", "[HAL] Job 8402 (train-8402)"]  # fmt: skip
    assert "28 h" in msgs[-1]["Subject"]


def test_no_throttle_each_job_its_own_alert(
    engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer
) -> None:
    """`throttle_hours = 0`: every idle job of a user is alerted on, each with its own ledger key."""
    cfg = make_cfg(tmp_path, db_url, server, "[alerts]\nthrottle_hours = 0\n")
    start = NOW - timedelta(hours=2)
    load(engine, cfg, job(8451, start), job(8452, start))
    for raw in (8451, 8452):
        samples(engine, raw, start, NOW, {g: const(60.0, 0.0) for g in TWO})
    s = run(engine, cfg)
    assert (s.new, s.throttled, s.delivery.sent if s.delivery else 0) == (2, 0, 2), s.line()
    keys = bound(engine)
    assert sorted(keys) == [8451, 8452] and keys[8451][1] != keys[8452][1]
    assert len(server.messages) == 2


def test_opted_out_users_get_none(engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer) -> None:
    optout = tmp_path / "opt-out.txt"
    optout.write_text("carol\n")
    cfg = make_cfg(tmp_path, db_url, server, opt_out_file=str(optout))
    users(engine, {"name": "alice", "opted_out": True})
    start = NOW - timedelta(hours=2)
    load(engine, cfg, job(8501, start), job(8502, start, user="carol"), job(8503, start, user="dave"))
    for raw in (8501, 8502, 8503):
        samples(engine, raw, start, NOW, {g: const(60.0, 0.0) for g in TWO})
    s = run(engine, cfg)
    assert (s.idle_jobs, s.opted_out, s.new) == (3, 2, 1), s.line()
    assert [m.rcpt_tos for m in server.messages] == [["dave@example.org"]]
    assert list(bound(engine)) == [8503]


def test_switched_off(engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer) -> None:
    cfg = make_cfg(tmp_path, db_url, server, "[alerts]\nidle_gpu = false\n")
    start = NOW - timedelta(hours=2)
    load(engine, cfg, job(8601, start))
    samples(engine, 8601, start, NOW, {g: const(60.0, 0.0) for g in TWO})
    s = run(engine, cfg)
    assert (s.status, s.new, s.line()) == (
        "skipped",
        0,
        "idle-GPU alerts are off ([alerts] idle_gpu = false)",
    )
    assert server.messages == [] and bound(engine) == {}


def test_dry_run_records_and_sends_nothing(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    start = NOW - timedelta(hours=2)
    load(engine, cfg, job(8701, start))
    samples(engine, 8701, start, NOW, {g: const(60.0, 0.0) for g in TWO})
    s = run(engine, cfg, dry_run=True)
    assert (s.new, s.idle_jobs) == (1, 1) and "dry run" in s.line()
    assert s.lines()[0].startswith(
        "would alert alice: job 8701 (train-8701): 2 GPUs on n1, n2 idle for 2.0 h"
    )
    assert server.messages == [] and bound(engine) == {}
    with engine.connect() as c:
        assert c.execute(select(SentReport)).all() == []
    assert run(engine, cfg).new == 1 and len(server.messages) == 1


def test_unsent_alert_goes_with_the_next_run(
    engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer
) -> None:
    down = make_cfg(tmp_path, db_url, None, smtp_host="127.0.0.1", smtp_port=free_port(), retry_attempts=1)
    start = NOW - timedelta(hours=2)
    load(engine, down, job(8801, start))
    samples(engine, 8801, start, NOW + timedelta(minutes=5), {g: const(60.0, 0.0) for g in TWO})
    s = run(engine, down)
    assert s.new == 1 and s.status == "error" and s.delivery is not None and s.delivery.failed == 1
    cfg = make_cfg(tmp_path, db_url, server)
    s = run(engine, cfg, NOW + timedelta(minutes=5))
    assert (s.new, s.open, s.idle_jobs) == (0, 1, 0), s.line()
    assert s.delivery is not None and s.delivery.sent == 1
    (m,) = server.messages
    assert "2 h" in m.message["Subject"]  # what it said when it was bound
    assert run(engine, cfg, NOW + timedelta(minutes=10)).open == 0


# --- races -----------------------------------------------------------------------------------------------


def test_a_racing_run_binds_first_and_the_other_backs_off(
    setup: tuple[Engine, Config], server: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between this run's search and its bind, another run binds and sends the same job's alert: the
    primary key stops this one, which sends nothing."""
    engine, cfg = setup
    start = NOW - timedelta(hours=2)
    load(engine, cfg, job(8901, start))
    samples(engine, 8901, start, NOW, {g: const(60.0, 0.0) for g in TWO})
    real_bind = alerts._bind
    other: list[alerts.AlertSummary] = []

    def bind_after_the_other(*a: Any, **k: Any) -> Any:
        if not other:
            monkeypatch.setattr(alerts, "_bind", real_bind)
            other.append(run(engine, cfg))
            monkeypatch.setattr(alerts, "_bind", bind_after_the_other)
        return real_bind(*a, **k)

    monkeypatch.setattr(alerts, "_bind", bind_after_the_other)
    s = run(engine, cfg)
    assert other[0].new == 1 and (s.new, s.raced, s.open) == (0, 1, 0), s.line()
    assert "1 left to a concurrent run" in s.line()
    assert len(server.messages) == 1 and list(bound(engine)) == [8901]


def test_two_concurrent_runs_send_one_alert(setup: tuple[Engine, Config], server: SmtpServer) -> None:
    engine, cfg = setup
    start = NOW - timedelta(hours=2)
    load(engine, cfg, job(9001, start), job(9002, start))
    for raw in (9001, 9002):
        samples(engine, raw, start, NOW, {g: const(60.0, 0.0) for g in TWO})
    barrier = threading.Barrier(2)
    results: list[alerts.AlertSummary] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            barrier.wait(10)
            results.append(run(engine, cfg))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(results) == 2
    # One alert for alice (the throttle), whichever run bound it; the other run found it or backed off.
    assert sum(r.new for r in results) == 1, [r.line() for r in results]
    assert len(server.messages) == 1 and len(bound(engine)) == 1


# --- the command -------------------------------------------------------------------------------------------


def test_cli(
    engine: Engine, db_url: str, tmp_path: Path, server: SmtpServer, cli_env: dict[str, str]
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    cfg = make_cfg(tmp_path, db_url, server)
    start = now - timedelta(hours=2)
    load(engine, cfg, job(9101, start))
    samples(engine, 9101, start, now, {g: const(60.0, 0.0) for g in TWO})
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "cocaq.toml"))
    r = run_cocaq(["report", "alerts", "--dry-run"], env)
    assert r.code == 0, r.err
    assert r.out.startswith("would alert alice: job 9101 (train-9101): 2 GPUs on n1, n2 idle for"), r.out
    assert r.err.startswith("idle-GPU alerts (dry run): 1 new alert(s)"), r.err
    assert server.messages == []
    r = run_cocaq(["report", "alerts", "-M", "c"], env)
    assert r.code == 0 and r.out.startswith("alert alice: job 9101") and "1 sent" in r.err, r.err
    r = run_cocaq(["report", "alerts"], env)
    assert r.code == 0 and r.out == "" and r.err.startswith("idle-GPU alerts: 0 new, 0 to send"), r.err
    r = run_cocaq(["report", "alerts", "-M", "nope"], env)
    assert r.code != 0 and "no cluster named 'nope'" in r.err and "Traceback" not in r.err
    assert len(server.messages) == 1
    assert re.search(r"scancel 9101\b", text_of(server.messages[0].message))


# --- the message -----------------------------------------------------------------------------------------


def test_names_from_users_are_text_and_the_html_is_mail_safe(tmp_path: Path) -> None:
    from cocaq.reports.render import render_idle_alert

    cfg = make_cfg(tmp_path, f"sqlite:///{tmp_path / 'x.sqlite'}", None)
    evil = "<script>alert(1)</script>\x1b[31m\r\nBcc: x@example.org"
    a = idle_jobs.IdleAlert(
        pk=1, job_id="410466_7", name=evil, user='"><img src=x onerror=alert(1)>', cluster="c",
        partition="interactive-gpu", account=None, gpus=2,
        devices=(("gpu-01", "<b>GPU-1</b>"), ("gpu-02", "GPU-2")), start=NOW - timedelta(days=3),
        last=NOW, at_least=True, from_job_start=False, energy_kwh=12.5, co2_kg=None, threshold_pct=5.0,
        interactive=True, job_start=NOW - timedelta(days=4), time_limit_h=None,
    )  # fmt: skip
    r = render_idle_alert(a, cfg)
    assert "\n" not in r.subject and "\r" not in r.subject and "\x1b" not in r.subject
    assert r.subject.startswith("[HAL] Job 410466_7 (<script>alert(1)</script> [31m Bcc: x@e…): 2 GPUs")
    assert r.subject.endswith(": 2 GPUs idle for 3 days - scancel 410466_7 if you are done"), r.subject
    h = r.html
    assert "<script" not in h.lower() and "<img src=x" not in h and "<b>GPU-1" not in h
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in h and "&lt;b&gt;GPU-1&lt;/b&gt;" in h
    assert not re.search(r"\b(src|href|background)\s*=\s*[\"']", h, re.I)  # no image, no link at all
    assert '<meta name="viewport"' in h and "max-width:600px" in h
    assert "at least 3 days" in h and "12.5 kWh" in h and "CO2 not known yet" in h
    assert "<script>alert(1)</script>" in r.text and "\x1b" not in r.text and "\r" not in r.text
    assert "&lt;" not in r.text and "scancel 410466_7" in r.text and "notebook" in r.text
