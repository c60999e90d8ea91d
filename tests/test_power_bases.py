"""What predicts a GPU's power, judged on held-out runs (issue 35): the user's own measured runs, the
table, rated power; ranges that cover what they claim.

The site here is built so that, as on real clusters, utilisation says nothing about power (every run at
70-92 %), runs of one job differ by their settings (batch size, sequence length: +-12 % per run), and
different users' jobs of one GPU model draw anything from a fifth to most of its rated power. Runs are held
out whole, through the real import, `cocaq calibrate --refresh` and `cocaq recompute`; the judging is
computed here, from the generator's own truth, not from what cocaq reports of itself.
"""

from __future__ import annotations

import html
import json
import math
import random
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.accounting import power_bases as pb
from cocaq.accounting.calibrate import Sample
from cocaq.accounting.importer import import_records
from cocaq.accounting.quantiles import conformal_quantile
from cocaq.config_load import load_config
from cocaq.slurm.record import JobRecord
from tests import builders
from tests.conftest import run_cocaq

T0 = datetime(2026, 6, 1, tzinfo=UTC)
TDP = 700.0
SITE: dict[str, dict[str, Any]] = {
    "cluster": {"name": "c", "carbon_zone": "FRA"},
    "estimate": {"gpu_utilisation": 1.0},
    # acct_gather_energy/gpu: Slurm measures the GPUs of the jobs whose ConsumedEnergy it recorded
    "slurm": {"consumed_energy": "gpus"},
    "partitions": {
        "h100": {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_tdp_w": TDP, "cpu_tdp_w_per_core": 10}
    },
}


@dataclass
class Truth:
    rec: JobRecord
    w: float  # W per GPU it drew
    util: float  # % (what rated power x utilisation would use)
    run: str


def _site(seed: int = 7, run_sd: float = 0.12) -> list[Truth]:
    """40 users, each with 2-3 recurring jobs (4-6 runs of 3-6 chained jobs each), and one-off jobs; a run
    draws its job's level x exp(N(0, run_sd))."""
    rnd = random.Random(seed)
    out: list[Truth] = []
    raw = 10_000
    for u in range(40):
        user = f"u{u:02d}"
        t = T0 + timedelta(hours=rnd.uniform(0, 48))
        for name in rnd.sample(["train-llm", "finetune", "pretrain", "sweep", "distill"], rnd.randint(2, 3)):
            gpus = rnd.choice([1, 2, 4, 8])
            level = TDP * rnd.uniform(0.2, 0.85)  # what this user's job draws: its model, batch, code
            for r in range(rnd.randint(4, 6)):
                run_w = level * math.exp(rnd.gauss(0.0, run_sd))  # this run's settings
                t += timedelta(days=rnd.uniform(2, 5))
                for _ in range(rnd.randint(3, 6)):
                    hours = rnd.uniform(1.0, 6.0)
                    w = run_w * math.exp(rnd.gauss(0.0, 0.05))
                    rec = builders.job(
                        raw, t, hours, user=user, partition="h100", node_list="g1", gpus=gpus,
                        cpus=8 * gpus, name=name, queued=timedelta(minutes=2),
                    )  # fmt: skip
                    out.append(Truth(rec, w, rnd.uniform(70.0, 92.0), f"{user}/{name}/{r}"))
                    raw += 1
                    t += timedelta(hours=hours, minutes=rnd.uniform(1, 40))  # the next in the chain
        for k in range(2):  # one-off jobs: nothing of the user's own to learn from
            hours = rnd.uniform(0.5, 3.0)
            rec = builders.job(
                raw, t, hours, user=user, partition="h100", node_list="g1", gpus=1, name=f"x{k}"
            )
            out.append(Truth(rec, TDP * rnd.uniform(0.15, 0.8), rnd.uniform(70.0, 92.0), f"{user}/x{k}"))
            raw += 1
    return out


def _held_out_runs(site: list[Truth], share: float = 0.3, seed: int = 3) -> set[str]:
    runs = sorted({t.run for t in site})
    return set(random.Random(seed).sample(runs, round(share * len(runs))))


DRAWS = 4


def _draw(
    engine: Engine, cfg: Any, env: dict[str, str], draw: int, run_sd: float
) -> tuple[list[Truth], set[str], dict[int, Any], dict[int, float]]:
    """One site with its held-out runs imported unmeasured, calibrated and recomputed through the CLI:
    (the site, the held-out runs, each unmeasured job's assumptions, its estimated GPU energy)."""
    site = _site(seed=7 + draw, run_sd=run_sd)
    held = _held_out_runs(site, seed=3 + draw)
    for t in site:  # the learning runs measured by Slurm; the held-out ones measured by nothing
        if t.run not in held:
            t.rec.consumed_energy_j = t.w * t.rec.alloc_gpus * t.rec.elapsed_s
    import_records(engine, [t.rec for t in site], cfg, source="sacct-json")
    r = run_cocaq(["calibrate", "--refresh"], env)
    assert r.code == 0, r.err
    assert "judged on held-out runs to beat the table, and tried first: " in r.err, r.err
    if run_sd < 0.2:
        assert "tried first: series, user" in r.err, r.err
    assert run_cocaq(["recompute"], env).code == 0
    with engine.connect() as c:
        rows = {
            raw: json.loads(a) if isinstance(a, str) else a
            for raw, a in c.execute(
                text("SELECT job_id_raw, assumptions FROM jobs WHERE energy_measured_j = 0")
            )
        }
        gpu_j = dict(
            c.execute(
                text(
                    "SELECT j.job_id_raw, e.energy_j FROM job_energy e JOIN jobs j ON j.id = e.job_pk "
                    "WHERE e.component = 'gpu' AND e.method = 'estimated'"
                )
            ).all()
        )
    return site, held, rows, gpu_j


@pytest.mark.parametrize("run_sd", [0.12, 0.45])
def test_held_out_runs_are_estimated_from_the_users_own_runs_with_ranges_that_hold(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str], run_sd: float
) -> None:
    """run_sd 0.12: runs of one job within +-12 % of each other; 0.45: as far apart as the real 8x H100
    runs of one workload at different checkpoint intervals (143 to 441 W), where a user's past runs say
    less: the estimate is still closer than rated power, and the range, learnt from held-out residuals,
    widens so that it still holds about 80 % of the jobs."""
    url = engine.url.render_as_string(hide_password=False)
    cfg_path = builders.write_config(tmp_path / "cocaq.toml", url, base=False, **SITE)
    cfg = load_config(cfg_path, {})
    env = dict(cli_env, COCAQ_CONFIG=str(cfg_path), COLUMNS="160")
    # Four sites, each with its own draw of held-out runs: a site's coverage strays by several points
    # from draw to draw (a run's jobs miss or hit together), their pooled coverage is what the range claims.
    err: list[float] = []
    rated_err: list[float] = []
    covers: list[float] = []
    inside = 0
    for draw in range(DRAWS):
        if draw:
            with engine.begin() as c:
                c.execute(text("DELETE FROM jobs"))
        site, held, rows, gpu_j = _draw(engine, cfg, env, draw, run_sd)
        judged = [t for t in site if t.run in held]
        assert {t.rec.job_id_raw for t in judged} == set(rows), "every held-out job estimated, no other"
        bases: list[str] = []
        mine = 0
        for t in judged:
            a = rows[t.rec.job_id_raw]
            bases.append(a["gpu_basis"])
            gpu_s = t.rec.alloc_gpus * t.rec.elapsed_s
            assert gpu_j[t.rec.job_id_raw] == pytest.approx(a["gpu_w"] * gpu_s, rel=1e-3)  # what is stored
            err.append(abs(a["gpu_w"] / t.w - 1.0))
            rated_err.append(abs(TDP * t.util / 100.0 / t.w - 1.0))  # rated power x the job's utilisation
            lo, hi = a["gpu_w_range"]
            mine += lo <= t.w <= hi
            assert "held out" in a["gpu_cell"]  # the range says what it rests on
        inside += mine
        covers.append(mine / len(judged))
        assert len(judged) > 400
        # most held-out runs have earlier runs of the same job by the same user
        if run_sd < 0.2:
            assert bases.count(pb.BASIS_SERIES) > 0.6 * len(bases)
        assert set(bases) <= {*pb.KEYED_TEXT, "calibrated-partition", "calibrated-model"}
    cover = inside / len(err)
    med, rated = statistics.median(err), statistics.median(rated_err)
    assert med <= (0.5 if run_sd < 0.2 else 0.8) * rated, (med, rated)
    assert 0.75 <= cover <= 0.85, (cover, covers)
    assert all(0.65 <= c <= 0.95 for c in covers), covers

    # `cocaq calibrate` prints each basis's held-out error and coverage, and the estimate as made
    r = run_cocaq(["calibrate"], env)
    assert r.code == 0, r.err
    out = " ".join(r.out.split())
    assert "How good the estimate is" in out and "user's jobs, same name" in out, r.out
    assert "The estimate as made" in out and "its 10-90% range held" in out, r.out
    doc = json.loads(run_cocaq(["calibrate", "--format", "json"], env).out)
    got = {b["basis"]: b for b in doc["held_out"]}
    assert got["series"]["jobs"] >= pb.MIN_RESIDUALS
    assert got["series"]["used"] or run_sd > 0.2
    assert 0.7 <= got["chosen"]["coverage"] <= 0.9
    # (Slurm's energy gives no utilisation: cocaq compares with rated power x [estimate] gpu_utilisation)
    assert got["rated-util"]["jobs"] == 0 and got["rated-config"]["median_error"] > 0.5
    assert got["chosen"]["median_error"] < 0.5 * got["rated-config"]["median_error"]
    assert doc["user_cells"] > 100

    # `cocaq job` names the basis and the range of one of them
    one, basis = next((t, b) for t, b in zip(judged, bases, strict=True) if b in pb.KEYED_TEXT)
    r = run_cocaq(["job", str(one.rec.job_id_raw)], env)
    assert r.code == 0, r.err
    out = " ".join(r.out.split())
    whose = "of this name " if basis == pb.BASIS_SERIES else ""
    assert f"what the user's own measured jobs {whose}drew: h100, {one.rec.user_name}'s " in out, out
    assert "10-90%:" in out and "held out" in out, out
    # ... and so does its e-mail, with the same power and range
    from cocaq.reports.job_report import job_footprint
    from cocaq.reports.render import render_jobs

    with engine.connect() as c:
        pk = c.execute(
            text("SELECT id FROM jobs WHERE job_id_raw = :r"), {"r": one.rec.job_id_raw}
        ).scalar_one()
        report = job_footprint(c, cfg, pk)
    a = rows[one.rec.job_id_raw]
    lo, hi = a["gpu_w_range"]
    said = f"GPUs estimated at {a['gpu_w']:,.0f} W each (10-90%: {lo:,.0f}-{hi:,.0f} W), what the user's own"
    mail = render_jobs([report], cfg)
    assert said in " ".join(mail.text.split()) and said in html.unescape(mail.html), mail.text


# --- the parts --------------------------------------------------------------------------------------------


def _s(
    user: str,
    name: str | None,
    start_h: float,
    hours: float,
    w: float,
    array: int | None = None,
    part: str = "p",
) -> Sample:
    t = T0.timestamp() + start_h * 3600
    return Sample("h100", part, w, hours, 80.0, TDP, user, name, 1, t, t + hours * 3600, array, int(start_h))


def test_runs_are_chains_of_one_job_arrays_or_single_jobs() -> None:
    ss = [
        _s("a", "train", 0, 2, 100), _s("a", "train", 2.1, 2, 100),  # one chain
        _s("a", "train", 4.1 + 13, 1, 100),  # 13 h later: a new run
        _s("a", "eval", 2, 1, 100),  # another name: another run
        _s("b", "train", 0, 2, 100),  # another user
        _s("a", "train", 30, 1, 100, array=7), _s("a", "train", 90, 1, 100, array=7),  # one array
        _s("a", None, 0, 1, 100), _s("a", None, 1.5, 1, 100),  # no name: each job its own run
    ]  # fmt: skip
    runs = pb.run_ids(ss)
    assert runs[0] == runs[1] != runs[2]
    assert len({runs[0], runs[2], runs[3], runs[4], runs[5], runs[7], runs[8]}) == 7
    assert runs[5] == runs[6]


def test_conformal_quantiles_take_the_finite_sample_rank() -> None:
    xs = [float(i) for i in range(1, 10)]  # 9 values: (n + 1) x 0.9 = 9, (n + 1) x 0.1 = 1
    assert conformal_quantile(xs, 0.9) == 9.0 and conformal_quantile(xs, 0.1) == 1.0
    assert conformal_quantile(xs[:4], 0.9) == 4.0  # ceil(4.5) = 5 > n: the largest
    assert math.isnan(conformal_quantile([], 0.5))


def test_a_basis_that_does_not_help_is_not_used_and_few_jobs_widen_the_range() -> None:
    """Users whose runs of one job alternate between two partitions whose GPUs draw 20 % and 90 % of their
    rated power: the user's past says less than the partition, so the series and user bases are judged
    worse than the table and left out; a handful of jobs gives a widened range that says so."""
    rnd = random.Random(1)
    ss = []
    for u in range(30):
        for r in range(5):
            part, share = ("slow", 0.2) if r % 2 else ("fast", 0.9)
            for j in range(3):
                w = TDP * share * math.exp(rnd.gauss(0, 0.03))
                ss.append(_s(f"u{u}", "job", u * 1000 + r * 48 + j * 2.0, 1.5, w, part=part))

    from cocaq.accounting.calibrate import Calibration, build_cells

    def table(train: Any) -> Calibration:
        return Calibration(build_cells(train, (50.0,), T0), 5, (50.0,))

    a = pb.assess(ss, table, lambda s: s.tdp_w, T0)
    for basis in (pb.SERIES, pb.USER):
        judged = a.bases[basis]
        assert judged.jobs >= pb.MIN_RESIDUALS and not judged.used, judged
        assert judged.err_instead is not None and judged.median_err is not None
        assert judged.err_instead < judged.median_err
    assert a.bases[pb.CHOSEN].median_err is not None and a.bases[pb.CHOSEN].median_err < 0.1
    few = pb.assess(ss[:9], table, lambda s: s.tdp_w, T0)
    lo, hi = few.bases[pb.TABLE].factors() if few.bases[pb.TABLE].jobs else (0.5, 2.0)
    assert few.bases[pb.TABLE].widened and lo <= 0.5 and hi >= 2.0


def test_a_hostile_job_name_is_inert_and_bounded_in_the_label() -> None:
    key = pb.keyed_key(pb.SERIES, pb.Facts("eve", "\x1b[31mrm -rf\u202e" + "x" * 500, 2))
    assert key is not None
    words = pb.key_words(pb.SERIES, key)
    assert "\x1b" not in words and "\u202e" not in words and len(words) < 100, words
    assert words.startswith("eve's ?[31mrm -rf?") and words.endswith(" on 2 GPUs")


def test_keys_of_the_other_facts_and_a_declared_model_that_predicts_power() -> None:
    f = pb.Facts("ann", "train", 4, 32, 3 * 1024 * 4, pb.meta_of("x; cocaq: model=Llama-3-8B precision=bf16"))
    assert pb.keyed_key(pb.META, f) == "llama-3-8b\x1fbf16\x1f\x1f4"
    assert pb.key_words(pb.META, "llama-3-8b\x1fbf16\x1f\x1f4") == "llama-3-8b, bf16 on 4 GPUs"
    assert pb.keyed_key(pb.GPUMEM, f) == "8-16\x1f4" and pb.keyed_key(pb.SHAPE, f) == "<=8\x1f4"
    bare = pb.Facts(None, None, 2)
    assert [pb.keyed_key(b, bare) for b in pb.KEYED_BASES] == [None] * len(pb.KEYED_BASES)
    assert pb.meta_of("cocaq: precision=bf16") is None and pb.meta_of("no metadata") is None
    assert pb.keyed_key(pb.GPUMEM, pb.Facts("a", "b", 1, 4, float("nan"))) is None

    # Each user runs anything; what they declared (the model) sets the power: the meta basis is chosen.
    from dataclasses import replace

    from cocaq.accounting.calibrate import Calibration, build_cells

    rnd = random.Random(5)
    levels = {"bert": 150.0, "llama": 600.0, "vit": 250.0, "unet": 400.0, "gpt2": 500.0, "t5": 200.0}
    ss = []
    for u in range(60):
        for r in range(4):
            m = rnd.choice(list(levels))
            w = levels[m] * math.exp(rnd.gauss(0, 0.05))
            s = _s(f"u{u}", f"job{r}", u * 1000 + r * 48, 1.5, w)
            ss.append(replace(s, meta=pb.meta_of(f"cocaq: model={m}")))

    def table(train: Any) -> Calibration:
        return Calibration(build_cells(train, (50.0,), T0), 5, (50.0,))

    a = pb.assess(ss, table, lambda s: s.tdp_w, T0)
    assert a.bases[pb.META].used and a.bases[pb.META].median_err is not None
    meta = a.bases[pb.META]
    assert meta.median_err < 0.1 < meta.err_instead  # type: ignore[operator]  (what the table would do)
