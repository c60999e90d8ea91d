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

pandas and numpy are imported here only: the analysis paths (`cocaq study report`, the admin report's
section, notebooks), never a login-node or node path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from sqlalchemy import Connection

    from cocaq.config import Config

EMAILED, HOLDOUT = "emailed", "hold-out"
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Outcome:
    name: str
    label: str  # what it measures, for a sentence: "the share of GPU energy drawn by idle GPUs"
    unit: str  # "%", "kWh", "kg", "kWh/GPU-h"
    num: str  # the panel's column summed over the arm's users
    den: str | None  # ... divided by this one's sum (None: by the number of users)
    lower_is_better: bool
    scale: float = 1.0  # to the unit (a share to %)


OUTCOMES: tuple[Outcome, ...] = (
    Outcome(
        "idle_share", "the share of GPU energy drawn by idle GPUs", "%", "idle_kwh", "gpu_kwh", True, 100.0
    ),
    Outcome(
        "idle_hours_share", "the share of GPU-hours held idle", "%", "idle_hours", "gpu_hours", True, 100.0
    ),
    Outcome("failed_kwh", "the energy of failed jobs per user", "kWh", "failed_kwh", None, True),
    Outcome("gpu_util", "energy-weighted GPU utilisation", "%", "util_weighted", "util_energy", False),
    Outcome("kwh_per_gpu_hour", "energy per GPU-hour", "kWh/GPU-h", "energy_kwh", "gpu_hours", True),
    Outcome("co2_per_user", "CO2 per user", "kg", "co2_kg", None, True),
)
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


@dataclass(frozen=True)
class OutcomeResult:
    outcome: Outcome
    by_month: tuple[tuple[str, Estimate], ...]  # each study month: the arms compared
    pooled: Estimate  # the study months together: the arms compared
    did: Estimate  # the study months against each user's baseline months
    sentence: str


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

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for o, r in zip(d["outcomes"], self.outcomes, strict=True):
            o["outcome"] = asdict(r.outcome)
            o["by_month"] = [{"month": m, **asdict(e)} for m, e in r.by_month]
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


def compare(
    post: pd.DataFrame, arms: pd.Series, outcome: Outcome, resamples: int, rng: np.random.Generator,
    pre: pd.DataFrame | None = None,
) -> Estimate:  # fmt: skip
    """The arms compared on `outcome`: over the users of `arms` (user -> arm), their sums in `post` (one
    row per user, the panel's columns; users absent count as zeros); with `pre`, the difference of
    differences over the users who have a baseline (a row in `pre`)."""
    import numpy as np

    if pre is not None:
        arms = arms[arms.index.isin(pre.index)]
    groups = {a: arms.index[arms == a] for a in (EMAILED, HOLDOUT)}
    n_e, n_h = len(groups[EMAILED]), len(groups[HOLDOUT])

    def cols(frame: pd.DataFrame, users: pd.Index) -> tuple[np.ndarray, np.ndarray | None]:
        rows = frame.reindex(users).fillna(0.0)
        num = rows[outcome.num].to_numpy(dtype=float) * outcome.scale
        den = None if outcome.den is None else rows[outcome.den].to_numpy(dtype=float)
        return num, den

    if n_e == 0 or n_h == 0:
        return Estimate(None, None, None, None, None, None, None, None, n_e, n_h)
    e_post, h_post = cols(post, groups[EMAILED]), cols(post, groups[HOLDOUT])
    ve, vh = _arm_value(*e_post, n_e), _arm_value(*h_post, n_h)
    ie = rng.integers(0, n_e, size=(resamples, n_e))
    ih = rng.integers(0, n_h, size=(resamples, n_h))
    be, bh = _boot_values(*e_post, ie), _boot_values(*h_post, ih)
    if pre is None:
        if ve is None or vh is None:
            return Estimate(ve, vh, None, None, None, None, None, None, n_e, n_h)
        diff = ve - vh
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_b = be / bh - 1.0
        lo, hi = _interval(be - bh)
        rlo, rhi = _interval(rel_b)
        return Estimate(ve, vh, diff, lo, hi, (ve / vh - 1.0) if vh else None, rlo, rhi, n_e, n_h)
    e_pre, h_pre = cols(pre, groups[EMAILED]), cols(pre, groups[HOLDOUT])
    ve0, vh0 = _arm_value(*e_pre, n_e), _arm_value(*h_pre, n_h)
    if None in (ve, vh, ve0, vh0):
        return Estimate(None, None, None, None, None, None, None, None, n_e, n_h)
    assert ve is not None and vh is not None and ve0 is not None and vh0 is not None
    be0, bh0 = _boot_values(*e_pre, ie), _boot_values(*h_pre, ih)
    did = (ve - ve0) - (vh - vh0)
    did_b = (be - be0) - (bh - bh0)
    counterfactual = ve0 + (vh - vh0)  # the e-mailed arm had it moved as the hold-out did
    with np.errstate(divide="ignore", invalid="ignore"):
        cf_b = be0 + (bh - bh0)
        rel_b = np.where(cf_b != 0, did_b / cf_b, np.nan)
    lo, hi = _interval(did_b)
    rlo, rhi = _interval(rel_b)
    rel = did / counterfactual if counterfactual else None
    return Estimate(ve - ve0, vh - vh0, did, lo, hi, rel, rlo, rhi, n_e, n_h)


def sentence(o: Outcome, e: Estimate) -> str:
    """The estimate in words a non-statistician reads: "e-mailed users' share of GPU energy drawn by
    idle GPUs was 18% lower than it would have been without the e-mails (95% interval: 6% to 29%
    lower)", or that the data cannot tell."""
    if e.rel is None or e.rel_lo is None or e.rel_hi is None:
        return f"{o.label}: not enough data to compare the arms yet."

    def way(x: float) -> str:
        return "lower" if x < 0 else "higher"

    def pct(x: float) -> str:
        return "under 1%" if abs(x) < 0.005 else f"{abs(x):.0%}"

    size = f"{pct(e.rel)} {way(e.rel)}"
    if e.rel_lo <= 0 <= e.rel_hi:
        return (
            f"{o.label[0].upper()}{o.label[1:]}: no clear difference between the arms: e-mailed users' was "
            f"{size} than expected without the e-mails, but the 95% interval runs from "
            f"{pct(e.rel_lo)} {way(e.rel_lo)} to {pct(e.rel_hi)} {way(e.rel_hi)}."
        )
    good = (e.rel < 0) == o.lower_is_better
    lo, hi = sorted((abs(e.rel_lo), abs(e.rel_hi)))
    return (
        f"{o.label[0].upper()}{o.label[1:]}: {size} for e-mailed users than it would have been without the "
        f"e-mails (95% interval: {lo:.0%} to {hi:.0%} {way(e.rel)}){'' if good else ', the wrong way'}."
    )


# --- the data -------------------------------------------------------------------------------------------


def month_label(d: datetime) -> str:
    return f"{d:%Y-%m}"


def add_months(label: str, n: int) -> str:
    """`YYYY-MM` moved by n months (cocaq.study.assign.month_start does the arithmetic)."""
    from cocaq.study.assign import month_start

    return month_label(month_start(label, n))


def panel(conn: Connection, first: str, last: str) -> pd.DataFrame:
    """Per user and UTC month, from the daily rollups, the sums the outcomes read (PANEL_COLUMNS):
    months `first` to `last` ("YYYY-MM", inclusive)."""
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
            "co2_kg": df["co2"].astype(float) / 1000.0,
        }
    )
    return out.groupby(["user", "month"], as_index=False).sum()


def arms_frame(conn: Connection, study: str) -> pd.DataFrame:
    """The study's users: user (index), arm, stratum, assigned_at, opted_out_at."""
    import pandas as pd
    from sqlalchemy import select

    from cocaq.db.schema import StudyArm

    t = StudyArm.__table__.c
    rows = conn.execute(
        select(t.user_name, t.arm, t.stratum, t.assigned_at, t.opted_out_at).where(t.study == study)
    ).all()
    df = pd.DataFrame(rows, columns=["user", "arm", "stratum", "assigned_at", "opted_out_at"])
    return df.set_index("user")


def analyse(
    p: pd.DataFrame, arms: pd.DataFrame, *, study: str, start: str, end: str | None, baseline: Sequence[str],
    months: Sequence[str], resamples: int, seed: int,
) -> StudyReport:  # fmt: skip
    """The report from a panel (per user and month) and the arms; pure (tests feed it simulated panels)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arm = arms["arm"]
    joined_mask = arms["stratum"] < 0
    study_rows = p[p["month"].isin(list(months))]
    base_rows = p[p["month"].isin(list(baseline))]
    post_all = study_rows.groupby("user")[list(PANEL_COLUMNS)].sum()
    pre_all = base_rows.groupby("user")[list(PANEL_COLUMNS)].sum()
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
    )
    strangers = sorted(set(post_all.index) - set(arm.index))
    if strangers:
        rep.notes.append(f"{len(strangers)} users with jobs in the study months were never drawn: left out")
    if not months:
        rep.notes.append("no study month has data yet")
        return rep
    for o in OUTCOMES:
        by_month = []
        for m in months:
            rows = study_rows[study_rows["month"] == m].groupby("user")[list(PANEL_COLUMNS)].sum()
            by_month.append((m, compare(rows, arm, o, resamples, rng)))
        pooled = compare(post_all, arm, o, resamples, rng)
        did = compare(post_all, arm, o, resamples, rng, pre=pre_all)
        rep.outcomes.append(OutcomeResult(o, tuple(by_month), pooled, did, sentence(o, did)))
    return rep


def study_report(conn: Connection, cfg: Config, now: datetime) -> StudyReport:
    """The configured study's report, from the database, with the months that have begun by `now`."""
    from cocaq.errors import UsageError

    s = cfg.study
    if s.start is None or s.key is None:
        raise UsageError("no study configured: set [study] start (docs/study.md)")
    current = month_label(now.astimezone(UTC))
    last = min(s.end, current) if s.end is not None else current
    months = []
    m = s.start
    while m <= last:
        months.append(m)
        m = add_months(m, 1)
    baseline = [add_months(s.start, -k) for k in range(s.baseline_months, 0, -1)]
    p = panel(conn, baseline[0], last if months else add_months(s.start, -1))
    arms = arms_frame(conn, s.key)
    if arms.empty:
        raise UsageError(f"study {s.key}: no user has been drawn yet (cocaq study assign)")
    with_data = [m for m in months if (p["month"] == m).any()]
    return analyse(
        p, arms, study=s.key, start=s.start, end=s.end, baseline=baseline, months=with_data,
        resamples=s.bootstrap, seed=s.seed,
    )  # fmt: skip
