"""Do the e-mails work? The study's analysis: per month and arm, the outcomes the e-mails target, the
difference between arms with a bootstrap 95% interval, and the difference-in-differences against each
user's own baseline (docs/study.md says what the numbers mean and do not mean).

The unit is the user, as drawn (intention to treat: a user who opted out of the e-mails stays in the
arm they were drawn into, and is counted apart). An outcome is either a ratio of sums over the arm's
users (the idle share of GPU energy, energy-weighted GPU utilisation, kWh per GPU-hour: heavy users
weigh as much as their GPUs) or a mean per user over every user of the arm (failed-job energy and CO2:
a user with no jobs in a month counts as zero, so leaving does not flatter an arm). Intervals resample
users within each arm (the percentile bootstrap, `[study] bootstrap` resamples, seeded by the study's
seed so that a report is reproducible); the difference-in-differences keeps each resampled user's
baseline and study months together. Users who joined after the draw have no baseline: they count in
the between-arm comparison and not in the difference-in-differences, and the report says how many.

A user's study months are counted from the study's first contact with them (cocaq.study.assign.
first_contacts: their first study e-mail delivered, or, for a held-out user, the first one held back),
from the first whole UTC day after it: the days before it are neither baseline nor study, since no
e-mail could yet act on them, and a user never reached is left out of the study months (and counted).
The change from baseline over the study months is tested by re-randomisation (the arms re-drawn within
the draw's strata, `[study] bootstrap` times): its p-value is exact under no effect, and its interval is
the effects that test does not reject. The primary outcome (`[study] primary`, kept with the study at
its first draw) is the headline; the others are secondary and counted as clear only after Holm's
correction for their number.

pandas and numpy are imported here only: the analysis paths (`cocaq study report`, the admin report's
section, notebooks), never a login-node or node path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from sqlalchemy import Connection

    from cocaq.config import Config

from cocaq.config import STUDY_ARMS, STUDY_OUTCOMES, STUDY_PRIMARY
from cocaq.units import G_PER_KG, J_PER_KWH

EMAILED, HOLDOUT = STUDY_ARMS
LEVEL = 0.05  # the intervals are 95%; a claim is p < 0.05


@dataclass(frozen=True)
class Outcome:
    name: str
    label: str  # what it measures, for a sentence: "the share of GPU energy drawn by idle GPUs"
    unit: str  # "%", "kWh", "kg", "kWh/GPU-h"
    num: str  # the panel's column summed over the arm's users
    den: str | None  # ... divided by this one's sum (None: by the number of users)
    lower_is_better: bool
    scale: float = 1.0  # to the unit (a share to %)
    # False: compared as a difference in the unit, never as a %: most users' values are zero (a few
    # users' failures), so a relative figure divides by a counterfactual near zero ("-1127% to +1920%")
    relative: bool = True


OUTCOMES: tuple[Outcome, ...] = (
    Outcome(
        "idle_gpu_energy_share",
        "the share of GPU energy drawn by idle GPUs",
        "%",
        "idle_kwh",
        "gpu_kwh",
        True,
        100.0,
    ),
    Outcome(
        "idle_gpu_hours_share",
        "the share of GPU-hours held idle",
        "%",
        "idle_hours",
        "gpu_hours",
        True,
        100.0,
    ),
    Outcome(
        "failed_kwh_per_user",
        "the energy of failed jobs per user and month",
        "kWh",
        "failed_kwh",
        None,
        True,
        relative=False,
    ),
    Outcome("gpu_util", "energy-weighted GPU utilisation", "%", "util_weighted", "util_energy", False),
    Outcome("kwh_per_gpu_hour", "energy per GPU-hour", "kWh/GPU-h", "energy_kwh", "gpu_hours", True),
    Outcome("co2_per_user", "CO2 per user and month", "kg", "co2_kg", None, True),
)
assert tuple(o.name for o in OUTCOMES) == STUDY_OUTCOMES, "cocaq.config.STUDY_OUTCOMES drifted"
BY_NAME = {o.name: o for o in OUTCOMES}
PANEL_COLUMNS = (
    "energy_kwh", "gpu_kwh", "idle_kwh", "failed_kwh", "gpu_hours", "idle_hours", "util_weighted",
    "util_energy", "co2_kg",
)  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    """One comparison: the e-mailed arm's value against the hold-out's (or their changes), the difference
    and the relative difference, each with its 95% interval."""

    emailed: float | None
    holdout: float | None
    diff: float | None
    diff_lo: float | None
    diff_hi: float | None
    rel: float | None  # diff / the hold-out's value (or the e-mailed arm's counterfactual)
    rel_lo: float | None
    rel_hi: float | None
    n_emailed: int
    n_holdout: int
    p: float | None = None  # two-sided, the re-randomisation test of no effect (the change from baseline)
    method: str = "bootstrap"  # how the interval was made: "bootstrap" or "randomisation"

    @property
    def relative(self) -> bool:
        """Whether this estimate is read as a relative difference (else as a difference in the unit)."""
        return self.rel is not None and self.rel_lo is not None and self.rel_hi is not None


@dataclass(frozen=True)
class OutcomeResult:
    outcome: Outcome
    by_month: tuple[tuple[str, Estimate], ...]  # each study month: the arms compared
    pooled: Estimate  # the study months together: the arms compared
    did: Estimate  # the study months against each user's baseline months
    sentence: str
    did_by_month: tuple[tuple[str, Estimate], ...] = ()  # each study month against the baseline
    months_text: str = ""  # did_by_month in a line: when an effect began
    primary: bool = False  # the outcome the study is judged by
    p_holm: float | None = None  # a secondary's p-value, Holm-corrected for the number of secondaries
    clear: bool = False  # a difference the study may claim: the primary's interval, a secondary's p_holm


@dataclass
class StudyReport:
    study: str
    start: str
    end: str | None
    baseline: tuple[str, ...]  # the months before the start
    months: tuple[str, ...]  # the study months with data so far
    arms: dict[str, int]  # users drawn per arm
    joined: dict[str, int]  # per arm: drawn after the start (no baseline)
    active: dict[str, int]  # per arm: users with jobs in the study months
    opted_out: dict[str, int]
    outcomes: list[OutcomeResult] = field(default_factory=list)
    resamples: int = 0
    notes: list[str] = field(default_factory=list)
    primary: str = STUDY_PRIMARY  # the primary outcome's name
    declared: str = ""  # when and how the primary outcome was declared, in words
    counting: str = ""  # how a user's study months are counted, in words
    unreached: dict[str, int] = field(default_factory=dict)  # per arm: drawn, never reached by the study

    @property
    def headline(self) -> OutcomeResult | None:
        return next((r for r in self.outcomes if r.primary), None)

    @property
    def secondary(self) -> list[OutcomeResult]:
        return [r for r in self.outcomes if not r.primary]

    @property
    def caveat(self) -> str:
        """Why a secondary outcome's clear difference is weak evidence, in words."""
        n = len(self.secondary)
        chance = 1.0 - (1.0 - LEVEL) ** n
        return (
            f"each 95% interval excludes no change by chance alone one time in twenty, so with "
            f"{_NUMBERS.get(n, str(n))} of them "
            f"{chance:.0%} of studies with no effect at all show at least one such difference; a secondary "
            "difference counts as clear only after Holm's correction for their number."
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for o, r in zip(d["outcomes"], self.outcomes, strict=True):
            o["outcome"] = asdict(r.outcome)
            o["by_month"] = [{"month": m, **asdict(e)} for m, e in r.by_month]
            o["did_by_month"] = [{"month": m, **asdict(e)} for m, e in r.did_by_month]
        return d


# --- the numbers ----------------------------------------------------------------------------------------


def _arm_value(num: np.ndarray, den: np.ndarray | None, n: int) -> float | None:
    """An arm's value from its users' sums (the last axis): a ratio of sums, or a mean per user."""
    if den is None:
        return float(num.sum() / n) if n else None
    d = float(den.sum())
    return float(num.sum()) / d if d > 0 else None


def _boot_values(num: np.ndarray, den: np.ndarray | None, idx: np.ndarray) -> np.ndarray:
    """The arm's value in each resample (rows of `idx`); NaN where a resample has no denominator."""
    import numpy as np

    s = num[idx].sum(axis=1)
    if den is None:
        return s / idx.shape[1]
    d = den[idx].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, s / np.where(d > 0, d, 1.0), np.nan)


def _interval(x: np.ndarray) -> tuple[float | None, float | None]:
    import numpy as np

    x = x[np.isfinite(x)]
    if len(x) < 20:
        return None, None
    lo, hi = np.percentile(x, [2.5, 97.5])
    return float(lo), float(hi)


def _months(months: float | pd.Series, users: pd.Index) -> np.ndarray | float:
    """`months` for `users`: a number as it is, a per-user Series aligned (absent users: 0)."""
    if isinstance(months, (int, float)):
        return max(float(months), 1e-9)
    return months.reindex(users).fillna(0.0).to_numpy(dtype=float).clip(min=1e-9)


def _values(
    frame: pd.DataFrame, users: pd.Index, outcome: Outcome, months: float | pd.Series
) -> tuple[np.ndarray, np.ndarray | None]:
    """The users' numerators (a mean per user: per month of their own period) and denominators; users
    absent count as zeros."""
    rows = frame.reindex(users).fillna(0.0)
    num = rows[outcome.num].to_numpy(dtype=float) * outcome.scale
    if outcome.den is None:
        return num / _months(months, users), None
    return num, rows[outcome.den].to_numpy(dtype=float)


def _trusted(denominators: np.ndarray, observed: float) -> bool:
    """Whether a relative figure is readable: its denominator stays well away from zero in the resamples
    (its 2.5th percentile above a quarter of what was observed); else the difference is read in the unit."""
    import numpy as np

    d = denominators[np.isfinite(denominators)]
    return observed > 0 and len(d) >= 20 and float(np.percentile(d, 2.5)) > 0.25 * observed


def compare(
    post: pd.DataFrame, arms: pd.Series, outcome: Outcome, resamples: int, rng: np.random.Generator,
    months: float | pd.Series = 1,
) -> Estimate:  # fmt: skip
    """The arms compared on `outcome`: over the users of `arms` (user -> arm), their sums in `post` (one
    row per user, the panel's columns, over `months` months, or each user's own; users absent count as
    zeros)."""
    import numpy as np

    groups = {a: arms.index[arms == a] for a in (EMAILED, HOLDOUT)}
    n_e, n_h = len(groups[EMAILED]), len(groups[HOLDOUT])
    if n_e == 0 or n_h == 0:
        return Estimate(None, None, None, None, None, None, None, None, n_e, n_h)
    e_post = _values(post, groups[EMAILED], outcome, months)
    h_post = _values(post, groups[HOLDOUT], outcome, months)
    ve, vh = _arm_value(*e_post, n_e), _arm_value(*h_post, n_h)
    if ve is None or vh is None or ve == vh == 0:
        return Estimate(ve, vh, None, None, None, None, None, None, n_e, n_h)
    ie = rng.integers(0, n_e, size=(resamples, n_e))
    ih = rng.integers(0, n_h, size=(resamples, n_h))
    be, bh = _boot_values(*e_post, ie), _boot_values(*h_post, ih)
    lo, hi = _interval(be - bh)
    if not (outcome.relative and vh and _trusted(bh, vh)):
        return Estimate(ve, vh, ve - vh, lo, hi, None, None, None, n_e, n_h)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_b = be / bh - 1.0
    rlo, rhi = _interval(rel_b)
    return Estimate(ve, vh, ve - vh, lo, hi, ve / vh - 1.0, rlo, rhi, n_e, n_h)


def _changes(
    pre: pd.DataFrame, post: pd.DataFrame, users: pd.Index, outcome: Outcome, pre_months: float,
    post_months: float | pd.Series,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Per user: (weight, value before, value after). A mean per user weighs every user alike (one absent
    after counts as zero); a ratio is each user's own, weighted by the inverse of its sampling variance's
    scale, den_before * den_after / (den_before + den_after), zero where either period has none."""
    import numpy as np

    n0, d0 = _values(pre, users, outcome, pre_months)
    n1, d1 = _values(post, users, outcome, post_months)
    if d0 is None or d1 is None:
        return np.ones(len(users)), n0, n1
    ok = (d0 > 0) & (d1 > 0)
    safe0, safe1 = np.where(ok, d0, 1.0), np.where(ok, d1, 1.0)
    w = np.where(ok, safe0 * safe1 / (safe0 + safe1), 0.0)
    return w, np.where(ok, n0 / safe0, 0.0), np.where(ok, n1 / safe1, 0.0)


def _did_arms(arms: pd.Series, pre: pd.DataFrame, post_months: float | pd.Series) -> pd.Series:
    """The users a change from baseline counts: drawn, with a baseline, and (where each user's study
    period is their own) reached by the study."""
    arms = arms[arms.index.isin(pre.index)]
    if not isinstance(post_months, (int, float)):
        arms = arms[arms.index.isin(post_months.index[post_months > 0])]
    return arms


def did(
    pre: pd.DataFrame, post: pd.DataFrame, arms: pd.Series, outcome: Outcome, resamples: int,
    rng: np.random.Generator, pre_months: float, post_months: float | pd.Series,
) -> Estimate:  # fmt: skip
    """The difference in differences: each arm's change from its users' own baseline (`pre`: a row per
    user with jobs in the baseline months), the e-mailed arm's against the hold-out's; bootstrap interval.

    Within-user changes, not the change of the arm's ratio of sums: an arm's ratio moves when a heavy
    user has a busy month, whatever anyone's habits; a user's own ratio moves only when their habits or
    their luck do. The arm's change is the weighted mean of its users' changes (weights: _changes).
    `emailed`/`holdout` are the arms' changes; `rel` is the difference over the e-mailed arm's value had
    it changed as the hold-out did; n counts the users who weigh."""
    import numpy as np

    arms = _did_arms(arms, pre, post_months)
    groups = {a: arms.index[arms == a] for a in (EMAILED, HOLDOUT)}
    e = _changes(pre, post, groups[EMAILED], outcome, pre_months, post_months)
    h = _changes(pre, post, groups[HOLDOUT], outcome, pre_months, post_months)
    n_e, n_h = int((e[0] > 0).sum()), int((h[0] > 0).sum())
    if n_e == 0 or n_h == 0 or not any(np.any(x[0] * (x[1] + x[2])) for x in (e, h)):
        return Estimate(None, None, None, None, None, None, None, None, n_e, n_h)

    def arm(w: np.ndarray, v0: np.ndarray, v1: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ws = w[idx].sum(axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            before = np.where(ws > 0, (w[idx] * v0[idx]).sum(axis=-1) / ws, np.nan)
            after = np.where(ws > 0, (w[idx] * v1[idx]).sum(axis=-1) / ws, np.nan)
        return before, after

    def draws(n: int) -> np.ndarray:  # the arm as it is, then the resamples of its users
        return np.vstack([np.arange(n)[None, :], rng.integers(0, n, size=(resamples, n))])

    # resample each arm's users (those with no weight too: an arm's makeup is part of the chance)
    e0, e1 = arm(*e, draws(len(e[0])))
    h0, h1 = arm(*h, draws(len(h[0])))
    d = (e1 - e0) - (h1 - h0)
    cf = e0 + (h1 - h0)  # the e-mailed arm, had it changed as the hold-out did
    lo, hi = _interval(d[1:])
    changes = (float(e1[0] - e0[0]), float(h1[0] - h0[0]), float(d[0]))
    if not (outcome.relative and _trusted(cf[1:], float(cf[0]))):
        return Estimate(*changes, lo, hi, None, None, None, n_e, n_h)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(cf != 0, d / cf, np.nan)
    rlo, rhi = _interval(rel[1:])
    r0 = float(rel[0]) if np.isfinite(rel[0]) else None
    return Estimate(*changes, lo, hi, r0, rlo, rhi, n_e, n_h)


# --- the change from baseline, by re-randomisation -------------------------------------------------------


def redraws(strata: np.ndarray, emailed: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` re-draws of the arms (n x users, 1.0 = e-mailed): the labels shuffled within each stratum, as
    the draw holds out a fixed number per stratum (cocaq.study.assign.split)."""
    import numpy as np

    out = np.tile(emailed.astype(float), (n, 1))
    for s in np.unique(strata):
        idx = np.flatnonzero(strata == s)
        if len(idx) > 1:
            order = np.argsort(rng.random((n, len(idx))), axis=1)
            out[:, idx] = emailed[idx].astype(float)[order]
    return out


def _did_stat(labels: np.ndarray, w: np.ndarray, v0: np.ndarray, v1: np.ndarray) -> np.ndarray:
    """The difference in differences for each row of `labels` (1.0 e-mailed, 0.0 held out)."""
    import numpy as np

    other = 1.0 - labels
    with np.errstate(divide="ignore", invalid="ignore"):
        we, wh = labels @ w, other @ w
        e = (labels @ (w * v1) - labels @ (w * v0)) / we
        h = (other @ (w * v1) - other @ (w * v0)) / wh
    return np.asarray(e - h)


class _Test:
    """The re-randomisation test of one outcome's change from baseline, and its inversion.

    Under "the e-mails changed each e-mailed user's value after by `theta`" (a factor 1 + theta for a
    relative outcome, theta added for the others), taking it out of the e-mailed users' values leaves data
    in which the arms differ by chance only; the test re-draws the arms within the strata and asks how often
    a re-draw differs as much. The interval is the thetas it does not reject at 5% (the same re-draws for
    every theta, so that the bounds are those of one test)."""

    def __init__(self, w: np.ndarray, v0: np.ndarray, v1: np.ndarray, emailed: np.ndarray,
                 labels: np.ndarray, relative: bool) -> None:  # fmt: skip
        self.w, self.v0, self.v1, self.emailed, self.labels, self.relative = (
            w,
            v0,
            v1,
            emailed,
            labels,
            relative,
        )

    def p(self, theta: float) -> float:
        import numpy as np

        if self.relative:
            v1 = np.where(self.emailed, self.v1 / (1.0 + theta), self.v1)
        else:
            v1 = np.where(self.emailed, self.v1 - theta, self.v1)
        t = _did_stat(self.emailed.astype(float)[None, :], self.w, self.v0, v1)[0]
        r = _did_stat(self.labels, self.w, self.v0, v1)
        r = r[np.isfinite(r)]
        tol = 1e-12 * max(1.0, abs(t))
        return float((1 + np.count_nonzero(np.abs(r) >= abs(t) - tol)) / (len(r) + 1))

    def bound(self, estimate: float, step: float, limit: float) -> float | None:
        """The furthest theta from `estimate` towards `step`'s sign that the test does not reject, within
        `limit` (None: not rejected up to there)."""
        inside, far = estimate, estimate + step
        while self.p(far) >= LEVEL:
            inside, far = far, estimate + 2.0 * (far - estimate)
            if (far - limit) * step > 0:
                far = limit
                if self.p(far) >= LEVEL:
                    return None
        for _ in range(40):
            mid = (inside + far) / 2.0
            inside, far = (mid, far) if self.p(mid) >= LEVEL else (inside, mid)
        return inside


def _cells(arms: pd.DataFrame) -> np.ndarray:
    """What the draw held a fixed number out of: each stratum, or each block of it where the draw made
    blocks (cocaq.study.assign.blocks)."""
    import numpy as np

    stratum = arms["stratum"].to_numpy(dtype=np.int64)
    if "block" not in arms:
        return stratum
    block = arms["block"].to_numpy(dtype=float)
    return np.where(np.isnan(block), stratum * 100_000, stratum * 100_000 + 1 + np.nan_to_num(block)).astype(
        np.int64
    )


def did_test(
    pre: pd.DataFrame, post: pd.DataFrame, arms: pd.DataFrame, outcome: Outcome, redraws_n: int,
    rng: np.random.Generator, pre_months: float, post_months: float | pd.Series,
) -> Estimate:  # fmt: skip
    """The change from baseline over the study months (as `did`), with its p-value and 95% interval from
    re-drawing the arms within the draw's strata (`arms`: arm and stratum per user): exact under no effect,
    however skewed the users' values, where the bootstrap's percentiles are only approximate."""
    import numpy as np

    drawn = _did_arms(arms["arm"], pre, post_months)
    users = drawn.index
    w, v0, v1 = _changes(pre, post, users, outcome, pre_months, post_months)
    emailed = (drawn == EMAILED).to_numpy()
    n_e, n_h = int(((w > 0) & emailed).sum()), int(((w > 0) & ~emailed).sum())
    if n_e == 0 or n_h == 0:
        return Estimate(None, None, None, None, None, None, None, None, n_e, n_h)
    observed = emailed.astype(float)[None, :]

    def means(lab: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        other = 1.0 - lab
        with np.errstate(divide="ignore", invalid="ignore"):
            return (lab @ (w * v0) / (lab @ w), lab @ (w * v1) / (lab @ w),
                    other @ (w * v0) / (other @ w), other @ (w * v1) / (other @ w))  # fmt: skip

    if not (np.any(v0 * w) or np.any(v1 * w)):  # nothing to compare (no samples: no idle time seen)
        return Estimate(None, None, None, None, None, None, None, None, n_e, n_h)
    e0, e1, h0, h1 = (float(x[0]) for x in means(observed))
    d, cf = (e1 - e0) - (h1 - h0), e0 + (h1 - h0)
    labels = redraws(_cells(arms.loc[users]), emailed, redraws_n, rng)
    absolute = _Test(w, v0, v1, emailed, labels, relative=False)
    spread = float(np.nanstd(_did_stat(labels, w, v0, v1))) or abs(d) or 1e-9
    lo = absolute.bound(d, -spread, d - 1e6 * spread)
    hi = absolute.bound(d, spread, d + 1e6 * spread)
    base = Estimate(e1 - e0, h1 - h0, d, lo, hi, None, None, None, n_e, n_h, absolute.p(0.0), "randomisation")
    r0, _, q0, q1 = means(labels)
    if not (outcome.relative and cf > 0 and _trusted(r0 + (q1 - q0), cf)):
        return base
    rel = d / cf
    relative = _Test(w, v0, v1, emailed, labels, relative=True)
    rlo = relative.bound(rel, -max(abs(rel), 0.05), -0.999)
    rhi = relative.bound(rel, max(abs(rel), 0.05), 10.0)
    if rlo is None or rhi is None:  # no bound within -99.9% to +1000%: read it in the unit
        return base
    return replace(base, rel=rel, rel_lo=rlo, rel_hi=rhi)


def holm(ps: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of p-values (None: not tested, and not counted)."""
    tested = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    m = len(tested)
    out: list[float | None] = [None] * len(ps)
    running = 0.0
    for k, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out


def _way(x: float) -> str:
    return "lower" if x < 0 else "higher"


def _pct(x: float) -> str:
    return "under 1%" if abs(x) < 0.005 else f"{abs(x):.0%}"


def _span(lo: float, hi: float) -> str:
    """An interval of relative differences in words: "12% to 33% lower", "25% lower to 18% higher"."""
    if _way(lo) == _way(hi):
        near, far = sorted((lo, hi), key=abs)
        return f"{_pct(near)} to {_pct(far)} {_way(lo)}"
    return f"{_pct(lo)} {_way(lo)} to {_pct(hi)} {_way(hi)}"


def _g(x: float) -> str:
    """A magnitude in three significant figures, no exponent."""
    x = abs(x)
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _amount(x: float, o: Outcome) -> str:
    """A difference in the outcome's unit, unsigned: "0.86 kWh", "1.2 percentage points"."""
    return f"{abs(x):.1f} percentage points" if o.unit == "%" else f"{_g(x)} {o.unit}"


def _span_in(lo: float, hi: float, o: Outcome) -> str:
    """An interval of differences in the unit: "0.3 to 2.1 kWh lower", "1.2 kWh lower to 0.4 kWh higher"."""
    if _way(lo) == _way(hi):
        near, far = sorted((lo, hi), key=abs)
        if o.unit == "%":
            return f"{abs(near):.1f} to {abs(far):.1f} percentage points {_way(lo)}"
        return f"{_g(near)} to {_g(far)} {o.unit} {_way(lo)}"
    return f"{_amount(lo, o)} {_way(lo)} to {_amount(hi, o)} {_way(hi)}"


def _reading(o: Outcome, e: Estimate) -> tuple[float, float, float, str, str] | None:
    """(estimate, lo, hi, its size in words, its interval in words), relative where readable, else in the
    unit; None without an interval."""
    if e.relative:
        assert e.rel is not None and e.rel_lo is not None and e.rel_hi is not None
        return e.rel, e.rel_lo, e.rel_hi, f"{_pct(e.rel)} {_way(e.rel)}", _span(e.rel_lo, e.rel_hi)
    if e.diff is None or e.diff_lo is None or e.diff_hi is None:
        return None
    x, lo, hi = e.diff, e.diff_lo, e.diff_hi  # (in the unit: a share's in percentage points)
    return x, lo, hi, f"{_amount(x, o)} {_way(x)}", _span_in(lo, hi, o)


_NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def excludes_zero(o: Outcome, e: Estimate) -> bool:
    r = _reading(o, e)
    return r is not None and not r[1] <= 0 <= r[2]


def sentence(o: Outcome, e: Estimate, *, p_holm: float | None = None, secondaries: int = 0) -> str:
    """The estimate in words a non-statistician reads: "e-mailed users' share of GPU energy drawn by
    idle GPUs was 18% lower than it would have been without the e-mails (95% interval: 6% to 29%
    lower)", or that the data cannot tell. A secondary outcome (`secondaries` of them) whose interval
    excludes no change says whether it still does once their number is counted (Holm's correction)."""
    r = _reading(o, e)
    label = f"{o.label[0].upper()}{o.label[1:]}"
    if r is None:
        return f"{label}: not enough data to compare the arms yet."
    x, lo, hi, size, span = r
    if lo <= 0 <= hi:
        return (
            f"{label}: no clear difference between the arms: e-mailed users' was {size} than expected "
            f"without the e-mails, but the 95% interval runs from {span}."
        )
    good = (x < 0) == o.lower_is_better
    wrong = "" if good else ", the wrong way"
    said = (
        f"{label}: {size} for e-mailed users than it would have been without the e-mails "
        f"(95% interval: {span}"
    )
    if p_holm is None or not secondaries:
        return f"{said}){wrong}."
    n = _NUMBERS.get(secondaries, str(secondaries))
    if p_holm >= LEVEL:
        return (
            f"{said}){wrong}; but not clear once the {n} secondary outcomes are counted (p = {p_holm:.2g} "
            "after Holm's correction): one interval in twenty excludes no change by chance alone."
        )
    return f"{said}; p = {p_holm:.2g} after Holm's correction for {n} secondary outcomes){wrong}."


def months_text(by_month: Sequence[tuple[str, Estimate]], o: Outcome) -> str:
    """Each study month against the baseline, in a line: "2026-08: 1% higher (3% lower to 4% higher);
    2026-09: 21% lower (20% to 24% lower); ..." (when an effect began, and whether it lasted)."""
    out = []
    for m, e in by_month:
        r = _reading(o, e)
        out.append(f"{m}: not enough data" if r is None else f"{m}: {r[3]} ({r[4]})")
    return "; ".join(out)


# --- the data -------------------------------------------------------------------------------------------


def month_label(d: datetime) -> str:
    return f"{d:%Y-%m}"


def add_months(label: str, n: int) -> str:
    """`YYYY-MM` moved by n months (cocaq.study.assign.month_start does the arithmetic)."""
    from cocaq.study.assign import month_start

    return month_label(month_start(label, n))


def exposure_days(contacts: Mapping[str, datetime]) -> dict[str, datetime]:
    """user -> the first whole UTC day after the study first reached them (cocaq.study.assign.
    first_contacts): where their study months begin."""
    out = {}
    for u, t in contacts.items():
        t = t.astimezone(UTC)
        out[u] = datetime(t.year, t.month, t.day, tzinfo=UTC) + timedelta(days=1)
    return out


def panel(
    conn: Connection, first: str, last: str, *, exposure: Mapping[str, datetime] | None = None,
    study_start: str | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Per user and UTC month, from the daily rollups, the sums the outcomes read (PANEL_COLUMNS):
    months `first` to `last` ("YYYY-MM", inclusive). With `exposure` (user -> first study day), the days
    from `study_start` on count only from each user's own first study day (users without one: none)."""
    import pandas as pd
    from sqlalchemy import func, select

    from cocaq.db.schema import DailyRollup
    from cocaq.study.assign import month_start

    r = DailyRollup.__table__.c
    q = (
        select(
            r.user_name, r.day,
            func.sum(r.energy_measured_j + r.energy_estimated_j), func.sum(r.energy_gpu_j),
            func.sum(r.idle_gpu_energy_j), func.sum(r.energy_failed_j), func.sum(r.gpu_hours),
            func.sum(r.gpu_util_weighted), func.sum(r.gpu_util_energy_j), func.sum(r.co2_g),
            func.sum(r.idle_gpu_hours),
        )
        .where(r.day >= month_start(first), r.day < month_start(last, 1))
        .group_by(r.user_name, r.day)
    )  # fmt: skip
    rows = conn.execute(q).all()
    cols = [
        "user",
        "day",
        "energy_j",
        "gpu_j",
        "idle_j",
        "failed_j",
        "gpu_hours",
        "uw",
        "ue",
        "co2",
        "idle_h",
    ]
    df = pd.DataFrame(rows, columns=cols)
    if df.empty:
        return pd.DataFrame(columns=["user", "month", *PANEL_COLUMNS])
    day = pd.to_datetime(df["day"], utc=True)
    if exposure is not None and study_start is not None:
        begun = pd.Timestamp(month_start(study_start))
        own = df["user"].map({u: pd.Timestamp(t) for u, t in exposure.items()})
        keep = (day < begun) | (own.notna() & (day >= own))
        df, day = df[keep.to_numpy()], day[keep.to_numpy()]
        if df.empty:
            return pd.DataFrame(columns=["user", "month", *PANEL_COLUMNS])
    out = pd.DataFrame(
        {
            "user": df["user"],
            "month": day.dt.strftime("%Y-%m"),
            "energy_kwh": df["energy_j"].astype(float) / J_PER_KWH,
            "gpu_kwh": df["gpu_j"].astype(float) / J_PER_KWH,
            "idle_kwh": df["idle_j"].astype(float) / J_PER_KWH,
            "failed_kwh": df["failed_j"].astype(float) / J_PER_KWH,
            "gpu_hours": df["gpu_hours"].astype(float),
            "idle_hours": df["idle_h"].astype(float),
            "util_weighted": df["uw"].astype(float) / J_PER_KWH,
            "util_energy": df["ue"].astype(float) / J_PER_KWH,
            "co2_kg": df["co2"].astype(float) / G_PER_KG,
        }
    )
    return out.groupby(["user", "month"], as_index=False).sum()


def arms_frame(conn: Connection, study: str) -> pd.DataFrame:
    """The study's users: user (index), arm, stratum, block (None: none), assigned_at, opted_out_at."""
    import pandas as pd
    from sqlalchemy import select

    from cocaq.db.schema import StudyArm

    t = StudyArm.__table__.c
    rows = conn.execute(
        select(t.user_name, t.arm, t.stratum, t.block, t.assigned_at, t.opted_out_at)
        .where(t.study == study)
        .order_by(t.user_name)  # (the bootstrap draws by position: the same data, the same report)
    ).all()
    df = pd.DataFrame(rows, columns=["user", "arm", "stratum", "block", "assigned_at", "opted_out_at"])
    return df.set_index("user")


def exposed_months(
    users: pd.Index, months: Sequence[str], exposure: Mapping[str, datetime] | None,
    until: datetime | None = None,
) -> pd.DataFrame:  # fmt: skip
    """users x study months: the share of each month in each user's study period (from their first study
    day, `exposure`, to `until`); without `exposure` every user's whole months (to `until`)."""
    import pandas as pd

    from cocaq.study.assign import month_start

    cols = {}
    for m in months:
        m0, m1 = month_start(m), month_start(m, 1)
        end = min(m1, until) if until is not None else m1
        length = (m1 - m0).total_seconds()
        if exposure is None:
            cols[m] = pd.Series(max((end - m0).total_seconds(), 0.0) / length, index=users)
        else:
            own = [exposure.get(u) for u in users]
            cols[m] = pd.Series(
                [0.0 if t is None else max((end - max(m0, t)).total_seconds(), 0.0) / length for t in own],
                index=users,
            )
    return pd.DataFrame(cols, index=users)


def analyse(
    p: pd.DataFrame, arms: pd.DataFrame, *, study: str, start: str, end: str | None, baseline: Sequence[str],
    months: Sequence[str], resamples: int, seed: int, primary: str = STUDY_PRIMARY,
    exposure: Mapping[str, datetime] | None = None, until: datetime | None = None, declared: str = "",
) -> StudyReport:  # fmt: skip
    """The report from a panel (per user and month) and the arms; pure (tests feed it simulated panels).

    `exposure` (user -> first study day; `panel` trims the study months to it) makes each user's study
    period their own, from the study's first contact with them; None: every drawn user's from the start.
    `until` ends a month still running (for the per-user means)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arm = arms["arm"]
    joined_mask = arms["stratum"] < 0
    study_rows = p[p["month"].isin(list(months))]
    base_rows = p[p["month"].isin(list(baseline))]
    post_all = study_rows.groupby("user")[list(PANEL_COLUMNS)].sum()
    pre_all = base_rows.groupby("user")[list(PANEL_COLUMNS)].sum()
    reached = arm.index if exposure is None else arm.index[arm.index.isin(list(exposure))]
    rep = StudyReport(
        study=study,
        start=start,
        end=end,
        baseline=tuple(baseline),
        months=tuple(months),
        arms={a: int((arm == a).sum()) for a in (EMAILED, HOLDOUT)},
        joined={a: int(((arm == a) & joined_mask).sum()) for a in (EMAILED, HOLDOUT)},
        active={a: int(arm[arm == a].index.isin(post_all.index).sum()) for a in (EMAILED, HOLDOUT)},
        opted_out={a: int(((arm == a) & arms["opted_out_at"].notna()).sum()) for a in (EMAILED, HOLDOUT)},
        resamples=resamples,
        primary=primary,
        declared=declared,
        unreached={a: int(((arm == a) & ~arm.index.isin(reached)).sum()) for a in (EMAILED, HOLDOUT)},
    )
    rep.counting = (
        "each user's study months start on the first whole UTC day after the study first reached them "
        "(their first study e-mail delivered, or for the hold-out the first one held back)"
        if exposure is not None
        else "every drawn user's study months start with the study"
    )
    strangers = sorted(set(post_all.index) - set(arm.index))
    if strangers:
        rep.notes.append(f"{len(strangers)} users with jobs in the study months were never drawn: left out")
    if exposure is not None and any(rep.unreached.values()):
        rep.notes.append(
            f"not reached by the study yet (no study e-mail sent or held back): {rep.unreached[EMAILED]} "
            f"e-mailed, {rep.unreached[HOLDOUT]} held out; left out of the study months"
        )
    if not months:
        rep.notes.append("no study month has data yet")
        return rep
    n_pre = max(int(base_rows["month"].nunique()), 1)  # baseline months with data (a new site has fewer)
    share = exposed_months(arm.index, months, exposure, until)
    total = share.sum(axis=1)
    per_month = {
        m: study_rows[study_rows["month"] == m].groupby("user")[list(PANEL_COLUMNS)].sum() for m in months
    }
    in_month = {m: arm[share[m] > 0] for m in months}
    results = []
    for o in OUTCOMES:
        by_month = tuple(
            (m, compare(rows, in_month[m], o, resamples, rng, share[m])) for m, rows in per_month.items()
        )
        did_by_month = tuple(
            (m, did(pre_all, rows, arm, o, resamples, rng, n_pre, share[m])) for m, rows in per_month.items()
        )
        pooled = compare(post_all, arm[total > 0], o, resamples, rng, total)
        headline = did_test(pre_all, post_all, arms, o, resamples, rng, n_pre, total)
        results.append((o, by_month, pooled, headline, did_by_month))
    n_secondary = len(OUTCOMES) - 1
    adjusted = iter(holm([h.p for o, _, _, h, _ in results if o.name != primary]))
    for o, by_month, pooled, headline, did_by_month in results:
        is_primary = o.name == primary
        p_holm = None if is_primary else next(adjusted)
        clear = excludes_zero(o, headline) and (is_primary or (p_holm is not None and p_holm < LEVEL))
        said = sentence(o, headline, p_holm=p_holm, secondaries=0 if is_primary else n_secondary)
        rep.outcomes.append(
            OutcomeResult(
                o, by_month, pooled, headline, said, did_by_month, months_text(did_by_month, o), is_primary,
                p_holm, clear,
            )
        )  # fmt: skip
    rep.outcomes.sort(key=lambda r: not r.primary)  # the primary first, the others in their order
    return rep


def study_report(conn: Connection, cfg: Config, now: datetime) -> StudyReport:
    """The configured study's report, from the database, with the months that have begun by `now`."""
    from cocaq.errors import UsageError
    from cocaq.study.assign import first_contacts, protocol, study_id

    s = cfg.study
    if s.start is None:
        raise UsageError("no study configured: set [study] start (docs/study.md)")
    sid = study_id(conn, s)
    current = month_label(now.astimezone(UTC))
    last = min(s.end, current) if s.end is not None else current
    months = []
    m = s.start
    while m <= last:
        months.append(m)
        m = add_months(m, 1)
    baseline = [add_months(s.start, -k) for k in range(s.baseline_months, 0, -1)]
    arms = arms_frame(conn, sid.key)
    if arms.empty or sid.seed is None:
        raise UsageError(f"study {sid.key}: no user has been drawn yet (cocaq study assign)")
    exposure = exposure_days(first_contacts(conn, s, sid.key))
    p = panel(
        conn, baseline[0], last if months else add_months(s.start, -1), exposure=exposure, study_start=s.start
    )
    with_data = [m for m in months if (p["month"] == m).any()]
    kept = protocol(conn, s, sid.key)
    return analyse(
        p, arms, study=sid.key, start=s.start, end=s.end, baseline=baseline, months=with_data,
        resamples=s.bootstrap, seed=sid.seed, primary=kept.primary, exposure=exposure, until=now,
        declared=kept.words(),
    )  # fmt: skip
