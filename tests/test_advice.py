"""The advice engine (cocaq.footprint.advice): each suggestion fires on the user's own jobs when they support it, is
sized on the energy it would change, names the exact change, and is ranked by its saving.

Two layers: the rules on hand-made JobFacts (every threshold and edge), and a real month (import, samples,
metadata, aggregate) on SQLite and PostgreSQL read back through users_month, as the e-mails get it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, insert, text

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.engine import make_engine
from cocaq.db.schema import ModelMetadata
from cocaq.footprint import advice
from cocaq.footprint.advice import Context, Thresholds, candidates
from cocaq.footprint.job_advice import job_notes
from cocaq.footprint.jobfacts import DeviceUse, JobFacts
from cocaq.footprint.rules.precision import BALER_SAVING
from cocaq.reports import data, user_report
from cocaq.reports.suggest import suggest_for_user
from tests.conftest import ROOT, migrated_database
from tests.test_report_data import config, gpu_samples, job

JUNE = datetime(2025, 6, 1, tzinfo=UTC)
JULY = datetime(2025, 7, 1, tzinfo=UTC)
CTX = Context(
    since=JUNE, until=JULY, idle_threshold_pct=5.0, interactive_names=("jupyter",), period="in June"
)
H = 3600.0


def fact(**kw: Any) -> JobFacts:
    """A job of June with plain defaults: one GPU for 10 h, 4 kWh, COMPLETED, 0.5 kg per kWh."""
    start = kw.pop("start", JUNE + timedelta(days=2))
    elapsed = kw.pop("elapsed_h", 10.0)
    base: dict[str, Any] = dict(
        pk=1, job_id="1", job_id_raw=1, cluster_id=1, cluster="c", name="train", user="u", account="a",
        partition="gpu", node_list="n1", state="COMPLETED", exit_code=0, start=start,
        end=start + timedelta(hours=elapsed), is_open=False, cpus=8, gpus=1, nodes=1, elapsed_h=elapsed,
        time_limit_h=None, req_mem_mb=None, max_rss_mb=None, rss_tasks_per_node=None, total_cpu_s=None,
        share=1.0, energy_kwh=4.0, gpu_kwh=3.0, cpu_kwh=0.6, dram_kwh=0.4, other_kwh=0.0, measured_kwh=4.0,
        gpu_source="nvml", co2_kg=2.0, gpu_util_pct=None, sampled_share=0.0, idle_gpu_hours=0.0,
        idle_kwh=0.0, gpu_mem_peak_mb=None, mean_gpu_power_w=None, gpu_tdp_w=400.0, gpu_mem_gb=80.0,
        gpu_model="NVIDIA A100-SXM4-80GB",
    )  # fmt: skip
    base.update(kw)
    return JobFacts(**base)


def by_id(jobs: list[JobFacts], ctx: Context = CTX) -> dict[str, advice.Advice]:
    return {a.id: a for a in candidates(jobs, ctx)}


# --- the rules -------------------------------------------------------------------------------------------


def test_precision_uses_the_users_own_runs_per_token_and_sizes_on_the_full_precision_energy() -> None:
    # the user's own llm runs: bf16 used 0.5 kWh per 1M tokens, fp32 0.9 (44% less in bf16)
    bf16 = fact(pk=1, job_id="10", model="llm", precision="reduced", precision_label="bf16", energy_kwh=50.0,
                gpu_kwh=45.0, co2_kg=25.0, tokens=100_000_000)  # fmt: skip
    fp32 = fact(pk=2, job_id="11", model="llm", precision="full", precision_label="fp32", energy_kwh=90.0,
                gpu_kwh=81.0, co2_kg=45.0, tokens=100_000_000)  # fmt: skip
    a = by_id([bf16, fp32])["precision"]
    assert a.title == "Train llm in bf16 mixed precision"
    saving = 1 - 0.5 / 0.9
    assert a.saving_kwh == pytest.approx(90.0 * saving) and a.saving_kg == pytest.approx(45.0 * saving)
    assert not a.upper_bound and "own runs" in a.basis
    assert "44% less energy per 1M tokens in bf16 than in fp32" in a.body and a.job_ids == ("11",)
    # only a share of the run in the window counts: the saving follows it
    half = by_id([bf16, replace(fp32, share=0.5)])["precision"]
    assert half.saving_kwh == pytest.approx(45.0 * saving)


def test_precision_without_an_own_comparison_counts_the_literature_on_the_gpu_energy() -> None:
    fp32 = fact(model="resnet", precision="full", precision_label="fp32", energy_kwh=40.0, gpu_kwh=30.0,
                co2_kg=20.0, epochs=10)  # fmt: skip
    a = by_id([fp32])["precision"]
    assert a.saving_kwh == pytest.approx(30.0 * BALER_SAVING)  # the GPU energy, not the node's
    assert "Baler" in a.basis and "Baler" in a.body
    # too little GPU energy to bother
    assert "precision" not in by_id([replace(fp32, gpu_kwh=1.0)])
    # idle-dominated jobs are left out: AMP speeds arithmetic, not waiting
    idle = replace(fp32, gpu_util_pct=2.0, sampled_share=1.0, idle_gpu_hours=9.0)
    assert "precision" not in by_id([idle])


def test_unknown_precision_only_for_heavy_users_who_use_no_reduced_precision() -> None:
    heavy = fact(gpus=8, elapsed_h=20.0, gpu_kwh=60.0, energy_kwh=70.0)  # 160 GPU-hours, precision unknown
    a = by_id([heavy])["precision"]
    assert a.upper_bound and a.title.startswith("Mixed precision, if")
    assert a.saving_kwh == pytest.approx(60.0 * BALER_SAVING)
    known = fact(pk=2, job_id="2", precision="reduced", precision_label="bf16")
    assert "precision" not in by_id([heavy, known])  # a user who uses it knows of it
    assert "precision" not in by_id([replace(heavy, gpus=1)])  # 20 GPU-hours: not heavy


def test_timeouts_failures_and_oom_are_sized_on_their_ledger_part_beyond_idle_gpus() -> None:
    t = fact(pk=1, job_id="1", state="TIMEOUT", time_limit_h=12.0, elapsed_h=12.0, energy_kwh=10.0,
             co2_kg=5.0, idle_kwh=2.0)  # fmt: skip
    f = fact(pk=2, job_id="2", state="FAILED", exit_code=1, energy_kwh=3.0, co2_kg=1.5, elapsed_h=0.2)
    n = fact(pk=3, job_id="3", state="NODE_FAIL", energy_kwh=50.0)  # not the user's doing
    o = fact(pk=4, job_id="4", state="OUT_OF_MEMORY", req_mem_mb=64 * 1024.0, energy_kwh=2.0, co2_kg=1.0)
    got = by_id([t, f, n, o])
    assert got["timeouts"].saving_kwh == pytest.approx(8.0) and got["timeouts"].upper_bound
    assert got["timeouts"].saving_kg == pytest.approx(4.0)
    assert "#SBATCH --signal=B:USR1@300" in got["timeouts"].change
    assert "#SBATCH --time=18:00:00" in got["timeouts"].change
    assert got["failures"].saving_kwh == pytest.approx(3.0) and got["failures"].job_ids == ("2",)
    assert got["out-of-memory"].change == ("#SBATCH --mem=96G",) and got["out-of-memory"].saving_kwh == 2.0
    # a notebook that hit its limit is not a lost computation: it gets the notebook advice, not this one
    nb = replace(t, name="jupyter", idle_kwh=2.0)
    assert "timeouts" not in by_id([nb]) and by_id([nb])["notebooks"].saving_kwh == pytest.approx(2.0)
    # nor is a session that ended in an error a run to rehearse on a small input
    nbf = replace(f, name="jupyter", gpu_util_pct=0.0, sampled_share=1.0, idle_gpu_hours=10.0, idle_kwh=1.0)
    assert "failures" not in by_id([nbf]) and "notebooks" in by_id([nbf])
    assert [n.id for n in job_notes(nbf, CTX)] == ["notebooks"]


def test_idle_gpus_per_gpu_and_per_job() -> None:
    # one GPU of two idle all the time while the other worked: ask for one
    devs = (
        DeviceUse("n1", "GPU-0", 300, 10.0, 0.0, 90.0, 300.0, 3.0),
        DeviceUse("n1", "GPU-1", 300, 10.0, 1.0, 0.0, 60.0, 0.6),
    )
    two = fact(gpus=2, gpu_util_pct=45.0, sampled_share=1.0, idle_gpu_hours=10.0, idle_kwh=0.6, devices=devs)
    a = by_id([two])["fewer-gpus"]
    assert a.saving_kwh == pytest.approx(0.6) and a.change[0].startswith("#SBATCH --gres=gpu:1")
    assert "1 of its 2 GPUs idle" in a.body
    # the same job without per-GPU samples (`cocaq user`): the same saving and change, only less detail
    half = replace(two, devices=())
    b = by_id([half])["fewer-gpus"]
    assert (b.saving_kwh, b.change) == (a.saving_kwh, a.change) and "idle 50% of the sampled time" in b.body
    assert "fewer-gpus" not in by_id([replace(half, idle_gpu_hours=9.0)])  # 45%: under the threshold
    # a single GPU sitting idle: check the code uses it
    one = fact(gpu_util_pct=1.0, sampled_share=1.0, idle_gpu_hours=9.0, idle_kwh=0.5)
    assert by_id([one])["fewer-gpus"].title == "Make sure your GPU jobs use their GPU"


def test_dataloader_memory_cpus_and_time_limits() -> None:
    loader = fact(gpu_util_pct=30.0, sampled_share=1.0, total_cpu_s=0.95 * 8 * 10 * H, gpu_kwh=3.0)
    a = by_id([loader])["dataloader"]
    assert a.saving_kwh == pytest.approx(3.0 * (1 - 30 / 70)) and a.upper_bound
    assert "dataloader" not in by_id([replace(loader, total_cpu_s=0.5 * 8 * 10 * H)])
    mem = fact(req_mem_mb=256 * 1024.0, max_rss_mb=20 * 1024.0, rss_tasks_per_node=2, dram_kwh=1.0)
    m = by_id([mem])["memory"]
    assert m.change == ("#SBATCH --mem=50G",)  # 2 tasks x 20 GB, and a quarter more
    assert m.saving_kwh == pytest.approx(1.0 * (1 - 50 * 1024 / (256 * 1024)))
    assert "memory" not in by_id([replace(mem, max_rss_mb=100 * 1024.0)])  # 200 GB of 256: used
    cpus = fact(cpus=64, total_cpu_s=0.1 * 64 * 10 * H)
    c = by_id([cpus])["cpus"]
    assert c.saving_kwh is None and c.change[0].startswith("#SBATCH --cpus-per-task=8")
    quick = [fact(pk=i, job_id=str(i), time_limit_h=24.0, elapsed_h=1.0) for i in range(3)]
    assert by_id(quick)["time-limits"].change == ("#SBATCH --time=01:15:00  (train, gpu)",)
    assert "time-limits" not in by_id([*quick, fact(pk=9, job_id="9", state="TIMEOUT")])


def test_ranking_and_the_threshold_of_an_e_mail() -> None:
    jobs = [
        fact(pk=1, job_id="1", state="FAILED", energy_kwh=3.0, elapsed_h=0.2),
        fact(pk=2, job_id="2", state="TIMEOUT", energy_kwh=10.0),
        fact(pk=3, job_id="3", cpus=64, total_cpu_s=0.1 * 64 * 10 * H),
    ]
    assert [a.id for a in candidates(jobs, CTX)] == ["timeouts", "failures", "cpus"]  # no saving: last
    # in an e-mail: only savings of at least min_share of the user's energy and min_kwh, no "None" ones
    got = advice.advise(jobs, CTX, total_kwh=100.0, min_share=0.05, min_kwh=0.5)
    assert [a.id for a in got] == ["timeouts"]
    assert advice.advise(jobs, CTX, total_kwh=100.0, min_share=0.0, min_kwh=0.0)[-1].id == "failures"
    assert advice.advise([], CTX, total_kwh=0.0, min_share=0.0, min_kwh=0.0) == []
    # as_dict (what the CLI, API and e-mails carry) is dataclasses.asdict, without its deep copy
    for a in candidates(jobs, CTX):
        assert a.as_dict() == dataclasses.asdict(a) and advice.Advice.from_dict(a.as_dict()) == a


def test_job_notes_say_the_exact_line_to_change() -> None:
    j = fact(
        state="COMPLETED", cpus=512, nodes=4, gpus=32, elapsed_h=13.9, time_limit_h=48.0,
        total_cpu_s=0.29 * 512 * 13.9 * H, req_mem_mb=4 * 512 * 1024.0, max_rss_mb=40 * 1024.0,
        rss_tasks_per_node=1, gpu_util_pct=57.0, sampled_share=1.0, gpu_mem_peak_mb=12 * 1024.0,
        model="mistral-7b", precision="full", precision_label="fp32", tokens=2_000_000_000,
        energy_kwh=155.0, gpu_kwh=142.0, co2_kg=80.0,
    )  # fmt: skip
    mine = fact(pk=7, job_id="7", model="mistral-7b", precision="reduced", precision_label="bf16",
                tokens=2_000_000_000, energy_kwh=86.8)  # fmt: skip
    notes = {n.id: n for n in job_notes(j, CTX, [mine])}
    assert set(notes) == {"precision", "cpus", "memory", "time-limits", "gpu-memory"}
    assert notes["precision"].saving_kwh == pytest.approx(155.0 * (1 - 86.8 / 155.0))
    assert "per 1M tokens, 44% less than in fp32" in notes["precision"].body
    # one run of its kind: no --time sized on a single run (issue 32), only the fact and how to get one
    assert notes["time-limits"].change == () and "more completed runs" in notes["time-limits"].body
    assert notes["cpus"].change[0].startswith("#SBATCH --cpus-per-task=47")  # 128 per node x 29% x 1.25
    assert notes["memory"].change == ("#SBATCH --mem=50G",)
    assert "12 GB of their 80 GB" in notes["gpu-memory"].body
    # largest saving first
    assert next(iter(notes)) == "precision"
    # an OOM job: no "ask for less memory", but "ask for more"
    oom = replace(j, state="OUT_OF_MEMORY", precision=None)
    ids = [n.id for n in job_notes(oom, CTX)]
    assert "out-of-memory" in ids and "memory" not in ids and "time-limits" not in ids


def test_saving_in_kg_follows_each_jobs_own_intensity() -> None:
    clean = fact(pk=1, job_id="1", state="FAILED", energy_kwh=10.0, co2_kg=0.5, elapsed_h=0.2)  # 50 g/kWh
    dirty = fact(pk=2, job_id="2", state="FAILED", energy_kwh=10.0, co2_kg=8.0, elapsed_h=0.2)  # 800 g/kWh
    a = by_id([clean, dirty])["failures"]
    assert a.saving_kwh == pytest.approx(20.0) and a.saving_kg == pytest.approx(8.5)


# --- a real month ----------------------------------------------------------------------------------------


def day(d: int, hour: float = 0.0) -> datetime:
    return JUNE.replace(day=d) + timedelta(hours=hour)


def build(engine: Engine, cfg: Config) -> None:
    recs = [
        job(1101, day(2), 30, user="amp", account="a", gpus=4),  # bf16, 1e9 tokens
        job(
            1201, day(5), 30, user="amp", account="a", gpus=4
        ),  # fp32, 5e8 tokens: twice the energy per token
        job(2001, day(3, 10), 2, user="one_idle", account="a", gpus=2, name="ddp-not-launched"),
        job(2101, day(3, 10), 2, user="half_idle", account="a", gpus=2),
        job(3001, day(4), 3, user="nb", account="a", gpus=2, name="jupyter", state="TIMEOUT", limit_h=3),
        job(4001, day(6), 5, user="fails", account="a", gpus=1, state="FAILED"),
        job(4002, day(7), 5, user="fails", account="a", gpus=1, state="TIMEOUT", limit_h=5),
    ]
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
    gpu_samples(engine, 3001, day(4), 180, {"GPU-0": idle, "GPU-1": idle}, node="n3001")
    with engine.begin() as c:
        pks = dict(c.execute(text("SELECT job_id_raw, id FROM jobs")).all())
        c.execute(
            insert(ModelMetadata),
            [
                {"job_pk": pks[1101], "model_name": "llm", "precision": "bf16", "tokens": 1_000_000_000,
                 "sources": {"model": "api"}},
                {"job_pk": pks[1201], "model_name": "llm", "precision": "fp32", "tokens": 500_000_000,
                 "sources": {"model": "api"}},
            ],
        )  # fmt: skip
    run_aggregate(engine, cfg)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def month(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, data.UserMonth], Config]]:
    tmp = tmp_path_factory.mktemp(f"advice-{request.param}")
    url = migrated_database(request.param, tmp, request)
    engine = make_engine(url)
    cfg = config(tmp, url, "[advice]\nmin_share = 0.0\nmin_kwh = 0.0\n")
    build(engine, cfg)
    with engine.connect() as conn:
        yield user_report.users_month(conn, cfg, JUNE), cfg
    engine.dispose()


def test_a_real_month(month: tuple[dict[str, data.UserMonth], Config]) -> None:
    months, cfg = month

    def ids(user: str) -> dict[str, advice.Advice]:
        return {a.id: a for a in suggest_for_user(months[user], cfg)}

    # the same run per token: fp32 took twice the energy per token of bf16 (TDP estimates: energy is
    # proportional to GPU-hours, which are equal, and the fp32 run did half the tokens)
    p = ids("amp")["precision"]
    assert "50% less energy per 1M tokens in bf16 than in fp32" in p.body
    fp32 = next(j for j in months["amp"].jobs if j.job_id == "1201")
    assert p.saving_kwh == pytest.approx(fp32.energy_kwh * 0.5)
    # one GPU of two idle (per-GPU samples) against two GPUs each idle half of the time
    one = next(j for j in months["one_idle"].jobs if j.job_id == "2001")
    assert [(d.device, round(d.idle_share, 6)) for d in one.devices] == [("GPU-a", 0.0), ("GPU-b", 1.0)]
    f = ids("one_idle")["fewer-gpus"]
    assert f.job_ids == ("2001",) and f.change[0].startswith("#SBATCH --gres=gpu:1")
    assert f.saving_kwh == pytest.approx(months["one_idle"].totals.idle_gpu_kwh, rel=0.02)
    half = ids("half_idle")["fewer-gpus"]  # two GPUs each idle half the time: job-level, without detail
    assert half.saving_kwh == pytest.approx(months["half_idle"].totals.idle_gpu_kwh, rel=0.02)
    # a notebook: its idle GPUs, and its time-out is not a lost computation
    nb = ids("nb")
    assert set(nb) >= {"notebooks"} and "timeouts" not in nb
    assert nb["notebooks"].saving_kwh == pytest.approx(months["nb"].totals.idle_gpu_kwh)
    # a failure and a time-out: each sized on its own part of the ledger
    fails = ids("fails")
    assert "failures" not in fails  # after 5 h: no short test catches it
    assert fails["failures-late"].saving_kwh == pytest.approx(months["fails"].totals.failed_kwh)
    assert fails["timeouts"].saving_kwh == pytest.approx(months["fails"].totals.timeout_kwh)
    # the e-mail's threshold: each of the two is half of the energy, so at 60% neither goes
    strict = Config(**{**cfg.__dict__, "advice": replace(cfg.advice, min_share=0.6, min_kwh=0.0)})
    assert [a.id for a in suggest_for_user(months["fails"], strict)] == []
    assert Thresholds().own_min_saving == 0.05


def test_jobfacts_rows_line_up_with_its_fields() -> None:
    """cocaq.footprint.jobfacts builds JobFacts positionally from its query (a heavy user's 10,000 jobs on a login
    node): a field added or moved must move the query's columns too."""
    from cocaq.footprint import jobfacts

    names = [f.name for f in dataclasses.fields(JobFacts)]
    n = jobfacts._N_PLAIN
    assert names[:2] == ["pk", "job_id"] and names[n - 1] == "mean_gpu_power_w"
    assert names[n:] == [
        "gpu_tdp_w", "gpu_mem_gb", "model", "precision", "precision_label", "batch_size", "epochs", "tokens",
        "devices", "shift_state", "shift_slack_h", "shift_best_start", "shift_now_g", "shift_best_g",
        "shift_saved_kg", "shift_pause_saved_kg", "gpu_util_source", "gpus_unknown", "qos", "gpu_type",
        "gpu_model", "batch_step", "node_cores", "node_gpus", "node_mem_gb", "zero_cpu_nodes",
    ]  # fmt: skip
    sql = jobfacts._sql(type("Db", (), {"dialect": "postgresql"})(), "user", False)  # type: ignore[arg-type]
    select = sql.rsplit("\nSELECT ", 1)[1].split("\nFROM w", 1)[0]
    depth, cols, cur = 0, [], ""
    for ch in select:
        depth += ch == "(" or -(ch == ")")
        if ch == "," and depth == 0:
            cols.append(cur.strip())
            cur = ""
        else:
            cur += ch
    cols.append(cur.strip())
    # the fields, the model metadata, the when-to-run figures, the GPU figures' source and flag, the QOS and
    # TRES GPU type, the batch step, the nodes with no CPU use, the sort key (the profile's gpu_model comes
    # from the config)
    assert len(cols) == n + 6 + 7 + 2 + 2 + 1 + 1 + 1
    assert cols[n - 1].startswith("CASE WHEN m.gpu_samples_s > 0") and cols[n] == "mm.model_name"
    assert cols[n + 6] == "m.shift_state" and cols[n + 12].startswith("coalesce(m.shift_pause_saved_g")
    assert cols[n + 13 : n + 18] == [
        "m.gpu_util_source",
        "w.gpus_unknown",
        "w.qos",
        "w.gpu_type",
        "w.batch_step",
    ]
    assert cols[n + 18] == "w.zero_cpu_nodes"


def test_the_precision_advice_reads_the_same_whatever_the_hash_seed() -> None:
    """Its evidence lists the models in the body's order (by the energy that ran in full precision), not
    in a set's order, which changes from one process to the next: the same jobs give the same JSON."""
    import json
    import subprocess
    import sys

    code = (
        "import json\n"
        "from tests.test_advice import fact, by_id\n"
        "jobs = []\n"
        "for i, (model, kwh) in enumerate([('mistral-7b', 90.0), ('llama-3-8b', 60.0), ('bert', 30.0)]):\n"
        "    jobs.append(fact(pk=10*i+1, job_id=str(10*i+1), model=model, precision='reduced',\n"
        "                     precision_label='bf16', energy_kwh=kwh/2, gpu_kwh=kwh/2, tokens=100_000_000))\n"
        "    jobs.append(fact(pk=10*i+2, job_id=str(10*i+2), model=model, precision='full',\n"
        "                     precision_label='fp32', energy_kwh=kwh, gpu_kwh=kwh, tokens=100_000_000))\n"
        "print(json.dumps(by_id(jobs)['precision'].as_dict(), default=str))\n"
    )
    outs = set()
    for seed in ("0", "1", "2", "3", "4", "5"):
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=120, check=True)  # fmt: skip
        outs.add(proc.stdout)
    assert len(outs) == 1
    labels = [e["label"] for e in json.loads(outs.pop())["evidence"]][2:]
    assert [x.split(":")[0] for x in labels] == ["mistral-7b", "llama-3-8b", "bert"]
