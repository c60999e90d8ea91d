"""The `sbatch --begin=` line for a start instant, written so that Slurm cannot read it as another one.

Slurm reads a --begin wall time in the local time of the host running sbatch (the cluster's zone,
`[cluster] timezone`), and its relative form `now+N` too: parse_time.c turns now + N into local
date and time fields and back through mktime(3) with tm_isdst = -1 (slurm_mktime). So a wall time the
zone shows once is exact in either form, whenever it is pasted (the absolute form) or when submitted
at the stated time (the relative one); a wall time the zone shows twice (the hour that repeats when
clocks go back) is ambiguous in both, and mktime may take the other one, an hour off. For that hour
the line asks sbatch to read the time in UTC (`TZ=UTC sbatch --begin=<UTC time>`), which has no such
hour. A UTC instant never falls in the skipped hour (clocks going forward), so no line names one.

Pure functions of the instant and the zone: the CLI, JSON and the suggestions print the same.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


def site_zone(name: str | None, fallback: tzinfo) -> tzinfo:
    """The zone sbatch reads --begin in: `[cluster] timezone`, else this machine's own zone with its
    daylight-saving rules (TZ, then /etc/localtime), else `fallback` (a fixed offset keeps no rules: a
    summer date planned in winter would be an hour off)."""
    if name:
        return ZoneInfo(name)
    tz = os.environ.get("TZ", "").lstrip(":")
    if tz:
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    try:
        with open("/etc/localtime", "rb") as fh:
            return ZoneInfo.from_file(fh, key=_localtime_key())
    except (OSError, ValueError):
        return fallback


def _localtime_key() -> str | None:
    """The name /etc/localtime links to (Europe/Madrid), for the words; None where it is a copy."""
    try:
        target = os.path.realpath("/etc/localtime")
    except OSError:
        return None
    marker = "/zoneinfo/"
    return target.split(marker, 1)[1] if marker in target else None


def zone_name(tz: tzinfo) -> str:
    key = getattr(tz, "key", None)
    return str(key) if key else str(tz)


def local(ts: float, tz: tzinfo) -> datetime:
    return datetime.fromtimestamp(ts, UTC).astimezone(tz)


def is_ambiguous(d: datetime) -> bool:
    """Whether d's wall time (in its zone) is shown twice: the hour that repeats when clocks go back."""
    w = d.replace(tzinfo=None)
    a, b = w.replace(tzinfo=d.tzinfo, fold=0), w.replace(tzinfo=d.tzinfo, fold=1)
    return a.utcoffset() != b.utcoffset()


def is_skipped(w: datetime, tz: tzinfo) -> bool:
    """Whether the naive wall time w never shows in tz: the hour skipped when clocks go forward."""
    there = w.replace(tzinfo=tz)
    back = there.astimezone(UTC).astimezone(tz).replace(tzinfo=None)
    return back != w


def offset_text(d: datetime) -> str:
    """UTC+02:00, UTC-08:00, UTC+05:30."""
    off = d.utcoffset() or timedelta(0)
    minutes = round(off.total_seconds() / 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def wait_text(seconds: float) -> str:
    """1 h 30 min, 45 min, 2 h: a wait in real (elapsed) time."""
    m = max(round(seconds / 60), 0)
    if m < 60:
        return f"{m} min"
    return f"{m // 60} h" + (f" {m % 60} min" if m % 60 else "")


def relative(start: float, at: float) -> str:
    """Slurm's relative form for `start` submitted at `at`: now+90minutes, now+2hours (sbatch(1):
    now[+count[seconds(default)|minutes|hours|days|weeks]]; its example: now+1hour)."""
    minutes = math.ceil(round(start - at, 6) / 60)
    if minutes <= 0:
        return "now"
    if minutes % 60 == 0:
        return f"now+{minutes // 60}hour" + ("s" if minutes > 60 else "")
    return f"now+{minutes}minutes"


@dataclass(frozen=True)
class Change:
    """A change of the zone's UTC offset (daylight saving): at `instant`, from `before` to `after`."""

    instant: float
    before: datetime  # the wall clock just before it
    after: datetime  # and at it

    @property
    def forward(self) -> bool:
        return (self.after.utcoffset() or timedelta(0)) > (self.before.utcoffset() or timedelta(0))

    def words(self) -> str:
        """clocks go forward from 02:00 CET to 03:00 CEST / back from 03:00 CEST to 02:00 CET."""
        way = "forward" if self.forward else "back"
        return (
            f"clocks go {way} from {_wall_at(self.before, self.instant):%H:%M} {self.before.tzname()} "
            f"to {self.after:%H:%M} {self.after.tzname()} on {self.after:%Y-%m-%d}"
        )


def _wall_at(before: datetime, instant: float) -> datetime:
    """The old clock at the change itself (02:00 CET when it jumps to 03:00 CEST)."""
    off = before.utcoffset() or timedelta(0)
    return datetime.fromtimestamp(instant, UTC).replace(tzinfo=None) + off


def changes(a: float, b: float, tz: tzinfo) -> list[Change]:
    """The zone's offset changes in (a, b], to the second (a day's step, then bisection: no zone
    changes twice in a day)."""
    out: list[Change] = []

    def off(t: float) -> timedelta | None:
        return local(t, tz).utcoffset()

    t = a
    while t < b:
        u = min(t + 86400.0, b)
        if off(t) != off(u):
            lo, hi = t, u  # off(lo) != off(hi); find the first second with the new offset
            while hi - lo > 1:
                mid = math.floor((lo + hi) / 2)
                if off(mid) == off(lo):
                    lo = mid
                else:
                    hi = mid
            out.append(Change(hi, local(hi - 1, tz), local(hi, tz)))
        t = u
    return out


@dataclass(frozen=True)
class Begin:
    """How to ask Slurm for `start` (epoch seconds, rounded up to the minute: --begin has no seconds
    cocaq needs) when submitted at `at`, in zone `tz`."""

    start: float
    at: float
    tz: tzinfo

    @property
    def local(self) -> datetime:
        return local(self.start, self.tz)

    @property
    def ambiguous(self) -> bool:
        return is_ambiguous(self.local)

    @property
    def option(self) -> str:
        """--begin=..., in the zone's wall time, or in UTC where the wall time comes twice."""
        if self.ambiguous:
            return f"--begin={datetime.fromtimestamp(self.start, UTC):%Y-%m-%dT%H:%M}"
        return f"--begin={self.local:%Y-%m-%dT%H:%M}"

    @property
    def command(self) -> str:
        """The line to paste (without the script)."""
        return ("TZ=UTC " if self.ambiguous else "") + f"sbatch {self.option}"

    @property
    def relative(self) -> str | None:
        """now+N, or None where Slurm would read it through the repeated hour (see the module)."""
        return None if self.ambiguous else relative(self.start, self.at)

    def shown(self) -> str:
        """2023-07-02 14:00 CEST (UTC+02:00; 12:00 UTC): the wall time as the zone shows it, never
        without its offset, and the instant in UTC."""
        d = self.local
        u = datetime.fromtimestamp(self.start, UTC)
        if not (d.utcoffset() or timedelta(0)) and d.tzname() in ("UTC", "GMT", "Z"):
            return f"{u:%Y-%m-%d %H:%M} UTC"
        return f"{d:%Y-%m-%d %H:%M} {d.tzname()} ({offset_text(d)}; {u:%H:%M} UTC)"

    def changes(self) -> list[Change]:
        """Offset changes between the submission and the start, and the one that makes it repeat."""
        return changes(min(self.at, self.start - 7200), self.start + 7200, self.tz)

    def notes(self) -> list[str]:
        """What a user reading the line must know: why it is in UTC, or that the wall clock jumps."""
        out: list[str] = []
        near = self.changes()
        zone = zone_name(self.tz)
        if self.ambiguous:
            back = next((c for c in near if not c.forward), None)
            d = self.local
            out.append(
                f"{d:%H:%M} comes twice in {zone} that night"
                + (f" ({back.words()})" if back else "")
                + ", and Slurm reads a --begin, now+N too, in local time: this line asks for it in UTC, "
                "which it cannot misread (the job then has TZ=UTC in its environment)."
            )
            return out
        rel = self.relative
        a = local(self.at, self.tz)
        out.append(
            f"{zone} time, as Slurm reads it; or --begin={rel} if you submit at {a:%H:%M} {a.tzname()}."
        )
        between = [c for c in near if self.at < c.instant <= self.start]
        if between:
            wall = self.local.replace(tzinfo=None) - a.replace(tzinfo=None)
            out.append(
                f"Before then {between[0].words()}: the start is {wait_text(self.start - self.at)} after "
                f"{a:%H:%M} {a.tzname()}, not the {wait_text(wall.total_seconds())} the wall clock shows."
            )
        return out

    def as_dict(self) -> dict[str, Any]:
        d = self.local
        return {
            "command": self.command,
            "local": d.isoformat(),
            "zone": zone_name(self.tz),
            "abbreviation": d.tzname(),
            "utc_offset": offset_text(d),
            "ambiguous": self.ambiguous,
            "relative": self.relative,
            "relative_from": local(self.at, self.tz).isoformat(),
        }


def begin(start: float, at: float, tz: tzinfo) -> Begin:
    return Begin(math.ceil(start / 60) * 60.0, at, tz)


def touched_hours(tz: tzinfo, around: datetime) -> dict[int, str]:
    """The hours of the day (0..23) whose HH:00 the zone skips or shows twice on some night within a
    year either side of `around`: {2: "skipped or comes twice"} in Europe. For a daily `--begin=HH:00`."""
    a = around.timestamp() - 366 * 86400
    out: dict[int, set[str]] = {}
    for c in changes(a, a + 2 * 366 * 86400, tz):
        lo = _wall_at(c.before, c.instant)
        hi = c.after.replace(tzinfo=None)
        lo, hi = min(lo, hi), max(lo, hi)
        h = lo.replace(minute=0, second=0, microsecond=0)
        if h < lo:
            h += timedelta(hours=1)
        while h < hi:
            out.setdefault(h.hour, set()).add("skipped" if c.forward else "comes twice")
            h += timedelta(hours=1)
    return {h: " or ".join(sorted(kinds, reverse=True)) for h, kinds in out.items()}
