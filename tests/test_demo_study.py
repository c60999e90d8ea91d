"""`cocaq demo --study`: the larger site over six months, the draw, the planted effect in the samples,
the study's report and the admin report's section (a small site here: the real one takes minutes)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cocaq


def test_the_study_demo_runs_the_study_end_to_end(tmp_path: Path, cli_env: dict[str, str]) -> None:
    import json

    from cocaq.cli.demo_study import run_study_demo
    from cocaq.config_load import load_config

    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    obj = type("Obj", (), {"cfg": load_config(None, environ={"COCAQ_DATABASE_URL": url})})()
    got = run_study_demo(obj, str(tmp_path / "out"), seed=3, effect=0.5, copies=2)
    env = dict(cli_env, COCAQ_CONFIG=got["config"], COCAQ_DATABASE_URL=url)
    status = json.loads(run_cocaq(["study", "status", "-o", "json"], env).out)
    assert status["study"] == f"{got['start']}/seed 3" and status["drawn_at"].startswith(got["start"])
    d = json.loads(run_cocaq(["study", "report", "-o", "json"], env).out)
    assert d["start"] == got["start"] and len(d["months"]) == 3 and d["baseline"][-1] < d["start"]
    assert d["arms"]["hold-out"] == status["arms"]["hold-out"]["users"] >= 3
    assert d["arms"]["emailed"] == status["arms"]["emailed"]["users"] > d["arms"]["hold-out"]
    idle = next(o for o in d["outcomes"] if o["outcome"]["name"] == "idle_gpu_hours_share")
    # a small site: its estimate is there, with its interval, but no interval is asked to exclude zero
    assert (
        idle["did"]["n_emailed"] > 0 and idle["did"]["rel"] is not None and idle["did"]["rel_lo"] is not None
    )
    page = (tmp_path / "out" / "reports" / f"admin-{got['end']}-study.html").read_text()
    assert 'id="study"' in page and "Do the e-mails work?" in page


def test_the_demo_site_shows_the_planted_effect_within_its_interval(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The demo's generator at its real size (162 users, six months, a fixed date so the data is the same on
    every run): e-mailed users' GPUs idle a fifth less of the time from the month after their first
    e-mail. The share of GPU-hours held idle (the outcome the planting cuts by exactly that) shows it:
    nothing in the first study month, -20% inside the interval of each later month, an interval clear of
    zero, in `cocaq study report` and in the admin report's words. (tests/test_study_analysis.py checks the
    coverage over many simulated sites, and the A/A case.)"""
    import json
    from datetime import UTC, datetime

    from cocaq.cli.demo_study import run_study_demo
    from cocaq.config_load import load_config

    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    obj = type("Obj", (), {"cfg": load_config(None, environ={"COCAQ_DATABASE_URL": url})})()
    got = run_study_demo(obj, str(tmp_path / "out"), now=datetime(2026, 11, 27, 12, tzinfo=UTC))
    assert (got["start"], got["effect_from"], got["end"]) == ("2026-08", "2026-09", "2026-10")
    env = dict(cli_env, COCAQ_CONFIG=got["config"], COCAQ_DATABASE_URL=url)
    d = json.loads(run_cocaq(["study", "report", "-o", "json"], env).out)
    assert d["arms"] == {"emailed": 130, "hold-out": 32}
    idle = next(o for o in d["outcomes"] if o["outcome"]["name"] == "idle_gpu_hours_share")
    first, *later = idle["did_by_month"]
    assert first["month"] == "2026-08" and first["rel_lo"] < 0 < first["rel_hi"]  # the e-mail just arrived
    for m in later:
        assert m["rel_lo"] <= -0.2 <= m["rel_hi"] < 0, m
    assert idle["did"]["rel_hi"] < 0 and "lower for e-mailed users" in idle["sentence"]
    mail = (tmp_path / "out" / "reports" / "admin-2026-10-study-email.txt").read_text()
    assert idle["sentence"] in " ".join(mail.split())
    assert f"month by month: {idle['months_text']}" in " ".join(mail.split())
