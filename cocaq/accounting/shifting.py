"""When to run, for what already ran: each job's CO2 had it started at its best hour within its slack, or
run in the cheapest hours of its window (pausing), against when it did run (issue 21).

The model is cocaq.carbon.shifting's, over the hourly series of the zone the aggregator priced the job in:
a job of run time L that started at `a` could have started any time in [a, a + S], S its slack: the
site's `[shifting] slack_s` (24 h by default), never more than the job's own time limit (a user who asks
for two hours does not expect to wait a day). Its power is taken as flat over its run, so the share it
would have saved is 1 - (best average g/kWh) / (average g/kWh over its run), and the grams saved are its
own CO2 (energy-weighted, with PUE) times that share.

Figures need the series over the whole window [a, a + S + L]: where it does not reach that far yet (the
last import ends earlier), or has holes the gap tolerance does not fill, the job is `pending` and the
aggregator derives it again after the next `cocaq carbon import`. Interactive sessions (`[advice]
interactive_names`, "interactive" partitions) cannot wait and get none; neither do running jobs (until
they end) or jobs in a zone without an hourly series.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cocaq.carbon.intensity import IntensityIndex

OK = "ok"
PENDING = "pending"  # the series does not cover the window (yet)
NO_SERIES = "no-series"  # the zone has no hourly series: the annual figure says nothing about hours
INTERACTIVE = "interactive"
RUNNING = "running"
NO_RUN = "no-run"  # never ran (or for no time)
NO_SLACK = "no-slack"  # the site's slack is 0
MIN_COVER = 0.99  # of the window the series (or its nearest values) must cover


@dataclass(frozen=True, slots=True)
class Job:
    pk: int
    zone: str
    start: float  # epoch seconds
    run_s: float
    time_limit_s: float | None
    interactive: bool
    running: bool


@dataclass(frozen=True, slots=True)
class Figures:
    state: str
    slack_s: float | None = None
    now_g: float | None = None
    best_g: float | None = None
    best_start: float | None = None  # epoch seconds
    pause_g: float | None = None

    def saved(self, co2_g: float) -> tuple[float, float]:
        """(grams the best start, and pausing, would have saved) of a job that emitted `co2_g`."""
        if self.state != OK or not self.now_g or self.now_g <= 0:
            return 0.0, 0.0
        best, pause = self.best_g or 0.0, self.pause_g or 0.0
        return co2_g * max(1.0 - best / self.now_g, 0.0), co2_g * max(1.0 - pause / self.now_g, 0.0)


def slack_of(site_slack_s: float, time_limit_s: float | None) -> float:
    """The slack a job is given: the site's, at most its time limit (where Slurm recorded one)."""
    if time_limit_s is not None and time_limit_s > 0:
        return min(site_slack_s, time_limit_s)
    return site_slack_s


def window_end(j: Job, site_slack_s: float) -> float:
    """The end of the hours the job's figures read: its latest start plus its run time."""
    return j.start + slack_of(site_slack_s, j.time_limit_s) + max(j.run_s, 0.0)


def derive(index: IntensityIndex, jobs: list[Job], site_slack_s: float) -> dict[int, Figures]:
    """Each job's figures (or why it has none). `index` must be loaded up to every job's `window_end`."""
    out: dict[int, Figures] = {}
    todo: dict[str, list[tuple[Job, float]]] = defaultdict(list)
    for j in jobs:
        if j.running:
            out[j.pk] = Figures(RUNNING)
        elif j.run_s <= 0:
            out[j.pk] = Figures(NO_RUN)
        elif j.interactive:
            out[j.pk] = Figures(INTERACTIVE)
        elif site_slack_s <= 0:
            out[j.pk] = Figures(NO_SLACK)
        elif not index.has_series(j.zone):
            out[j.pk] = Figures(NO_SERIES)
        else:
            todo[j.zone].append((j, slack_of(site_slack_s, j.time_limit_s)))
    if not todo:
        return out
    import numpy as np

    from cocaq.carbon.shifting import averages, batch

    for zone, items in todo.items():
        start = np.array([j.start for j, _ in items])
        run = np.array([j.run_s for j, _ in items])
        slack = np.array([s for _, s in items])
        end = start + slack + run
        series, covered = index.hourly(zone, float(start.min()), float(end.max()))
        # figures only where the series reaches the window's end and covers (nearly) all of it
        ok = (end <= index.series_end(zone)) & (averages(covered, start, end) >= MIN_COVER)
        r = batch(series, start[ok], run[ok], slack[ok])
        at = np.cumsum(ok) - 1
        for i, (j, s) in enumerate(items):
            if not ok[i]:
                out[j.pk] = Figures(PENDING, s)
                continue
            k = at[i]
            out[j.pk] = Figures(
                OK,
                s,
                float(r["now_g"][k]),
                float(r["contiguous_g"][k]),
                float(r["contiguous_start"][k]),
                float(r["interruptible_g"][k]),
            )
    return out
