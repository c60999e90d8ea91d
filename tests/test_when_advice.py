"""When to run, the suggestion (cocaq.footprint.when_advice): its daily `sbatch --begin=HH:00` on the nights
clocks change (issue 32, point 10). Pure function over JobFacts: `cocaq user`, the API and the e-mail
call the same one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cocaq.carbon.begin import touched_hours
from cocaq.footprint.jobfacts import JobFacts
from cocaq.footprint.when_advice import Settings, when_to_run
from tests.test_advice import fact

MADRID = ZoneInfo("Europe/Madrid")


def _jobs(best_local_hour: int) -> list[JobFacts]:
    """Ten jobs of October 2023 whose best start is `best_local_hour`:30 in Madrid, saving 40% each."""
    out = []
    for i in range(10):
        start = datetime(2023, 10, 2 + i, 18, 0, tzinfo=MADRID).astimezone(UTC)
        best = datetime(2023, 10, 3 + i, best_local_hour, 30, tzinfo=MADRID).astimezone(UTC)
        out.append(
            fact(
                pk=i + 1,
                job_id=str(100 + i),
                start=start,
                elapsed_h=4.0,
                co2_kg=5.0,
                shift_state="ok",
                shift_slack_h=24.0,
                shift_best_start=best,
                shift_now_g=200.0,
                shift_best_g=120.0,
                shift_saved_kg=2.0,
                shift_pause_saved_kg=2.5,
            )
        )
    return out


def test_the_hours_a_zone_skips_or_repeats() -> None:
    assert touched_hours(MADRID, datetime(2023, 10, 1, tzinfo=UTC)) == {2: "skipped or comes twice"}
    la = touched_hours(ZoneInfo("America/Los_Angeles"), datetime(2023, 10, 1, tzinfo=UTC))
    assert la == {2: "skipped", 1: "comes twice"}  # 02:00 jumps to 03:00; 01:00-01:59 comes twice
    assert touched_hours(ZoneInfo("Asia/Tokyo"), datetime(2023, 10, 1, tzinfo=UTC)) == {}
    assert touched_hours(UTC, datetime(2023, 10, 1, tzinfo=UTC)) == {}


def test_a_daily_begin_in_the_hour_clocks_skip_or_repeat_says_so() -> None:
    s = Settings(24.0, 0.1, 1.0, MADRID)
    a = when_to_run(_jobs(2), s, "in October")
    assert a is not None and "sbatch --begin=02:00 job.sh" in a.change
    assert "starts around 02:00 CEST (sbatch --begin=02:00 holds a job until the next one)." in a.body
    assert (
        "On the nights clocks change, 02:00 skipped or comes twice in Europe/Madrid: those nights, take the "
        "line `cocaq carbon when` prints." in a.body
    )
    # an hour no change touches: no caution
    a = when_to_run(_jobs(13), s, "in October")
    assert a is not None and "--begin=13:00" in a.body and "clocks change" not in a.body


def test_the_example_best_start_names_its_own_zone_across_a_change() -> None:
    """Started 28 Oct at 18:00 CEST, best at 13:30 the next day: that is CET, and the sentence says so."""
    start = datetime(2023, 10, 28, 18, 0, tzinfo=MADRID).astimezone(UTC)
    best = start + timedelta(hours=20, minutes=30)  # 13:30 CET on Sunday 29 (clocks went back)
    j = fact(
        pk=1, job_id="7", start=start, elapsed_h=4.0, co2_kg=5.0, shift_state="ok", shift_slack_h=24.0,
        shift_best_start=best, shift_now_g=200.0, shift_best_g=120.0, shift_saved_kg=2.0,
        shift_pause_saved_kg=2.5,
    )  # fmt: skip
    a = when_to_run([j], Settings(24.0, 0.1, 1.0, MADRID), "in October")
    assert a is not None
    assert "started Sat 28 Oct 18:00 CEST, would have emitted 40% less starting at 13:30 CET on Sun" in a.body
