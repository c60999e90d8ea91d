"""Calibrated estimates (issue 18): GPU power learnt from the site's measured jobs, applied to the jobs that
nothing measured, with its range and basis; `cocaq calibrate`, `cocaq recompute`, bad input."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cocaq.accounting import calibrate, measured
from cocaq.accounting.importer import import_records
from cocaq.collector.ship import connect
from cocaq.config_load import load_config
from cocaq.slurm.record import JobRecord
from tests import builders
from tests.conftest import run_cocaq

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
# the site's cocaq.toml: H100 and V100 partitions, every GPU at its full TDP unless calibrated
SITE: dict[str, dict[str, Any]] = {
    "cluster": {"name": "c", "carbon_zone": "FRA"},
    "estimate": {"gpu_utilisation": 1.0},
    "partitions": {
        "h100": {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_tdp_w": 700, "cpu_tdp_w_per_core": 10},
        "v100": {"gpu_model": "Tesla V100-SXM2-32GB", "gpu_tdp_w": 300, "cpu_tdp_w_per_core": 10},
    },
}
# what the measured H100 jobs' GPUs drew, W per GPU (the real trace's 143 W among them)
MEASURED_W = (120.0, 135.0, 143.0, 150.0, 160.0, 180.0)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("nvidia_h100_80gb_hbm3", "h100"),  # Slurm's gres type from AutoDetect=nvml
        ("h100", "h100"),
        ("H100-SXM5-80GB", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("a100_3g.40gb", "a100"),  # a MIG profile's gres type: the family still
        ("Tesla V100-SXM2-32GB", "v100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA RTX A6000", "a6000"),
        ("AMD Instinct MI250X", "mi250x"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("unknown GPU", None),
        ("", None),
        (None, None),
        ("80GB HBM3", None),
        ("!!!\x00\u202e", None),
        ("gpu", None),
    ],
)
def test_gpu_model_names_meet(name: str | None, key: str | None) -> None:
    assert calibrate.normalise_gpu_model(name) == key


def test_weighted_quantiles_and_buckets() -> None:
    vw = [(100.0, 1.0), (200.0, 1.0), (300.0, 2.0)]
    # midpoints of the cumulative weights: 100 at 1/8, 200 at 3/8, 300 at 3/4
    assert calibrate.weighted_quantile(vw, 0.5) == pytest.approx(200.0 + 100.0 * (1 / 8) / (3 / 8))
    assert calibrate.weighted_quantile(vw, 0.05) == 100.0 and calibrate.weighted_quantile(vw, 0.95) == 300.0
    assert calibrate.weighted_quantile([(5.0, 3.0)], 0.1) == 5.0
    assert calibrate.bucket_of(None, (25, 50, 75)) is None
    assert calibrate.bucket_of(99.9, (25.0, 50.0, 75.0))[0] == "75-100"  # type: ignore[index]
    assert calibrate.bucket_of(100.0, (25.0, 50.0, 75.0))[0] == "75-100"  # type: ignore[index]
    assert calibrate.bucket_of(0.0, (50.0,))[0] == "0-50"  # type: ignore[index]


# --- a site: measured H100 jobs, unmeasured H100/V100 jobs -----------------------------------------------


def _job(raw: int, partition: str, node: str, gpus: int = 2, hours: float = 2.0, **kw: Any) -> JobRecord:
    """Alice's job on `node`, started (raw % 50) hours after T0, one core busy all along."""
    return builders.job(
        raw, T0 + timedelta(hours=raw % 50), hours, partition=partition, node_list=node, gpus=gpus,
        cpu_s=hours * 3600, queued=timedelta(minutes=1), **kw,
    )  # fmt: skip


def _site_config(tmp_path: Path, url: str) -> Path:
    """SITE's cocaq.toml on the database `url`, in tmp_path."""
    return builders.write_config(tmp_path / "cocaq.toml", url, base=False, **SITE)


def _measure(url: str, rec: JobRecord, watts: list[float], name: str = "NVIDIA H100 80GB HBM3") -> None:
    """The hooks' start and end records of a job whose GPUs drew `watts` each (NVML counters)."""
    assert rec.start_time is not None
    t0 = rec.start_time.timestamp()
    t1 = t0 + rec.elapsed_s
    base = {"cluster": "c", "node": rec.node_list, "job_id": str(rec.job_id_raw), "job": {"user": "alice"}}
    gpus = [{"slurm_index": i, "uuid": f"GPU-{rec.job_id_raw}-{i}", "name": name} for i in range(len(watts))]
    energy = [
        {"component": "gpu", "device": g["uuid"], "source": "nvml", "method": "measured",
         "energy_j": w * rec.elapsed_s, "t0": t0, "t1": t1, "job_start": t0, "final": True}
        for g, w in zip(gpus, watts, strict=True)
    ]  # fmt: skip
    events = [
        {**base, "uid": f"c/{rec.job_id_raw}/start", "event": "start", "ts": t0, "gpus": gpus},
        {
            **base,
            "uid": f"c/{rec.job_id_raw}/end",
            "event": "end",
            "ts": t1,
            "job_start": t0,
            "energy": energy,
        },
    ]
    target = connect(url)
    target.ship_events(target.cluster_id("c"), events)


def _site(engine: Engine, tmp_path: Path) -> tuple[str, Path, dict[str, JobRecord]]:
    url = engine.url.render_as_string(hide_password=False)
    cfg_path = _site_config(tmp_path, url)
    cfg = load_config(cfg_path, {})
    jobs = {
        "unmeasured-h100": _job(900, "h100", "u1", gpus=4, hours=3.0),
        "unmeasured-v100": _job(901, "v100", "v1", gpus=2, hours=1.0),
        "garbage-gres": _job(902, "h100", "u1", gpus=1, hours=1.0, gpu_type="\u202e!!zz"),
        "unknown-model": _job(903, "other", "x1", gpus=1, hours=1.0, gpu_type="???"),
    }
    measured_jobs = [_job(800 + i, "h100", "m1") for i in range(len(MEASURED_W))]
    import_records(engine, [*measured_jobs, *jobs.values()], cfg, source="sacct-json")
    for rec, w in zip(measured_jobs, MEASURED_W, strict=True):
        _measure(url, rec, [w, w])
    measured.refresh(engine, cfg)
    return url, cfg_path, jobs


def _job_row(engine: Engine, raw: int) -> Any:
    with engine.connect() as c:
        row = c.execute(
            text(
                "SELECT energy_j, energy_measured_j, energy_est_low_j, energy_est_high_j, assumptions "
                "FROM jobs WHERE job_id_raw = :r"
            ),
            {"r": raw},
        ).one()
    a = row.assumptions if isinstance(row.assumptions, dict) else json.loads(row.assumptions)
    return row, a


def _gpu_rows(engine: Engine, raw: int) -> list[tuple[str, str, float]]:
    with engine.connect() as c:
        return [
            (r[0], r[1], round(r[2], 3))
            for r in c.execute(
                text(
                    "SELECT e.method, e.source, e.energy_j FROM job_energy e JOIN jobs j ON j.id = e.job_pk "
                    "WHERE j.job_id_raw = :r AND e.component = 'gpu' ORDER BY e.source"
                ),
                {"r": raw},
            )
        ]


def test_unmeasured_jobs_take_the_power_measured_jobs_drew(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    _, cfg_path, _ = _site(engine, tmp_path)
    env = dict(cli_env, COCAQ_CONFIG=str(cfg_path))
    # Before anything is learnt: a clear line, and the estimate is TDP x utilisation, labelled so.
    r = run_cocaq(["calibrate"], env)
    assert r.code == 0 and "no GPU power learnt yet" in r.out, (r.out, r.err)
    row, a = _job_row(engine, 900)
    assert _gpu_rows(engine, 900) == [("estimated", "tdp-estimate", 4 * 3 * 3600 * 700.0)]
    assert a["gpu_basis"] == "tdp" and "no measured GPU jobs learnt yet" in a["gpu_cell"]
    assert row.energy_est_low_j is None

    r = run_cocaq(["calibrate", "--refresh"], env)
    assert r.code == 0, r.err
    assert "6 measured jobs of h100" in r.err and "cocaq recompute" in r.err
    assert "h100" in r.out and "(all)" in r.out and "146" in r.out  # the median (146.5), per cell
    r = run_cocaq(["calibrate", "--format", "json"], env)
    doc = json.loads(r.out)
    cells = {(c["partition"], c["bucket"]): c for c in doc["cells"]}
    # (no GPU samples here: utilisation unknown, only the "any" rows)
    assert set(cells) == {(None, "any"), ("h100", "any")}
    cell = cells[("h100", "any")]
    assert cell["jobs"] == 6 and cell["gpu_hours"] == pytest.approx(24.0) and cell["used"] is True
    assert cell["w_p10"] < cell["w_median"] < cell["w_p90"]
    assert cell["w_median"] == pytest.approx(146.5)  # midway between the 3rd and 4th of six equal weights

    r = run_cocaq(["recompute"], env)
    assert r.code == 0, r.err
    w, lo, hi = cell["w_median"], cell["w_p10"], cell["w_p90"]
    gpu_s = 4 * 3 * 3600.0
    (g,) = _gpu_rows(engine, 900)
    assert g[:2] == ("estimated", "calibrated-estimate") and g[2] == pytest.approx(gpu_s * w, rel=1e-3)
    row, a = _job_row(engine, 900)
    assert a["gpu_basis"] == "calibrated-partition" and a["gpu_w"] == pytest.approx(w, abs=0.1)
    assert a["basis"] == "estimated: GPUs from the site's measured jobs, CPU and memory from TDP"
    assert "h100, in h100, any utilisation: 6 jobs" in a["gpu_cell"]
    rest = row.energy_j - gpu_s * a["gpu_w"]  # CPU (and memory) as estimated before
    # six measured jobs are too few to learn a range from held-out runs: it is widened to at least half
    # to twice the estimate (wider than the six jobs' own spread), and says so
    assert w / 2 < lo < hi < 2 * w
    assert row.energy_est_low_j == pytest.approx(rest + gpu_s * w / 2, rel=1e-3)
    assert row.energy_est_high_j == pytest.approx(rest + gpu_s * w * 2, rel=1e-3)
    assert re.search(r"; range widened: \d job(s)? held out$", a["gpu_cell"]), a["gpu_cell"]
    # 4.9x less than TDP x 1.0 would have said for the GPUs
    assert 700.0 / a["gpu_w"] > 4.5
    # A garbage gres type: the partition's model (h100) is used; a model nothing tells: TDP, and why.
    assert _job_row(engine, 902)[1]["gpu_basis"] == "calibrated-partition"
    _, a = _job_row(engine, 903)
    assert a["gpu_basis"] == "tdp" and a["gpu_cell"] == "GPU model unknown"
    # A model nothing measured: TDP x utilisation, no range.
    row, a = _job_row(engine, 901)
    assert a["gpu_basis"] == "tdp" and a["gpu_cell"] == "no measured v100 jobs"
    assert a["basis"] == "estimated from TDP"
    assert _gpu_rows(engine, 901) == [("estimated", "tdp-estimate", 2 * 3600 * 300.0)]
    assert row.energy_est_low_j is None
    # Measured jobs keep their measurements; recompute again changes nothing.
    assert _gpu_rows(engine, 800) == [("measured", "nvml", 2 * 2 * 3600 * 120.0)]
    r = run_cocaq(["recompute"], env)
    assert "0 changed" in r.err, r.err

    # Too few jobs behind a cell: not used (TDP again), and the table says so.
    env2 = dict(env, COCAQ_ESTIMATE__CALIBRATE_MIN_JOBS="7")
    r = run_cocaq(["calibrate"], env2)
    assert "no (<7 jobs)" in r.out
    assert run_cocaq(["recompute"], env2).code == 0
    _, a = _job_row(engine, 900)
    assert a["gpu_basis"] == "tdp" and a["gpu_cell"] == "fewer than 7 measured h100 jobs"
    assert _gpu_rows(engine, 900) == [("estimated", "tdp-estimate", 4 * 3 * 3600 * 700.0)]
    # Calibration off: TDP x utilisation.
    assert run_cocaq(["recompute"], env).code == 0  # (calibrated again)
    assert _job_row(engine, 902)[1]["gpu_basis"] == "calibrated-partition"
    env3 = dict(env, COCAQ_ESTIMATE__CALIBRATE="false")
    assert run_cocaq(["recompute"], env3).code == 0
    _, a = _job_row(engine, 902)
    assert a["gpu_basis"] == "tdp" and "calibration off" in a["gpu_cell"]
    assert _gpu_rows(engine, 902) == [("estimated", "tdp-estimate", 3600 * 700.0)]


def test_a_partly_measured_job_estimates_its_other_gpus_from_the_table(
    engine: Engine, tmp_path: Path
) -> None:
    url, cfg_path, _ = _site(engine, tmp_path)
    cfg = load_config(cfg_path, {})
    calibrate.refresh(engine, cfg)
    rec = _job(950, "h100", "m2", gpus=4, hours=2.0)
    import_records(engine, [rec], cfg, source="sacct-json")
    _measure(url, rec, [200.0])  # one of its four GPUs measured
    measured.refresh(engine, cfg)
    cal = calibrate.load_engine(engine, cfg)
    assert cal is not None
    hit = cal.lookup("h100", "h100")
    assert not isinstance(hit, str)
    rows = _gpu_rows(engine, 950)
    assert rows[0] == ("estimated", "calibrated-estimate", pytest.approx(3 * 2 * 3600 * hit.w, rel=1e-6))
    assert rows[1] == ("measured", "nvml", 2 * 3600 * 200.0)
    row, _ = _job_row(engine, 950)
    est = row.energy_j - row.energy_measured_j
    gpu_s = 3 * 2 * 3600.0
    assert row.energy_est_low_j == pytest.approx(est - gpu_s * (hit.w - hit.w_low), rel=1e-6)
    assert row.energy_est_high_j == pytest.approx(est + gpu_s * (hit.w_high - hit.w), rel=1e-6)
    # (the measured job is not learnt from: a quarter of it is an estimate)
    assert calibrate.refresh(engine, cfg).skipped["partly estimated"] == 1


def test_nothing_measured_and_one_job_of_a_model(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    cfg_path = _site_config(tmp_path, url)
    cfg = load_config(cfg_path, {})
    env = dict(cli_env, COCAQ_CONFIG=str(cfg_path))
    import_records(engine, [_job(700, "v100", "v1")], cfg, source="sacct-json")
    r = run_cocaq(["calibrate", "--refresh"], env)
    assert r.code == 0 and "calibrate: no measured GPU jobs to learn from" in r.err, r.err
    assert "no GPU power learnt yet" in r.out
    r = run_cocaq(["calibrate", "--format", "json"], env)
    assert r.code == 0 and json.loads(r.out)["cells"] == [] and "note" in json.loads(r.out)
    one = _job(701, "h100", "m1")
    import_records(engine, [one], cfg, source="sacct-json")
    _measure(url, one, [150.0, 150.0])
    measured.refresh(engine, cfg)
    r = run_cocaq(["calibrate", "--refresh"], env)
    assert r.code == 0 and "2 cells (0 with at least 5 jobs) from 1 measured jobs of h100" in r.err, r.err
    assert "no (<5 jobs)" in r.out and "Traceback" not in r.err
    # on a 60-column terminal: the counts give way, the power figures stay whole
    r = run_cocaq(["calibrate"], dict(env, COLUMNS="60"))
    assert r.code == 0 and all(len(line) <= 60 for line in r.out.splitlines()), r.out
    assert "150-150" in r.out and "…" not in r.out, r.out
    assert "too narrow for: used, jobs, GPU-h; --format json has them" in " ".join(r.out.split()), r.out


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("CALIBRATE", "maybe", "config: estimate.calibrate: expected true or false, got 'maybe'"),
        ("CALIBRATE_MIN_JOBS", "0", "config: estimate.calibrate_min_jobs: expected a number between 1"),
        (
            "CALIBRATE_MIN_JOBS",
            "2.5",
            "config: estimate.calibrate_min_jobs: expected a whole number, got '2.5'",
        ),
        ("CALIBRATE_BUCKETS", "50,25", "config: estimate.calibrate_buckets: expected increasing percentages"),
        ("CALIBRATE_BUCKETS", "0,50", "config: estimate.calibrate_buckets: expected increasing percentages"),
        ("CALIBRATE_BUCKETS", "x", "config: estimate.calibrate_buckets: expected a number"),
    ],
)
def test_bad_calibration_settings_are_one_line(
    cli_env: dict[str, str], var: str, value: str, message: str
) -> None:
    r = run_cocaq(["calibrate"], dict(cli_env, **{f"COCAQ_ESTIMATE__{var}": value}))
    assert r.code != 0 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_buckets_in_a_config_file(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[estimate]\ncalibrate_buckets = [10, 90]\ncalibrate_min_jobs = 3\n")
    est = load_config(p, {}).estimate
    assert est.calibrate_buckets == (10.0, 90.0) and est.calibrate_min_jobs == 3 and est.calibrate
    p.write_text("[estimate]\ncalibrate_buckets = 50\n")
    with pytest.raises(Exception, match="expected a list of percentages"):
        load_config(p, {})


# --- validation on the demo: measured jobs held out and estimated as if nothing had measured them --------


def test_held_out_measured_jobs_are_closer_with_the_calibrated_estimate(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The demo's measured GPU jobs (A100s, half the V100s) draw what their work makes them draw (from
    ~40 W idling to ~330 W communication-bound), not a constant share of TDP: held out 30 % at a time, the
    calibrated estimate of their GPU energy is much closer than TDP x utilisation (bench/bench_calibration.py
    reports the same numbers in BENCHMARKS.md)."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    env = dict(cli_env, COCAQ_DATABASE_URL=url)
    r = run_cocaq(["demo", "--out", str(tmp_path / "demo")], env, cwd=tmp_path)
    assert r.code == 0, r.err
    assert "estimated from what the measured ones drew" in " ".join(r.out.split())
    cfg = load_config(tmp_path / "demo" / "cocaq-demo.toml", {})
    from cocaq.db.engine import make_engine

    engine = make_engine(url)
    with engine.connect() as conn:
        samples = calibrate.measured_samples(conn, cfg)
    engine.dispose()
    assert {s.gpu_model for s in samples} == {"a100", "v100"} and len(samples) > 150
    # what a GPU draws depends on what the job does (its utilisation), not a constant share of its TDP
    cells = {(c.gpu_model, c.bucket): c for c in calibrate.build_cells(samples, (25.0, 50.0, 75.0), T0)}
    assert (
        cells[("v100", "0-25")].w_median
        < cells[("v100", "25-50")].w_median
        < cells[("v100", "75-100")].w_median
    )
    assert cells[("a100", "0-25")].w_median < 100.0 < 250.0 < cells[("a100", "any")].w_median

    res = {k: v.summary() for k, v in calibrate.holdout(samples, cfg).items()}
    tdp, own, any_, cal = (res[k] for k in ("tdp_config", "tdp_job_util", "calibrated_any", "calibrated"))
    assert cal["jobs"] == tdp["jobs"] > 1000
    assert cal["median_abs"] < own["median_abs"] < tdp["median_abs"]
    assert cal["p90_abs"] < tdp["p90_abs"] and cal["p90_abs"] <= own["p90_abs"]
    assert abs(cal["bias"]) < abs(own["bias"]) and abs(cal["bias"]) < abs(tdp["bias"])
    # without the job's utilisation the table still does better than TDP x 0.8, if not by much
    assert any_["median_abs"] < tdp["median_abs"] and abs(any_["bias"]) < abs(tdp["bias"])

    # The demo's V100 jobs on nodes nothing measured carry the calibrated estimate, its range and basis.
    db = sqlite3.connect(tmp_path / "demo.sqlite")
    try:
        (job_id,) = db.execute(
            "SELECT j.job_id FROM jobs j JOIN job_energy e ON e.job_pk = j.id WHERE e.source = "
            "'calibrated-estimate' AND j.partition = 'gpu_v100' ORDER BY j.energy_j DESC LIMIT 1"
        ).fetchone()
    finally:
        db.close()
    env = dict(env, COCAQ_CONFIG=str(tmp_path / "demo" / "cocaq-demo.toml"), COLUMNS="200")
    r = run_cocaq(["job", job_id], env)
    assert r.code == 0, r.err
    assert "estimate from the site's measured jobs" in r.out
    # (dave's own measured jobs on 4 V100s, judged on held-out runs to beat the model's table)
    assert re.search(r"what the (site's|user's own) measured jobs( of this name)? drew", r.out), r.out
    assert re.search(
        r"Energy drawn by the hardware: [\d.,]+ kWh \(0 kWh measured, [\d.,]+ kWh, [\d.,]+-[\d.,]+ "
        r"estimated\)",
        " ".join(r.out.split()),  # (the heading wraps at the table's width)
    ), r.out


def test_every_surface_shows_the_estimate_with_its_range(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """`cocaq user`/`lab` (from the rollups and from the jobs, table and JSON), `cocaq job` and the monthly
    report say the same estimated kWh and range, next to the measured part."""
    _, cfg_path, _ = _site(engine, tmp_path)
    env = dict(cli_env, COCAQ_CONFIG=str(cfg_path), COLUMNS="200")
    assert run_cocaq(["calibrate", "--refresh"], env).code == 0
    assert run_cocaq(["recompute"], env).code == 0  # (and the rollups)
    with engine.connect() as c:
        meas, est, low, high = c.execute(
            text(
                "SELECT sum(energy_measured_j), sum(energy_j - energy_measured_j), "
                "sum(coalesce(energy_est_low_j, energy_j - energy_measured_j)), "
                "sum(coalesce(energy_est_high_j, energy_j - energy_measured_j)) FROM jobs"
            )
        ).one()
    assert low < est < high
    window = ["--since", "2026-11-01", "--until", "2026-11-10"]
    docs = []
    for extra in ([], ["--from-jobs"]):
        r = run_cocaq(["lab", "lab", *window, "--format", "json", *extra], env)
        assert r.code == 0, r.err
        docs.append(json.loads(r.out))
    assert docs[0]["rollups_through"] and docs[0]["rollup_days"] and docs[1]["from_jobs"]
    for t in docs:
        assert t["energy_measured_kwh"] == pytest.approx(meas / 3.6e6, rel=1e-9)
        assert t["energy_estimated_kwh"] == pytest.approx(est / 3.6e6, rel=1e-9)
        assert t["energy_estimated_low_kwh"] == pytest.approx(low / 3.6e6, rel=1e-9)
        assert t["energy_estimated_high_kwh"] == pytest.approx(high / 3.6e6, rel=1e-9)
    r = run_cocaq(["user", "alice", *window], env)
    assert r.code == 0, r.err
    from cocaq.cli.terminal import _kwh, estimate_text

    said = estimate_text(est / 3.6e6, low / 3.6e6, high / 3.6e6)
    assert f"{_kwh(meas / 3.6e6)} measured / {said}" in r.out, r.out
    assert re.search(r"[\d.,]+ kWh, [\d.,]+-[\d.,]+ estimated", said)
    r = run_cocaq(["user", "alice", *window, "--format", "csv"], env)
    assert "energy_estimated_low_kwh" in r.out and "energy_estimated_high_kwh" in r.out

    # The month's admin report and the user's e-mail: the same range in their words.
    out = tmp_path / "reports"
    r = run_cocaq(["report", "admin", "--month", "2026-11", "--out", str(out)], env)
    assert r.code == 0, r.err
    from cocaq.reports.wording import estimate, kwh

    text_ = " ".join(" ".join(p.read_text(errors="replace") for p in out.iterdir()).split())
    assert f"{kwh(meas / 3.6e6)} measured, {estimate(est / 3.6e6, low / 3.6e6, high / 3.6e6)}" in text_
    r = run_cocaq(["report", "user", "alice", "--month", "2026-11", "--out", str(tmp_path / "user")], env)
    assert r.code == 0, r.err
    (page,) = [p for p in (tmp_path / "user").iterdir() if p.suffix == ".html"]
    said = f"{kwh(meas / 3.6e6)} measured, {estimate(est / 3.6e6, low / 3.6e6, high / 3.6e6)}"
    assert said in " ".join(page.read_text().split())
    assert "measured jobs drew on the same GPU model" in " ".join(page.read_text().split())
