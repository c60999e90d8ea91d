"""The suggestions of a user's monthly report: cocaq.footprint.advice over the user's jobs of the month.

The rules, their evidence and how each saving is sized live in cocaq.footprint.advice, shared with `cocaq
user`
and `cocaq job`, so that the e-mail, the CLI and the API say the same thing. Here: the month's context
(its window, the site's idle threshold and interactive job names) and the threshold that keeps a
suggestion out of an e-mail (`[advice] min_share` of the user's month and `min_kwh`).
"""

from __future__ import annotations

from cocaq.config import Config
from cocaq.footprint.advice import Advice, Context, Thresholds, advise_user, site_context
from cocaq.reports.data import UserMonth

Suggestion = Advice  # (the name the templates and senders have used)


def context_for(month: UserMonth, cfg: Config, thresholds: Thresholds | None = None) -> Context:
    return site_context(
        cfg,
        month.month.start,
        month.month.end,
        period=f"in {month.month.start:%B}",
        thresholds=thresholds,
        idle_threshold_pct=month.basis.idle_threshold_pct,
    )


def suggest_for_user(month: UserMonth, cfg: Config, thresholds: Thresholds | None = None) -> list[Advice]:
    """What the month's jobs support, largest saving first; none below the configured share."""
    return advise_user(month.jobs, context_for(month, cfg, thresholds), month.totals.energy_kwh, cfg)
