"""Importing sacct data: idempotent, updates to final states, estimates and CO2 stored with their basis."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from cocaq.accounting.importer import import_records
from cocaq.accounting.recompute import recompute_jobs
from cocaq.carbon.zones import zone_intensity
from cocaq.config import Config, Estimate, Hardware
from cocaq.db.schema import Job, JobEnergy
from cocaq.slurm.sacct import ParseStats, iter_parsable
from tests.builders import default_config

HEADER = (
    "JobID|JobIDRaw|JobName|User|UID|Account|Partition|QOS|NodeList|NNodes|AllocCPUS|AllocTRES|ReqMem|"
    "Submit|Start|End|ElapsedRaw|State|ExitCode|TotalCPU|Comment|ConsumedEnergyRaw|Cluster"
)
TRAIN = (
    "100|100|train|alice|1001|lab_nlp|gpu|normal|gpu01|1|8|cpu=8,gres/gpu:a100=2,mem=64G,node=1|64G|"
    "2026-11-10T10:00:00|2026-11-10T10:00:00|2026-11-10T20:00:00|36000|COMPLETED|0:0|2-00:00:00|resnet||c1"
)
TRAIN_STEP = (
    "100.batch|100.batch|batch||1001|lab_nlp||||1|8|cpu=8,mem=64G,node=1||"
    "2026-11-10T10:00:00|2026-11-10T10:00:00|2026-11-10T20:00:00|36000|COMPLETED|0:0|2-00:00:00|||"
)
RUNNING = (
    "200|200|sim|bob|1002|lab_phys|cpu|normal|cpu01|1|4|cpu=4,mem=8G,node=1|8G|"
    "2026-11-11T00:00:00|2026-11-11T00:00:00|Unknown|3600|RUNNING|0:0|00:00:00|||c1"
)
FINISHED = (
    "200|200|sim|bob|1002|lab_phys|cpu|normal|cpu01|1|4|cpu=4,mem=8G,node=1|8G|"
    "2026-11-11T00:00:00|2026-11-11T00:00:00|2026-11-11T05:00:00|18000|COMPLETED|0:0|20:00:00|||c1"
)
MEASURED = (
    "300|300|m|carol|1003|lab_nlp|gpu|normal|gpu02|1|2|cpu=2,gres/gpu=1,mem=4G,node=1|4G|"
    "2026-11-12T00:00:00|2026-11-12T00:00:00|2026-11-12T01:00:00|3600|FAILED|1:0|01:00:00||7200000|c1"
)


def cfg() -> Config:
    c = default_config(name="c1", carbon_zone="FRA", pue=1.5)
    return replace(
        c,
        estimate=Estimate(gpu_utilisation=0.5, mem_w_per_gb=0.3725),
        partitions={
            "gpu": Hardware(cpu_tdp_w_per_core=10.0, gpu_tdp_w=400.0),
            "cpu": Hardware(cpu_tdp_w_per_core=5.0, gpu_tdp_w=0.0),
        },
    )


def dump(*lines: str) -> list[bytes]:
    return [(line + "\n").encode() for line in (HEADER, *lines)]


def do_import(engine: Engine, lines: list[bytes], c: Config | None = None):
    st = ParseStats()
    s = import_records(
        engine, iter_parsable(lines, tz=UTC, stats=st), c or cfg(), source="sacct-parsable", batch_size=100
    )
    return s, st


def jobs(engine: Engine) -> dict[str, Job]:
    from sqlalchemy.orm import Session

    with Session(engine) as s:
        return {j.job_id: j for j in s.scalars(select(Job)).all()}


def test_estimates_are_exact_and_labelled(engine: Engine) -> None:
    s, st = do_import(engine, dump(TRAIN, TRAIN_STEP, MEASURED))
    assert (s.inserted, s.updated, s.unchanged) == (2, 0, 0)
    assert st.steps == 1
    j = jobs(engine)["100"]
    cpu_j = 48 * 3600 * 10.0  # TotalCPU 2 days x 10 W/core
    gpu_j = 2 * 36000 * 400.0 * 0.5  # 2 GPUs x 10 h x 400 W x 50 %
    mem_j = 64 * 36000 * 0.3725  # 64 GB x 10 h x 0.3725 W/GB
    assert j.energy_j == pytest.approx(cpu_j + gpu_j + mem_j)
    assert j.energy_measured_j == 0
    assert (j.alloc_gpus, j.gpu_type, j.req_mem_mb) == (2, "a100", 65536.0)
    fra = zone_intensity("FRA")
    assert j.carbon_zone == "FRA" and j.carbon_g_per_kwh == fra.g_per_kwh and j.carbon_year == fra.year
    assert j.carbon_source == fra.source and j.pue == 1.5
    assert j.co2_g == pytest.approx((cpu_j + gpu_j + mem_j) / 3.6e6 * 1.5 * fra.g_per_kwh)
    assert j.assumptions["cpu_tdp_w_per_core"] == 10.0 and j.assumptions["gpu_utilisation"] == 0.5
    assert j.assumptions["profile"] == "partition:gpu" and j.assumptions["cpu_basis"] == "TotalCPU"
    with engine.connect() as conn:
        rows = conn.execute(
            select(JobEnergy.component, JobEnergy.method, JobEnergy.source, JobEnergy.energy_j)
            .where(JobEnergy.job_pk == j.id)
            .order_by(JobEnergy.component)
        ).all()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("cpu", "estimated", "tdp-estimate"),
        ("dram", "estimated", "tdp-estimate"),
        ("gpu", "estimated", "tdp-estimate"),
    ]
    assert [r[3] for r in rows] == pytest.approx([cpu_j, mem_j, gpu_j])
    m = jobs(engine)["300"]  # Slurm measured the node: that, not an estimate
    assert m.energy_j == 7200000 and m.energy_measured_j == 7200000
    assert m.assumptions["basis"].startswith("Slurm ConsumedEnergyRaw")


def test_reimport_is_idempotent_and_final_state_updates(engine: Engine) -> None:
    s, _ = do_import(engine, dump(TRAIN, TRAIN_STEP, RUNNING))
    assert (s.inserted, s.updated, s.unchanged) == (2, 0, 0)
    running = jobs(engine)["200"]
    assert running.is_open and running.end_time is None
    s, _ = do_import(engine, dump(TRAIN, TRAIN_STEP, RUNNING))  # the same dump again
    assert (s.inserted, s.updated, s.unchanged) == (0, 0, 2)
    s, _ = do_import(engine, dump(FINISHED, MEASURED))  # an overlapping later window
    assert (s.inserted, s.updated, s.unchanged) == (1, 1, 0)
    done = jobs(engine)["200"]
    assert done.id == running.id and not done.is_open and done.state == "COMPLETED"
    assert done.end_time == datetime(2026, 11, 11, 5, tzinfo=UTC)
    assert done.energy_j == pytest.approx(20 * 3600 * 5.0 + 8 * 18000 * 0.3725)
    s, _ = do_import(engine, dump(RUNNING))  # an old snapshot never undoes the final state
    assert (s.inserted, s.updated, s.unchanged) == (0, 0, 1)
    assert jobs(engine)["200"].state == "COMPLETED"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Job)).scalar() == 3
        # energy rows were replaced, not added to
        n = conn.execute(
            select(func.count()).select_from(JobEnergy).where(JobEnergy.job_pk == done.id)
        ).scalar()
        assert n == 2  # cpu + dram


def test_same_job_twice_in_one_batch(engine: Engine) -> None:
    s, _ = do_import(engine, dump(RUNNING, FINISHED))
    assert s.inserted == 1
    assert jobs(engine)["200"].state == "COMPLETED"


def test_recompute_after_config_change(engine: Engine) -> None:
    do_import(engine, dump(TRAIN, TRAIN_STEP, MEASURED))
    before = jobs(engine)
    c = cfg()
    c2 = replace(
        c,
        cluster=replace(c.cluster, carbon_zone="DEU", pue=1.2),
        estimate=Estimate(gpu_utilisation=1.0, mem_w_per_gb=0.3725),
    )
    n, changed = recompute_jobs(engine, c2)
    assert (n, changed) == (2, 2)
    after = jobs(engine)
    assert after["100"].id == before["100"].id
    assert after["100"].energy_j > before["100"].energy_j  # GPU at 100 % instead of 50 %
    assert after["100"].assumptions["gpu_utilisation"] == 1.0
    assert after["300"].energy_j == before["300"].energy_j  # measured stays measured
    deu = zone_intensity("DEU")
    assert after["300"].co2_g == pytest.approx(7200000 / 3.6e6 * 1.2 * deu.g_per_kwh)
    assert recompute_jobs(engine, c2) == (2, 0)  # nothing left to change


def test_unknown_partition_is_reported(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    odd = TRAIN.replace("|gpu|", "|weird|").replace("100|100|", "101|101|")
    odd2 = odd.replace("101|101|", "102|102|")
    s, _ = do_import(engine, dump(odd, odd2))
    assert s.unknown_partitions == {"weird": 2}
    assert [r.getMessage() for r in caplog.records].count(
        "partition 'weird' is not in the configuration: using the default hardware profile"
    ) == 1
    assert jobs(engine)["101"].hw_profile == "default"


def test_bulk_import_large_batches(engine: Engine) -> None:
    lines = [HEADER]
    for i in range(2500):
        lines.append(TRAIN.replace("100|100|", f"{5000 + i}|{5000 + i}|"))
    s, _ = do_import(engine, [(x + "\n").encode() for x in lines])
    assert s.inserted == 2500
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(JobEnergy)).scalar() == 2500 * 3
    s, _ = do_import(engine, [(x + "\n").encode() for x in lines])
    assert (s.inserted, s.unchanged) == (0, 2500)


def test_real_captured_dumps_import(engine: Engine) -> None:
    data = Path(__file__).parent / "data" / "sacct"
    files = sorted(data.glob("slurm2205_*parsable2.txt"))
    if not files:
        pytest.fail("tests/data/sacct has no captured Slurm 22.05 output")
    for f in files:
        with open(f, "rb") as fh:
            s, st = do_import(engine, list(fh))
        assert s.inserted + s.updated + s.unchanged == st.jobs
