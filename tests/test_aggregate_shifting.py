"""When to run, for what already ran: the aggregator's per-job shifting figures and their daily sums
(cocaq.accounting.shifting), on both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, select, text

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.db.schema import CarbonIntensity, DailyRollup
from tests.builders import config
from tests.builders import job as _job
from tests.test_aggregate import _series as hourly_series

DAY0 = datetime(2026, 10, 5, tzinfo=UTC)
_cfg = partial(config, cluster={"carbon_zone": "FR", "pue": 1.2})


def _series(engine: Engine, start: datetime, values: list[float], zone: str = "FR") -> None:
    """An hourly series from `start` (tests.test_aggregate's writer, the zone last)."""
    hourly_series(engine, zone, start, values)


def _shift(engine: Engine, raw: int) -> dict[str, Any]:
    with engine.connect() as c:
        row = c.execute(
            text(
                "SELECT j.co2_g, m.shift_state, m.shift_slack_s, m.shift_now_g, m.shift_best_g, m.shift_best_start,"
                " m.shift_pause_g, m.shift_saved_g, m.shift_pause_saved_g"
                " FROM jobs j JOIN job_metrics m ON m.job_pk = j.id WHERE j.job_id_raw = :r"
            ),
            {"r": raw},
        ).one()
    d = dict(row._mapping)
    if d["shift_best_start"] is not None and isinstance(d["shift_best_start"], str):  # SQLite's text
        d["shift_best_start"] = datetime.fromisoformat(d["shift_best_start"])
    if d["shift_best_start"] is not None and d["shift_best_start"].tzinfo is None:
        d["shift_best_start"] = d["shift_best_start"].replace(tzinfo=UTC)
    return d


def _day_sums(engine: Engine) -> tuple[float, float, float, float]:
    r = DailyRollup.__table__.c
    with engine.connect() as c:
        row = c.execute(
            select(
                *(
                    text(f"coalesce(sum({k}), 0)")
                    for k in ("co2_g", "shift_co2_g", "shift_saved_g", "shift_pause_saved_g")
                )
            ).select_from(DailyRollup.__table__)
        ).one()
    assert r is not None
    return tuple(float(x) for x in row)  # type: ignore[return-value]


def test_one_cheap_hour_within_the_slack(engine: Engine, tmp_path: Path) -> None:
    """A 2 h job at 10:00 on a flat 100 g/kWh day with one 20 g/kWh hour at 15:00: its best start is
    14:00 or 15:00 (one cheap hour either way: the earlier wins), 60 g/kWh; pausing gets 20 and 100."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    day = [100.0] * 48
    day[15] = 20.0
    _series(engine, DAY0, day)
    import_records(engine, [_job(1, DAY0 + timedelta(hours=10), 2.0)], cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    s = _shift(engine, 1)
    assert s["shift_state"] == "ok" and s["shift_slack_s"] == 86400.0  # no time limit: the site's 24 h
    assert s["shift_now_g"] == pytest.approx(100.0)
    assert s["shift_best_g"] == pytest.approx(60.0)
    assert s["shift_best_start"] == DAY0 + timedelta(hours=14)
    assert s["shift_pause_g"] == pytest.approx(60.0)  # the cheap hour and one at 100
    assert s["shift_saved_g"] == pytest.approx(s["co2_g"] * 0.4)
    assert s["shift_pause_saved_g"] == pytest.approx(s["co2_g"] * 0.4)
    co2, shift_co2, saved, pause = _day_sums(engine)
    assert shift_co2 == pytest.approx(co2) and saved == pytest.approx(co2 * 0.4)
    assert pause == pytest.approx(co2 * 0.4)


def test_slack_is_never_beyond_the_time_limit_and_pausing_beats_waiting(
    engine: Engine, tmp_path: Path
) -> None:
    """Cheap hours at 12:00 and 14:00 (not adjacent). A 2 h job at 10:00 with a 3 h time limit may start
    until 13:00: its best contiguous run holds one cheap hour (60 g/kWh), first from 11:00; pausing takes
    12:00 and 14:00, both inside [10:00, 10:00 + 3 h + 2 h]."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    day = [100.0] * 48
    day[12] = day[14] = 20.0
    day[20] = 0.0  # cheaper still, but beyond what the job's limit lets it wait
    _series(engine, DAY0, day)
    import_records(
        engine, [_job(2, DAY0 + timedelta(hours=10), 2.0, time_limit_s=3 * 3600.0)], cfg, source="sacct-json"
    )
    run_aggregate(engine, cfg)
    s = _shift(engine, 2)
    assert s["shift_state"] == "ok" and s["shift_slack_s"] == 3 * 3600.0
    assert s["shift_best_g"] == pytest.approx(60.0) and s["shift_best_start"] == DAY0 + timedelta(hours=11)
    assert s["shift_pause_g"] == pytest.approx(20.0)
    assert s["shift_pause_saved_g"] == pytest.approx(s["co2_g"] * 0.8)


def test_who_gets_no_figures_and_why(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url, "[partitions.other]\ncarbon_zone = 'DE'\n")
    _series(engine, DAY0, [100.0] * 48)
    t = DAY0 + timedelta(hours=2)
    import_records(
        engine,
        [
            _job(3, t, 1.0, name="jupyter"),  # an interactive session cannot wait
            _job(4, t, 1.0, running=True),
            _job(5, t, 0.0),  # never ran
            _job(6, t, 1.0, partition="other"),  # its zone has no hourly series
            _job(7, DAY0 + timedelta(hours=30), 1.0),  # its window runs past the series' end
        ],
        cfg,
        source="sacct-json",
    )
    run_aggregate(engine, cfg)
    states = {raw: _shift(engine, raw)["shift_state"] for raw in (3, 4, 5, 6, 7)}
    assert states == {3: "interactive", 4: "running", 5: "no-run", 6: "no-series", 7: "pending"}
    assert all(_shift(engine, raw)["shift_saved_g"] == 0.0 for raw in states)
    co2, shift_co2, saved, _ = _day_sums(engine)
    assert co2 > 0 and shift_co2 == 0.0 and saved == 0.0


def test_pending_jobs_get_figures_when_the_series_reaches_their_window(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cocaq.accounting import aggregate

    monkeypatch.setattr(aggregate, "MARGIN", timedelta(0))  # (runs re-derive what changed just before them)
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url, "[partitions.other]\ncarbon_zone = 'DE'\n")
    _series(engine, DAY0, [100.0] * 24)
    _series(engine, DAY0, [100.0] * 24, zone="DE")
    jobs = [
        _job(8, DAY0 + timedelta(hours=20), 1.0),
        _job(18, DAY0 + timedelta(hours=20), 1.0, partition="other"),
    ]
    import_records(engine, jobs, cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    assert _shift(engine, 8)["shift_state"] == _shift(engine, 18)["shift_state"] == "pending"
    assert run_aggregate(engine, cfg).jobs == 0  # nothing new: not derived again for nothing
    _series(engine, DAY0 + timedelta(hours=24), [100.0] * 10 + [50.0] + [100.0] * 13)  # FR's next day arrives
    res = run_aggregate(engine, cfg)
    assert res.jobs == 1  # the FR job only: DE got no new hours
    assert _shift(engine, 18)["shift_state"] == "pending"
    s = _shift(engine, 8)
    assert s["shift_state"] == "ok" and s["shift_best_start"] == DAY0 + timedelta(hours=34)
    assert s["shift_saved_g"] == pytest.approx(s["co2_g"] * 0.5)
    assert _day_sums(engine)[2] == pytest.approx(s["co2_g"] * 0.5)  # its day was rebuilt with it


def test_changing_the_slack_derives_every_job_again(engine: Engine, tmp_path: Path) -> None:
    url = engine.url.render_as_string(hide_password=False)
    day = [100.0] * 72
    day[20] = 10.0
    _series(engine, DAY0, day)
    cfg = _cfg(tmp_path, url)
    import_records(engine, [_job(9, DAY0 + timedelta(hours=2), 1.0)], cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    assert _shift(engine, 9)["shift_best_g"] == pytest.approx(10.0)
    short = _cfg(tmp_path, url, "[shifting]\nslack_s = '6h'\n", name="short.toml")
    run_aggregate(engine, short)  # an incremental run: the job did not change, the settings did
    s = _shift(engine, 9)
    assert s["shift_slack_s"] == 6 * 3600.0 and s["shift_best_g"] == pytest.approx(100.0)
    assert s["shift_saved_g"] == 0.0 and _day_sums(engine)[2] == 0.0
    none = _cfg(tmp_path, url, "[shifting]\nslack_s = 0\n", name="none.toml")
    run_aggregate(engine, none)
    assert _shift(engine, 9)["shift_state"] == "no-slack"


def test_a_gap_in_the_window_leaves_the_job_pending_not_priced_at_the_annual_figure(
    engine: Engine, tmp_path: Path
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url, "[carbon]\ngap_tolerance_s = 1800\n")
    _series(engine, DAY0, [100.0] * 48)
    with engine.begin() as c:  # six hours missing in the job's window (more than the tolerance fills)
        ci = CarbonIntensity.__table__.c
        c.execute(
            delete(CarbonIntensity).where(
                ci.ts_start >= DAY0 + timedelta(hours=12), ci.ts_start < DAY0 + timedelta(hours=18)
            )
        )
    import_records(engine, [_job(10, DAY0 + timedelta(hours=2), 1.0)], cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    assert _shift(engine, 10)["shift_state"] == "pending"


def test_rollups_in_sql_equal_the_python_ones_with_shifting(engine: Engine, tmp_path: Path) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("the SQL rollups are PostgreSQL's")
    from cocaq.accounting.rollups import DAY, day_floor, rebuild_days

    url = engine.url.render_as_string(hide_password=False)
    cfg = _cfg(tmp_path, url)
    day = [100.0 + 30 * (i % 5) for i in range(24 * 5)]
    _series(engine, DAY0, day)
    jobs = [_job(100 + i, DAY0 + timedelta(hours=3 * i + 0.5), 1.5 + i % 4) for i in range(20)]
    import_records(engine, jobs, cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    cols = [c for c in DailyRollup.__table__.columns if c.name not in ("id", "computed_at")]

    def rows() -> list[tuple[Any, ...]]:
        with engine.connect() as c:
            got = c.execute(select(*cols).order_by(*cols[:5])).all()
        return [tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in got]

    days = {day_floor(DAY0.timestamp()) + k * DAY for k in range(4)}
    with engine.begin() as c:
        rebuild_days(c, days, in_sql=True)
    in_sql = rows()
    with engine.begin() as c:
        rebuild_days(c, days, in_sql=False)
    assert rows() == in_sql
    assert any(r[[c.name for c in cols].index("shift_saved_g")] > 0 for r in in_sql)


def _evenings(engine: Engine, tmp_path: Path, extra: str = "") -> dict[str, str]:
    """A week of a grid that is dear in the evening and clean at night, alice's 2 h jobs every evening at
    18:00 and an interactive session, bob's one small job; aggregated. Returns the CLI's environment."""
    url = engine.url.render_as_string(hide_password=False)
    cfg = config(tmp_path, url, extra, cluster={"carbon_zone": "FR", "pue": 1.2, "timezone": "UTC"})
    hourly = [50.0 if h < 6 else 300.0 if 16 <= h < 22 else 150.0 for h in range(24)]
    _series(engine, DAY0 - timedelta(days=1), hourly * 10)
    jobs = [_job(200 + d, DAY0 + timedelta(days=d, hours=18), 2.0, gpus=4, name="train") for d in range(6)]
    jobs.append(_job(299, DAY0 + timedelta(hours=18), 3.0, name="jupyter"))  # cannot wait
    jobs.append(_job(300, DAY0 + timedelta(hours=18), 0.1, user="bob", gpus=0, cpus=1))  # too little to say
    import_records(engine, jobs, cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    return {"COCAQ_CONFIG": str(tmp_path / "c.toml"), "TZ": "UTC"}


def test_cocaq_user_shows_what_jobs_that_could_wait_would_have_saved(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    import json

    from tests.conftest import run_cocaq

    env = dict(cli_env, **_evenings(engine, tmp_path))
    window = ["-S", "2026-10-05", "-E", "2026-10-12"]
    d = json.loads(run_cocaq(["user", "alice", *window, "-o", "json"], env).out)
    # the batch jobs started at 18:00 (300 g/kWh); best start 00:00 (50 g/kWh) within 24 h: 5/6 less
    assert d["shift_co2_kg"] < d["co2_kg"]  # the notebook's CO2 is not among them
    assert d["shift_saved_kg"] == pytest.approx(d["shift_co2_kg"] * (1 - 50 / 300), rel=1e-6)
    w = d["when_to_run"]
    assert w["id"] == "when-to-run" and w["saving_kg"] == pytest.approx(d["shift_saved_kg"], rel=1e-6)
    assert w["saving_kwh"] is None  # the same energy at other hours
    assert (
        "sbatch --begin=00:00 job.sh" in w["change"]
        and "cocaq carbon when --hours 2 --within 24h" in w["change"]
    )
    assert len(w["job_ids"]) == 6 and "299" not in w["job_ids"]
    assert "would have emitted 83% less starting at 00:00 on Tue (6 h later)" in w["body"], w["body"]
    # the table at 60 columns: the totals row and the suggestion, with its commands whole
    r = run_cocaq(["user", "alice", *window], dict(env, COLUMNS="60"))
    assert r.code == 0, r.err
    assert "could wait" in r.out and "When to run" in r.out and "sbatch --begin=00:00 job.sh" in r.out
    assert max(len(line) for line in r.out.splitlines()) <= 60
    # CSV: the sums among the totals' columns, the suggestion among the advice rows
    out = run_cocaq(["user", "alice", *window, "-o", "csv"], env).out.splitlines()
    head, row = out[0].split(","), out[1].split(",")
    assert float(row[head.index("shift_saved_kg")]) == pytest.approx(d["shift_saved_kg"], rel=1e-5)
    assert any(line.startswith("when-to-run,Start jobs that can wait") for line in out)
    # one job: its own figures, in words
    j = json.loads(run_cocaq(["job", "200", "-o", "json"], env).out)["metrics"]["when_to_run"]
    assert j["state"] == "ok" and j["best_start"].startswith("2026-10-06T00:00")
    assert j["g_per_kwh_as_run"] == pytest.approx(300.0) and j["g_per_kwh_best_start"] == pytest.approx(50.0)
    r = run_cocaq(["job", "200"], dict(env, COLUMNS="200"))
    assert (
        "When to run: started at 2026-10-06 00:00 UTC (6 h later), within 24 h, it would have emitted 83% less"
        in r.out
    ), r.out
    r = run_cocaq(["job", "299"], dict(env, COLUMNS="200"))  # the notebook: nothing to say
    assert r.code == 0 and "When to run" not in r.out
    # bob's job would have saved grams: below the floor, no suggestion (the totals still say it)
    b = json.loads(run_cocaq(["user", "bob", *window, "-o", "json"], env).out)
    assert b["when_to_run"] is None and 0 < b["shift_saved_kg"] < 1.0
    # a lab: the sums, as for its members
    lab = json.loads(run_cocaq(["lab", "lab", *window, "-o", "json"], env).out)
    assert lab["shift_saved_kg"] == pytest.approx(d["shift_saved_kg"] + b["shift_saved_kg"], rel=1e-9)


def test_the_suggestion_needs_a_material_saving(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    import json

    from tests.conftest import run_cocaq

    env = dict(cli_env, **_evenings(engine, tmp_path, "[shifting]\nmin_kg = 1000\n"))
    d = json.loads(
        run_cocaq(["user", "alice", "-S", "2026-10-05", "-E", "2026-10-12", "-o", "json"], env).out
    )
    assert d["shift_saved_kg"] > 0 and d["when_to_run"] is None


def test_the_monthly_email_says_it_with_the_same_numbers_as_cocaq_user(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    import json

    from cocaq.config_load import load_config
    from cocaq.reports import render, user_report
    from cocaq.reports.suggest import suggest_for_user
    from tests.conftest import run_cocaq

    env = dict(cli_env, **_evenings(engine, tmp_path))
    cfg = load_config(env["COCAQ_CONFIG"], environ={})
    with engine.connect() as conn:
        m = user_report.user_month(conn, cfg, "alice", datetime(2026, 10, 1, tzinfo=UTC))
    r = render.render_user_month(m, suggest_for_user(m, cfg), cfg)
    d = json.loads(
        run_cocaq(["user", "alice", "-S", "2026-10-01", "-E", "2026-11-01", "-o", "json"], env).out
    )
    kg = d["when_to_run"]["saving_kg"]
    assert m.totals.shift_saved_kg == pytest.approx(d["shift_saved_kg"], rel=1e-9)
    said = f"{kg:.2f} kg CO2e"  # the e-mails' co2 filter
    assert "WHEN TO RUN" in r.text and f"about {said} less" in r.text, r.text
    assert (
        "sbatch --begin=00:00 job.sh" in r.text
        and "typical wait to the best start (by CO2 saved): 6 h" in r.text
    )
    assert 'id="when-to-run"' in r.html and f"about {said} less" in r.html
    if not suggest_for_user(
        m, cfg
    ):  # nothing saves energy: the timing is the one change the e-mail opens with
        assert f"{said} less by starting jobs that can wait" in r.subject, r.subject
        assert "the one change worth making: start jobs that can wait" in r.text
    # bob's month: no suggestion (grams), no section
    with engine.connect() as conn:
        b = user_report.user_month(conn, cfg, "bob", datetime(2026, 10, 1, tzinfo=UTC))
    rb = render.render_user_month(b, [], cfg)
    assert "WHEN TO RUN" not in rb.text and "when-to-run" not in rb.html


def test_the_lab_email_says_what_its_jobs_that_could_wait_would_have_saved(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    import json

    from cocaq.config_load import load_config
    from cocaq.reports import lab_report, render
    from cocaq.reports.wording import co2
    from tests.conftest import run_cocaq

    env = dict(cli_env, **_evenings(engine, tmp_path))
    cfg = load_config(env["COCAQ_CONFIG"], environ={})
    with engine.connect() as conn:
        m = lab_report.lab_month(conn, cfg, "lab", datetime(2026, 10, 1, tzinfo=UTC))
    r = render.render_lab_month(m, cfg)
    d = json.loads(run_cocaq(["lab", "lab", "-S", "2026-10-01", "-E", "2026-11-01", "-o", "json"], env).out)
    said = f"{co2(d['shift_saved_kg'])} less (83%)"  # as the e-mails write kg
    assert f"When to run: {co2(d['shift_co2_kg'])} of the lab's CO2" in r.text, r.text
    assert said in r.text and "up to 24 h or their time limit" in r.text
    assert "<b>When to run:</b>" in r.html and f"{co2(d['shift_saved_kg'])} less</b> (83%)" in r.html
