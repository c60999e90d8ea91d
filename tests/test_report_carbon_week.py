"""The admin report's carbon intensity by weekday and hour (AdminMonth.carbon_week), on SQLite and PostgreSQL.

March 2025 (it starts on a Saturday), jobs in four zones: FR with an hourly series over the whole month
(a few hours missing, and a `direct` series the lca basis must ignore), ES with a quarter-hourly day, rows
of half an hour around an hour boundary and a row that crosses it, and one that starts in February; DEU
with no series at all, SE with one only in February. The expected means are computed here row by row.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from statistics import fmean

import pytest
from sqlalchemy import Engine, insert, text, update

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.engine import make_engine
from cocaq.db.schema import CarbonIntensity, DailyRollup
from cocaq.reports import admin_report, charts, data, render, wording
from tests import builders
from tests.conftest import migrated_database

MONTH = datetime(2025, 3, 1, tzinfo=UTC)
NEXT = datetime(2025, 4, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
FR_HOLE = (datetime(2025, 3, 10, tzinfo=UTC), datetime(2025, 3, 10, 6, tzinfo=UTC))  # a Monday, no rows
FEB_DAY = datetime(2025, 2, 20, tzinfo=UTC)
FEB_SHIFT_G = (4000.0, 400.0, 1000.0)  # February's when-to-run sums, written into its rollup by hand


def fr_value(t: datetime) -> float:
    """FR's hourly value: by weekday and hour, and a little higher each week."""
    return 100.0 + 10 * t.weekday() + 5 * t.hour + 3 * ((t.day - 1) // 7)


def es_rows() -> list[tuple[datetime, datetime, float]]:
    """ES: Monday 3 March in quarter hours (50 x hour + 10 x quarter); Tuesday 4 March 10:00-12:00 in three
    rows, one of them crossing 11:00; a row from 28 February 23:30 to 1 March 00:30."""
    rows = []
    day = datetime(2025, 3, 3, tzinfo=UTC)
    for q in range(96):
        t = day + timedelta(minutes=15 * q)
        rows.append((t, t + timedelta(minutes=15), 50.0 * (q // 4) + 10.0 * (q % 4)))
    tue = datetime(2025, 3, 4, 10, tzinfo=UTC)
    rows += [
        (tue, tue + timedelta(minutes=30), 100.0),
        (tue + timedelta(minutes=30), tue + timedelta(minutes=90), 400.0),
        (tue + timedelta(minutes=90), tue + timedelta(minutes=120), 200.0),
        (MONTH - timedelta(minutes=30), MONTH + timedelta(minutes=30), 500.0),
    ]
    return rows


def build(engine: Engine, cfg: Config) -> None:
    jobs = [
        builders.job(1, datetime(2025, 3, 5, 10, tzinfo=UTC), 20, partition="gpu"),  # FR, 20 h
        builders.job(2, datetime(2025, 3, 6, 10, tzinfo=UTC), 2, partition="cpu", gpus=0),  # DEU
        builders.job(3, datetime(2025, 3, 3, 8, tzinfo=UTC), 4, partition="es"),  # ES
        builders.job(4, datetime(2025, 3, 12, 8, tzinfo=UTC), 1, partition="se", gpus=0),  # SE
        builders.job(5, FEB_DAY + 2 * HOUR, 2, partition="cpu", gpus=0),  # February: the data starts then
    ]
    import_records(engine, jobs, cfg, source="sacct-json")
    rows = []
    t = MONTH - 2 * HOUR  # two hours of February: outside the month
    while t < NEXT + 2 * HOUR:
        if not (FR_HOLE[0] <= t < FR_HOLE[1]):
            for kind, g in (("lifecycle", fr_value(t)), ("direct", 5000.0)):
                rows.append({"zone": "FR", "ts_start": t, "ts_end": t + HOUR, "g_per_kwh": g, "kind": kind,
                             "source": f"fr {kind}"})  # fmt: skip
        t += HOUR
    for s, e, g in es_rows():
        rows.append({"zone": "ES", "ts_start": s, "ts_end": e, "g_per_kwh": g, "kind": "lifecycle",
                     "source": "es quarter-hours"})  # fmt: skip
    feb = datetime(2025, 2, 20, tzinfo=UTC)
    rows.append({"zone": "SE", "ts_start": feb, "ts_end": feb + HOUR, "g_per_kwh": 30.0, "kind": "lifecycle",
                 "source": "se"})  # fmt: skip
    with engine.begin() as c:
        c.execute(insert(CarbonIntensity), rows)
    run_aggregate(engine, cfg)
    co2, saved, paused = FEB_SHIFT_G
    with engine.begin() as c:
        n = c.execute(
            update(DailyRollup)
            .where(DailyRollup.day == FEB_DAY)
            .values(shift_co2_g=co2, shift_saved_g=saved, shift_pause_saved_g=paused)
        ).rowcount
    assert n == 1


@dataclass
class Setup:
    engine: Engine
    cfg: Config
    admin: data.AdminMonth


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def month(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp(f"carbon-week-{request.param}")
    url = migrated_database(request.param, tmp, request)
    engine = make_engine(url)
    cfg = builders.config(
        tmp,
        url,
        cluster={"carbon_zone": "FR", "pue": 1.2},
        partitions={"cpu": {"carbon_zone": "DEU"}, "es": {"carbon_zone": "ES"}, "se": {"carbon_zone": "SE"}},
    )
    build(engine, cfg)
    with engine.connect() as conn:
        adm = admin_report.admin_month(conn, cfg, MONTH)
    yield Setup(engine, cfg, adm)
    engine.dispose()


def expected_fr() -> dict[tuple[int, int], list[float]]:
    cells: dict[tuple[int, int], list[float]] = defaultdict(list)
    t = MONTH
    while t < NEXT:
        if not (FR_HOLE[0] <= t < FR_HOLE[1]):
            cells[(t.weekday(), t.hour)].append(fr_value(t))
        t += HOUR
    return cells


def test_weekday_by_hour_means_of_an_hourly_series(month: Setup) -> None:
    adm = month.admin
    assert {z.zone for z in adm.intensity} == {"FR", "DEU", "ES", "SE"}
    weeks = {z.zone: z for z in adm.carbon_week}
    assert set(weeks) == {"FR", "ES"}
    assert sorted(adm.carbon_week_missing) == ["DEU", "SE"]  # no series, or none in the month
    fr = weeks["FR"]
    cells = expected_fr()
    assert fr.basis == "lca" and fr.sources == ("fr lifecycle",)  # the direct rows are another basis
    assert {(c.weekday, c.hour): (c.g_per_kwh, c.hours) for c in fr.cells} == {
        k: (pytest.approx(fmean(v)), len(v)) for k, v in cells.items()
    }
    # March 2025: five Saturdays, Sundays and Mondays, four of the other days; Monday 10 March 0-6 h missing
    by = {(c.weekday, c.hour): c for c in fr.cells}
    assert by[(5, 0)].hours == 5 and by[(1, 0)].hours == 4 and by[(0, 0)].hours == 4 and by[(0, 6)].hours == 5
    assert (fr.hours, fr.month_hours) == (744 - 6, 744)
    assert fr.g_per_kwh == pytest.approx(fmean(g for v in cells.values() for g in v))
    assert fr.weekdays_g_per_kwh == pytest.approx(fmean(g for (d, _), v in cells.items() if d < 5 for g in v))
    assert fr.weekends_g_per_kwh == pytest.approx(
        fmean(g for (d, _), v in cells.items() if d >= 5 for g in v)
    )
    # the hour of day's mean over every day: lowest from 00:00, highest up to midnight (5 g/kWh an hour)
    profile = {h: fmean(g for (_, hh), v in cells.items() if hh == h for g in v) for h in range(24)}
    assert fr.cheapest is not None and fr.dearest is not None
    assert (fr.cheapest.start, fr.cheapest.end, fr.cheapest.hours) == (0, 4, data.WEEK_WINDOW_H)
    assert fr.cheapest.g_per_kwh == pytest.approx(fmean(profile[h] for h in range(4)))
    assert (fr.dearest.start, fr.dearest.end) == (20, 0)
    assert fr.dearest.g_per_kwh == pytest.approx(fmean(profile[h] for h in range(20, 24)))


def test_sub_hourly_rows_are_weighted_into_their_hours(month: Setup) -> None:
    es = next(z for z in month.admin.carbon_week if z.zone == "ES")
    by = {(c.weekday, c.hour): (c.g_per_kwh, c.hours) for c in es.cells}
    # Monday 3 March: each hour the mean of its four quarters, 50 h + 15
    assert {k: v for k, v in by.items() if k[0] == 0} == {(0, h): (pytest.approx(50.0 * h + 15), 1)
                                                          for h in range(24)}  # fmt: skip
    # Tuesday 10:00-11:00: 30 min at 100, 30 min of the crossing row at 400; 11:00-12:00: 400 then 200
    assert by[(1, 10)] == (pytest.approx(250.0), 1) and by[(1, 11)] == (pytest.approx(300.0), 1)
    # Saturday 1 March 00:00: the February row's half hour in the month, alone in its hour
    assert by[(5, 0)] == (pytest.approx(500.0), 1)
    assert len(by) == 24 + 2 + 1 and es.hours == 27
    # by hour of day over every day: 00:00 (15 and 500), 10:00 (515 and 250), 11:00 (565 and 300)
    assert es.cheapest is not None and es.dearest is not None
    assert (es.cheapest.start, es.cheapest.g_per_kwh) == (1, pytest.approx(fmean([65, 115, 165, 215])))
    assert (es.dearest.start, es.dearest.end) == (20, 0)
    assert es.dearest.g_per_kwh == pytest.approx(fmean([1015, 1065, 1115, 1165]))
    assert es.weekends_g_per_kwh == pytest.approx(500.0)
    assert es.sources == ("es quarter-hours",)


def test_words_for_the_cheapest_and_dearest_hours() -> None:
    w = data.HourWindow
    z = data.ZoneWeek("FR", "lca", (), 720, 744, 250.0, w(11, 4, 180.4), w(19, 4, 320.0), 260.0, 230.0, ())
    assert wording.week_text(z) == (
        "cheapest 11:00-15:00 UTC, 180 g CO2e/kWh; dearest 19:00-23:00 UTC, 320 g CO2e/kWh; mean 250 g CO2e/kWh; "
        "weekends 12% below weekdays (series over 720 of 744 hours)"
    )
    late = data.ZoneWeek("ES", "direct", (), 30, 744, 99.0, w(22, 4, 50.0), w(5, 4, 90.0), 99.0, 100.0, ())
    assert "cheapest 22:00-02:00 UTC" in wording.week_text(late)
    assert "weekends about the same as weekdays" in wording.week_text(late)
    flat = data.ZoneWeek("FR", "lca", (), 480, 744, 30.5, w(0, 4, 30.5), w(3, 4, 31.9), 31.0, 28.5, ())
    assert wording.week_text(flat) == (
        "no hours of the day much cleaner than others (within 5%); mean 30.5 g CO2e/kWh; weekends 8% below "
        "weekdays (series over 480 of 744 hours)"
    )
    sparse = data.ZoneWeek("SE", "lca", (), 3, 744, 40.0, None, None, 40.0, None, ())
    assert wording.week_text(sparse) == (
        "too few hours of series to name the cheapest and dearest hours of the day; mean 40 g CO2e/kWh "
        "(series over 3 of 744 hours)"
    )


def test_heatmap_on_the_admin_page_and_words_in_the_emails(month: Setup) -> None:
    adm = month.admin
    page = render.render_admin_html(adm, month.cfg)
    fr_i = next(i for i, z in enumerate(adm.carbon_week) if z.zone == "FR")
    fr = adm.carbon_week[fr_i]
    div = f'id="chart-carbon_week_{fr_i}"'
    assert div in page and "Carbon intensity of FR by hour" in page
    # the figure's JSON: a heatmap, Monday on the first row, the cells' means and hours
    m = re.search(
        r'Plotly\.newPlot\(\s*"chart-carbon_week_' + str(fr_i) + r'",\s*(\[.*?\]),\s*\{', page, re.S
    )
    assert m is not None
    (trace,) = json.loads(m.group(1))
    assert trace["type"] == "heatmap" and trace["y"][0] == "Mon" and len(trace["x"]) == 24
    by = {(c.weekday, c.hour): c for c in fr.cells}
    assert trace["z"][0][7] == pytest.approx(by[(0, 7)].g_per_kwh)
    assert trace["customdata"][0][0] == 4 and trace["customdata"][5][0] == 5
    sentence = wording.week_text(fr)
    assert "cheapest 00:00-04:00 UTC" in sentence
    assert sentence in page.replace("&#39;", "'")
    mail = render.render_admin_email(adm, month.cfg)
    assert f"- FR: {sentence}" in mail.text
    assert sentence in mail.html.replace("&#39;", "'")
    # the e-mail's static heatmaps, one a zone, where the page has its Plotly ones
    assert [cid for cid, _ in mail.images if cid.startswith("carbon_week_")] == [
        "carbon_week_0",
        "carbon_week_1",
    ]
    assert f'src="cid:carbon_week_{fr_i}"' in mail.html
    assert "no hourly series in March 2025 for DEU, SE" in mail.text
    assert "No hourly series in March 2025 for DEU, SE" in mail.html


def test_realised_against_best_start_this_month_and_before(month: Setup) -> None:
    """March's figures are the aggregator's, job by job (job_metrics); February's were written by hand."""
    adm = month.admin
    with month.engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT j.co2_g, m.shift_saved_g, m.shift_pause_saved_g FROM jobs j JOIN job_metrics m "
                "ON m.job_pk = j.id WHERE m.shift_state = 'ok'"
            )
        ).all()
    assert rows, "the FR job (whole in March, its window in the series) has when-to-run figures"
    co2, saved, paused = (sum(r[i] for r in rows) / 1000 for i in range(3))
    t = adm.totals
    assert (t.shift_co2_kg, t.shift_saved_kg, t.shift_pause_saved_kg) == (
        pytest.approx(co2),
        pytest.approx(saved),
        pytest.approx(paused),
    )
    assert 0 < saved <= paused < co2
    feb, mar = adm.shift_trend
    assert (feb.month.label, feb.data_days) == ("2025-02", 9)  # from 20 February, the first job's day
    assert (feb.co2_kg, feb.best_start_kg, feb.paused_kg) == (4.0, pytest.approx(3.6), pytest.approx(3.0))
    assert (feb.saved_share, feb.pause_saved_share) == (pytest.approx(0.1), pytest.approx(0.25))
    assert mar.month.label == "2025-03" and (mar.co2_kg, mar.saved_kg, mar.pause_saved_kg) == (
        pytest.approx(co2),
        pytest.approx(saved),
        pytest.approx(paused),
    )
    # the chart on the page: three bars a month, as run, at the best start, pausing
    page = render.render_admin_html(adm, month.cfg)
    m = re.search(r'Plotly\.newPlot\(\s*"chart-shift",\s*(\[.*?\]),\s*\{', page, re.S)
    assert m is not None
    traces = json.loads(m.group(1))
    assert [x["name"] for x in traces] == ["as they ran", "at the best start", "pausing"]
    assert all(x["x"] == ["Feb 2025*", "Mar 2025"] for x in traces)
    assert traces[0]["y"] == [pytest.approx(4.0), pytest.approx(co2)]
    assert traces[1]["y"] == [pytest.approx(3.6), pytest.approx(co2 - saved)]
    assert traces[2]["y"] == [pytest.approx(3.0), pytest.approx(co2 - paused)]
    # the words in the e-mails, and the static chart the HTML e-mail shows
    mail = render.render_admin_email(adm, month.cfg)
    sentence = (
        f"Each started at its cleanest hour within its slack (24 h at most, never more than its time limit), "
        f"they would have emitted {wording.co2(co2 - saved)}: {wording.co2(saved)} less "
        f"({wording.share(saved / co2)})"
    )
    assert sentence in mail.text
    assert f"emitted {wording.co2(co2)} ({wording.share(co2 / t.co2_kg)} of the month's CO2)" in mail.text
    assert "- February 2025 (9 days of data): 4 kg CO2e as run, 3.6 kg CO2e at the best start (10% less)" in (
        mail.text
    )
    assert "shift" in dict(mail.images) and 'src="cid:shift"' in mail.html
    assert f"<b>{wording.co2(saved)} less</b>" in mail.html


def test_static_heatmap_colours_its_cells_by_bin() -> None:
    from io import BytesIO

    from PIL import Image

    png = charts.heatmap_chart(
        "t", ["a", "b"], ["0", "1", "2"], [[0.0, None, 10.0], [5.0, 2.0, 8.0]], unit="g"
    )
    assert png.startswith(b"\x89PNG")
    colours = {rgb for _, rgb in Image.open(BytesIO(png)).convert("RGB").getcolors(1 << 16)}
    assert {charts.HEAT[0], charts.HEAT[1], charts.HEAT[2], charts.HEAT[-1], charts.GRID} <= colours
    # one value everywhere: a single bin; nothing at all: said so, no cells
    flat = charts.heatmap_chart("t", ["a"], ["0", "1"], [[3.0, 3.0]], unit="g")
    flat_colours = {rgb for _, rgb in Image.open(BytesIO(flat)).convert("RGB").getcolors(1 << 16)}
    assert charts.HEAT[0] in flat_colours and charts.HEAT[-1] not in flat_colours
    none = charts.heatmap_chart("t", ["a"], ["0"], [[None]], unit="g")
    assert not {charts.HEAT[0], charts.HEAT[-1]} & {
        rgb for _, rgb in Image.open(BytesIO(none)).convert("RGB").getcolors(1 << 16)
    }
