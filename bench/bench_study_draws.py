"""The e-mail study on the demo's site with no effect (`cocaq demo --study --study-effect 0`): how often
the report claims a difference over many draws of the arms, and whether stratifying the draw by baseline
CO2 as well as GPU-hours would make the per-user CO2 outcome steadier (issue 36, point 5).

With no effect planted, who is in which arm changes nothing in the data (the ledger's first contact is
the same instant for a user in either arm), so re-drawing the arms with other seeds gives A/A studies of
the same site: the share that claim a primary difference is the report's false-claim rate there.

    cocaq demo --study --study-effect 0 --out OUT --at 2026-11-27T12:00
    python bench/bench_study_draws.py --config OUT/cocaq-demo-study.toml --draws 40
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime


def main() -> None:
    import numpy as np
    import pandas as pd

    from cocaq.config_load import load_config
    from cocaq.db.engine import make_engine
    from cocaq.study import analysis as an
    from cocaq.study.assign import (
        baseline_co2,
        baseline_hours,
        block_size,
        blocks,
        first_contacts,
        split,
        strata,
        study_id,
        window,
    )

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--redraws", type=int, default=4000, help="re-draws for the spread of each estimate")
    ap.add_argument("--now", default="2026-11-27T12:00:00+00:00")
    a = ap.parse_args()
    cfg = load_config(a.config, environ=dict(os.environ))  # (COCAQ_DATABASE_URL: the demo's database)
    s = cfg.study
    assert s.start is not None and s.end is not None
    now = datetime.fromisoformat(a.now)
    engine = make_engine(cfg.database_url)
    t0 = time.monotonic()
    with engine.connect() as conn:
        sid = study_id(conn, s)
        w = window(s)
        hours = baseline_hours(conn, w.baseline_start, w.start)
        co2_before = baseline_co2(conn, w.baseline_start, w.start)
        exposure = an.exposure_days(first_contacts(conn, s, sid.key))
        baseline = [an.add_months(s.start, -k) for k in range(s.baseline_months, 0, -1)]
        months = [s.start]
        while months[-1] < s.end:
            months.append(an.add_months(months[-1], 1))
        p = an.panel(conn, baseline[0], s.end, exposure=exposure, study_start=s.start)
        real = an.arms_frame(conn, sid.key)
    stratum = strata(hours)
    block = blocks(stratum, co2_before, s.holdout_share)
    users = sorted(hours)
    out: dict[str, object] = {"users": len(users), "reached": len(exposure), "draws": a.draws}

    # A/A: the report over many draws of the arms, made as the study's draw makes them
    claims, secondary, uncorrected, co2 = 0, 0, 0, []
    for k in range(a.draws):
        arms = split(stratum, 1000 + k, s.holdout_share, block)
        frame = pd.DataFrame(
            {"arm": [arms[u] for u in users], "stratum": [stratum[u] for u in users],
             "block": [block[u] for u in users],
             "assigned_at": w.start, "opted_out_at": None}, index=pd.Index(users, name="user"),
        )  # fmt: skip
        rep = an.analyse(
            p, frame, study=sid.key, start=s.start, end=s.end, baseline=baseline, months=months,
            resamples=1000, seed=k, primary=s.primary, exposure=exposure, until=now,
        )  # fmt: skip
        assert rep.headline is not None
        claims += rep.headline.clear
        secondary += any(r.clear for r in rep.secondary)
        uncorrected += any(r.did.p is not None and r.did.p < an.LEVEL for r in rep.secondary)
        c = next(r for r in rep.outcomes if r.outcome.name == "co2_per_user").did
        co2.append(c.rel if c.rel is not None else float("nan"))
    out |= {"primary_claims": claims, "any_secondary_clear_after_holm": secondary,
            "any_secondary_p_below_005_uncorrected": uncorrected,
            "co2_rel_by_draw_sd": float(np.nanstd(co2))}  # fmt: skip

    # the spread of each estimate over re-draws: strata by GPU-hours (the draw), and with baseline CO2 too
    pre = p[p["month"].isin(baseline)].groupby("user")[list(an.PANEL_COLUMNS)].sum()
    post = p[p["month"].isin(months)].groupby("user")[list(an.PANEL_COLUMNS)].sum()
    total = an.exposed_months(pd.Index(users), months, exposure, now).sum(axis=1)
    drawn = real["arm"][real.index.isin(pre.index) & real.index.isin(total.index[total > 0])]
    idx = drawn.index
    emailed = (drawn == an.EMAILED).to_numpy()
    gh = np.array([stratum.get(u, 0) for u in idx])
    co2b = pre.reindex(idx)["co2_kg"].fillna(0.0).to_numpy()
    # the draw's own blocks (cocaq.study.assign.blocks), and halves by CO2 within each stratum beside them
    size = block_size(s.holdout_share)
    real_blocks = blocks({u: int(g) for u, g in zip(idx, gh, strict=True)},
                         dict(zip(idx, co2b, strict=True)), s.holdout_share)  # fmt: skip
    cells = np.array([int(g) * 100_000 + real_blocks[u] for u, g in zip(idx, gh, strict=True)])
    halves = gh * 10
    for g in np.unique(gh):
        members = np.flatnonzero(gh == g)
        order = members[np.argsort(co2b[members])]
        halves[order[len(order) // 2 :]] += 1
    rng = np.random.default_rng(0)
    spread: dict[str, dict[str, float]] = {}
    for o in an.OUTCOMES:
        wt, v0, v1 = an._changes(pre, post, idx, o, len(baseline), total)
        row = {}
        for name, st in (
            ("gpu-hours strata", gh),
            ("+ CO2 halves", halves),
            (f"+ CO2 blocks of {size}", cells),
        ):
            row[name] = float(np.nanstd(an._did_stat(an.redraws(st, emailed, a.redraws, rng), wt, v0, v1)))
        spread[o.name] = row
    out["did_spread_by_stratification"] = spread
    wt, v0, v1 = an._changes(pre, post, idx, an.BY_NAME["co2_per_user"], len(baseline), total)
    change = v1 - v0
    heavy = np.argsort(-co2b)[:20]
    out["co2_change_variance_share_of_20_heaviest"] = float(
        ((change[heavy] - change.mean()) ** 2).sum() / ((change - change.mean()) ** 2).sum()
    )
    out["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
