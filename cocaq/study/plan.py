"""How large an effect can the study find? The smallest effect on the primary outcome that the study,
as configured, finds 4 times in 5 (80% power), by simulating the study on the site's own data.

Why by simulation rather than a formula: a site's users differ by orders of magnitude in GPU use, their
months swing by factors of two or three, and the analysis (cocaq.study.analysis.did) weighs users by
their GPU use; how that adds up is the site's own. So each simulated study resamples the site's users
(as many as it has, with replacement) with their history (the whole UTC months before the study's start,
or before now if the start is later; `history_months`), draws the arms as the real draw does (strata by
baseline GPU-hours, cocaq.study.assign.strata, blocks by baseline CO2 within them, and the same rounding
as assign.split), draws each simulated user's baseline and study months from their own history months,
and computes the difference-in-differences of the primary outcome with the analysis's weighting.

The months are a *smoothed bootstrap*. A month drawn from a user's history months is a month of zeros
where the user has no row (they ran nothing), as often as their history has such months; a month with a
row has its deviation from the mean of the user's a months with rows inflated by sqrt(a / (a - 1)), then
clipped at zero (and an idle part kept at most its whole), because drawing from only a months
underestimates the month-to-month variance by (a - 1) / a (a third, for the usual three). The mean is
over the months with rows, not all of them: a user's idle share is seen only in the months they ran
jobs, and inflating the deviations from a mean that counts the empty months as zeros inflates mostly
the gap between active and empty months, leaving the share's variation under-inflated (in simulated
sites, the plan from three months then fell further short of the plan from 24 months of the same users).
A user with one month with rows has no month-to-month variation to go by: their month is drawn as it is.

An effect of relative size delta on the e-mailed arm's study months (lower is better: its numerator
times 1 - delta, idle time turned busy; higher is better: times 1 + delta) scales the e-mailed arm's
weighted mean after (its denominators, hence its weights, unchanged), so the estimate is linear in delta
and each simulation gives the smallest delta it finds exactly. A study "finds" an effect when its 95%
interval excludes no change in the right direction, taken here as the estimate beyond 1.96 times the
spread (standard deviation) of the estimates with no effect over the simulations; the power at delta is
the share of simulations that find it; the detectable effect is the smallest delta with 80% power.

What it assumes: each user's months vary around a steady level, independently. Drift (a user's GPU use
growing over the months, a site's new users) makes every month less like the baseline, which the
hold-out's change removes only on average: longer studies gain less than shown.

pandas and numpy are imported inside the functions, as in cocaq.study.analysis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from sqlalchemy import Connection

    from cocaq.config import Config, Study
    from cocaq.study.analysis import Outcome

POWER = 0.8  # the share of studies that find the effect
Z = 1.959963984540054  # a two-sided 95% interval's half-width, in standard errors
MIN_GPU_USERS = 10  # fewer users with GPU-hours in the history: no plan
MAX_EFFECT = 1.0  # a cut of all of it (lower is better), or a doubling: beyond, "not detectable"
TABLE_SHARES = (0.1, 0.2, 0.3, 0.5)
TABLE_MONTHS = (1, 2, 3, 6, 12)
DEFAULT_HISTORY = 6  # months of history by default (at least [study] baseline_months)
DEFAULT_MONTHS = 3  # a study's length when [study] end is unset
SIMULATIONS = 400
SEED = 0  # the plan's simulations: the same data, the same plan
_CHUNK = 3_000_000  # values per chunk of simulations (memory)
# an idle part can be no more than its whole (utilisation: % x energy, at most 100 x the energy)
_BOUNDS = {
    "idle_kwh": ("gpu_kwh", 1.0), "idle_hours": ("gpu_hours", 1.0), "util_weighted": ("util_energy", 100.0),
}  # fmt: skip


@dataclass(frozen=True)
class Cell:
    """One design: the hold-out share and the study's months, and the effect it detects."""

    holdout_share: float
    months: int
    holdout_users: int  # of the site's users, as the draw rounds it
    mde: float | None  # the smallest relative effect found with 80% power; None: not even MAX_EFFECT
    se0: float | None  # the spread (standard deviation) of the relative estimate with no effect


@dataclass(frozen=True)
class Plan:
    outcome: str
    label: str
    lower_is_better: bool
    history: tuple[str, ...]  # the months the simulations drew from
    users: int  # users with a row in the history months (the ones resampled)
    gpu_users: int  # ... of whom with GPU-hours
    baseline_months: int
    holdout_share: float
    months: int
    simulations: int
    seed: int
    chosen: Cell | None
    table: tuple[Cell, ...] = ()
    reason: str | None = None  # why there is no plan (too few users, no history)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["headline"] = headline(self)
        return d


def _held(share: float, n: int) -> int:
    from cocaq.study.assign import _round

    return _round(share * n)


def _months_words(n: int) -> str:
    return f"{n} month" if n == 1 else f"{n} months"


def effect_words(o: Outcome | Plan) -> str:
    return "cut" if o.lower_is_better else "rise"


def headline(plan: Plan) -> str:
    """The plan in a sentence: "With 32 of 162 users held out (20%) for 3 months, the study finds a cut
    of 14% or more in the share of GPU-hours held idle 4 times in 5 (80% power); smaller effects are
    likely to read as no clear difference." Or why it cannot say."""
    if plan.reason is not None or plan.chosen is None:
        return f"No plan: {plan.reason}"
    c = plan.chosen
    who = (
        f"With {c.holdout_users} of {plan.users} users held out ({plan.holdout_share:.0%}) for "
        f"{_months_words(plan.months)}"
    )
    what = effect_words(plan)
    if c.mde is None:
        return (
            f"{who}, the study would not find even a {what} of {MAX_EFFECT:.0%} in {plan.label} "
            f"4 times in 5 (80% power): too few users or months to tell an effect from chance."
        )
    return (
        f"{who}, the study finds a {what} of {_pct(c.mde)} or more in {plan.label} 4 times in 5 "
        f"(80% power); smaller effects are likely to read as no clear difference."
    )


def _pct(x: float) -> str:
    return "under 1%" if x < 0.005 else f"{x:.0%}"


# --- the history ----------------------------------------------------------------------------------------


def study_length(study: Study) -> int:
    """The study's months from [study] start to end (inclusive); DEFAULT_MONTHS without an end."""
    if study.start is None or study.end is None:
        return DEFAULT_MONTHS
    (y0, m0), (y1, m1) = ((int(x) for x in s.split("-")) for s in (study.start, study.end))
    return max((y1 * 12 + m1) - (y0 * 12 + m0) + 1, 1)


def history_months(study: Study, now: datetime, n: int | None = None) -> list[str]:
    """The `n` whole UTC months (default: max(baseline_months, DEFAULT_HISTORY)) before the study's start
    month, or before the current month if the start is later: what the study will use as its baseline,
    and the months before it."""
    from cocaq.errors import UsageError
    from cocaq.study.analysis import add_months, month_label
    from cocaq.study.assign import NO_STUDY

    if study.start is None:
        raise UsageError(NO_STUDY)
    anchor = min(study.start, month_label(now.astimezone(UTC)))
    n = max(study.baseline_months, DEFAULT_HISTORY) if n is None else n
    return [add_months(anchor, -k) for k in range(n, 0, -1)]


# --- the simulations ------------------------------------------------------------------------------------


def _holdout(stratum: np.ndarray, number: np.ndarray, share: float) -> np.ndarray:
    """cocaq.study.assign.split's rule, vectorised: within each stratum (in order) the users with the
    lowest numbers are held out, as many as R(share x users so far) - R(share x users before) (R: half
    up). `stratum` < 0: not drawn (never held out). `number` stands for assign.draw's SHA-256 numbers:
    uniform random numbers have their distribution, without hashing every user of every simulation."""
    import numpy as np

    out = np.zeros(len(stratum), dtype=bool)
    drawn = np.flatnonzero(stratum >= 0)
    if not len(drawn):
        return out
    order = drawn[np.lexsort((number[drawn], stratum[drawn]))]
    s = stratum[order]
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    before = np.concatenate([[0], np.cumsum(counts)[:-1]])
    k = np.floor(share * (before + counts) + 0.5) - np.floor(share * before + 0.5)
    rank = np.arange(len(order)) - np.repeat(first, counts)
    out[order] = rank < np.repeat(k, counts)
    return out


def _blocks(stratum: np.ndarray, co2: np.ndarray, share: float) -> np.ndarray:
    """Each user's cell of the draw, stratum and block (cocaq.study.assign.blocks: the stratum's users by
    baseline CO2, heaviest first, in runs of block_size), as one number ordered as split orders them; -1
    stays -1 (not drawn). Ties are broken at random here, by name there."""
    import numpy as np

    from cocaq.study.assign import block_size

    size = block_size(share)
    out = np.full(len(stratum), -1, dtype=np.int64)
    drawn = np.flatnonzero(stratum >= 0)
    order = drawn[np.lexsort((-co2[drawn], stratum[drawn]))]
    s = stratum[order]
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    rank = np.arange(len(order)) - np.repeat(first, counts)
    out[order] = s.astype(np.int64) * 100_000 + rank // size
    return out


def _strata(hours: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """Each simulated user's stratum by their baseline GPU-hours (cocaq.study.assign.strata); -1 for one
    not drawn (no row in the baseline months)."""
    import numpy as np

    from cocaq.study.assign import strata

    out = np.full(len(hours), -1, dtype=int)
    idx = np.flatnonzero(drawn)
    got = strata({f"{i:07d}": float(hours[i]) for i in idx})
    out[idx] = [got[f"{i:07d}"] for i in idx]
    return out


@dataclass(frozen=True)
class _History:
    """The site's users x history months x the columns the outcome needs."""

    x: np.ndarray  # (users, months, columns)
    active: np.ndarray  # (users, months): the user has a row (jobs) that month
    columns: tuple[str, ...]


def _history(p: pd.DataFrame, history: Sequence[str], outcome: Outcome) -> _History:
    import numpy as np

    cols = [outcome.num, *([outcome.den] if outcome.den else []), "gpu_hours", "co2_kg"]
    bound = _BOUNDS.get(outcome.num)
    if bound is not None:
        cols.append(bound[0])
    cols = list(dict.fromkeys(cols))
    rows = p[p["month"].isin(list(history))]
    users = sorted(rows["user"].unique())
    ui = {u: i for i, u in enumerate(users)}
    mi = {m: i for i, m in enumerate(history)}
    x = np.zeros((len(users), len(history), len(cols)))
    active = np.zeros((len(users), len(history)), dtype=bool)
    if len(rows):
        r = rows["user"].map(ui).to_numpy()
        m = rows["month"].map(mi).to_numpy()
        np.add.at(x, (r, m), rows[cols].to_numpy(dtype=float))
        active[r, m] = True
    return _History(x, active, tuple(cols))


def _draw_months(
    h: _History, rng: np.random.Generator, sims: int, n: int, months: int
) -> tuple[np.ndarray, np.ndarray]:
    """`sims` simulated sites of `n` users resampled from `h`, each with `months` months drawn from their
    own history (the smoothed bootstrap: module doc): (values (sims, n, months, columns), active (sims,
    n, months))."""
    import numpy as np

    users, hist = h.active.shape
    who = rng.integers(0, users, size=(sims, n))
    which = rng.integers(0, hist, size=(sims, n, months))
    x = h.x[who[..., None], which]
    act = h.active[who[..., None], which]
    a = h.active.sum(axis=1)
    mean = (h.x.sum(axis=1) / np.maximum(a, 1)[:, None])[who][:, :, None, :]
    k = np.sqrt(np.where(a > 1, a / np.maximum(a - 1, 1), 1.0))[who][:, :, None, None]
    x = np.where(act[..., None], np.maximum(mean + k * (x - mean), 0.0), 0.0)
    for part, (whole, scale) in _BOUNDS.items():
        if part in h.columns and whole in h.columns:
            i, j = h.columns.index(part), h.columns.index(whole)
            x[..., i] = np.minimum(x[..., i], scale * x[..., j])
    return x, act


def _arm_changes(
    w: np.ndarray, v0: np.ndarray, v1: np.ndarray, arm: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """An arm's weighted means before and after, per simulation (rows): cocaq.study.analysis.did's."""
    import numpy as np

    wa = w * arm
    ws = wa.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (wa * v0).sum(axis=1) / ws, (wa * v1).sum(axis=1) / ws


def _weights(
    outcome: Outcome, n0: np.ndarray, d0: np.ndarray, n1: np.ndarray, d1: np.ndarray, drawn: np.ndarray,
    pre_months: int, post_months: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Per simulated user: (weight, value before, value after), as cocaq.study.analysis._changes makes
    them (a ratio: den0 x den1 / (den0 + den1), zero where either has none; a mean per user: alike)."""
    import numpy as np

    if outcome.den is None:
        return drawn.astype(float), n0 / pre_months, n1 / post_months
    ok = drawn & (d0 > 0) & (d1 > 0)
    s0, s1 = np.where(ok, d0, 1.0), np.where(ok, d1, 1.0)
    return np.where(ok, s0 * s1 / (s0 + s1), 0.0), np.where(ok, n0 / s0, 0.0), np.where(ok, n1 / s1, 0.0)


def _thresholds(rel0: np.ndarray, gain: np.ndarray, lower: bool) -> tuple[np.ndarray, float | None]:
    """Per simulation, the smallest effect it finds, and the spread of the estimates with no effect.

    rel(delta) = rel0 -/+ delta x gain (gain = the e-mailed arm's value after over its counterfactual);
    found: rel(delta) beyond Z x SE0 in the right direction. A simulation without an estimate finds
    nothing (inf)."""
    import numpy as np

    ok = np.isfinite(rel0) & np.isfinite(gain) & (gain > 0)
    if ok.sum() < 2:
        return np.full(len(rel0), np.inf), None
    se0 = float(np.std(rel0[ok], ddof=1))
    need = (rel0 + Z * se0) if lower else (Z * se0 - rel0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(ok, np.maximum(need / np.where(ok, gain, 1.0), 0.0), np.inf)
    return t, se0


def detectable(thresholds: np.ndarray, power: float = POWER) -> float | None:
    """The smallest effect found by at least `power` of the simulations (None beyond MAX_EFFECT)."""
    import numpy as np

    t = np.sort(thresholds)
    x = float(t[max(math.ceil(power * len(t)) - 1, 0)])
    return x if x <= MAX_EFFECT else None


def power_at(thresholds: np.ndarray, delta: float) -> float:
    """The share of simulations that find an effect of `delta`."""
    import numpy as np

    return float(np.mean(thresholds <= delta))


def simulate(
    p: pd.DataFrame, history: Sequence[str], outcome: Outcome, *, baseline_months: int,
    shares: Sequence[float], months: Sequence[int], simulations: int = SIMULATIONS, seed: int = SEED,
) -> dict[tuple[float, int], tuple[np.ndarray, float | None]]:  # fmt: skip
    """(share, months) -> (each simulation's smallest effect found, SE0), for every pair, from the same
    simulated sites (common random numbers: the table's differences are the designs', not chance's).

    `p`: the panel (user, month, cocaq.study.analysis.PANEL_COLUMNS), `history` its months to draw
    from (at least two)."""
    import numpy as np

    h = _history(p, history, outcome)
    n = h.active.shape[0]
    b, lmax = baseline_months, max(months)
    rng = np.random.default_rng(seed)
    ci = {c: i for i, c in enumerate(h.columns)}
    num, den, gh = ci[outcome.num], ci[outcome.den] if outcome.den else None, ci["gpu_hours"]
    co2 = ci["co2_kg"]
    rel: dict[tuple[float, int], list[np.ndarray]] = {(s, m): [] for s in shares for m in months}
    gain: dict[tuple[float, int], list[np.ndarray]] = {(s, m): [] for s in shares for m in months}
    chunk = max(1, _CHUNK // max(n * (b + lmax) * len(h.columns), 1))
    done = 0
    while done < simulations:
        k = min(chunk, simulations - done)
        done += k
        x, act = _draw_months(h, rng, k, n, b + lmax)
        pre = x[:, :, :b].sum(axis=2)
        post = np.cumsum(x[:, :, b:], axis=2)
        drawn: np.ndarray = np.asarray(act[:, :, :b].any(axis=2))
        stratum = np.stack([_strata(pre[i, :, gh], drawn[i]) for i in range(k)])
        number = rng.random((k, n))
        for s in shares:
            cells = np.stack([_blocks(stratum[i], pre[i, :, co2], s) for i in range(k)])
            held = np.stack([_holdout(cells[i], number[i], s) for i in range(k)])
            emailed = drawn & ~held
            for m in months:
                d0 = pre[..., den] if den is not None else pre[..., num]
                d1 = post[:, :, m - 1, den] if den is not None else post[:, :, m - 1, num]
                w, v0, v1 = _weights(outcome, pre[..., num], d0, post[:, :, m - 1, num], d1, drawn, b, m)
                e0, e1 = _arm_changes(w, v0, v1, emailed)
                h0, h1 = _arm_changes(w, v0, v1, held)
                cf = e0 + (h1 - h0)
                with np.errstate(divide="ignore", invalid="ignore"):
                    ok = np.isfinite(cf) & (cf > 0)
                    rel[(s, m)].append(np.where(ok, ((e1 - e0) - (h1 - h0)) / np.where(ok, cf, 1.0), np.nan))
                    gain[(s, m)].append(np.where(ok, e1 / np.where(ok, cf, 1.0), np.nan))
    return {
        key: _thresholds(np.concatenate(rel[key]), np.concatenate(gain[key]), outcome.lower_is_better)
        for key in rel
    }


def _no_plan(p: pd.DataFrame, history: Sequence[str], outcome: Outcome) -> str | None:
    rows = p[p["month"].isin(list(history))]
    span = f"{history[0]} to {history[-1]}" if len(history) > 1 else (history[0] if history else "")
    if rows.empty or not history:
        return f"no jobs in the months before the study{f' ({span})' if span else ''}: nothing to plan from"
    if len(history) < 2:
        return (
            f"only one month of history ({span}): a user's month-to-month variation needs two at least "
            "(--history)"
        )
    gpu = int((rows.groupby("user")["gpu_hours"].sum() > 0).sum())
    if gpu < MIN_GPU_USERS:
        return (
            f"only {gpu} user(s) with GPU-hours in {span}: too few to plan a study ({MIN_GPU_USERS} at least)"
        )
    if outcome.den is not None and not (rows[outcome.num].sum() > 0 and rows[outcome.den].sum() > 0):
        return f"no {outcome.num.replace('_', ' ')} in {span}: {outcome.label} cannot be measured yet"
    return None


def plan(
    p: pd.DataFrame, history: Sequence[str], outcome: Outcome, *, holdout_share: float, months: int,
    baseline_months: int, simulations: int = SIMULATIONS, seed: int = SEED, table: bool = True,
) -> Plan:  # fmt: skip
    """The detectable effect of `outcome` at the chosen hold-out share and months, and (`table`) for
    TABLE_SHARES x TABLE_MONTHS with the chosen ones, from the panel `p`'s `history` months."""
    rows = p[p["month"].isin(list(history))]
    users = int(rows["user"].nunique())
    gpu_users = int((rows.groupby("user")["gpu_hours"].sum() > 0).sum()) if users else 0
    base = Plan(
        outcome.name, outcome.label, outcome.lower_is_better, tuple(history), users, gpu_users,
        baseline_months, holdout_share, months, simulations, seed, None,
    )  # fmt: skip
    reason = _no_plan(p, history, outcome)
    if reason is not None:
        return _replace(base, reason=reason)
    shares = sorted({*TABLE_SHARES, holdout_share}) if table else [holdout_share]
    lengths = sorted({*TABLE_MONTHS, months}) if table else [months]
    got = simulate(
        p, history, outcome, baseline_months=baseline_months, shares=shares, months=lengths,
        simulations=simulations, seed=seed,
    )  # fmt: skip
    cells = {(s, m): Cell(s, m, _held(s, users), detectable(t), se0) for (s, m), (t, se0) in got.items()}
    return _replace(
        base,
        chosen=cells[(holdout_share, months)],
        table=tuple(cells[(s, m)] for s in shares for m in lengths) if table else (),
    )


def _replace(p: Plan, **kw: Any) -> Plan:
    from dataclasses import replace

    return replace(p, **kw)


def primary(cfg: Config) -> Outcome:
    from cocaq.study.analysis import OUTCOMES

    return next(o for o in OUTCOMES if o.name == cfg.study.primary)


def site_plan(
    conn: Connection, cfg: Config, now: datetime, *, holdout_share: float | None = None,
    months: int | None = None, history: int | None = None, simulations: int = SIMULATIONS,
    table: bool = True,
) -> Plan:  # fmt: skip
    """The configured study's plan from the database: the history months with data (`history_months`;
    months without a single row are left out: no data is not a month when nobody ran anything)."""
    from cocaq.study.analysis import panel

    s = cfg.study
    candidates = history_months(s, now, history)
    p = panel(conn, candidates[0], candidates[-1])
    with_data = [m for m in candidates if (p["month"] == m).any()]
    return plan(
        p, with_data, primary(cfg),
        holdout_share=s.holdout_share if holdout_share is None else holdout_share,
        months=study_length(s) if months is None else months, baseline_months=s.baseline_months,
        simulations=simulations, table=table,
    )  # fmt: skip
