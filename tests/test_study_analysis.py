"""The study's analysis (cocaq.study.analysis) finds a planted effect within its interval and no false
one: simulated panels of users and months, where the truth is known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cocaq.study.analysis import EMAILED, HOLDOUT, OUTCOMES, Estimate, analyse, compare, sentence
from cocaq.study.analysis import PANEL_COLUMNS as PANEL

BASELINE = ("2026-06", "2026-07", "2026-08")
MONTHS = ("2026-09", "2026-10", "2026-11")


def _population(
    seed: int, n: int = 200, effect: float = 0.0, holdout: float = 0.2
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """n users, their arms (a stratified draw by GPU use, as cocaq.study.assign makes it) and six months of
    sums: each user's GPU energy and idle share vary around their own level month to month; e-mailed users'
    idle energy is cut by `effect` from the month after their first e-mail (the study's second month)."""
    rng = np.random.default_rng(seed)
    users = [f"u{i:03d}" for i in range(n)]
    gpu = rng.lognormal(np.log(300.0), 1.0, n)  # kWh of GPU energy a month
    idle = rng.beta(2, 6, n)  # the share of it idle
    util = rng.uniform(30, 90, n)
    order = np.argsort(gpu)
    arm = np.empty(n, dtype=object)
    for stratum in np.array_split(order, 5):  # quintiles of use, a fifth of each held out
        draw = rng.permutation(stratum)
        k = round(holdout * len(stratum))
        arm[draw[:k]] = HOLDOUT
        arm[draw[k:]] = EMAILED
    rows = []
    for month in (*BASELINE, *MONTHS):
        noise_g = rng.lognormal(0.0, 0.3, n)
        noise_i = rng.lognormal(0.0, 0.2, n)
        active = rng.random(n) < 0.9  # a user runs nothing in a tenth of the months
        for i, u in enumerate(users):
            if not active[i]:
                continue
            g = gpu[i] * noise_g[i]
            idle_kwh = g * min(idle[i] * noise_i[i], 0.95)
            if arm[i] == EMAILED and month in MONTHS[1:]:
                idle_kwh *= 1.0 - effect
            rows.append(
                {
                    "user": u, "month": month, "energy_kwh": g * 1.15, "gpu_kwh": g, "idle_kwh": idle_kwh,
                    "failed_kwh": g * 0.05 * rng.random(), "gpu_hours": g / 0.3, "idle_hours": idle_kwh / 0.06,
                    "util_weighted": util[i] * g, "util_energy": g, "co2_kg": g * 1.15 * 0.2,
                }
            )  # fmt: skip
    p = pd.DataFrame(rows)
    arms = pd.DataFrame(
        {"arm": arm, "stratum": 1, "assigned_at": pd.Timestamp("2026-09-01", tz="UTC"), "opted_out_at": None},
        index=pd.Index(users, name="user"),
    )
    return p, arms


def _report(p: pd.DataFrame, arms: pd.DataFrame, resamples: int = 1000, seed: int = 1):  # type: ignore[no-untyped-def]
    return analyse(
        p, arms, study="2026-09/seed 1", start="2026-09", end=None, baseline=BASELINE, months=MONTHS,
        resamples=resamples, seed=seed,
    )  # fmt: skip


def _result(rep, name: str):  # type: ignore[no-untyped-def]
    return next(r for r in rep.outcomes if r.outcome.name == name)


def _true_rel(p: pd.DataFrame, truth_p: pd.DataFrame, arms: pd.DataFrame, months: tuple[str, ...]) -> float:
    """What the difference-in-differences estimates, from the truth: the e-mailed users' idle shares in
    `months` with the effect against the same without it, weighted as the estimate weighs them (GPU
    energy before x after / (before + after))."""
    e = arms.index[arms["arm"] == EMAILED]

    def sums(frame: pd.DataFrame, ms: tuple[str, ...]) -> pd.DataFrame:
        rows = frame[frame["month"].isin(ms) & frame["user"].isin(e)]
        return rows.groupby("user")[["idle_kwh", "gpu_kwh"]].sum()

    pre, post, post0 = sums(p, BASELINE), sums(p, months), sums(truth_p, months)
    j = pre.join(post.add_suffix("_1"), how="inner").join(post0.add_suffix("_0"), how="inner")
    w = j["gpu_kwh"] * j["gpu_kwh_1"] / (j["gpu_kwh"] + j["gpu_kwh_1"])
    with_effect = (w * j["idle_kwh_1"] / j["gpu_kwh_1"]).sum()
    without = (w * j["idle_kwh_0"] / j["gpu_kwh_0"]).sum()
    return float(with_effect / without - 1.0)


def test_a_planted_cut_of_idle_gpus_is_found_within_its_interval() -> None:
    """Over 20 simulated sites: the truth inside the 95% interval in at least 17 (coverage), the interval
    excluding no change in at least 16 (power), for the study months together and for each month after the
    first e-mail; the first month (the e-mail just arrived) shows no effect as often as chance allows."""
    seeds = range(20)
    hits = {"pooled": 0, "pooled found": 0, "months": 0, "months found": 0, "first covers 0": 0}
    for seed in seeds:
        p, arms = _population(seed, effect=0.2)
        truth_p, _ = _population(seed, effect=0.0)  # the same users and noise without the e-mails' effect
        idle = _result(_report(p, arms, resamples=500), "idle_gpu_energy_share")
        true_rel = _true_rel(p, truth_p, arms, MONTHS)
        assert true_rel == pytest.approx(-0.2 * 2 / 3, abs=0.03)  # two of the three study months
        d = idle.did
        assert d.rel is not None and d.rel_lo is not None and d.rel_hi is not None
        hits["pooled"] += d.rel_lo <= true_rel <= d.rel_hi
        hits["pooled found"] += d.rel_hi < 0
        (m1, first), *later = idle.did_by_month
        assert m1 == MONTHS[0] and first.rel_lo is not None and first.rel_hi is not None
        hits["first covers 0"] += first.rel_lo <= 0 <= first.rel_hi
        for m, e in later:
            assert e.rel_lo is not None and e.rel_hi is not None
            hits["months"] += e.rel_lo <= _true_rel(p, truth_p, arms, (m,)) <= e.rel_hi
            hits["months found"] += e.rel_hi < 0
    n = len(seeds)
    assert hits["pooled"] >= 17 and hits["pooled found"] >= 16, hits
    assert hits["months"] >= 2 * 17 and hits["months found"] >= 2 * 14 and hits["first covers 0"] >= 17, hits
    assert n == 20


def test_the_report_of_a_planted_effect_reads_as_found() -> None:
    p, arms = _population(2, effect=0.2)
    rep = _report(p, arms)
    idle = _result(rep, "idle_gpu_energy_share")
    d = idle.did
    assert d.rel is not None and d.rel_hi is not None and d.rel_hi < 0
    with_baseline = set(p[p["month"].isin(BASELINE)]["user"])  # (a user may have run nothing then)
    # (a user weighs in the change from baseline when they used GPUs both before and during)
    with_both = with_baseline & set(p[p["month"].isin(MONTHS)]["user"])
    assert d.n_emailed == sum(u in with_both for u in arms.index[arms["arm"] == EMAILED])
    assert d.n_emailed + d.n_holdout == len(with_both)
    assert [m for m, _ in idle.did_by_month] == list(MONTHS) == [m for m, _ in idle.by_month]
    assert idle.months_text.startswith(f"{MONTHS[0]}: ") and f"; {MONTHS[1]}: " in idle.months_text
    assert "lower for e-mailed users than it would have been without the e-mails" in idle.sentence
    # outcomes the effect did not touch show no clear difference
    assert "no clear difference" in _result(rep, "gpu_util").sentence


def test_a_heavy_users_busy_month_does_not_move_the_change_from_baseline() -> None:
    """The change from baseline is within users: where nobody's habits change (each user's idle share the
    same every month), GPU use that swings from month to month (a heavy user five times as busy in one
    month) moves the arms' ratio of sums, and not the estimate, which stays at no change."""
    p, arms = _population(11, effect=0.0)
    share = p.groupby("user")["idle_kwh"].sum() / p.groupby("user")["gpu_kwh"].sum()
    p["idle_kwh"] = p["gpu_kwh"] * p["user"].map(share)
    heavy = p[p["month"].isin(BASELINE) & p["user"].isin(arms.index[arms["arm"] == EMAILED])]
    heavy_user = heavy.groupby("user")["gpu_kwh"].sum().idxmax()
    at = (p["user"] == heavy_user) & (p["month"] == MONTHS[1])
    p.loc[
        at, ["energy_kwh", "gpu_kwh", "idle_kwh", "gpu_hours", "idle_hours", "util_energy", "util_weighted"]
    ] *= 5.0
    idle = _result(_report(p, arms), "idle_gpu_energy_share")
    for _, e in (*idle.did_by_month, ("pooled", idle.did)):
        assert e.rel == pytest.approx(0.0, abs=1e-12) and e.diff == pytest.approx(0.0, abs=1e-12)
    assert abs(dict(idle.by_month)[MONTHS[1]].rel or 0.0) > 0.01  # the arms' ratios of sums did move


def test_no_effect_planted_the_interval_covers_zero_in_at_least_nine_seeds_of_ten() -> None:
    covered = {"did": 0, "pooled": 0}
    seeds = range(40)
    for seed in seeds:
        p, arms = _population(100 + seed, n=150, effect=0.0)
        rep = _report(p, arms, resamples=400, seed=seed)
        idle = _result(rep, "idle_gpu_energy_share")
        covered["did"] += (idle.did.diff_lo or 0) <= 0 <= (idle.did.diff_hi or 0)
        covered["pooled"] += (idle.pooled.diff_lo or 0) <= 0 <= (idle.pooled.diff_hi or 0)
    assert covered["did"] >= 0.9 * len(seeds), covered
    assert covered["pooled"] >= 0.9 * len(seeds), covered


def test_users_who_left_joined_or_were_never_drawn_are_counted() -> None:
    p, arms = _population(3, n=100)
    # a joiner (drawn after the start, no baseline), a user who left (no study months), a stranger
    arms.loc["new1"] = {
        "arm": HOLDOUT,
        "stratum": -1,
        "assigned_at": pd.Timestamp("2026-10-02", tz="UTC"),
        "opted_out_at": None,
    }
    p = pd.concat([p, pd.DataFrame([{**p.iloc[0].to_dict(), "user": "new1", "month": "2026-10"},
                                    {**p.iloc[0].to_dict(), "user": "zz-stranger", "month": "2026-10"}])])  # fmt: skip
    p = p[~((p["user"] == "u000") & p["month"].isin(MONTHS))]
    arms.loc["u001", "opted_out_at"] = pd.Timestamp("2026-09-15", tz="UTC")
    rep = _report(p, arms, resamples=200)
    assert rep.joined == {EMAILED: 0, HOLDOUT: 1}
    assert sum(rep.arms.values()) == 101 and sum(rep.opted_out.values()) == 1
    assert any("1 users with jobs in the study months were never drawn" in n for n in rep.notes)
    idle = _result(rep, "idle_gpu_energy_share")
    assert idle.did.n_emailed + idle.did.n_holdout <= 100  # the joiner has no baseline: not in the DiD
    assert idle.pooled.n_emailed + idle.pooled.n_holdout == 101  # ... but in the comparison of arms
    # per-user outcomes count a user without jobs as zero, not as absent
    co2 = _result(rep, "co2_per_user").pooled
    e = arms.index[arms["arm"] == EMAILED]
    months = p[p["month"].isin(MONTHS) & p["user"].isin(e)]
    assert co2.emailed == pytest.approx(months["co2_kg"].sum() / len(e) / len(MONTHS))  # per month
    # ... and the one who left stays in the change from baseline, at zero after
    co2_did = _result(rep, "co2_per_user").did
    assert co2_did.n_emailed + co2_did.n_holdout == len(set(p[p["month"].isin(BASELINE)]["user"]))


def test_an_arm_without_users_or_data_says_so() -> None:
    p, arms = _population(5, n=30)
    only = arms[arms["arm"] == EMAILED]
    e = compare(
        p.groupby("user")[["idle_kwh", "gpu_kwh"]].sum(),
        only["arm"],
        OUTCOMES[0],
        200,
        np.random.default_rng(0),
    )
    assert e.diff is None and e.n_holdout == 0
    assert sentence(OUTCOMES[0], e).endswith("not enough data to compare the arms yet.")
    wrong = Estimate(0.1, 0.0, 0.1, 0.05, 0.15, 0.3, 0.1, 0.5, 10, 10)
    assert sentence(OUTCOMES[0], wrong).endswith("higher), the wrong way.")


# --- issue 36: exposure, the primary outcome, its test, readable intervals ------------------------------


def _exposed(p: pd.DataFrame, arms: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, dict]:  # type: ignore[type-arg]
    """Each user's first contact: at the study's start for three in four, a month later for the rest (no
    jobs in the month before it: their first report came a month later); the study months before it
    dropped, as `panel` drops them."""
    from cocaq.study.assign import month_start

    rng = np.random.default_rng(seed)
    later = set(arms.index[rng.random(len(arms)) < 0.25])
    exposure = {u: month_start(MONTHS[1] if u in later else MONTHS[0]) for u in arms.index}
    first = p["user"].map(lambda u: f"{exposure[u]:%Y-%m}")
    keep = p["month"].isin(BASELINE) | (p["month"] >= first)
    return p[keep.to_numpy()], exposure


def _planted_from_exposure(seed: int, effect: float, n: int = 200) -> tuple[pd.DataFrame, pd.DataFrame, dict]:  # type: ignore[type-arg]
    """A site where e-mailed users' idle time is cut by `effect` from their own first contact on."""
    p, arms = _population(seed, n=n, effect=0.0)
    _, exposure = _exposed(p, arms, seed)
    e = set(arms.index[arms["arm"] == EMAILED])
    after = (
        p["user"].isin(e)
        & (p["month"] >= p["user"].map(lambda u: f"{exposure[u]:%Y-%m}"))
        & p["month"].isin(MONTHS)
    )
    for col in ("idle_hours", "idle_kwh"):
        p.loc[after, col] *= 1.0 - effect
    trimmed, _ = _exposed(p, arms, seed)
    return trimmed, arms, exposure


def test_study_months_counted_from_each_users_first_contact_recover_the_planted_effect() -> None:
    """An effect that starts with each user's first e-mail, and users reached at different times: counted
    from each one's own first contact, the primary outcome's headline holds the planted -20% and excludes
    no change; counted from the study's start for everyone (the old way) it is diluted towards zero."""
    inside = found = diluted = 0
    for seed in range(12):
        p, arms, exposure = _planted_from_exposure(seed, 0.2)
        rep = analyse(
            p, arms, study="s", start=MONTHS[0], end=None, baseline=BASELINE, months=MONTHS, resamples=500,
            seed=seed, exposure=exposure,
        )  # fmt: skip
        h = rep.headline
        assert h is not None and h.outcome.name == "idle_gpu_hours_share" and h.did.method == "randomisation"
        assert h.did.rel_lo is not None and h.did.rel_hi is not None and h.did.rel is not None
        inside += h.did.rel_lo <= -0.2 <= h.did.rel_hi
        found += h.clear
        untrimmed, _ = _population(seed, n=200)  # the same users, every study month counted
        untrimmed = untrimmed.copy()
        e = set(arms.index[arms["arm"] == EMAILED])
        late = untrimmed["user"].isin(e) & untrimmed["month"].isin(MONTHS)
        merged = untrimmed.merge(p[["user", "month", "idle_hours"]], on=["user", "month"], how="left",
                                 suffixes=("", "_cut"))  # fmt: skip
        untrimmed.loc[late, "idle_hours"] = (
            merged.loc[late.to_numpy(), "idle_hours_cut"]
            .fillna(merged.loc[late.to_numpy(), "idle_hours"])
            .to_numpy()
        )
        old = _result(_report(untrimmed, arms, resamples=200, seed=seed), "idle_gpu_hours_share").did
        diluted += (old.rel or 0.0) > (h.did.rel or 0.0)
    assert inside >= 11 and found >= 11 and diluted >= 10, (inside, found, diluted)


def test_exposed_months_are_each_users_share_of_each_month() -> None:
    from datetime import UTC, datetime

    from cocaq.study.analysis import exposed_months

    users = pd.Index(["a", "b", "c"])
    exposure = {"a": datetime(2026, 9, 1, tzinfo=UTC), "b": datetime(2026, 9, 16, tzinfo=UTC)}
    f = exposed_months(users, ["2026-09", "2026-10"], exposure, until=datetime(2026, 10, 11, tzinfo=UTC))
    assert f.loc["a"].tolist() == pytest.approx([1.0, 10 / 31])
    assert f.loc["b"].tolist() == pytest.approx([0.5, 10 / 31]) and f.loc["c"].tolist() == [0.0, 0.0]


def test_no_effect_no_primary_claim_in_at_least_95_percent_of_40_sites() -> None:
    """A/A: 40 simulated sites, no effect: the primary outcome's headline (the re-randomisation test)
    claims a difference in at most 2 (5%); and the secondaries' Holm correction keeps a site from showing
    any false clear secondary as often as five uncorrected intervals would."""
    claims = secondary_claims = uncorrected = 0
    for seed in range(40):
        p, arms = _population(100 + seed, n=150, effect=0.0)
        rep = _report(p, arms, resamples=1000, seed=seed)
        h = rep.headline
        assert h is not None and h.did.p is not None
        claims += h.clear
        secondary_claims += any(r.clear for r in rep.secondary)
        uncorrected += any(r.did.p is not None and r.did.p < 0.05 for r in rep.secondary)
    assert claims <= 2, claims
    assert secondary_claims <= uncorrected and secondary_claims <= 4, (secondary_claims, uncorrected)


def test_the_randomisation_p_value_matches_enumerating_every_draw() -> None:
    """An independent computation: 10 users in two strata, 2 held out in each, all 45 x ... draws
    enumerated; the test's p-value from 20,000 re-draws agrees with the exact one."""
    from itertools import combinations

    from cocaq.study.analysis import BY_NAME, did_test

    rng = np.random.default_rng(5)
    users = [f"v{i}" for i in range(10)]
    pre = pd.DataFrame({"idle_hours": rng.uniform(5, 50, 10), "gpu_hours": rng.uniform(100, 300, 10)},
                       index=users)  # fmt: skip
    post = pd.DataFrame({"idle_hours": rng.uniform(5, 50, 10), "gpu_hours": rng.uniform(100, 300, 10)},
                        index=users)  # fmt: skip
    for c in PANEL:
        for frame in (pre, post):
            if c not in frame:
                frame[c] = 0.0
    strata = np.array([1] * 5 + [2] * 5)
    held = {"v0", "v3", "v6", "v8"}
    arms = pd.DataFrame({"arm": [HOLDOUT if u in held else EMAILED for u in users], "stratum": strata},
                        index=users)  # fmt: skip
    o = BY_NAME["idle_gpu_hours_share"]
    got = did_test(pre, post, arms, o, 20_000, np.random.default_rng(1), 3, 3.0)

    def stat(hold: set[str]) -> float:
        w = pre["gpu_hours"] * post["gpu_hours"] / (pre["gpu_hours"] + post["gpu_hours"])
        ch = (post["idle_hours"] / post["gpu_hours"] - pre["idle_hours"] / pre["gpu_hours"]) * 100
        e = [u for u in users if u not in hold]
        h = list(hold)
        return float((w[e] * ch[e]).sum() / w[e].sum() - (w[h] * ch[h]).sum() / w[h].sum())

    t = abs(stat(held))
    draws = [set(a) | set(b) for a in combinations(users[:5], 2) for b in combinations(users[5:], 2)]
    exact = sum(abs(stat(d)) >= t - 1e-12 for d in draws) / len(draws)
    assert got.p == pytest.approx(exact, abs=0.015) and got.diff == pytest.approx(stat(held), rel=1e-9)


def test_holm() -> None:
    from cocaq.study.analysis import holm

    assert holm([0.01, 0.04, 0.03, 0.005, None]) == pytest.approx([0.03, 0.06, 0.06, 0.02, None])
    assert holm([0.2, 0.9]) == pytest.approx([0.4, 0.9]) and holm([0.5, 0.9]) == [1.0, 1.0]


def test_failed_job_energy_reads_in_kwh_not_as_a_percentage() -> None:
    """Per-user values mostly zero (a few users' failures): a difference in kWh with an interval in kWh,
    never a relative figure over a counterfactual near zero."""
    p, arms = _population(7, n=150)
    rng = np.random.default_rng(7)
    p["failed_kwh"] = np.where(rng.random(len(p)) < 0.08, rng.lognormal(3.0, 1.2, len(p)), 0.0)
    rep = _report(p, arms, resamples=500)
    failed = _result(rep, "failed_kwh_per_user")
    assert failed.did.rel is None and failed.did.diff_lo is not None and failed.did.diff_hi is not None
    said = failed.sentence.replace("95% interval", "")
    assert "kWh" in said and "%" not in said, failed.sentence
    assert all(e.rel is None for _, e in (*failed.by_month, *failed.did_by_month))
    assert "%" not in failed.months_text
