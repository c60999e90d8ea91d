"""A case book of the jobstats notes (issue 32, point 7): each case a small user written as sacct lines
(parsable2 with a header), imported through the real `cocaq import sacct --file`, with the notes that must
and must not appear, on SQLite and PostgreSQL.

One import of every case per database (a module fixture); the advice is read in-process through
cocaq.footprint.jobfacts.load, advice.candidates (a window) and job_advice.job_notes (one job), and twice
through the real CLI (`cocaq job ID -o json`, `cocaq user U -o json`). Per-GPU figures are collector
samples in the database, read the way the reports read them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cocaq.accounting.aggregate import run_aggregate
from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.db.dbapi import connect
from cocaq.db.engine import make_engine
from cocaq.errors import ConfigError
from cocaq.footprint import advice, job_advice, jobfacts
from cocaq.footprint.advice import Advice
from cocaq.footprint.jobfacts import JobFacts
from tests.conftest import new_database, run_cocaq
from tests.test_report_data import gpu_samples

CONFIG = """
[cluster]
name = "hal"
carbon_zone = "FRA"
pue = 1.2
timezone = "UTC"
[advice]
mig_partitions = { "gpu-mig" = "1g.10gb" }
[partitions.cpu]
cores_per_node = 64
mem_gb = 256
[partitions.gpu]
gpu_tdp_w = 400
gpu_mem_gb = 80
cores_per_node = 64
gpus_per_node = 4
mem_gb = 512
[partitions.gpu-mig]
gpu_tdp_w = 60
gpu_mem_gb = 10
"""

HEADER = (
    "JobID|JobIDRaw|JobName|User|UID|Account|Partition|QOS|NodeList|NNodes|AllocCPUS|AllocTRES|ReqMem|Submit|"
    "Start|End|ElapsedRaw|State|ExitCode|TotalCPU|Comment|ConsumedEnergyRaw|Cluster|Timelimit|MaxRSS|NTasks|"
    "TRESUsageInAve|TRESUsageInMax"
)
H = 3600


@dataclass(frozen=True)
class Case:
    """One job of its own user: what sacct said about it."""

    raw: int
    user: str
    cpus: int
    cpu_share: float  # TotalCPU / (cpus x elapsed)
    partition: str = "cpu"
    gpus: int = 0
    nodes: int = 1
    mem_gb: int = 16
    rss_gb: float = 4.0
    gpuutil: float | None = None  # the step's gres/gpuutil (% of one GPU), gres/gpumem
    gpumem_gb: float | None = None
    hours: float = 2.0


CASES = (
    # CPU use, CPU-only jobs of 8 cores for 2 h: jobstats' bands
    Case(101, "cpu49", 8, 0.49),
    Case(102, "cpu51", 8, 0.51),
    Case(103, "cpu79", 8, 0.79),
    Case(104, "cpu81", 8, 0.81),
    Case(105, "serial", 8, 0.125),  # one core's worth
    Case(106, "two", 2, 0.40),  # 2 cores: under the old rule's 4-core floor
    Case(107, "gpu60", 8, 0.60, "gpu", gpus=1),  # a GPU job's cores feed its GPU: 60% is no note
    # cores per GPU: the gpu partition's share is 64 / 4 = 16 cores, 512 / 4 = 128 GB
    Case(201, "cores32", 32, 0.25, "gpu", gpus=1),
    Case(202, "cores16", 16, 0.25, "gpu", gpus=1),
    Case(203, "cores32busy", 32, 0.90, "gpu", gpus=1),
    # memory per GPU
    Case(301, "mem256", 8, 0.9, "gpu", gpus=1, mem_gb=256, rss_gb=20),
    Case(302, "mem128", 8, 0.9, "gpu", gpus=1, mem_gb=128, rss_gb=20),
    Case(303, "mem256used", 8, 0.9, "gpu", gpus=1, mem_gb=256, rss_gb=230),
    # nodes: cpu nodes of 64 cores and 256 GB, gpu nodes of 4 GPUs
    Case(401, "nodes2fit1", 32, 0.9, nodes=2, mem_gb=64),
    Case(402, "nodes2need2", 96, 0.9, nodes=2, mem_gb=64),
    Case(403, "gpunodes", 16, 0.9, "gpu", gpus=2, nodes=2, mem_gb=64),
    Case(404, "memnodes", 32, 0.9, nodes=2, mem_gb=400),  # its memory needs both nodes
    # per-GPU samples (below): one GPU of four at 0%, against four that all worked
    Case(501, "unused", 16, 0.9, "gpu", gpus=4),
    Case(502, "allused", 16, 0.9, "gpu", gpus=4),
    # MIG: a 1g.10gb slice has 1/7 (14%) of an A100's compute and 10 GB
    Case(601, "mig", 4, 0.9, "gpu", gpus=1, gpuutil=10, gpumem_gb=6),
    Case(602, "migbusy", 4, 0.9, "gpu", gpus=1, gpuutil=20, gpumem_gb=6),
    Case(603, "migmem", 4, 0.9, "gpu", gpus=1, gpuutil=10, gpumem_gb=12),
    Case(604, "onmig", 4, 0.9, "gpu-mig", gpus=1, gpuutil=10, gpumem_gb=6),
)


def _t(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%S")


def _dur(s: float) -> str:
    d, rest = divmod(round(s), 86400)
    return (f"{d}-" if d else "") + f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def start_of(c: Case, now: datetime) -> datetime:
    return now - timedelta(days=2, hours=c.raw % 100)


def dump(now: datetime) -> str:
    rows = []
    for c in CASES:
        t0 = start_of(c, now)
        t1 = t0 + timedelta(hours=c.hours)
        el = int(c.hours * H)
        cpu = _dur(c.cpus * el * c.cpu_share)
        nodes = f"n{c.raw}" if c.nodes == 1 else f"n{c.raw}[1-{c.nodes}]"
        gres = f",gres/gpu={c.gpus}" if c.gpus else ""
        tres = f"cpu={c.cpus},mem={c.mem_gb}G,node={c.nodes}{gres}"
        ave = f"cpu=00:00:01,gres/gpuutil={c.gpuutil:g}" if c.gpuutil is not None else ""
        top = f"gres/gpumem={c.gpumem_gb:g}G" if c.gpumem_gb is not None else ""
        rows.append(
            f"{c.raw}|{c.raw}|job{c.raw}|{c.user}|1000|lab|{c.partition}|normal|{nodes}|{c.nodes}|{c.cpus}|"
            f"{tres}|{c.mem_gb}G|{_t(t0)}|{_t(t0)}|{_t(t1)}|{el}|COMPLETED|0:0|{cpu}|||hal|1-00:00:00||||"
        )
        rows.append(
            f"{c.raw}.batch|{c.raw}.batch|batch||1000|lab||||{c.nodes}|{c.cpus}|{tres}||{_t(t0)}|{_t(t0)}|"
            f"{_t(t1)}|{el}|COMPLETED|0:0|{cpu}|||||{c.rss_gb:g}G|{c.nodes}|{ave}|{top}"
        )
    return HEADER + "\n" + "\n".join(rows) + "\n"


@dataclass
class Site:
    url: str
    cfg: Config
    env: dict[str, str]
    now: datetime
    jobs: dict[str, JobFacts]  # by user, with the per-GPU samples the reports read


def _with_devices(url: str, cfg: Config, jobs: list[JobFacts]) -> list[JobFacts]:
    """The jobs with their GPUs one by one, from the samples, as the monthly report reads them."""
    from cocaq.reports.user_report import _devices

    eng = make_engine(url)
    try:
        with eng.connect() as conn:
            found = _devices(conn, [j for j in jobs if j.gpus >= 2], cfg)
    finally:
        eng.dispose()
    return [j.with_devices(found[j.pk]) if j.pk in found else j for j in jobs]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp(f"jobstats-{request.param}")
    url = new_database(request.param, tmp, request)
    cfg_path = tmp / "cocaq.toml"
    cfg_path.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env.update(COCAQ_DATABASE_URL=url, COCAQ_CONFIG=str(cfg_path), COLUMNS="200", HOME=str(tmp))
    env["XDG_DATA_HOME"] = str(tmp / "xdg")
    assert run_cocaq(["db", "upgrade"], env).code == 0
    now = datetime.now(UTC).replace(microsecond=0)
    f = tmp / "sacct.txt"
    f.write_text(dump(now))
    r = run_cocaq(["import", "sacct", "--file", str(f)], env)
    assert r.code == 0, r.err
    f = tmp / "sacct-nodes.txt"  # the nodes' cases: a dump with the per-step minimum's fields
    f.write_text(node_dump(now))
    r = run_cocaq(["import", "sacct", "--file", str(f)], env)
    assert r.code == 0, r.err
    cfg = load_config(cfg_path)
    eng = make_engine(url)
    busy, zero, low = (300.0, 90.0), (60.0, 0.0), (80.0, 3.0)
    for raw, devs in ((501, {"GPU-0": busy, "GPU-1": busy, "GPU-2": busy, "GPU-3": zero}),
                      (502, {"GPU-0": busy, "GPU-1": busy, "GPU-2": busy, "GPU-3": low})):  # fmt: skip
        t0 = start_of(next(c for c in CASES if c.raw == raw), now)
        gpu_samples(eng, raw, t0, 60, devs, cluster="hal", node=f"n{raw}")
    run_aggregate(eng, cfg)
    eng.dispose()
    with connect(url) as db:
        loaded = jobfacts.load(db, cfg, now - timedelta(days=30), now)
    by_user = {j.user: j for j in _with_devices(url, cfg, loaded)}
    assert set(by_user) == {c.user for c in CASES} | {c.user for c in NODE_CASES}
    yield Site(url, cfg, env, now, by_user)


def window(site: Site, user: str, cfg: Config | None = None) -> dict[str, Advice]:
    ctx = advice.site_context(cfg or site.cfg, site.now - timedelta(days=30), site.now)
    return {a.id: a for a in advice.candidates([site.jobs[user]], ctx)}


def notes(site: Site, user: str) -> dict[str, Advice]:
    ctx = advice.site_context(site.cfg, site.now - timedelta(days=30), site.now)
    return {a.id: a for a in job_advice.job_notes(site.jobs[user], ctx)}


def both(site: Site, user: str) -> tuple[dict[str, Advice], dict[str, Advice]]:
    return window(site, user), notes(site, user)


JOBSTATS = {"cpus", "cores-per-gpu", "mem-per-gpu", "fewer-nodes", "unused-gpus", "mig", "zero-cpu-nodes"}


def only(found: dict[str, Advice], *ids: str) -> None:
    assert set(found) & JOBSTATS == set(ids), sorted(found)


# --- CPU use ------------------------------------------------------------------------------------------


def test_cpu_under_half_is_sized_down(site: Site) -> None:
    w, n = both(site, "cpu49")
    only(w, "cpus")
    only(n, "cpus")
    assert n["cpus"].title == "Ask for fewer CPU cores"
    assert "49% of its 8 CPU cores busy" in n["cpus"].body
    assert n["cpus"].change == ("#SBATCH --cpus-per-task=5  (with one task per node)",)  # 8 x 49% x 1.25
    assert w["cpus"].job_ids == ("101",) and w["cpus"].saving_kwh is None


def test_cpu_between_half_and_80_asks_for_a_scaling_test(site: Site) -> None:
    for user, share, cores, word in (("cpu51", "51%", 5, "low"), ("cpu79", "79%", 7, "somewhat low")):
        w, n = both(site, user)
        only(w, "cpus")
        only(n, "cpus")
        assert n["cpus"].title == "Find out why its CPU cores wait"
        assert f"{share} of its 8 CPU cores busy" in n["cpus"].body
        assert f": {word} against the 90% and above" in n["cpus"].body
        assert n["cpus"].change == (
            f"#SBATCH --cpus-per-task={cores}  (for the scaling test; one task per node)",
        )
    only(window(site, "cpu81"))
    only(notes(site, "cpu81"))


def test_cpu_one_core_worth_is_a_serial_code(site: Site) -> None:
    n = notes(site, "serial")["cpus"]
    assert "one core's worth" in n.body and n.change[0].startswith("#SBATCH --cpus-per-task=1 ")


def test_cpu_two_cores_and_gpu_jobs(site: Site) -> None:
    only(notes(site, "two"), "cpus")  # jobstats: more than one core
    assert notes(site, "two")["cpus"].change[0].startswith("#SBATCH --cpus-per-task=1 ")
    only(both(site, "gpu60")[0])  # a GPU job at 60% of its cores: nothing
    only(both(site, "gpu60")[1])


# --- a GPU's share of its node ------------------------------------------------------------------------


def test_cores_per_gpu(site: Site) -> None:
    w, n = both(site, "cores32")
    assert "cores-per-gpu" in w and "cores-per-gpu" in n
    c = n["cores-per-gpu"]
    assert "32 CPU cores per GPU" in c.body and "16 cores per GPU (64 cores / 4 GPUs per node)" in c.body
    assert "kept 8 per GPU busy" in c.body
    assert c.change == (
        "#SBATCH --cpus-per-gpu=10  (in place of --cpus-per-task: Slurm takes one of the two)",
    )
    assert "cores-per-gpu" not in notes(site, "cores16")  # at the share
    assert "cores-per-gpu" not in notes(site, "cores32busy")  # it keeps them busy


def test_mem_per_gpu(site: Site) -> None:
    w, n = both(site, "mem256")
    assert "mem-per-gpu" in w and "mem-per-gpu" in n
    m = n["mem-per-gpu"]
    assert "256 GB of memory per GPU" in m.body and "128 GB (512 GB / 4 GPUs per node)" in m.body
    assert "at most 20 GB per GPU (sacct MaxRSS)" in m.body
    assert m.change[0].startswith("#SBATCH --mem-per-gpu=25G  (in place of --mem")
    assert "mem-per-gpu" not in notes(site, "mem128")  # at the share
    assert "mem-per-gpu" not in notes(site, "mem256used")  # uses 90% of it


# --- nodes ----------------------------------------------------------------------------------------------


def test_fewer_nodes(site: Site) -> None:
    w, n = both(site, "nodes2fit1")
    assert "fewer-nodes" in w and "fewer-nodes" in n
    f = n["fewer-nodes"]
    assert "It ran on 2 nodes with 32 cores in all; its nodes have 64 cores each, so it fits on 1" in f.body
    assert f.change == ("#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=32  (with one core per task)")
    g = notes(site, "gpunodes")["fewer-nodes"]
    assert "16 cores and 2 GPUs" in g.body and g.change == (
        "#SBATCH --nodes=1", "#SBATCH --gres=gpu:2  (GPUs per node)",
    )  # fmt: skip
    assert "fewer-nodes" not in notes(site, "nodes2need2")  # 96 cores need two 64-core nodes
    assert "fewer-nodes" not in notes(site, "memnodes")  # 400 GB need two 256 GB nodes
    assert "fewer-nodes" not in notes(site, "cpu49")  # one node


# --- GPUs one by one --------------------------------------------------------------------------------------


def test_unused_gpus_from_per_gpu_samples(site: Site) -> None:
    j = site.jobs["unused"]
    assert sorted(d.mean_util_pct for d in j.devices) == [0.0, 90.0, 90.0, 90.0]
    w, n = both(site, "unused")
    assert "unused-gpus" in w and "unused-gpus" in n
    u = n["unused-gpus"]
    assert "did not use 1 of its 4 GPUs: GPU-3 on n501 stayed at 0% in every sample" in u.body
    assert u.change[0] == "#SBATCH --gres=gpu:3"
    assert "unused-gpus" not in notes(site, "allused")  # 3% is some use
    assert len(site.jobs["allused"].devices) == 4


# --- MIG --------------------------------------------------------------------------------------------------


def test_mig_slice_for_a_small_part_of_a_gpu(site: Site) -> None:
    j = site.jobs["mig"]
    assert j.gpu_util_pct == pytest.approx(10.0) and j.gpu_mem_peak_mb == pytest.approx(6 * 1024)
    w, n = both(site, "mig")
    assert "mig" in w and "mig" in n
    m = n["mig"]
    assert "busy 10% of the time on average and held at most 6 GB" in m.body
    assert "1g.10gb MIG slice (1/7 of an A100's or H100's compute, 10 GB) on the gpu-mig partition" in m.body
    assert m.change == ("#SBATCH --partition=gpu-mig", "#SBATCH --gres=gpu:1g.10gb:1")
    for user in ("migbusy", "migmem", "onmig"):  # 20% > 1/7; 12 GB > 10 GB; already on a slice
        assert "mig" not in notes(site, user), user
    # without a MIG partition in the site's config, no such note
    bare = replace(site.cfg, advice=replace(site.cfg.advice, mig_partitions={}))
    assert "mig" not in window(site, "mig", bare)


def test_mig_partitions_config_errors(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[advice]\nmig_partitions = { "gpu-mig" = "small" }\n')
    with pytest.raises(
        ConfigError, match=r'advice.mig_partitions.gpu-mig: expected a MIG profile like "1g.10gb"'
    ):
        load_config(p)
    p.write_text("[partitions.gpu]\ngpus_per_node = 2.5\n")
    with pytest.raises(ConfigError, match=r"partitions.gpu.gpus_per_node: expected a whole number"):
        load_config(p)


# --- through the real CLI ------------------------------------------------------------------------------


def test_cocaq_job_says_them(site: Site) -> None:
    def job(job_id: str) -> dict[str, dict[str, object]]:
        r = run_cocaq(["job", job_id, "-o", "json"], site.env)
        assert r.code == 0, r.err
        return {n["id"]: n for n in json.loads(r.out)["notes"]}

    got = job("201")
    assert "cores-per-gpu" in got and "cpus" not in got  # one line about its cores, not two
    assert got["cores-per-gpu"]["change"] == [
        "#SBATCH --cpus-per-gpu=10  (in place of --cpus-per-task: Slurm takes one of the two)"
    ]
    assert job("601")["mig"]["change"] == ["#SBATCH --partition=gpu-mig", "#SBATCH --gres=gpu:1g.10gb:1"]
    # they claim no energy saving, so `cocaq user` (the suggestions worth an e-mail) does not list them
    r = run_cocaq(["user", "nodes2fit1", "--since", "30d", "-o", "json"], site.env)
    assert r.code == 0, r.err
    assert not {a["id"] for a in json.loads(r.out)["advice"]} & JOBSTATS


# --- a node with no CPU use -------------------------------------------------------------------------------
#
# What sacct says per step (sacct(1)): TRESUsageInMin, the least use of any one task; TRESUsageInMinNode,
# where; TRESUsageInMinTask, which task (-1: node-centric). A zero minimum is one task's: it is the node's
# whole share only where the step ran one task per node. With 64 tasks per node (case 704) one idle task
# says nothing of its node, whose other 63 may work: no node is named, whatever the node did, because the
# data cannot tell an idle node from one idle rank on a busy node.

NODE_HEADER = HEADER + "|TRESUsageInMin|TRESUsageInMinNode|TRESUsageInMinTask"


@dataclass(frozen=True)
class NodeCase:
    """A job of 4 nodes of 64 cores (or 1) and its steps: (step, nodes, tasks, TotalCPU in s, least CPU
    of one task in s, where, which task); the nodes are the step's first `nodes` of the job's."""

    raw: int
    user: str
    nodes: int
    steps: tuple[tuple[str, int, int, float, float, int, int], ...]


BUSY = 64 * 2 * H * 0.95  # one node's 64 cores, 95% busy for 2 h
NODE_CASES = (
    # srun's step ran one task per node, and the one on the third node did nothing
    NodeCase(701, "idlenode", 4, (("batch", 1, 1, 2, 2, 1, 0), ("extern", 4, 4, 0, 0, 1, 0),
                                  ("0", 4, 4, 3 * BUSY, 0, 3, 2))),
    NodeCase(702, "allnodes", 4, (("batch", 1, 1, 2, 2, 1, 0), ("extern", 4, 4, 0, 0, 1, 0),
                                  ("0", 4, 4, 4 * BUSY, BUSY / 64, 2, 1))),
    NodeCase(703, "onenode", 1, (("batch", 1, 1, 2, 2, 1, 0), ("0", 1, 1, 0, 0, 1, 0))),
    # 64 tasks per node: its least-used task (130, on the third node) did nothing, its node's others worked
    NodeCase(704, "manytasks", 4, (("batch", 1, 1, 2, 2, 1, 0), ("extern", 4, 4, 0, 0, 1, 0),
                                   ("0", 4, 256, 4 * BUSY - BUSY / 64, 0, 3, 130))),
    # no srun: the batch script ran the work on the first node; only the extern step is on the others
    NodeCase(705, "nosrun", 4, (("batch", 1, 1, BUSY, BUSY, 1, 0), ("extern", 4, 4, 0, 0, 2, 1))),
)  # fmt: skip


def _host(c: NodeCase, i: int) -> str:
    return f"n{c.raw}{i}" if c.nodes > 1 else f"n{c.raw}"


def node_dump(now: datetime) -> str:
    rows = []
    for c in NODE_CASES:
        t0 = start_of(Case(c.raw, c.user, 0, 0.0), now)
        t1, el = t0 + timedelta(hours=2), 2 * H
        nodes = f"n{c.raw}[1-{c.nodes}]" if c.nodes > 1 else f"n{c.raw}"
        cpus = 64 * c.nodes
        tres = f"cpu={cpus},mem=64G,node={c.nodes}"
        total = _dur(sum(s[3] for s in c.steps))
        rows.append(
            f"{c.raw}|{c.raw}|job{c.raw}|{c.user}|1000|lab|cpu|normal|{nodes}|{c.nodes}|{cpus}|{tres}|64G|"
            f"{_t(t0)}|{_t(t0)}|{_t(t1)}|{el}|COMPLETED|0:0|{total}|||hal|1-00:00:00|||||||"
        )
        for step, nn, tasks, cpu_s, least, at, task in c.steps:
            on = f"n{c.raw}[1-{nn}]" if nn > 1 else _host(c, 1)
            where = _host(c, at)
            mins = f"cpu={_dur(least)},energy=0,fs/disk=2012,mem=1200K,pages=0,vmem=4000K"
            node = f"cpu={where},energy={_host(c, 1)},fs/disk={_host(c, 1)},mem={where},pages={where},vmem={where}"
            rows.append(
                f"{c.raw}.{step}|{c.raw}.{step}|{step}||1000|lab|||{on}|{nn}|{64 * nn}|cpu={64 * nn}||"
                f"{_t(t0)}|{_t(t0)}|{_t(t1)}|{el}|COMPLETED|0:0|{_dur(cpu_s)}|||||2G|{tasks}|||"
                f"{mins}|{node}|cpu={task},energy=0,fs/disk=0,mem={task},pages=0,vmem=0"
            )
    return NODE_HEADER + "\n" + "\n".join(rows) + "\n"


def test_zero_cpu_node_is_named_with_the_line_to_change(site: Site) -> None:
    assert site.jobs["idlenode"].zero_cpu_nodes == ("n7013",)
    w, n = both(site, "idlenode")
    only(w, "zero-cpu-nodes")  # its 75% CPU use and its nodes are the idle node's doing: no other note
    only(n, "zero-cpu-nodes")
    z = n["zero-cpu-nodes"]
    assert z.title == "Start the code on every node"
    assert "It ran on 4 nodes and Slurm accounted no CPU time on 1 of them: n7013 (sacct" in z.body
    assert "Is the code able" not in z.body  # three nodes worked
    assert z.change == (
        "srun python train.py  (your command after srun, in the batch script)",
        "#SBATCH --ntasks-per-node=64  (one task per core, as an MPI code runs; 1 for a code that starts "
        "its own threads)",
        "#SBATCH --nodes=3  (or ask for the nodes it used)",
    )
    assert w["zero-cpu-nodes"].job_ids == ("701",) and w["zero-cpu-nodes"].saving_kwh is None
    assert "701: 1 of 4 nodes idle (n7013)" in w["zero-cpu-nodes"].body


def test_a_batch_script_without_srun_leaves_every_other_node_idle(site: Site) -> None:
    assert site.jobs["nosrun"].zero_cpu_nodes == ("n7052", "n7053", "n7054")
    n = notes(site, "nosrun")
    only(n, "zero-cpu-nodes")  # not "cpus" for its 24% CPU use: the three idle nodes are why
    z = n["zero-cpu-nodes"]
    assert "no CPU time on 3 of them: n7052, n7053, n7054" in z.body
    assert "Is the code able to use more than one node?" in z.body  # only one node worked
    assert z.change[-1] == "#SBATCH --nodes=1  (or ask for the nodes it used)"


def test_no_zero_cpu_node_note_where_every_node_worked_one_node_or_many_tasks(site: Site) -> None:
    for user in ("allnodes", "onenode", "manytasks"):
        assert site.jobs[user].zero_cpu_nodes == (), user
        assert "zero-cpu-nodes" not in window(site, user), user
        assert "zero-cpu-nodes" not in notes(site, user), user


def test_cocaq_job_names_the_idle_node(site: Site) -> None:
    r = run_cocaq(["job", "701", "-o", "json"], site.env)
    assert r.code == 0, r.err
    got = {x["id"]: x for x in json.loads(r.out)["notes"]}
    assert "n7013" in got["zero-cpu-nodes"]["body"]
    assert got["zero-cpu-nodes"]["change"][-1] == "#SBATCH --nodes=3  (or ask for the nodes it used)"


def _json_job(steps: list[dict[str, object]], nodes: str = "n[1-4]") -> dict[str, object]:
    """A finished 4-node job as sacct --json (data_parser v0.0.40+) writes it."""
    return {
        "job_id": 9, "user": "alice", "cluster": "hal", "partition": "cpu", "nodes": nodes,
        "allocation_nodes": 4, "state": {"current": ["COMPLETED"]},
        "time": {"submission": 1_800_000_000, "start": 1_800_000_000, "end": 1_800_007_200,
                 "elapsed": 7200, "total": {"seconds": 0, "microseconds": 0}},
        "tres": {"allocated": [{"type": "cpu", "count": 256}, {"type": "node", "count": 4}]},
        "steps": steps,
    }  # fmt: skip


def _json_step(sid: str, nodes: list[str], tasks: int, cpu_s: float, least_ms: int, at: str, task: int):  # type: ignore[no-untyped-def]
    return {
        "step": {"id": f"9.{sid}"}, "nodes": {"count": len(nodes), "list": nodes}, "tasks": {"count": tasks},
        "time": {"total": {"seconds": int(cpu_s), "microseconds": 0}},
        "tres": {"requested": {"min": [{"type": "cpu", "name": "", "count": least_ms, "task": task, "node": at},
                                       {"type": "mem", "name": "", "count": 10**6, "task": 0, "node": "n1"}]}},
    }  # fmt: skip


def test_json_and_pyslurm_read_the_same() -> None:
    from types import SimpleNamespace

    from cocaq.slurm.sacct import iter_job_dicts, iter_json
    from cocaq.slurm.slurmdb import job_dict
    from tests.test_slurm_backend_choice import job as pyslurm_job
    from tests.test_slurm_backend_choice import tres

    four = ["n1", "n2", "n3", "n4"]
    steps = [_json_step("batch", ["n1"], 1, 2, 2000, "n1", 0), _json_step("extern", four, 4, 0, 0, "n1", 0),
             _json_step("0", four, 4, 3 * BUSY, 0, "n3", 2)]  # fmt: skip
    (rec,) = iter_json(json.dumps({"jobs": [_json_job(steps)]}))
    assert rec.zero_cpu_nodes == "n3"
    steps[2] = _json_step("0", four, 256, 4 * BUSY, 0, "n3", 130)  # 64 tasks per node: one task's zero
    (rec,) = iter_json(json.dumps({"jobs": [_json_job(steps)]}))
    assert rec.zero_cpu_nodes is None
    steps[2] = _json_step("0", four, 256, 4 * BUSY, 0, "n3", -1)  # node-centric (sacct(1): task -1)
    (rec,) = iter_json(json.dumps({"jobs": [_json_job(steps)]}))
    assert rec.zero_cpu_nodes == "n3"

    def step(nodes: str, n: int, tasks: int, cpu: float, least: float, at: str, task: int) -> object:
        stats = SimpleNamespace(total_cpu_time=cpu, max_resident_memory=None, consumed_energy=None,
                                min_cpu_time=least, min_cpu_time_node=at, min_cpu_time_task=task)  # fmt: skip
        return SimpleNamespace(stats=stats, num_nodes=n, ntasks=tasks, nodelist=nodes)

    j = pyslurm_job(
        nodelist="n[1-4]", num_nodes=4, allocated_tres=tres(cpu=256, mem=64000, node=4),
        elapsed_time=7200, end_time=1_800_007_210,
        steps={"batch": step("n1", 1, 1, 2, 2, "n1", 0), "extern": step("n[1-4]", 4, 4, 0, 0, "n1", 0),
               0: step("n[1-4]", 4, 4, 3 * BUSY, 0, "n3", 2)},
    )  # fmt: skip
    (rec,) = iter_job_dicts([job_dict(j)])
    assert rec.zero_cpu_nodes == "n3"


def test_hostile_minimum_fields_cost_only_themselves() -> None:
    """Bad values in the three fields (a duration no run has, a node name with shell characters, a task
    that is not a number, a host list of a billion nodes) leave the job as it is, with no node named."""
    from cocaq.slurm.sacct import ParseStats, iter_parsable

    now = datetime(2026, 11, 10, tzinfo=UTC)
    text = node_dump(now).splitlines()
    head, body = text[0], [x for x in text[1:] if x.startswith("701")]
    bad = []
    for x in body:
        if x.startswith("701.0|"):
            parts = x.split("|")
            parts[-3] = "cpu=99999999999-00:00:00,mem=1e400"
            parts[-2] = "cpu=$(rm -rf ~);n7013"
            parts[-1] = "cpu=two"
            x = "|".join(parts)
        if x.startswith("701.extern|"):
            x = x.replace("n701[1-4]", "n[0-999999999]")
        bad.append(x)
    st = ParseStats()
    (rec,) = iter_parsable([(y + "\n").encode() for y in [head, *bad]], tz=UTC, stats=st)
    assert rec.job_id == "701" and rec.n_nodes == 4 and not st.skipped
    assert rec.zero_cpu_nodes is None
