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
        "idle_gpu_energy_share", "the share of GPU energy drawn by idle GPUs", "%", "idle_kwh", "gpu_kwh", True, 100.0
    ),
    Outcome(
        "idle_gpu_hours_share", "the share of GPU-hours held idle", "%", "idle_hours", "gpu_hours", True, 100.0
    ),
    Outcome("failed_kwh_per_user", "the energy of failed jobs per user and month", "kWh", "failed_kwh", None, True),
    Outcome("gpu_util", "energy-weighted GPU utilisation", "%", "util_weighted", "util_energy", False),
    Outcome("kwh_per_gpu_hour", "energy per GPU-hour", "kWh/GPU-h", "energy_kwh", "gpu_hours", True),
    Outcome("co2_per_user", "CO2 per user and month", "kg", "co2_kg", None, True),
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
    did_by_month: tuple[tuple[str, Estimate], ...] = ()  # each study month against the baseline
    months_text: str = ""  # did_by_month in a line: when an effect began


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


def _values(
    frame: pd.DataFrame, users: pd.Index, outcome: Outcome, months: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The users' numerators (a mean per user: per month) and denominators; users absent count as zeros."""
    rows = frame.reindex(users).fillna(0.0)
    num = rows[outcome.num].to_numpy(dtype=float) * outcome.scale
    if outcome.den is None:
        return num / max(months, 1), None
    return num, rows[outcome.den].to_numpy(dtype=float)


def compare(
    post: pd.DataFrame, arms: pd.Series, outcome: Outcome, resamples: int, rng: np.random.Generator,
    months: int = 1,
) -> Estimate:  # fmt: skip
    """The arms compared on `outcome`: over the users of `arms` (user -> arm), their sums in `post` (one
    row per user, the panel's columns, over `months` months; users absent count as zeros)."""
    import numpy as np

    groups = {a: arms.index[arms == a] for a in (EMAILED, HOLDOUT)}
    n_e, n_h = len(groups[EMAILED]), len(groups[HOLDOUT])
    if n_e == 0 or n_h == 0:
        return Estimate(None, None, None, None, None, None, None, None, n_e, n_h)
    e_post = _values(post, groups[EMAILED], outcome, months)
    h_post = _values(post, groups[HOLDOUT], outcome, months)
    ve, vh = _arm_value(*e_post, n_e), _arm_value(*h_post, n_h)
    if ve is None or vh is None:
        return Estimate(ve, vh, None, None, None, None, None, None, n_e, n_h)
    ie = rng.integers(0, n_e, size=(resamples, n_e))
    ih = rng.integers(0, n_h, size=(resamples, n_h))
    be, bh = _boot_values(*e_post, ie), _boot_values(*h_post, ih)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_b = be / bh - 1.0
    lo, hi = _interval(be - bh)
    rlo, rhi = _interval(rel_b)
    return Estimate(ve, vh, ve - vh, lo, hi, (ve / vh - 1.0) if vh else None, rlo, rhi, n_e, n_h)


def _changes(
    pre: pd.DataFrame, post: pd.DataFrame, users: pd.Index, outcome: Outcome, pre_months: int,
    post_months: int,
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


def did(
    pre: pd.DataFrame, post: pd.DataFrame, arms: pd.Series, outcome: Outcome, resamples: int,
    rng: np.random.Generator, pre_months: int, post_months: int,
) -> Estimate:  # fmt: skip
    """The difference in differences: each arm's change from its users' own baseline (`pre`: a row per
    user with jobs in the baseline months), the e-mailed arm's against the hold-out's.

    Within-user changes, not the change of the arm's ratio of sums: an arm's ratio moves when a heavy
    user has a busy month, whatever anyone's habits; a user's own ratio moves only when their habits or
    their luck do. The arm's change is the weighted mean of its users' changes (weights: _changes).
    `emailed`/`holdout` are the arms' changes; `rel` is the difference over the e-mailed arm's value had
    it changed as the hold-out did; n counts the users who weigh."""
    import numpy as np

    arms = arms[arms.index.isin(pre.index)]
    groups = {a: arms.index[arms == a] for a in (EMAILED, HOLDOUT)}
    e = _changes(pre, post, groups[EMAILED], outcome, pre_months, post_months)
    h = _changes(pre, post, groups[HOLDOUT], outcome, pre_months, post_months)
    n_e, n_h = int((e[0] > 0).sum()), int((h[0] > 0).sum())
    if n_e == 0 or n_h == 0:
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
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(cf != 0, d / cf, np.nan)
    lo, hi = _interval(d[1:])
    rlo, rhi = _interval(rel[1:])
    r0 = float(rel[0]) if np.isfinite(rel[0]) else None
    return Estimate(float(e1[0] - e0[0]), float(h1[0] - h0[0]), float(d[0]), lo, hi, r0, rlo, rhi, n_e, n_h)


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


def sentence(o: Outcome, e: Estimate) -> str:
    """The estimate in words a non-statistician reads: "e-mailed users' share of GPU energy drawn by
    idle GPUs was 18% lower than it would have been without the e-mails (95% interval: 6% to 29%
    lower)", or that the data cannot tell."""
    if e.rel is None or e.rel_lo is None or e.rel_hi is None:
        return f"{o.label}: not enough data to compare the arms yet."
    size = f"{_pct(e.rel)} {_way(e.rel)}"
    if e.rel_lo <= 0 <= e.rel_hi:
        return (
            f"{o.label[0].upper()}{o.label[1:]}: no clear difference between the arms: e-mailed users' was "
            f"{size} than expected without the e-mails, but the 95% interval runs from "
            f"{_span(e.rel_lo, e.rel_hi)}."
        )
    good = (e.rel < 0) == o.lower_is_better
    lo, hi = sorted((abs(e.rel_lo), abs(e.rel_hi)))
    return (
        f"{o.label[0].upper()}{o.label[1:]}: {size} for e-mailed users than it would have been without the "
        f"e-mails (95% interval: {lo:.0%} to {hi:.0%} {_way(e.rel)}){'' if good else ', the wrong way'}."
    )


def months_text(by_month: Sequence[tuple[str, Estimate]]) -> str:
    """Each study month against the baseline, in a line: "2026-08: 1% higher (3% lower to 4% higher);
    2026-09: 21% lower (20% to 24% lower); ..." (when an effect began, and whether it lasted)."""
    return "; ".join(
        f"{m}: not enough data"
        if e.rel is None or e.rel_lo is None or e.rel_hi is None
        else f"{m}: {_pct(e.rel)} {_way(e.rel)} ({_span(e.rel_lo, e.rel_hi)})"
        for m, e in by_month
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
        select(t.user_name, t.arm, t.stratum, t.assigned_at, t.opted_out_at)
        .where(t.study == study)
        .order_by(t.user_name)  # (the bootstrap draws by position: the same data, the same report)
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
    n_pre = max(int(base_rows["month"].nunique()), 1)  # baseline months with data (a new site has fewer)
    per_month = {
        m: study_rows[study_rows["month"] == m].groupby("user")[list(PANEL_COLUMNS)].sum() for m in months
    }
    for o in OUTCOMES:
        by_month = tuple((m, compare(rows, arm, o, resamples, rng)) for m, rows in per_month.items())
        did_by_month = tuple(
            (m, did(pre_all, rows, arm, o, resamples, rng, n_pre, 1)) for m, rows in per_month.items()
        )
        pooled = compare(post_all, arm, o, resamples, rng, len(months))
        headline = did(pre_all, post_all, arm, o, resamples, rng, n_pre, len(months))
        rep.outcomes.append(
            OutcomeResult(
                o, by_month, pooled, headline, sentence(o, headline), did_by_month, months_text(did_by_month)
            )
        )
    return rep


def study_report(conn: Connection, cfg: Config, now: datetime) -> StudyReport:
    """The configured study's report, from the database, with the months that have begun by `now`."""
    from cocaq.errors import UsageError
    from cocaq.study.assign import study_id

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
    p = panel(conn, baseline[0], last if months else add_months(s.start, -1))
    arms = arms_frame(conn, sid.key)
    if arms.empty or sid.seed is None:
        raise UsageError(f"study {sid.key}: no user has been drawn yet (cocaq study assign)")
    with_data = [m for m in months if (p["month"] == m).any()]
    return analyse(
        p, arms, study=sid.key, start=s.start, end=s.end, baseline=baseline, months=with_data,
        resamples=s.bootstrap, seed=sid.seed,
    )  # fmt: skip
