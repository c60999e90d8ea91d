"""Durations and dates as Slurm users write them (`30d`, `12h`, `2w`, `2026-11-01`)."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta, tzinfo

from cocaq.errors import UsageError

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
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+):(\d+):(\d+(?:\.\d+)?)|(\d+):(\d+(?:\.\d+)?)")


def parse_duration(text: str) -> timedelta:
    """`30d`, `12h`, `2w`, `90m`, `45s` -> timedelta (a bare number is days, as in `--since 30`)."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+", t):
        return timedelta(days=int(t))
    m = _DURATION.match(t)
    if not m or m.group(2) not in _UNITS:
        raise UsageError(f"bad duration {text!r}: use a number and a unit, like 30d, 12h, 2w, 90m")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def parse_when(text: str, now: datetime, tz: tzinfo | None = None) -> datetime:
    """A point in time: a duration back from `now`, `now`, `today`, or an ISO date/time (in `tz`)."""
    t = text.strip()
    low = t.lower()
    zone = tz or now.tzinfo or UTC
    if low == "now":
        return now
    if low in ("today", "midnight"):
        local = now.astimezone(zone)
        return datetime(local.year, local.month, local.day, tzinfo=zone)
    if low and (low[0].isdigit()) and not re.match(r"^\d{4}-", low):
        return now - parse_duration(t)
    try:
        if re.fullmatch(r"\d{4}-\d{2}", t):
            d = date.fromisoformat(t + "-01")
            return datetime(d.year, d.month, 1, tzinfo=zone)
        parsed = datetime.fromisoformat(t)
    except ValueError:
        raise UsageError(
            f"bad date {text!r}: use a duration (30d, 12h, 2w) or a date (2026-11-01, 2026-11-01T08:00)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=zone)


def parse_slurm_duration(text: str) -> float | None:
    """Slurm's `[D-]HH:MM:SS[.mmm]`, `MM:SS.mmm` -> seconds; None for empty/`Unknown`/`INVALID`."""
    t = text.strip()
    clock = _CLOCK.fullmatch(t)
    if clock:  # the common forms, without the general path's splitting (this runs for every sacct line)
        d, h, mi, sec, mi2, sec2 = clock.groups()
        if sec is not None:
            return (int(d) * 86400 if d else 0) + int(h) * 3600 + int(mi) * 60 + float(sec)
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
    return days * 86400 + h * 3600 + m * 60 + s


def format_slurm_duration(seconds: float) -> str:
    """Seconds -> `[D-]HH:MM:SS` as sacct prints Elapsed (whole seconds)."""
    s = int(seconds)
    d, r = divmod(s, 86400)
    h, r = divmod(r, 3600)
    m, sec = divmod(r, 60)
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}" if d else f"{h:02d}:{m:02d}:{sec:02d}"
