"""Suggestions (reports/suggest.py): each fires on a month whose data supports it, and not on one that
looks close but does not. Built like a real month (import, samples, metadata, aggregate) on SQLite and
PostgreSQL, one user per case, read back with users_month.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from cocaq.reports import data
from cocaq.reports.suggest import BALER_SAVING, Suggestion, Thresholds, suggest_for_user
from sqlalchemy import Engine, insert, text

from cocaq import migrate
from cocaq.aggregate import run_aggregate
from cocaq.config import Config
from cocaq.db import make_engine
from cocaq.importer import import_records
from cocaq.models import ModelMetadata
from tests.conftest import new_database
from tests.test_report_data import config, gpu_samples, job

JUNE = datetime(2025, 6, 1, tzinfo=UTC)
H = 3600.0


def day(d: int, hour: float = 0.0) -> datetime:
    return JUNE.replace(day=d) + timedelta(hours=hour)


def build(engine: Engine, cfg: Config) -> None:
    recs = [
        # mixed precision: 4 GPUs x 30 h = 120 GPU-hours, 48 kWh of GPU energy at the 400 W TDP
        job(1001, day(2), 30, user="amp_unknown", account="a", gpus=4),
        job(1101, day(2), 30, user="amp_bf16", account="a", gpus=4),
        job(1201, day(2), 30, user="amp_fp32", account="a", gpus=4),
        job(1301, day(2), 10, user="amp_light", account="a", gpus=1),
        job(1401, day(2), 30, user="amp_knows", account="a", gpus=4),
        job(1402, day(5), 30, user="amp_knows", account="a", gpus=4),
        # fewer GPUs: one GPU of two idle, against two GPUs each idle half of the time
        job(2001, day(3, 10), 2, user="one_idle", account="a", gpus=2, name="ddp-not-launched"),
        job(2101, day(3, 10), 2, user="half_idle", account="a", gpus=2),
        # data loader: 30% GPU with 8 CPUs 95% busy; the same GPU with idle CPUs; busy GPU; no samples
        job(3001, day(4), 3, user="loader", account="a", cpus=8, cpu_s=0.95 * 8 * 3 * H),
        job(3101, day(4), 3, user="loader_cpu_low", account="a", cpus=8, cpu_s=0.5 * 8 * 3 * H),
        job(3201, day(4), 3, user="loader_util_ok", account="a", cpus=8, cpu_s=0.95 * 8 * 3 * H),
        job(3301, day(4), 3, user="loader_no_samples", account="a", cpus=8, cpu_s=0.95 * 8 * 3 * H),
        # power cap: 4 GPUs x 10 h at 50% and 300 W of 400 (12 kWh drawn); busy; low power
        job(4001, day(6), 10, user="capper", account="a", gpus=4),
        job(4101, day(6), 10, user="cap_busy", account="a", gpus=4),
        job(4201, day(6), 10, user="cap_low_power", account="a", gpus=4),
    ]
    # time limits: 12 one-hour jobs asking 24 h; asking 2 h for 1.5 h; no limit; hitting their limits
    for i in range(12):
        t = day(10 + i % 10, i)
        recs.append(job(5000 + i, t, 1, user="limits", account="a", gpus=0, limit_h=24))
        recs.append(job(5100 + i, t, 1.5, user="limits_ok", account="a", gpus=0, limit_h=2))
        recs.append(job(5200 + i, t, 1, user="limits_none", account="a", gpus=0))
        recs.append(job(5300 + i, t, 1, user="limits_timeouts", account="a", gpus=0, limit_h=24))
    recs.append(
        job(5390, day(25), 24, user="limits_timeouts", account="a", gpus=0, limit_h=24, state="TIMEOUT")
    )
    import_records(engine, recs, cfg, source="sacct-json")
    busy, idle = (300.0, 90.0), (60.0, 0.0)
    gpu_samples(engine, 2001, day(3, 10), 120, {"GPU-a": busy, "GPU-b": idle}, node="n2001")
    gpu_samples(
        engine,
        2101,
        day(3, 10),
        120,
        {"GPU-a": [idle] * 60 + [busy] * 60, "GPU-b": [busy] * 60 + [idle] * 60},
        node="n2101",
    )
    for raw, sample in ((3001, (150.0, 30.0)), (3101, (150.0, 30.0)), (3201, (150.0, 60.0))):
        gpu_samples(engine, raw, day(4), 180, {"GPU-a": sample}, node=f"n{raw}")
    for raw, sample in ((4001, (300.0, 50.0)), (4101, (380.0, 95.0)), (4201, (100.0, 50.0))):
        gpu_samples(
            engine, raw, day(6), 10 * 60, {f"GPU-{i}": sample for i in range(4)}, step_s=120, node=f"n{raw}"
        )
    with engine.begin() as c:
        pks = dict(c.execute(text("SELECT job_id_raw, id FROM jobs")).all())
        # the precision column (bf16, fp32), and a row of the first shape that kept it in `extra` (amp)
        meta = [
            (1101, "llama-7b", "bf16", None),
            (1201, "resnet50", "fp32", None),
            (1401, "vit-b", None, {"amp": True}),
            (1402, "vit-b", None, None),
        ]
        c.execute(
            insert(ModelMetadata),
            [
                {"job_pk": pks[r], "model_name": m, "framework": "pytorch", "precision": p, "extra": e,
                 "sources": {"model": "api"} | ({"precision": "api"} if p else {})}
                for r, m, p, e in meta
            ],
        )  # fmt: skip
    run_aggregate(engine, cfg)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def months(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, data.UserMonth]]:
    tmp = tmp_path_factory.mktemp(f"suggest-{request.param}")
    url = new_database(request.param, tmp, request)
    engine = make_engine(url)
    migrate.upgrade(engine)
    cfg = config(tmp, url)
    build(engine, cfg)
    with engine.connect() as conn:
        yield data.users_month(conn, cfg, JUNE)
    engine.dispose()


def fired(months: dict[str, data.UserMonth], user: str) -> dict[str, Suggestion]:
    return {s.id: s for s in suggest_for_user(months[user])}


def test_mixed_precision_only_for_gpu_heavy_users_not_known_to_use_it(
    months: dict[str, data.UserMonth],
) -> None:
    s = fired(months, "amp_unknown")
    assert set(s) == {"mixed-precision"}
    amp = s["mixed-precision"]
    assert amp.title == "Mixed precision, if not already" and "If your training does not already" in amp.body
    assert amp.job_ids == ("1001",) and "1001" in amp.body and "120 GPU-hours" in amp.body
    assert "0.213 kWh" in amp.body and "0.143 kWh" in amp.body and "33%" in amp.body
    assert amp.saving_kwh == pytest.approx(BALER_SAVING * 48.0) and "upper bound" in amp.saving_basis
    assert "GPU-hours 120 >= 100" in amp.test
    # the metadata says fp32: a firm suggestion about those jobs
    fp32 = fired(months, "amp_fp32")["mixed-precision"]
    assert fp32.title == "Train in mixed precision" and fp32.job_ids == ("1201",)
    assert "full precision" in fp32.body
    assert fp32.saving_kwh == pytest.approx(BALER_SAVING * 48.0)
    # already bf16; too little GPU work; uses AMP in one job, nothing recorded for the other
    assert fired(months, "amp_bf16") == {}
    assert fired(months, "amp_light") == {}
    assert months["amp_knows"].totals.gpu_hours == pytest.approx(240.0)
    assert fired(months, "amp_knows") == {}


def test_fewer_gpus_only_where_one_gpu_idled_and_another_worked(months: dict[str, data.UserMonth]) -> None:
    one, half = months["one_idle"].gpu_jobs[0], months["half_idle"].gpu_jobs[0]
    # job-level figures cannot tell the two apart: half of the sampled GPU time idle in both
    assert one.idle_share == pytest.approx(0.5) and half.idle_share == pytest.approx(0.5)
    assert one.idle_gpu_hours == pytest.approx(2.0) and half.idle_gpu_hours == pytest.approx(2.0)
    # per GPU they differ
    assert [(d.device, round(d.idle_share, 6)) for d in one.devices] == [("GPU-a", 0.0), ("GPU-b", 1.0)]
    assert [(d.device, round(d.idle_share, 6)) for d in half.devices] == [("GPU-a", 0.5), ("GPU-b", 0.5)]
    assert one.devices[1].energy_kwh == pytest.approx(60 * 2 / 1000)
    assert one.devices[1].hours == pytest.approx(2.0)
    s = fired(months, "one_idle")
    assert set(s) == {"fewer-gpus"}
    f = s["fewer-gpus"]
    assert f.job_ids == ("2001",) and "2001 (ddp-not-launched)" in f.body
    assert "GPU-b on n2001 idle in 100%" in f.body
    assert "GPU-a averaged 90%" in f.body
    assert f.saving_kwh == pytest.approx(0.12)  # what GPU-b drew, 60 W for 2 h
    assert fired(months, "half_idle") == {}


def test_dataloader_only_with_low_gpu_use_and_saturated_cpus(months: dict[str, data.UserMonth]) -> None:
    s = fired(months, "loader")
    assert set(s) == {"dataloader-workers"}
    d = s["dataloader-workers"]
    assert d.job_ids == ("3001",) and "GPUs averaged 30%" in d.body and "95% busy" in d.body
    assert d.saving_kwh is None and "not estimated" in d.saving_basis
    assert "num_workers" in d.body
    assert months["loader"].gpu_jobs[0].cpu_usage == pytest.approx(0.95)
    assert fired(months, "loader_cpu_low") == {}  # the CPUs were not the bottleneck
    assert fired(months, "loader_util_ok") == {}  # the GPU was busy enough
    assert fired(months, "loader_no_samples") == {}  # nothing says how busy the GPU was


def test_power_cap_only_at_moderate_utilisation_and_high_power(months: dict[str, data.UserMonth]) -> None:
    capper = months["capper"].gpu_jobs[0]
    assert capper.mean_gpu_power_w == pytest.approx(300.0) and capper.gpu_tdp_w == 400.0
    assert capper.gpu_energy_kwh == pytest.approx(4 * 10 * 0.4)  # accounted: the TDP estimate
    s = fired(months, "capper")
    assert set(s) == {"power-cap"}
    p = s["power-cap"]
    assert p.saving_kwh == pytest.approx(0.10 * 4 * 10 * 0.3)  # 10% of what the samples say was drawn
    assert "4001" in p.body and "300 W of 400 W" in p.body
    assert "McDonald et al." in p.body and "15%" in p.body
    assert fired(months, "cap_busy") == {}  # compute-bound: a cap would slow it down
    assert fired(months, "cap_low_power") == {}  # already far under the TDP: nothing to cap


def test_time_limits_only_when_known_and_far_from_used(months: dict[str, data.UserMonth]) -> None:
    s = fired(months, "limits")
    assert set(s) == {"time-limits"}
    t = s["time-limits"]
    assert "12 completed jobs" in t.body and "asked for 24 h" in t.body and "A limit of about 1.5 h" in t.body
    assert t.saving_kwh is None and len(t.job_ids) == 3
    assert months["limits"].time_limits.median_use == pytest.approx(1 / 24)
    assert fired(months, "limits_ok") == {}  # 75% of the limit used
    assert months["limits_none"].time_limits.completed == 0
    assert fired(months, "limits_none") == {}  # no limit known: not judged
    assert months["limits_timeouts"].time_limits.timeouts == 1
    assert fired(months, "limits_timeouts") == {}  # a user who hits the limit keeps it


def test_order_and_thresholds(months: dict[str, data.UserMonth]) -> None:
    # the thresholds are the tests: lowering one makes a borderline month qualify
    assert fired(months, "amp_light") == {}
    low = Thresholds(amp_min_gpu_hours=5, amp_min_gpu_kwh=1)
    (s,) = suggest_for_user(months["amp_light"], low)
    assert s.id == "mixed-precision" and s.saving_kwh == pytest.approx(BALER_SAVING * 10 * 0.4)
    # several at once: the largest saving first, those without an estimate last
    mixed = data.UserMonth(**{**months["capper"].__dict__, "time_limits": months["limits"].time_limits})
    assert [s.id for s in suggest_for_user(mixed)] == ["power-cap", "time-limits"]
    # nothing to say about an empty month
    empty = data.UserMonth(
        **{**months["limits_none"].__dict__, "gpu_jobs": (), "time_limits": data.TimeLimitUse()}
    )
    assert suggest_for_user(empty) == []
