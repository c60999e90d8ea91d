"""What real sacct output holds and the demo never does (issue 31): a TotalCPU that Slurm did not gather,
times that contradict each other, GPUs missing from the TRES, and Slurm's own GPU signals (gres/gpuutil,
gres/gpumem, ConsumedEnergy of acct_gather_energy/gpu), from the parser to the stored job, its energy
ledger and its GPU metrics, on both databases.

The sacct lines are written here in the shape of real ones (the real captures' columns, plus the
TRESUsageInAve/Max that a site with `AccountingStorageTRES=gres/gpu,gres/gpumem,gres/gpuutil` and a gpu
plugin records; see tests/data/sacct/README.md).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.estimate import (
    CPU_BASIS_UNRECORDED,
    SOURCE_SLURM_GPU,
    SOURCE_SLURM_UTIL,
    SOURCE_TDP,
)
from cocaq.accounting.importer import import_records
from cocaq.config_load import load_config
from cocaq.db.schema import Cluster, Job, JobEnergy, JobMetrics
from cocaq.slurm.plausible import TOTALCPU_UNKNOWN, Tally, check, checked
from cocaq.slurm.sacct import ParseStats, gpu_usage, iter_json, iter_parsable

HEADER = [
    "JobID",
    "JobIDRaw",
    "JobName",
    "User",
    "UID",
    "Account",
    "Partition",
    "QOS",
    "NodeList",
    "NNodes",
    "AllocCPUS",
    "AllocTRES",
    "ReqTRES",
    "ReqMem",
    "Submit",
    "Start",
    "End",
    "Elapsed",
    "ElapsedRaw",
    "State",
    "ExitCode",
    "TotalCPU",
    "Comment",
    "ConsumedEnergyRaw",
    "Cluster",
    "Timelimit",
    "MaxRSS",
    "NTasks",
    "TRESUsageInAve",
    "TRESUsageInMax",
]
NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)


def line(**kw: str) -> str:
    return "|".join(kw.get(h, "") for h in HEADER)


def dump(*rows: dict[str, str]) -> bytes:
    return ("|".join(HEADER) + "\n" + "\n".join(line(**r) for r in rows) + "\n").encode()


def job(jid: str, *, user: str = "alice", part: str = "gpu", cpus: int = 16, gpus: int | None = 2,
        start: str = "2026-11-01T00:00:10", elapsed: int = 36000, totalcpu: str = "00:00:00",
        submit: str | None = None, state: str = "COMPLETED", energy: str = "0",
        end: str | None = None) -> dict[str, str]:  # fmt: skip
    t0 = datetime.fromisoformat(start)
    tres = f"billing={cpus},cpu={cpus}" + (f",gres/gpu={gpus}" if gpus else "") + ",mem=64G,node=1"
    return {
        "JobID": jid, "JobIDRaw": jid, "JobName": "train", "User": user, "UID": "1000", "Account": "lab",
        "Partition": part, "QOS": "normal", "NodeList": "g01", "NNodes": "1", "AllocCPUS": str(cpus),
        "AllocTRES": tres, "ReqTRES": tres, "ReqMem": "64G",
        "Submit": submit or (t0 - timedelta(seconds=10)).isoformat(), "Start": start,
        "End": end or (t0 + timedelta(seconds=elapsed)).isoformat(), "Elapsed": "", "ElapsedRaw": str(elapsed),
        "State": state, "ExitCode": "0:0", "TotalCPU": totalcpu, "ConsumedEnergyRaw": energy, "Cluster": "c",
        "Timelimit": "2-00:00:00",
    }  # fmt: skip


def step(jid: str, name: str, *, elapsed: int, ntasks: int = 1, totalcpu: str = "00:00:00",
         ave: str = "", top: str = "", start: str = "2026-11-01T00:00:10") -> dict[str, str]:  # fmt: skip
    t0 = datetime.fromisoformat(start)
    return {
        "JobID": f"{jid}.{name}", "JobIDRaw": f"{jid}.{name}", "JobName": name, "NodeList": "g01", "NNodes": "1",
        "Start": start, "End": (t0 + timedelta(seconds=elapsed)).isoformat(), "ElapsedRaw": str(elapsed),
        "State": "COMPLETED", "ExitCode": "0:0", "TotalCPU": totalcpu, "NTasks": str(ntasks),
        "TRESUsageInAve": ave, "TRESUsageInMax": top, "MaxRSS": "1G",
    }  # fmt: skip


def parse(data: bytes) -> tuple[dict[str, Any], ParseStats]:
    st = ParseStats()
    return {r.job_id: r for r in iter_parsable(BytesIO(data), tz=UTC, stats=st)}, st


def config(tmp_path: Path, url: str, extra: str = "") -> Any:
    p = tmp_path / "cocaq.toml"
    p.write_text(
        f'database_url = "{url}"\n[cluster]\nname = "c"\npue = 1.2\ncarbon_zone = "FR"\n'
        "[estimate]\ncalibrate = false\n"
        '[partitions.gpu]\ngpu_model = "NVIDIA A100-SXM4-80GB"\ngpu_tdp_w = 400\ncpu_tdp_w_per_core = 10\n'
        "[partitions.cpu]\ngpu_tdp_w = 0\ncpu_tdp_w_per_core = 10\n" + extra
    )
    return load_config(p)


def imported(engine: Engine, cfg: Any, data: bytes) -> dict[str, Any]:
    recs, _ = parse(data)
    import_records(
        engine,
        list(recs.values()),
        cfg,
        source="sacct",
    )
    with engine.connect() as c:
        return {r.job_id: r for r in c.execute(select(Job))}


def energy_rows(engine: Engine, job_id: str) -> dict[str, tuple[str, str, float]]:
    with engine.connect() as c:
        rows = c.execute(
            select(JobEnergy.component, JobEnergy.method, JobEnergy.source, JobEnergy.energy_j)
            .join(Job, Job.id == JobEnergy.job_pk)
            .where(Job.job_id == job_id)
        ).all()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


# --- 1. TotalCPU 0 is "not gathered", not "no CPU used" ------------------------------------------------


def test_a_zero_totalcpu_on_a_long_job_is_unknown_and_estimated_from_allocated_cores(
    engine: Engine, tmp_path: Path
) -> None:
    """A 448-core, 120-hour job with TotalCPU 00:00:00 and no steps: 448 x 120 h x W per core, said so."""
    cfg = config(tmp_path, str(engine.url))
    jobs = imported(engine, cfg, dump(job("200", cpus=448, gpus=None, part="cpu", elapsed=120 * 3600)))
    j = jobs["200"]
    assert j.total_cpu_s is None
    assert j.assumptions["cpu_basis"] == CPU_BASIS_UNRECORDED
    cpu = energy_rows(engine, "200")["cpu"]
    assert cpu[2] == pytest.approx(448 * 120 * 3600 * 10.0)


def test_zero_totalcpu_rules() -> None:
    """No step lines: unknown, however short; with steps: unknown from 5 minutes on, a real 0 below."""
    recs, _ = parse(
        dump(
            job("1", elapsed=60),  # no steps, a minute: Slurm gathered nothing
            job("2", elapsed=60), step("2", "batch", elapsed=60),  # a step accounted 0: a true 0
            job("3", elapsed=600), step("3", "batch", elapsed=600),  # 10 minutes at 0: not gathered
            job("4", elapsed=600, totalcpu="01:00:00"), step("4", "batch", elapsed=600, totalcpu="01:00:00"),
        )
    )  # fmt: skip
    assert recs["1"].total_cpu_s is None
    assert recs["2"].total_cpu_s == 0.0
    assert recs["3"].total_cpu_s == 0.0  # the parser keeps what the steps say; the rule decides
    p = check(recs["3"], NOW)
    assert recs["3"].total_cpu_s is None and TOTALCPU_UNKNOWN in p.clamped
    check(recs["2"], NOW)
    assert recs["2"].total_cpu_s == 0.0
    check(recs["4"], NOW)
    assert recs["4"].total_cpu_s == 3600.0


def test_json_without_steps_has_unknown_totalcpu() -> None:
    doc = json.loads((Path(__file__).parent / "data" / "sacct" / "slurm2511_gpu_job.json").read_text())
    j = doc["jobs"][0]
    j["steps"] = []
    j["time"]["total"] = {"seconds": 0, "microseconds": 0}
    (rec,) = iter_json(json.dumps(doc))
    assert rec.total_cpu_s is None


# --- 6. times that contradict each other ------------------------------------------------------------


def test_submit_after_start_is_set_to_the_start() -> None:
    (rec,) = parse(dump(job("5", submit="2026-11-01T05:00:00")))[0].values()
    p = check(rec, NOW)
    assert p.skip is None and rec.submit_time == rec.start_time
    assert "submitted after it started: submit time set to the start" in p.clamped


def test_a_start_years_before_its_end_is_set_from_elapsed_and_the_energy_lands_in_its_month(
    engine: Engine, tmp_path: Path
) -> None:
    """Start 2019 with End 2026-11-01 and Elapsed 2 h: it ran 2026-11-01 00:00 to 02:00, not since 2019."""
    bad = job("6", start="2019-03-01T00:00:00", end="2026-11-01T02:00:00", elapsed=7200,
              submit="2019-02-28T00:00:00")  # fmt: skip
    tally = Tally()
    (rec,) = checked(parse(dump(bad))[0].values(), tally, now=NOW)
    assert rec.start_time == datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
    # submitted a day before the wrong start: the same clock error, its day's wait kept
    assert rec.submit_time == datetime(2026, 10, 31, 0, 0, tzinfo=UTC)
    assert tally.clamped["start over 30 days before end - elapsed: start set to end - elapsed"] == 1
    assert not tally.clamped["submitted after it started: submit time set to the start"]
    cfg = config(tmp_path, str(engine.url))
    jobs = imported(engine, cfg, dump(bad))
    assert jobs["6"].start_time == datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
    run_aggregate(engine, cfg, full=True)
    from cocaq.db.schema import DailyRollup

    with engine.connect() as c:
        days = {r.day.date() for r in c.execute(select(DailyRollup.day))}
    assert days == {datetime(2026, 11, 1).date()}


def test_a_right_submit_time_is_not_moved_back_to_a_wrong_start() -> None:
    """Submit 2026-10-08 14:18:20 (right), Start 2019 (wrong), End and Elapsed right: the start comes from
    end - elapsed, and the submit time stays where it was (seen in tests/data/sacct's hand-made site)."""
    bad = job("9", submit="2026-10-08T14:18:20", start="2019-06-14T10:02:31", end="2026-10-08T16:18:40",
              elapsed=7200)  # fmt: skip
    (rec,) = parse(dump(bad))[0].values()
    p = check(rec, NOW)
    assert rec.start_time == datetime(2026, 10, 8, 14, 18, 40, tzinfo=UTC)
    assert rec.submit_time == datetime(2026, 10, 8, 14, 18, 20, tzinfo=UTC)
    assert p.clamped == ["start over 30 days before end - elapsed: start set to end - elapsed"]


def test_a_running_jobs_zero_totalcpu_is_no_step_ended_yet(engine: Engine, tmp_path: Path) -> None:
    """Slurm adds a step's CPU time when it ends: a running job's 0 (or partial) TotalCPU is kept as it is,
    not called 'not gathered', and its estimate is its allocated cores, labelled as a running job's."""
    from cocaq.accounting.estimate import CPU_BASIS_RUNNING

    running = job("10", state="RUNNING", start="2026-11-28T08:00:00", elapsed=3 * 3600, end="Unknown")
    (rec,) = parse(dump(running))[0].values()
    p = check(rec, NOW)
    assert rec.is_open and rec.total_cpu_s == 0.0 and TOTALCPU_UNKNOWN not in p.clamped
    cfg = config(tmp_path, str(engine.url))
    j = imported(engine, cfg, dump(running))["10"]
    assert j.total_cpu_s == 0.0 and j.assumptions["cpu_basis"] == CPU_BASIS_RUNNING
    assert energy_rows(engine, "10")["cpu"][2] == pytest.approx(16 * 3 * 3600 * 10.0)


def test_a_suspension_shorter_than_a_month_is_left_alone_and_no_elapsed_is_skipped() -> None:
    ok = job("7", start="2026-10-20T00:00:00", end="2026-11-01T00:00:00", elapsed=7200)
    (rec,) = parse(dump(ok))[0].values()
    check(rec, NOW)
    assert rec.start_time == datetime(2026, 10, 20, tzinfo=UTC)
    lost = job("8", start="2019-03-01T00:00:00", end="2026-11-01T02:00:00", elapsed=0)
    (rec,) = parse(dump(lost))[0].values()
    assert (
        check(rec, NOW).skip
        == "start and end over 30 days apart with no elapsed time: when it ran is unknown"
    )


# --- 4. Slurm's own GPU signals ---------------------------------------------------------------------

AVE_80 = "cpu=00:10:00,energy=0,fs/disk=1,gres/gpumem=30G,gres/gpuutil=80,mem=10G,pages=0,vmem=0"
MAX_80 = "cpu=00:10:00,energy=0,fs/disk=1,gres/gpumem=40777023488,gres/gpuutil=100,mem=10G,pages=0,vmem=0"
AVE_0 = "cpu=00:00:00,energy=0,fs/disk=1,gres/gpumem=0,gres/gpuutil=0,mem=1G,pages=0,vmem=0"


def test_gpu_usage_values() -> None:
    assert gpu_usage("gres/gpuutil=66,mem=2810884K", "gres/gpumem=1648M") == (66.0, 1648.0)
    assert gpu_usage("gres/gpuutil=0", "gres/gpumem=0") == (0.0, 0.0)
    assert gpu_usage("gres/gpuutil=18446744073709551614", "gres/gpumem=18446744073709551614") == (None, None)
    assert gpu_usage("gres/gpuutil=abc", "gres/gpumem=-5") == (None, None)
    assert gpu_usage("cpu=00:01:00,mem=1G", "mem=1G") == (None, None)


def test_gpuutil_is_the_steps_use_over_the_run_summed_over_gpus() -> None:
    """.batch idle for 10 h and a 2-task srun step at 80% for 5 h: 80 x 2 x 5 / 10 = 80 (% of one GPU),
    i.e. 40% per GPU of the 2; gpumem is the largest task's in MB (TRESUsageInMax, in bytes)."""
    recs, st = parse(
        dump(
            job("100", elapsed=36000),
            step("100", "batch", elapsed=36000, ave=AVE_0, top=AVE_0),
            step("100", "0", elapsed=18000, ntasks=2, ave=AVE_80, top=MAX_80),
        )
    )
    assert st.steps == 2 and not st.skipped
    r = recs["100"]
    assert r.slurm_gpu_util == pytest.approx(80.0)
    assert r.slurm_gpu_mem_mb == pytest.approx(40777023488 / 1048576)


def test_gpuutil_in_json_steps() -> None:
    doc = json.loads((Path(__file__).parent / "data" / "sacct" / "slurm2511_gpu_job.json").read_text())
    j = doc["jobs"][0]
    s = j["steps"][0]
    s["tasks"] = {"count": 2}
    s["time"]["elapsed"] = j["time"]["elapsed"]
    s["tres"]["requested"]["average"].append({"type": "gres", "name": "gpuutil", "id": 1002, "count": 30})
    s["tres"]["requested"]["max"] = [{"type": "gres", "name": "gpumem", "id": 1003, "count": 2 * 1024**3}]
    (rec,) = iter_json(json.dumps(doc))
    assert rec.slurm_gpu_util == pytest.approx(60.0)
    assert rec.slurm_gpu_mem_mb == pytest.approx(2048.0)


def test_gpu_estimate_from_slurm_gpuutil(engine: Engine, tmp_path: Path) -> None:
    """No node hook, no ConsumedEnergy: the GPUs at the power of their use, 400 W x (0.15 + 0.85 x 40%) =
    196 W each, labelled as Slurm's; stored per job with the memory figure."""
    cfg = config(tmp_path, str(engine.url))
    jobs = imported(
        engine, cfg,
        dump(job("100", totalcpu="10:00:00"), step("100", "0", elapsed=36000, ntasks=2, ave=AVE_80.replace("=80", "=40"),
                                                   top=MAX_80, totalcpu="10:00:00")),
    )  # fmt: skip
    j = jobs["100"]
    assert j.slurm_gpu_util == pytest.approx(80.0) and j.slurm_gpu_mem_mb == pytest.approx(38888.0)
    gpu = energy_rows(engine, "100")["gpu"]
    assert gpu[:2] == ("estimated", SOURCE_SLURM_UTIL)
    assert gpu[2] == pytest.approx(2 * 36000 * 196.0)
    assert j.assumptions["gpu_util_slurm_pct"] == 40.0
    assert "gres/gpuutil" in j.assumptions["basis"]


def test_consumed_energy_of_acct_gather_energy_gpu_is_the_gpus_measured(
    engine: Engine, tmp_path: Path
) -> None:
    """[slurm] consumed_energy = "gpus": ConsumedEnergy is the GPUs' (measured), CPU and memory estimated;
    a CPU-only job's ConsumedEnergy is not its own (other GPUs, or none): it is estimated."""
    cfg = config(tmp_path, str(engine.url), '[slurm]\nconsumed_energy = "gpus"\n')
    imported(engine, cfg, dump(job("300", energy="5000000", totalcpu="01:00:00"),
                               job("301", part="cpu", gpus=None, energy="700000", totalcpu="01:00:00")))  # fmt: skip
    rows = energy_rows(engine, "300")
    assert rows["gpu"] == ("measured", SOURCE_SLURM_GPU, 5000000.0)
    assert rows["cpu"][:2] == ("estimated", SOURCE_TDP) and rows["cpu"][2] == pytest.approx(3600 * 10.0)
    assert "node" not in rows
    assert set(energy_rows(engine, "301")) == {"cpu", "dram"}
    # the default: a node's energy, as before
    cfg2 = config(tmp_path, str(engine.url))
    import_records(engine, list(parse(dump(job("302", energy="5000000")))[0].values()), cfg2, source="sacct")
    assert set(energy_rows(engine, "302")) == {"node"}


def test_idle_gpus_by_slurm_gpuutil_in_the_job_metrics(engine: Engine, tmp_path: Path) -> None:
    """A real job with 2 A100s and gres/gpuutil=0 and no collector: all its GPU time and GPU energy idle,
    from Slurm; one at 80% per GPU: none idle; the metrics say where they came from."""
    cfg = config(tmp_path, str(engine.url))
    imported(
        engine, cfg,
        dump(job("400"), step("400", "batch", elapsed=36000, ave=AVE_0, top=AVE_0),
             job("401"), step("401", "0", elapsed=36000, ntasks=2, ave=AVE_80, top=MAX_80)),
    )  # fmt: skip
    run_aggregate(engine, cfg, full=True)
    with engine.connect() as c:
        m = {
            r.job_id: r
            for r in c.execute(select(Job.job_id, JobMetrics).join(JobMetrics, JobMetrics.job_pk == Job.id))
        }
    idle, busy = m["400"], m["401"]
    gpu_j = energy_rows(engine, "400")["gpu"][2]
    assert idle.gpu_util_source == "slurm" and idle.gpu_util_pct == 0.0
    assert idle.idle_gpu_s == pytest.approx(2 * 36000) and idle.idle_gpu_energy_j == pytest.approx(gpu_j)
    assert idle.gpu_mem_peak_mb == 0.0
    assert busy.gpu_util_source == "slurm" and busy.gpu_util_pct == pytest.approx(80.0)
    assert busy.idle_gpu_s == 0.0 and busy.gpu_mem_peak_mb == pytest.approx(38888.0)


# --- 3. GPUs missing from the TRES ------------------------------------------------------------------


def test_gpu_count_unknown_until_the_cluster_records_gpus(engine: Engine, tmp_path: Path) -> None:
    """A site without gres/gpu in AccountingStorageTRES: jobs on a GPU partition have an unknown GPU count
    (not 0), a CPU partition's jobs do not; once the cluster's accounting shows a GPU, its jobs without one
    are known to have none. A job with no GPU in its TRES that Slurm saw using GPUs stays unknown."""
    cfg = config(tmp_path, str(engine.url))
    jobs = imported(engine, cfg, dump(job("500", gpus=None), job("501", part="cpu", gpus=None)))
    assert jobs["500"].gpus_unknown and not jobs["501"].gpus_unknown
    with engine.connect() as c:
        assert c.execute(select(Cluster.gpu_tres)).scalar() is False
    used = job("503", gpus=None)
    jobs = imported(
        engine, cfg, dump(job("502"), used, step("503", "0", elapsed=36000, ave=AVE_80, top=MAX_80))
    )
    assert not jobs["500"].gpus_unknown and not jobs["502"].gpus_unknown
    assert jobs["503"].gpus_unknown
    with engine.connect() as c:
        assert c.execute(select(Cluster.gpu_tres)).scalar() is True
    jobs = imported(engine, cfg, dump(job("504", gpus=None)))
    assert not jobs["504"].gpus_unknown


# --- what a user sees: `cocaq job` and `cocaq user` through the real CLI ------------------------------


def _cli_site(tmp_path: Path, url: str, *dumps: bytes) -> tuple[Path, Any]:
    cfg_path = tmp_path / "cocaq.toml"
    config(tmp_path, url)  # writes cocaq.toml
    for i, d in enumerate(dumps):
        f = tmp_path / f"dump{i}.txt"
        f.write_bytes(d)
    return cfg_path, [tmp_path / f"dump{i}.txt" for i in range(len(dumps))]


def test_the_cli_says_what_slurm_did_not_record_and_where_gpu_figures_came_from(
    db_url: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """A cluster that records no GPUs: `cocaq job` says the count is unknown and why, `cocaq user` counts
    such jobs and shows '?' for their GPUs; on a cluster with Slurm's gres/gpuutil, an idle job's note and
    utilisation say they come from Slurm, and a job whose CPU time Slurm did not gather says so."""
    from tests.conftest import run_cocaq

    cfg_path, (untracked,) = _cli_site(tmp_path, db_url, dump(job("600", user="bob", gpus=None)))
    env = {**cli_env, "COLUMNS": "60"}
    run = lambda *a: run_cocaq(["--config", str(cfg_path), *a], env)  # noqa: E731
    assert run("db", "upgrade").code == 0
    assert run("import", "sacct", "--file", str(untracked)).code == 0
    r = run("job", "600")
    assert r.code == 0, r.err
    flat = " ".join(r.out.split())
    assert "GPUs unknown: none in the job's TRES, and cluster c's accounting records no GPUs" in flat
    assert "CPU time not recorded by Slurm" in flat
    r = run("user", "bob", "--since", "60d", "-E", "2026-11-28")
    flat = " ".join(r.out.split())
    assert "GPUs unknown 1 job on GPU partitions with no GPU in Slurm's accounting" in flat, r.out
    assert "│ ? │" in r.out.replace("   ?", " ?")
    data = json.loads(run("user", "bob", "--since", "60d", "-E", "2026-11-28", "--format", "json").out)
    assert data["jobs_gpus_unknown"] == 1

    site2 = tmp_path / "site2"
    site2.mkdir()
    url2 = db_url.replace("cocaq.sqlite", "site2.sqlite") if db_url.startswith("sqlite") else db_url
    cfg2, (tracked,) = _cli_site(
        site2, url2, dump(job("400"), step("400", "batch", elapsed=36000, ave=AVE_0, top=AVE_0))
    )
    run2 = lambda *a: run_cocaq(["--config", str(cfg2), *a], env)  # noqa: E731
    assert run2("db", "upgrade").code == 0
    assert run2("import", "sacct", "--file", str(tracked)).code == 0
    assert run2("aggregate", "--full").code == 0
    r = run2("job", "400")
    flat = " ".join(r.out.split())
    assert "GPU utilisation: 0% (per GPU, the mean over the run by Slurm gres/gpuutil)" in flat, r.out
    assert "Ask for the GPUs it uses" in flat
    assert "100% of the run (Slurm gres/gpuutil: a mean of 0% per GPU)" in flat
    assert "estimate from Slurm gres/gpuutil" in flat
    r = run2("user", "alice", "--since", "60d", "-E", "2026-11-28")
    assert "1 job' by Slurm gres/gpuutil" in " ".join(r.out.split()), r.out


def test_the_emails_say_it_too(db_url: str, tmp_path: Path, cli_env: dict[str, str]) -> None:
    """The monthly e-mail (through `cocaq report user`) and the job e-mail say the same as the CLI: a job
    whose GPU count Slurm does not tell is counted apart and shown as unknown, an idle job found by Slurm's
    gres/gpuutil is named so, and the basis says where utilisation comes from."""
    import email
    import email.policy

    from tests.conftest import run_cocaq

    cfg = config(tmp_path, db_url)
    eng = __import__("cocaq.db.engine", fromlist=["make_engine"]).make_engine(db_url)
    __import__("cocaq.db.migrate", fromlist=["upgrade"]).upgrade(eng)
    # one cluster records no GPUs (job 600), another records Slurm's GPU use (job 400: idle)
    untracked = dump(job("600", gpus=None))
    tracked = dump(job("400"), step("400", "batch", elapsed=36000, ave=AVE_0, top=AVE_0)).replace(
        b"|c|", b"|c2|"
    )
    imported(eng, cfg, untracked)
    imported(eng, cfg, tracked)
    run_aggregate(eng, cfg, full=True)
    r = run_cocaq(
        ["--config", str(tmp_path / "cocaq.toml"), "report", "user", "alice", "--month", "2026-11", "--out",
         str(tmp_path / "rep")], cli_env,
    )  # fmt: skip
    assert r.code == 0, r.err
    msg = email.message_from_bytes(
        (tmp_path / "rep" / "user-alice-2026-11.eml").read_bytes(), policy=email.policy.default
    )
    text = " ".join(msg.get_body(("plain",)).get_content().split())  # type: ignore[union-attr]
    assert "GPUs not counted: 1 job (600) ran on a GPU partition of a cluster whose Slurm accounting" in text
    assert "600 train, 1 Nov, COMPLETED" in text and "GPUs unknown (not in Slurm's accounting)" in text
    assert "2 GPUs at 0% (Slurm gres/gpuutil)" in text
    assert "2 GPUs idle 100% of the run (Slurm gres/gpuutil: a mean of 0% per GPU)" in text
    assert "from Slurm's gres/gpuutil, its mean over the run" in text
    html = (tmp_path / "rep" / "user-alice-2026-11.html").read_text()
    assert "GPUs not counted:" in html and "Slurm's gres/gpuutil: the job's mean over its run" in html

    from cocaq.reports.job_report import job_footprint
    from cocaq.reports.render import render_jobs

    with eng.connect() as c:
        pks = {r.job_id: r.id for r in c.execute(select(Job.job_id, Job.id))}
        idle, unknown = job_footprint(c, cfg, pks["400"]), job_footprint(c, cfg, pks["600"])
    mail = render_jobs([idle, unknown], cfg)
    flat = " ".join(mail.text.split())
    assert "utilisation per GPU, the mean over the run by Slurm's gres/gpuutil" in flat
    assert "GPUs unknown (Slurm's accounting records none here: not in its energy)" in flat
    assert "the mean over the run by Slurm's gres/gpuutil" in mail.html
    eng.dispose()


def test_the_admin_report_says_what_slurm_did_not_record(engine: Engine, tmp_path: Path) -> None:
    """Per cluster, the admins read which holes their accounting has and the slurm.conf line that fills
    each: GPUs not in the TRES, TotalCPU not gathered, GPU use from Slurm's gres/gpuutil."""
    from cocaq.reports import render
    from cocaq.reports.admin_report import admin_month

    cfg = config(tmp_path, str(engine.url))
    imported(engine, cfg, dump(job("600", gpus=None)))
    tracked = dump(
        job("400"), step("400", "batch", elapsed=36000, ave=AVE_0, top=AVE_0), job("401", gpus=None)
    )
    imported(engine, cfg, tracked.replace(b"|c|", b"|c2|"))
    run_aggregate(engine, cfg, full=True)
    month = datetime(2026, 11, 1, tzinfo=UTC)
    with engine.connect() as conn:
        untracked, gpus = admin_month(conn, cfg, month, "c"), admin_month(conn, cfg, month, "c2")
    assert untracked.gaps is not None and gpus.gaps is not None
    assert (untracked.gaps.gpus_unknown_jobs, untracked.gaps.gpus_unknown_partitions) == (1, ("gpu",))
    assert untracked.gaps.cpu_unrecorded_jobs == 1 and untracked.gaps.gpu_slurm_jobs == 0
    # c2 records GPUs (job 400): its job 401 without one has none, not an unknown count
    assert gpus.gaps.gpus_unknown_jobs == 0 and (gpus.gaps.gpu_slurm_jobs, gpus.gaps.gpu_jobs) == (1, 1)
    assert gpus.gaps.cpu_unrecorded_jobs == 2
    text = " ".join(render.render_admin_email(untracked, cfg).text.split())
    assert "WHAT SLURM'S ACCOUNTING DID NOT RECORD" in text
    assert "1 job on GPU partitions (gpu) had no GPU in their TRES" in text
    assert "AccountingStorageTRES=gres/gpu" in text and "JobAcctGatherType" in text
    page = render.render_admin_html(gpus, cfg)
    assert (
        "What Slurm's accounting did not record" in page
        and "1 of the month's 1 GPU job had no samples" in page
    )
    assert "energy-weighted, from GPU samples and Slurm" in page
    # the lab head reads it too: the lab's own jobs whose GPUs are not counted
    from cocaq.reports.lab_report import lab_month

    with engine.connect() as conn:
        lab_c = lab_month(conn, cfg, "lab", month, cluster="c")
        lab_c2 = lab_month(conn, cfg, "lab", month, cluster="c2")
    lab_text = " ".join(render.render_lab_month(lab_c, cfg).text.split())
    assert (
        "GPUs not counted: 1 job of the lab ran on GPU partitions (gpu) of a cluster whose Slurm" in lab_text
    )
    assert "GPUs not counted" not in render.render_lab_month(lab_c2, cfg).text
    assert "from GPU samples and Slurm" in render.render_lab_month(lab_c2, cfg).html
