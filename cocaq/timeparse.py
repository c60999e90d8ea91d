"""Durations, dates and months as Slurm users write them (`30d`, `12h`, `2w`, `2026-11-01`, `20261101`,
`2026-11`): the one parser of every time option and API query parameter.

Every time it returns is aware and within [EARLIEST, LATEST] (1970 to 2200, UTC): nothing cocaq stores is
outside it, and a time beyond it (year 1 at +14:00, 99999999 days back) would overflow Python's datetimes
or the database's somewhere downstream. Anything else is a UsageError with the reason: one line and exit 2
on the command line, 400 from the read API.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime, timedelta, tzinfo

from cocaq.errors import UsageError
from cocaq.units import S_PER_HOUR

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
_LONGEST_S = (LATEST - EARLIEST).total_seconds()  # a duration longer than the range is never meant
_UNITS = {
    "s": 1,
    "sec": 1,
    "m": 60,
    "min": 60,
    "h": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 7 * 86400,
    "week": 7 * 86400,
    "weeks": 7 * 86400,
}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)")
_COMPACT_DATE = re.compile(r"[0-9]{8}(?:[Tt].*)?")  # 20261101, 20261101T0830: a date, never 20M days
_MONTH = re.compile(r"([0-9]{4})-([0-9]{2})")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+):(\d+):(\d+(?:\.\d+)?)|(\d+):(\d+(?:\.\d+)?)")
_RANGE = f"{EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} (UTC)"


def parse_duration(text: str) -> timedelta:
    """`30d`, `12h`, `2w`, `90m`, `45s` -> timedelta (a bare number is days, as in `--since 30`); at most
    the length of cocaq's range, so that no count overflows a timedelta or a subtraction from now."""
    m = _DURATION.fullmatch(text.strip().lower())
    unit = (m.group(2) or ("d" if m.group(1).isdigit() else "")) if m else ""  # a bare 1.5: unit missing
    if not m or unit not in _UNITS:
        raise UsageError(f"bad duration {text!r}: use a number and a unit, like 30d, 12h, 2w, 90m")
    seconds = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(seconds) or seconds > _LONGEST_S:
        raise UsageError(
            f"bad duration {text!r}: longer than the {_LONGEST_S / 86400:,.0f} days from {_RANGE}"
        )
    return timedelta(seconds=seconds)


def in_range(when: datetime, text: str) -> datetime:
    """`when` itself if it lies within cocaq's range, else the UsageError that says so (aware datetimes
    compare as instants, whatever their offsets, without converting: year 1 at +14:00 cannot overflow)."""
    if when < EARLIEST:
        raise UsageError(f"bad date {text!r}: before {EARLIEST:%Y-%m-%d}, the range is {_RANGE}")
    if when > LATEST:
        raise UsageError(f"bad date {text!r}: after {LATEST:%Y-%m-%d}, the range is {_RANGE}")
    return when


def parse_when(text: str, now: datetime, tz: tzinfo | None = None) -> datetime:
    """A point in time: a duration back from `now`, `now`, `today`, a month, or an ISO date/time (also
    compact, 20261101; read in `tz` without an offset), within cocaq's range."""
    t = text.strip()
    low = t.lower()
    zone = tz or now.tzinfo or UTC
    if low == "now":
        return in_range(now, text)
    if low in ("today", "midnight"):
        local = now.astimezone(zone)
        return in_range(datetime(local.year, local.month, local.day, tzinfo=zone), text)
    if (
        low[:1].isascii()
        and low[:1].isdigit()
        and not re.match(r"[0-9]{4}-", low)
        and not _COMPACT_DATE.fullmatch(low)
    ):
        if low.isdigit() and len(low) >= 4:  # 2026, 202611, 20101: a year or a date cut short, not days
            back = (now - parse_duration(t)).date() if int(low) * 86400 <= _LONGEST_S else "before 1970"
            raise UsageError(
                f"bad date {text!r}: a bare number is days back, and {low} days would reach {back}: write "
                f"{low}d if you mean that, or a date (2026-01-01, 20260101) or a month (2026-01)"
            )
        return in_range(now - parse_duration(t), text)
    bad = UsageError(
        f"bad date {text!r}: use a duration (30d, 12h, 2w) or a date (2026-11-01, 20261101, 2026-11-01T08:00)"
    )
    if not t.isascii() or not t.isprintable():  # fromisoformat's digits would take other scripts' too
        raise bad
    try:
        if _MONTH.fullmatch(t):
            d = date.fromisoformat(t + "-01")
            return in_range(datetime(d.year, d.month, 1, tzinfo=zone), text)
        parsed = datetime.fromisoformat(t)
    except ValueError:
        raise bad from None
    return in_range(parsed if parsed.tzinfo else parsed.replace(tzinfo=zone), text)


def parse_month(text: str, option: str = "--month") -> datetime:
    """The first instant (UTC) of the month `YYYY-MM`, from 1970-01 to 2199-12 (its end is in range too)."""
    m = _MONTH.fullmatch(text.strip())
    if not m or not 1 <= int(m.group(2)) <= 12:
        raise UsageError(f"{option} {text!r}: expected a month like 2026-03")
    if not EARLIEST.year <= int(m.group(1)) < LATEST.year:
        raise UsageError(f"{option} {text!r}: months go from {EARLIEST:%Y-%m} to {LATEST.year - 1}-12")
    return datetime(int(m.group(1)), int(m.group(2)), 1, tzinfo=UTC)


def parse_slurm_duration(text: str) -> float | None:
    """Slurm's `[D-]HH:MM:SS[.mmm]`, `MM:SS.mmm` -> seconds; None for empty/`Unknown`/`INVALID`."""
    t = text.strip()
    clock = _CLOCK.fullmatch(t)
    if clock:  # the common forms, without the general path's splitting (this runs for every sacct line)
        d, h, mi, sec, mi2, sec2 = clock.groups()
        if sec is not None:
            return (int(d) * 86400 if d else 0) + int(h) * S_PER_HOUR + int(mi) * 60 + float(sec)
        return int(mi2) * 60 + float(sec2)
    if not t or t in ("Unknown", "INVALID", "UNLIMITED", "Partition_Limit", "None"):
        return None
    days = 0
    if "-" in t:
        d, _, t = t.partition("-")
        if not d.isdigit():
            raise ValueError(f"bad Slurm duration {text!r}")
        days = int(d)
    parts = t.split(":")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"bad Slurm duration {text!r}")
    if not all(_NUMBER.fullmatch(p) for p in parts):  # float() would take nan, inf, 1e3, -1, 1_0
        raise ValueError(f"bad Slurm duration {text!r}")
    nums = [float(p) for p in parts]
    while len(nums) < 3:  # with days the fields are hours[:min[:sec]], without them [[hours:]min:]sec
        if days or "-" in text:
            nums.append(0.0)
        else:
            nums.insert(0, 0.0)
    h, m, s = nums
    return days * 86400 + h * S_PER_HOUR + m * 60 + s


def format_slurm_duration(seconds: float) -> str:
    """Seconds -> `[D-]HH:MM:SS` as sacct prints Elapsed (whole seconds)."""
    s = int(seconds)
    d, r = divmod(s, 86400)
    h, r = divmod(r, 3600)
    m, sec = divmod(r, 60)
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}" if d else f"{h:02d}:{m:02d}:{sec:02d}"
