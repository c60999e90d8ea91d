"""`cocaq demo --study`: the larger site over six months, built month by month with the study's e-mails
sent by the real sender to an outbox, the draw, the planted effect in the samples from each e-mailed
user's first delivered e-mail, the study's report and the admin report's section (a small site here:
the real one takes minutes)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.conftest import run_cocaq


def check_ledger(url: str, got: dict[str, Any], seed: int) -> dict[str, datetime]:
    """What the demo's e-mails left, as a real site's: in `sent_reports` each e-mailed user's delivered
    monthly report and each held-out user's skipped one, for every month whose report went during the
    study (the month before the start to the one before the end: sent at 06:00 on the next month's
    1st), and everyone's for the end month (sent after the study); one .eml in the outbox for each
    message delivered; first_contacts a time for every user with jobs in the month before the start;
    and the effect planted in exactly the jobs an e-mailed user started from their first delivered
    e-mail on. Returns first_contacts."""
    from email import message_from_bytes

    from sqlalchemy import select

    from cocaq.config_load import load_config
    from cocaq.db.coltypes import as_utc
    from cocaq.db.engine import make_engine
    from cocaq.db.schema import Job, SentReport, StudyArm
    from cocaq.study.analysis import add_months
    from cocaq.study.assign import EMAILED, HOLDOUT, first_contacts, hold_out_reason, month_start
    from cocaq.study.assign import window as study_window

    engine = make_engine(url)
    key = f"{got['start']}/seed {seed}"
    reason = hold_out_reason(key)
    S = SentReport
    with engine.connect() as c:
        q_arms = select(StudyArm.user_name, StudyArm.arm).where(StudyArm.study == key)
        arms = {str(u): str(a) for u, a in c.execute(q_arms)}
        rows = c.execute(select(S.kind, S.user_name, S.period_start, S.status, S.error, S.sent_at)).all()
        q = select(Job.user_name, Job.job_id_raw, Job.start_time)
        jobs = [(str(u), int(r), as_utc(t)) for u, r, t in c.execute(q)]
        cfg = load_config(got["config"], environ={})
        first = first_contacts(c, cfg.study, key)
    assert len(arms) == sum(got["arms"].values()) and set(arms.values()) == {EMAILED, HOLDOUT}
    started: dict[str, set[str]] = defaultdict(set)  # month -> users with a job started in it
    for u, _, t in jobs:
        started[f"{t:%Y-%m}"].add(u)
    months = [add_months(got["start"], k) for k in range(-1, 3)]
    assert months[-1] == got["end"]
    user_rows: dict[str, dict[str, tuple[str, str | None, datetime]]] = defaultdict(dict)
    for kind, u, p0, status, error, at in rows:
        if kind == "user-monthly":
            p = f"{as_utc(p0):%Y-%m}"
            assert u not in user_rows[p], (p, u)
            user_rows[p][u] = (status, error, as_utc(at))
    assert sorted(user_rows) == months
    for p in months:
        went = month_start(p, 1) + timedelta(hours=6)  # the scheduler's run on the next month's 1st
        during = p != got["end"]
        assert started[p] <= set(user_rows[p]), p  # everyone with a job started in the month had one
        for u, (status, error, at) in user_rows[p].items():
            assert at == went, (p, u, at)
            if during and arms[u] == HOLDOUT:
                assert (status, error) == ("skipped", reason), (p, u)
            else:
                assert (status, error) == ("sent", None), (p, u)
    held = {u for u, a in arms.items() if a == HOLDOUT}
    during_study = [(u, st) for p in months[:-1] for u, (st, _, _) in user_rows[p].items()]
    assert all(st == "skipped" for u, st in during_study if u in held)
    assert any(u in held for u, _ in during_study)
    # the outbox: one .eml per message delivered, users', lab heads' and admins' alike
    outbox = Path(got["outbox"])
    emls = sorted(outbox.glob("*.eml"))
    sent = [r for r in rows if r.status == "sent"]
    assert len(emls) == len(sent) > 0
    kinds = {r.kind for r in sent}
    assert {"user-monthly", "admin-monthly"} <= kinds and any(k.startswith("lab:") for k in kinds)
    msg = message_from_bytes(emls[0].read_bytes())
    assert msg["To"] and msg["Message-ID"]
    # first contacts: everyone with jobs in the month before the start, as the study began
    opening = month_start(got["start"]) + timedelta(hours=6)
    before = started[months[0]]
    assert before and before <= set(first), sorted(before - set(first))
    assert all(first[u] == opening for u in before)
    w = study_window(cfg.study)
    assert w.end is not None and all(w.start <= t < w.end for t in first.values())
    # the planted effect: exactly the jobs an e-mailed user started from their first delivered e-mail on
    want = {r for u, r, t in jobs if arms.get(u) == EMAILED and u in first and t >= first[u]}
    assert want and got["planted"] == want
    assert got["first_delivery"] == min(t for u, t in first.items() if arms[u] == EMAILED).isoformat()
    return first


def test_the_study_demo_runs_the_study_end_to_end(tmp_path: Path, cli_env: dict[str, str]) -> None:
    import json

    from cocaq.cli.demo import run_study_demo
    from cocaq.config_load import load_config

    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    obj = type("Obj", (), {"cfg": load_config(None, environ={"COCAQ_DATABASE_URL": url})})()
    got = run_study_demo(obj, str(tmp_path / "out"), seed=3, effect=0.5, copies=2)
    check_ledger(url, got, 3)
    env = dict(cli_env, COCAQ_CONFIG=got["config"], COCAQ_DATABASE_URL=url)
    status = json.loads(run_cocaq(["study", "status", "-o", "json"], env).out)
    assert status["study"] == f"{got['start']}/seed 3" and status["drawn_at"].startswith(got["start"])
    d = json.loads(run_cocaq(["study", "report", "-o", "json"], env).out)
    assert d["start"] == got["start"] and len(d["months"]) == 3 and d["baseline"][-1] < d["start"]
    assert d["arms"]["hold-out"] == status["arms"]["hold-out"]["users"] >= 3
    assert d["arms"]["emailed"] == status["arms"]["emailed"]["users"] > d["arms"]["hold-out"]
    idle = next(o for o in d["outcomes"] if o["outcome"]["name"] == "idle_gpu_hours_share")
    # a small site: its estimate is there, with its interval (in percentage points where so few users
    # bound no relative one), but no interval is asked to exclude zero
    assert (
        idle["did"]["n_emailed"] > 0
        and idle["did"]["diff"] is not None
        and idle["did"]["diff_lo"] is not None
    )
    page = (tmp_path / "out" / "reports" / f"admin-{got['end']}-study.html").read_text()
    assert 'id="study"' in page and "Do the e-mails work?" in page
    # built again in the same database and directory: the same study, the same e-mails, no more
    again = run_study_demo(obj, str(tmp_path / "out"), seed=3, effect=0.5, copies=2)
    assert again["planted"] == got["planted"]
    check_ledger(url, again, 3)


def test_the_demo_site_shows_the_planted_effect_within_its_interval(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The demo's generator at its real size (162 users, six months, a fixed date so the data is the same on
    every run): the study's e-mails sent month by month to the outbox, and e-mailed users' GPUs idle a
    fifth less of the time in the jobs they started from their first delivered e-mail (all 130 have jobs
    in the month before the study, so theirs went as it began, on 2026-08-01 at 06:00). The ledger and
    the outbox hold what a real site's would (check_ledger). The share of GPU-hours held idle (the outcome
    the planting cuts by exactly that) shows it: -20% inside the interval of the months after the first,
    an interval clear of zero, in `cocaq study report` and in the admin report's words.
    (tests/test_study_analysis.py checks the coverage over many simulated sites, and the A/A case.)"""
    import json
    from datetime import UTC

    from cocaq.cli.demo import run_study_demo
    from cocaq.config_load import load_config

    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    obj = type("Obj", (), {"cfg": load_config(None, environ={"COCAQ_DATABASE_URL": url})})()
    got = run_study_demo(obj, str(tmp_path / "out"), now=datetime(2026, 11, 27, 12, tzinfo=UTC))
    assert (got["start"], got["end"]) == ("2026-08", "2026-10")
    assert got["first_delivery"] == "2026-08-01T06:00:00+00:00"
    assert got["arms"] == {"emailed": 130, "hold-out": 32}
    first = check_ledger(url, got, 42)
    assert len(first) == 162  # every user had jobs in July: all reached as the study began
    # the ledger's monthly user reports: 2026-07 to 2026-09 held back from the 32 (sent to the 130), and
    # 2026-10 (after the end) to all 162; one .eml for each, and the labs' and the admins'
    emls = len(list(Path(got["outbox"]).glob("*.eml")))
    assert emls == 3 * 130 + 162 + 4 * (2 + 1)
    env = dict(cli_env, COCAQ_CONFIG=got["config"], COCAQ_DATABASE_URL=url)
    d = json.loads(run_cocaq(["study", "report", "-o", "json"], env).out)
    assert d["arms"] == {"emailed": 130, "hold-out": 32}
    idle = next(o for o in d["outcomes"] if o["outcome"]["name"] == "idle_gpu_hours_share")
    # each user's study months from the day after their first e-mail (2 August for all here): every month
    # shows the cut, and the headline (the primary outcome, by re-randomisation) holds the planted -20%
    # with an interval clear of zero
    assert [m["month"] for m in idle["did_by_month"]] == ["2026-08", "2026-09", "2026-10"]
    months = idle["did_by_month"]
    assert all(m["rel_hi"] < 0 for m in months), months  # (each month's bootstrap interval: approximate)
    assert sum(m["rel_lo"] <= -0.2 <= m["rel_hi"] for m in months) >= 2, months
    assert idle["primary"] and idle["did"]["method"] == "randomisation"
    assert idle["did"]["rel_lo"] <= -0.2 <= idle["did"]["rel_hi"] < 0, idle["did"]
    assert idle["did"]["rel_hi"] < 0 and "lower for e-mailed users" in idle["sentence"]
    mail = (tmp_path / "out" / "reports" / "admin-2026-10-study-email.txt").read_text()
    assert idle["sentence"] in " ".join(mail.split())
    assert f"month by month: {idle['months_text']}" in " ".join(mail.split())
