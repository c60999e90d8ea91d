"""The study's report from the database: the panel from the daily rollups, the arms from study_arms, and
the admin report's section (text, e-mail HTML and the interactive page), on both databases."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.db.schema import SentReport, StudyArm
from tests.builders import config
from tests.builders import job as _job

STUDY = {"start": "2026-09", "seed": 7, "holdout_share": 0.2, "bootstrap": 300}


def _site(engine: Engine, tmp_path: Path, users: int = 30):  # type: ignore[no-untyped-def]
    """`users` users with a GPU job a week from June to October 2026 (e-mailed users' jobs a fifth shorter
    from September: less energy, less CO2), a fifth of them held out; aggregated."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = config(tmp_path, url, cluster={"carbon_zone": "FR", "pue": 1.2}, study=STUDY)
    rng = random.Random(3)
    held = {f"u{i:02d}" for i in range(0, users, 5)}
    jobs, raw = [], 1
    for i in range(users):
        user = f"u{i:02d}"
        size = rng.uniform(1.0, 4.0)
        t = datetime(2026, 6, 1, 3, tzinfo=UTC) + timedelta(hours=i)
        while t < datetime(2026, 10, 28, tzinfo=UTC):
            hours = size * rng.uniform(0.8, 1.2) * (0.8 if t.month >= 9 and user not in held else 1.0)
            jobs.append(_job(raw, t, hours, user=user, gpus=2, account=f"lab{i % 3}"))
            raw += 1
            t += timedelta(days=7)
    import_records(engine, jobs, cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    with engine.begin() as c:
        c.execute(
            insert(StudyArm),
            [
                {"study": f"{cfg.study.start}/seed {cfg.study.seed}", "user_name": f"u{i:02d}", "arm": "hold-out" if f"u{i:02d}" in held else "emailed",
                 "stratum": 1 + i % 4, "gpu_hours_before": 0.0, "draw": i / users,
                 "assigned_at": datetime(2026, 9, 1, tzinfo=UTC)}
                for i in range(users)
            ],
        )  # fmt: skip
        # the ledger of the senders: the report of August delivered to the e-mailed users on 1 September,
        # held back from the hold-out (where each user's study months start: the day after)
        key = f"{cfg.study.start}/seed {cfg.study.seed}"
        c.execute(
            insert(SentReport),
            [
                {"kind": "user-monthly", "recipient": f"u{i:02d}@example.org", "user_name": f"u{i:02d}",
                 "period_start": datetime(2026, 8, 1, tzinfo=UTC), "period_end": datetime(2026, 9, 1, tzinfo=UTC),
                 "sent_at": datetime(2026, 9, 1, 6, tzinfo=UTC),
                 "status": "skipped" if f"u{i:02d}" in held else "sent",
                 "error": f"study hold-out ({key})" if f"u{i:02d}" in held else None}
                for i in range(users)
            ],
        )  # fmt: skip
    return cfg


def test_the_report_reads_the_rollups_and_the_arms(engine: Engine, tmp_path: Path) -> None:
    from cocaq.study.analysis import study_report

    cfg = _site(engine, tmp_path)
    with engine.connect() as c:
        rep = study_report(c, cfg, datetime(2026, 10, 20, tzinfo=UTC))
    assert rep.study == "2026-09/seed 7" and rep.baseline == ("2026-06", "2026-07", "2026-08")
    assert rep.months == ("2026-09", "2026-10") and rep.arms == {"emailed": 24, "hold-out": 6}
    co2 = next(r for r in rep.outcomes if r.outcome.name == "co2_per_user")
    # the e-mailed users' jobs got a fifth shorter: their CO2 fell against the hold-out's, relative to
    # each one's baseline
    assert co2.did.rel is not None and co2.did.rel == pytest.approx(-0.2, abs=0.08)
    assert co2.did.n_emailed == 24 and co2.did.n_holdout == 6
    # no samples: no idle energy to compare, and the report says so rather than inventing a figure
    idle = next(r for r in rep.outcomes if r.outcome.name == "idle_gpu_energy_share")
    assert idle.did.rel is None and idle.sentence.endswith("not enough data to compare the arms yet.")


def test_the_admin_report_has_the_study_section(engine: Engine, tmp_path: Path) -> None:
    from markupsafe import escape

    from cocaq.reports import render
    from cocaq.reports.admin_report import admin_month

    cfg = _site(engine, tmp_path)
    with engine.connect() as c:
        m = admin_month(c, cfg, datetime(2026, 10, 1, tzinfo=UTC))
        before = admin_month(c, cfg, datetime(2026, 8, 1, tzinfo=UTC))
    assert before.study is None  # not begun
    assert m.study is not None and m.study.months == ("2026-09", "2026-10")
    mail = render.render_admin_email(m, cfg)
    assert "DO THE E-MAILS WORK? THE STUDY 2026-09/seed 7" in mail.text
    assert "6 held out, 24 e-mailed" in mail.text
    co2 = next(r for r in m.study.outcomes if r.outcome.name == "co2_per_user")
    # (their jobs a fifth shorter from 1 September; their study months from 2 September, the day after the
    # report of August reached them)
    assert co2.sentence in mail.text and "18% lower for e-mailed users" in co2.sentence
    assert co2.months_text.startswith("2026-09: ") and f"month by month: {co2.months_text}" in mail.text
    said = str(escape(co2.sentence))  # (as the HTML templates escape it)
    assert 'id="study"' in mail.html and said in mail.html
    assert said in render.render_admin_html(m, cfg)


def test_cocaq_study_report_through_the_cli(engine: Engine, tmp_path: Path, cli_env: dict[str, str]) -> None:
    import json

    from tests.conftest import run_cocaq

    _site(engine, tmp_path)
    env = dict(cli_env, COCAQ_CONFIG=str(tmp_path / "c.toml"))
    r = run_cocaq(["study", "report", "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["study"] == "2026-09/seed 7" and d["arms"] == {"emailed": 24, "hold-out": 6}
    names = [o["outcome"]["name"] for o in d["outcomes"]]
    # the primary outcome first, then the secondary ones in their order, each Holm-corrected
    assert (
        d["primary"] == "idle_gpu_hours_share"
        and [o["primary"] for o in d["outcomes"]] == [True] + [False] * 5
    )
    assert names[:3] == ["idle_gpu_hours_share", "idle_gpu_energy_share", "failed_kwh_per_user"]
    assert d["outcomes"][0]["p_holm"] is None and all(o["p_holm"] is not None for o in d["outcomes"][4:])
    assert "first whole UTC day after the study first reached them" in d["counting"]
    assert d["unreached"] == {"emailed": 0, "hold-out": 0}
    co2 = d["outcomes"][names.index("co2_per_user")]
    assert co2["did"]["n_emailed"] == 24 and [m["month"] for m in co2["by_month"]] == d["months"]
    assert [m["month"] for m in co2["did_by_month"]] == d["months"]  # each month against the baseline
    assert all(m["rel"] is not None and m["rel_lo"] <= m["rel"] <= m["rel_hi"] for m in co2["did_by_month"])
    t = run_cocaq(["study", "report"], dict(env, COLUMNS="100"))
    assert t.code == 0 and "change from baseline" in t.out and co2["sentence"][:40] in " ".join(t.out.split())
    assert "2026-09 vs baseline" in t.out and "2026-10 vs baseline" in t.out
    # an arm's change from its baseline is signed; a share's is in percentage points, not a relative %
    co2_rows = t.out[t.out.index("CO2 per user and month (kg") :].splitlines()
    row = next(line for line in co2_rows if line.startswith("change from baseline"))
    assert re.search(r"│ +[+-][\d.,]+ │ +[+-][\d.,]+ │", row), row
    from cocaq.cli.study_report import _change

    assert (_change(-0.61, "%"), _change(0.0, "%"), _change(1.5, "kg"), _change(None, "%")) == (
        "-0.6 pt", "+0.0 pt", "+1.5", "-",
    )  # fmt: skip
    narrow = run_cocaq(["study", "report"], dict(env, COLUMNS="60"))
    assert narrow.code == 0 and max(len(line) for line in narrow.out.splitlines()) <= 60
    none = run_cocaq(["study", "report"], dict(cli_env))  # no [study]: one line
    assert none.code != 0 and "no study configured" in none.err and len(none.err.strip().splitlines()) == 1
