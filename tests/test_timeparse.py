from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cocaq.errors import UsageError
from cocaq.timeparse import format_slurm_duration, parse_duration, parse_slurm_duration, parse_when

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("2w", timedelta(weeks=2)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("7", timedelta(days=7)),
        (" 1.5d ", timedelta(hours=36)),
    ],
)
def test_durations(text: str, delta: timedelta) -> None:
    assert parse_duration(text) == delta


@pytest.mark.parametrize("bad", ["3x", "d30", "", "-2d", "30 days ago", "1e9q"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(UsageError, match="bad duration"):
        parse_duration(bad)


def test_when() -> None:
    assert parse_when("30d", NOW) == NOW - timedelta(days=30)
    assert parse_when("now", NOW) == NOW
    assert parse_when("2026-11-01", NOW, UTC) == datetime(2026, 11, 1, tzinfo=UTC)
    assert parse_when("2026-11", NOW, UTC) == datetime(2026, 11, 1, tzinfo=UTC)
    paris = parse_when("2026-07-01T12:00", NOW, ZoneInfo("Europe/Paris"))
    assert paris.astimezone(UTC) == datetime(2026, 7, 1, 10, 0, tzinfo=UTC)
    assert parse_when("2026-07-01T12:00+00:00", NOW, ZoneInfo("Europe/Paris")).hour == 12
    with pytest.raises(UsageError, match="bad date"):
        parse_when("2026-13-45", NOW)
    with pytest.raises(UsageError):
        parse_when("yesterday-ish", NOW)


@pytest.mark.parametrize("text", ["2026", "202611", "20101", "1000", "999999999999", " 2026 "])
def test_a_bare_number_of_four_digits_or_more_is_refused_not_read_as_days(text: str) -> None:
    """A year, or a date cut short (`--since 2026`, `--since 202611`), once went back 2,026 or 202,611
    days without a word; a bare number stays days up to 999 (`--since 30`), longer ones need the unit."""
    with pytest.raises(UsageError, match=r"a bare number is days back.*write \d+d if you mean that"):
        parse_when(text, NOW)
    assert parse_when("999", NOW) == NOW - timedelta(days=999)
    assert parse_when("2026d", NOW) == NOW - timedelta(days=2026)
    assert parse_when("20261101", NOW, UTC) == datetime(2026, 11, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-04:33:44", 86400 + 4 * 3600 + 33 * 60 + 44),
        ("04:33:44", 16424),
        ("33:44", 2024),
        ("00:01.234", 1.234),
        ("2-00:00:00", 172800),
        ("1-04", 100800),
        ("1-04:30", 102600),
        ("45", 45),
    ],
)
def test_slurm_durations(text: str, seconds: float) -> None:
    assert parse_slurm_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "Unknown", "INVALID", "UNLIMITED"])
def test_slurm_duration_unknowns(text: str) -> None:
    assert parse_slurm_duration(text) is None


def test_slurm_duration_garbage() -> None:
    with pytest.raises(ValueError):
        parse_slurm_duration("1:2:3:4")
    with pytest.raises(ValueError):
        parse_slurm_duration("ab:cd")


@pytest.mark.parametrize("seconds", [0, 59, 3600, 86399, 86400, 102824, 9 * 86400 + 1])
def test_format_round_trips(seconds: int) -> None:
    assert parse_slurm_duration(format_slurm_duration(seconds)) == seconds
    assert format_slurm_duration(102824) == "1-04:33:44"
