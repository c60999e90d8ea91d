"""`cocaq carbon when` as data: the plan for a job of some hours, its best start and the `sbatch
--begin=` line, checked the same way for the CLI and for GET /v1/carbon/when (the web app's form).

The checks live here so that a length or a window the CLI refuses is refused by the API in the same
words, and the line a user copies from the page is the one the CLI prints.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cocaq.errors import UsageError
from cocaq.units import S_PER_HOUR

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from cocaq.carbon.begin import Begin
    from cocaq.carbon.when import Plan
    from cocaq.config import Config

MAX_HOURS = 24 * 31
MAX_WITHIN_S = 31 * 86400


def checked(hours: float, within_s: float, zone: str) -> str:
    """The zone, stripped, once the job's length and its window are within what a plan can say."""
    if not (math.isfinite(hours) and 0 < hours <= MAX_HOURS):
        raise UsageError(
            f"--hours: expected a job length in hours, more than 0 and at most {MAX_HOURS}, got {hours}"
        )
    if not (math.isfinite(within_s) and 0 <= within_s <= MAX_WITHIN_S):
        raise UsageError(f"--within: {within_s / S_PER_HOUR:g} h is outside 0..31d")
    z = zone.strip()
    if not z:
        raise UsageError("--zone: expected a zone id (FR, ES, US-CAL-CISO, ...)")
    return z


def plan_and_line(
    conn: Connection,
    cfg: Config,
    hours: float,
    within_s: float,
    *,
    zone: str | None = None,
    at: datetime,
    weeks: int,
    basis: str | None = None,
) -> tuple[Plan, Begin]:
    """The plan (cocaq.carbon.when) and the `--begin` line of its best start, in the site's time zone."""
    from cocaq.carbon.begin import begin, site_zone
    from cocaq.carbon.when import plan

    z = checked(hours, within_s, zone or cfg.cluster.carbon_zone)
    p = plan(
        conn,
        z,
        basis or cfg.carbon.basis,
        hours * float(S_PER_HOUR),
        within_s,
        at.astimezone(UTC).timestamp(),
        weeks,
    )
    tz = site_zone(cfg.cluster.timezone, cfg.tz())
    return p, begin(p.best.start, p.at, tz)


def as_dict(p: Plan, line: Begin) -> dict[str, Any]:
    """What `cocaq carbon when -o json` prints."""
    d = p.as_dict()
    d["sbatch"] = line.command
    d["begin"] = line.as_dict()
    return d
