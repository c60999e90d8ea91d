"""cocaq against Green Algorithms, job by job, on real and site-like sacct output (issue 31).

Green Algorithms (Lannelongue et al. 2021, and its HPC tool GA4HPC) estimates a job's energy from the
sacct line alone: elapsed x (cores x W per core x CPU usage + GPUs x W per GPU + GB of requested memory x
0.3725 W), CPU usage = TotalCPU / (elapsed x cores), and 100% when Slurm recorded no CPU time (TotalCPU
00:00:00); the energy with cooling is x PUE, the CO2 x the grid's intensity. This module imports the dumps
of tests/data/sacct/ with the real `cocaq import sacct --file`, under a config that makes the same
assumptions, and computes that formula itself, from the raw lines, with its own small parser (none of
cocaq's code). Each component of every job cocaq estimated must agree within 1%, and each user's total
within 2%.

A TotalCPU of 00:00:00 is where they once parted: cocaq read it as "no CPU used" and its totals came out
39% below GA4HPC's on a real site's dump. The jobs with it are compared at 100% CPU usage, and cocaq must
say that it estimated them from the allocated cores.

Left out, as GA4HPC leaves them out: jobs still running (Slurm adds a step's CPU time only when the step
ends, so a running job's TotalCPU is not its use yet; cocaq's figure for one is provisional and replaced
when the job ends) and jobs that never started. Jobs whose energy Slurm measured (ConsumedEnergyRaw) are
not estimates: only the parts cocaq still estimates of them are compared.

GB here is 1024 MB, as Slurm's suffixes mean (sacct's `1G` is 1024M): GA4HPC's own code divides an `M`
value by 1000, which would put a `--mem 32000M` job's memory 2.4% above both.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from cocaq.db.schema import Cluster, Job, JobEnergy
from tests import sitedump
from tests.conftest import run_cocaq

DATA = Path(__file__).parent / "data" / "sacct"

# The assumptions both sides make: partition -> (W per core, W per GPU); the site's PUE and grid.
WATTS: dict[str, tuple[float, float]] = {
    "cpu": (5.6, 0.0),
    "gpu-a100": (4.4, 400.0),
    "gpu-v100": (6.25, 300.0),
    "gpu": (12.0, 400.0),  # the test clusters' and the --noconvert dump's GPU partition
}
GPU_MODELS = {"gpu-a100": "NVIDIA A100-SXM4-80GB", "gpu-v100": "Tesla V100-SXM2-32GB", "gpu": "NVIDIA A100"}
PUE = 1.67
ZONE = "GBR"
MEM_W_PER_GB = 0.3725
# What cocaq's assumptions say of a job whose CPU time Slurm did not record
CPU_NOT_RECORDED = "allocated cores x elapsed (CPU time not recorded by Slurm)"
FINAL = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "DEADLINE"}


def grid_intensity(zone: str) -> float:
    """g CO2e/kWh of a country, read straight from codecarbon's data file (cocaq's source too)."""
    spec = importlib.util.find_spec("codecarbon")
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0]) / "data" / "private_infra" / "global_energy_mix.json"
    return float(json.loads(path.read_text())[zone]["carbon_intensity"])


def config_toml(consumed_energy: str = "node", gpu_idle_share: float = 1.0) -> str:
    """A cocaq.toml with Green Algorithms' assumptions: every GPU at its rated power (gpu_utilisation 1
    and, for jobs with Slurm's gres/gpuutil, an idle floor of 1), CPU time from TotalCPU, 0.3725 W/GB."""
    lines = [
        "[cluster]",
        'name = "greenhpc"',
        f'carbon_zone = "{ZONE}"',
        f"pue = {PUE}",
        'timezone = "UTC"',
        "[estimate]",
        "gpu_utilisation = 1.0",
        f"gpu_idle_share = {gpu_idle_share}",
        f"mem_w_per_gb = {MEM_W_PER_GB}",
        'cpu_usage = "totalcpu"',
        "calibrate = false",
        "[slurm]",
        f'consumed_energy = "{consumed_energy}"',
    ]
    for part, (w_core, w_gpu) in WATTS.items():
        lines += [f'[partitions."{part}"]', f"cpu_tdp_w_per_core = {w_core}", f"gpu_tdp_w = {w_gpu}"]
        if part in GPU_MODELS:
            lines.append(f'gpu_model = "{GPU_MODELS[part]}"')
    return "\n".join(lines) + "\n"


# --- Green Algorithms, from the raw lines ----------------------------------------------------------------


def seconds(text: str) -> float:
    """`[D-][HH:]MM:SS[.mmm]` -> seconds (sacct's Elapsed, TotalCPU)."""
    t = text.strip()
    if not t:
        return 0.0
    days, _, rest = t.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    h, m, s = parts
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


_MEM_GB = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}


def mem_gb(req_mem: str, nodes: int, cores: int) -> float:
    """ReqMem -> GB for the whole job (a trailing n: per node, c: per core, as Slurm before 21.08)."""
    m = re.fullmatch(r"([\d.]+)([KMGT])([nc]?)", req_mem.strip())
    if not m:
        return 0.0
    gb = float(m.group(1)) * _MEM_GB[m.group(2)]
    return gb * (nodes if m.group(3) == "n" else cores if m.group(3) == "c" else 1)


def gpu_count(tres: str) -> int:
    """`gres/gpu=N` of AllocTRES, else its typed counts added (GA4HPC reads the untyped one)."""
    kv = dict(p.split("=", 1) for p in tres.split(",") if "=" in p)
    if "gres/gpu" in kv:
        return int(kv["gres/gpu"])
    return sum(int(v) for k, v in kv.items() if k.startswith("gres/gpu:"))


@dataclass
class GaJob:
    """One job of a dump as Green Algorithms sees it."""

    cluster: str
    job_id: str
    user: str
    partition: str
    state: str
    started: bool
    elapsed_s: float
    cores: int
    gpus: int
    mem_gb: float
    total_cpu_s: float
    steps: list[dict[str, str]] = field(default_factory=list)
    measured: bool = False

    @property
    def finished(self) -> bool:
        return self.started and self.state in FINAL

    @property
    def cpu_unknown(self) -> bool:
        """TotalCPU 00:00:00: Slurm recorded none (GA4HPC then assumes every core busy)."""
        return self.total_cpu_s == 0

    def usage_cpu(self) -> float:
        if self.cpu_unknown or not self.cores or not self.elapsed_s:
            return 1.0
        return min(self.total_cpu_s / (self.elapsed_s * self.cores), 1.0)

    def kwh(self) -> dict[str, float]:
        """Energy per component, kWh, without PUE."""
        w_core, w_gpu = WATTS[self.partition]
        h = self.elapsed_s / 3600
        return {
            "cpu": h * self.cores * w_core * self.usage_cpu() / 1000,
            "gpu": h * self.gpus * w_gpu * 1.0 / 1000,
            "dram": h * self.mem_gb * MEM_W_PER_GB / 1000,
        }

    def slurm_gpu_util(self) -> float | None:
        """The job's GPUs' mean use, % of one GPU, from its steps' gres/gpuutil (a task's use summed over
        its GPUs, averaged over the step's tasks): each step's x its tasks x its run, over the job's run."""
        total, seen = 0.0, False
        for s in self.steps:
            m = re.search(r"(?:^|,)gres/gpuutil=([\d.]+)", s["TRESUsageInAve"])
            if m:
                seen = True
                total += float(m.group(1)) * int(s["NTasks"] or 1) * float(s["ElapsedRaw"])
        if not seen or not self.gpus or not self.elapsed_s:
            return None
        return min(total / self.elapsed_s / self.gpus, 100.0)


def ga_jobs(path: Path) -> dict[tuple[str, str], GaJob]:
    """The jobs of a `--parsable2` dump, with their steps."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("|")
    jobs: dict[tuple[str, str], GaJob] = {}
    for line in lines[1:]:
        f = dict(zip(header, line.split("|"), strict=True))
        base, dot, _ = f["JobID"].partition(".")
        key = (f["Cluster"], base)
        energy = float(f["ConsumedEnergyRaw"] or 0)
        if dot:
            jobs[key].steps.append(f)
            jobs[key].measured |= energy > 0
            continue
        nodes, cores = int(f["NNodes"]), int(f["AllocCPUS"])
        jobs[key] = GaJob(
            cluster=f["Cluster"],
            job_id=base,
            user=f["User"],
            partition=f["Partition"],
            state=f["State"].split(" ")[0],
            started=f["Start"] not in ("Unknown", "None", ""),
            elapsed_s=float(f["ElapsedRaw"]) if f["ElapsedRaw"] else seconds(f["Elapsed"]),
            cores=cores,
            gpus=gpu_count(f["AllocTRES"]),
            mem_gb=mem_gb(f["ReqMem"], nodes, cores),
            total_cpu_s=seconds(f["TotalCPU"]),
            measured=energy > 0,
        )
    return jobs


# --- cocaq's figures -------------------------------------------------------------------------------------


@dataclass
class CocaqJob:
    user: str
    is_open: bool
    energy_kwh: float
    co2_g: float
    pue: float
    g_per_kwh: float
    assumptions: dict[str, Any]
    gpus_unknown: bool
    kwh: dict[str, float]  # by component (cpu, gpu, dram, node), measured and estimated
    measured_kwh: dict[str, float]


def cocaq_jobs(engine: Engine) -> dict[tuple[str, str], CocaqJob]:
    with engine.connect() as c:
        rows = c.execute(
            select(
                Job.id, Cluster.name, Job.job_id, Job.user_name, Job.is_open, Job.energy_j, Job.co2_g, Job.pue,
                Job.carbon_g_per_kwh, Job.assumptions, Job.gpus_unknown,
            ).join(Cluster, Cluster.id == Job.cluster_id)
        ).all()  # fmt: skip
        parts = c.execute(
            select(
                JobEnergy.job_pk, JobEnergy.component, JobEnergy.method, func.sum(JobEnergy.energy_j)
            ).group_by(JobEnergy.job_pk, JobEnergy.component, JobEnergy.method)
        ).all()
    by_pk: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    measured: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for pk, comp, method, j in parts:
        by_pk[pk][comp] += j / 3.6e6
        if method == "measured":
            measured[pk][comp] += j / 3.6e6
    out = {}
    for pk, cluster, job_id, user, is_open, energy_j, co2_g, pue, g, assumptions, unknown in rows:
        a = assumptions if isinstance(assumptions, dict) else json.loads(assumptions or "{}")
        out[(cluster, job_id)] = CocaqJob(
            user,
            bool(is_open),
            energy_j / 3.6e6,
            co2_g,
            pue,
            g,
            a,
            bool(unknown),
            dict(by_pk[pk]),
            dict(measured[pk]),
        )
    return out


def import_dump(env: dict[str, str], path: Path) -> None:
    r = run_cocaq(["import", "sacct", "--file", str(path)], env)
    assert r.code == 0, r.err


@pytest.fixture
def site_env(cli_env: dict[str, str], db_url: str, engine: Engine, tmp_path: Path) -> dict[str, str]:
    """The real `cocaq` on a migrated database of each kind, under Green Algorithms' assumptions."""
    cfg = tmp_path / "cocaq.toml"
    cfg.write_text(config_toml())
    return dict(cli_env, COCAQ_DATABASE_URL=db_url, COCAQ_CONFIG=str(cfg))


# sacct's text cuts TotalCPU to the millisecond (JSON: 00:00.002 is 2910 us): on a 2-second job that is 1%
# of its few joules. Differences below 3.6 J (1e-6 kWh) are that, not a disagreement.
TINY_KWH = 1e-6


def close(a: float, b: float, rel: float, tiny: float = TINY_KWH) -> bool:
    """Within `rel` of each other, or apart by less than `tiny` (the text's millisecond cut)."""
    return abs(a - b) <= rel * max(abs(a), abs(b)) or abs(a - b) < tiny


def compare(ga: dict[tuple[str, str], GaJob], cq: dict[tuple[str, str], CocaqJob]) -> tuple[list[str], int]:
    """Every finished job's components, total, energy with PUE and CO2, GA against cocaq: the
    disagreements (one line each, with both numbers) and how many jobs were compared."""
    intensity = grid_intensity(ZONE)
    bad: list[str] = []
    n = 0
    for key, g in sorted(ga.items()):
        if not g.finished:
            continue  # running (its TotalCPU is the ended steps' only) or never started: GA4HPC skips them
        c = cq.get(key)
        if c is None:
            if g.elapsed_s > 0:
                bad.append(f"{key}: finished job not imported")
            continue
        n += 1
        want = g.kwh()
        if g.cpu_unknown and g.elapsed_s > 0 and c.assumptions.get("cpu_basis") != CPU_NOT_RECORDED:
            bad.append(f"{key}: TotalCPU 00:00:00, cocaq's CPU basis is {c.assumptions.get('cpu_basis')!r}")
        for comp, kwh in want.items():
            if c.measured_kwh.get(comp) or (g.measured and comp not in c.kwh and "node" in c.measured_kwh):
                continue  # measured by Slurm, not estimated: nothing to compare with a formula
            got = c.kwh.get(comp, 0.0)
            if not close(got, kwh, 0.01):
                bad.append(f"{key} {comp}: cocaq {got:.6g} kWh, Green Algorithms {kwh:.6g} kWh")
        if g.measured:
            continue  # its total is Slurm's measurement in part
        total = sum(want.values())
        checks = (
            ("energy", c.energy_kwh, total, TINY_KWH),
            ("energy with PUE", c.energy_kwh * c.pue, total * PUE, TINY_KWH * PUE),
            ("CO2 g", c.co2_g, total * PUE * intensity, TINY_KWH * PUE * intensity),
        )
        for what, got, kwh, tiny in checks:
            if not close(got, kwh, 0.01, tiny):
                bad.append(f"{key} {what}: cocaq {got:.6g}, Green Algorithms {kwh:.6g}")
    return bad, n


# One dump per database: each file's jobs under their own keys (the captures reuse the test cluster's ids).
PARSABLE = (
    "site_like_parsable2.txt",
    "handmade_site_parsable2.txt",
    "handmade_noconvert_parsable2.txt",
    "slurm2205_parsable2.txt",
    "slurm2511_parsable2.txt",
    "slurm2205_shapes_parsable2.txt",
    "slurm2205_shapes_X_parsable2.txt",
    "slurm2205_shapes_midway_parsable2.txt",
)


@pytest.mark.parametrize("name", PARSABLE)
def test_each_job_agrees_with_green_algorithms(name: str, site_env: dict[str, str], engine: Engine) -> None:
    if name == "handmade_site_parsable2.txt":  # its ConsumedEnergy is acct_gather_energy/gpu's: the GPUs'
        Path(site_env["COCAQ_CONFIG"]).write_text(config_toml(consumed_energy="gpus"))
    import_dump(site_env, DATA / name)
    ga, cq = ga_jobs(DATA / name), cocaq_jobs(engine)
    bad, n = compare(ga, cq)
    assert not bad, f"{len(bad)} disagreements over {n} jobs:\n" + "\n".join(bad)
    assert n > 0


# --json captures: cocaq reads the JSON, Green Algorithms the --parsable2 lines captured with it
JSON_TWINS = (
    ("slurm2205_shapes_sacct.json", "slurm2205_shapes_parsable2.txt"),
    ("slurm2205_sacct.json", "slurm2205_parsable2.txt"),
    ("slurm2511_sacct.json", "slurm2511_parsable2.txt"),
)


@pytest.mark.parametrize(("name", "twin"), JSON_TWINS)
def test_json_captures_agree_with_green_algorithms(
    name: str, twin: str, site_env: dict[str, str], engine: Engine
) -> None:
    import_dump(site_env, DATA / name)
    bad, n = compare(ga_jobs(DATA / twin), cocaq_jobs(engine))
    assert not bad, f"{len(bad)} disagreements over {n} jobs:\n" + "\n".join(bad)
    assert n >= 8


def test_unrecorded_cpu_time_is_most_of_a_sites_energy(site_env: dict[str, str], engine: Engine) -> None:
    """The jobs with TotalCPU 00:00:00 on the site-like dump: compared at 100% CPU, as GA4HPC does, they
    are a large share of the site's CPU energy (why reading them as idle cut the total by a third)."""
    import_dump(site_env, DATA / "site_like_parsable2.txt")
    ga = {k: g for k, g in ga_jobs(DATA / "site_like_parsable2.txt").items() if g.finished and not g.measured}
    cq = cocaq_jobs(engine)
    unknown = [k for k, g in ga.items() if g.cpu_unknown and g.elapsed_s > 0]
    assert len(unknown) >= 8  # long jobs whose steps show 0, and allocations with no step at all
    for k in unknown:
        assert cq[k].assumptions["cpu_basis"] == CPU_NOT_RECORDED, k
        assert cq[k].kwh["cpu"] == pytest.approx(ga[k].kwh()["cpu"], rel=0.01), k
    cpu_unknown = sum(ga[k].kwh()["cpu"] for k in unknown)
    cpu_all = sum(g.kwh()["cpu"] for g in ga.values())
    assert cpu_unknown / cpu_all > 0.2
    assert sum(cq[k].kwh["cpu"] for k in unknown) == pytest.approx(cpu_unknown, rel=0.01)


def test_per_user_totals_agree_with_green_algorithms(site_env: dict[str, str], engine: Engine) -> None:
    """Each user's kWh, kWh with PUE and CO2 as `cocaq lab LAB -o json` gives them: Green Algorithms'
    sum over the user's finished, estimated jobs, plus cocaq's own figures for the rest (running jobs,
    Slurm's measurements), within 2%."""
    import_dump(site_env, DATA / "site_like_parsable2.txt")
    ga, cq = ga_jobs(DATA / "site_like_parsable2.txt"), cocaq_jobs(engine)
    intensity = grid_intensity(ZONE)
    want: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    compared = 0
    for key, c in cq.items():
        g = ga[key]
        if g.finished and not g.measured:
            kwh = sum(g.kwh().values())
            w = (kwh, kwh * PUE, kwh * PUE * intensity / 1000)
            compared += 1
        else:
            w = (c.energy_kwh, c.energy_kwh * c.pue, c.co2_g / 1000)
        for i, x in enumerate(w):
            want[c.user][i] += x
    assert len(want) == len(sitedump.USERS) and compared >= 90
    got: dict[str, tuple[float, float, float]] = {}
    for lab in sitedump.LABS:
        r = run_cocaq(["lab", lab, "-S", "2026-09-01", "-E", "2026-12-01", "-o", "json"], site_env)
        assert r.code == 0, r.err
        for u in json.loads(r.out)["users"]:
            got[u["user"]] = (u["energy_kwh"], u["energy_kwh_with_pue"], u["co2_kg"])
    assert set(got) == set(want)
    bad = [
        f"{user} {what}: cocaq {got[user][i]:.6g}, Green Algorithms {w[i]:.6g}"
        for user, w in sorted(want.items())
        for i, what in enumerate(("kWh", "kWh with PUE", "kg CO2"))
        if not close(got[user][i], w[i], 0.02)
    ]
    assert not bad, "\n".join(bad)


def test_gpus_on_partitions_without_gres_gpu_are_unknown(site_env: dict[str, str], engine: Engine) -> None:
    """A GPU partition on a cluster that does not account gres/gpu: no GPU count in the line, so Green
    Algorithms (which reads `gres/gpu=N`) counts none and cocaq estimates none, but says it does not know."""
    import_dump(site_env, DATA / "site_like_parsable2.txt")
    import_dump(site_env, DATA / "handmade_site_parsable2.txt")
    ga = ga_jobs(DATA / "site_like_parsable2.txt") | ga_jobs(DATA / "handmade_site_parsable2.txt")
    cq = cocaq_jobs(engine)
    legacy = [k for k, g in ga.items() if g.partition == "gpu-v100"]
    assert len(legacy) >= 5 and {k[0] for k in legacy} == {"greenhpc-legacy", "hpclegacy"}
    for k in legacy:
        assert ga[k].gpus == 0 and "gpu" not in cq[k].kwh, k
        assert cq[k].gpus_unknown, k
    assert not any(cq[k].gpus_unknown for k, g in ga.items() if g.partition == "gpu-a100")


def test_gpu_energy_from_slurms_gpuutil(
    cli_env: dict[str, str], db_url: str, engine: Engine, tmp_path: Path
) -> None:
    """With the default idle floor (0.15), a GPU job that Slurm's gres/gpuutil describes is estimated at
    rated power x (0.15 + 0.85 x its use): the use worked out here from its steps' TRESUsageInAve, in both
    of sacct's spellings of gres/gpumem (bytes with --noconvert, else a suffix)."""
    cfg = tmp_path / "cocaq.toml"
    cfg.write_text(config_toml(gpu_idle_share=0.15))
    env = dict(cli_env, COCAQ_DATABASE_URL=db_url, COCAQ_CONFIG=str(cfg))
    names = ("site_like_parsable2.txt", "handmade_site_parsable2.txt", "handmade_noconvert_parsable2.txt")
    ga: dict[tuple[str, str], GaJob] = {}
    for name in names:
        import_dump(env, DATA / name)
        ga |= ga_jobs(DATA / name)
    cq = cocaq_jobs(engine)
    seen = 0
    for key, g in ga.items():
        util = g.slurm_gpu_util()
        if util is None or not g.finished or g.measured:
            continue
        seen += 1
        w_gpu = WATTS[g.partition][1] * (0.15 + 0.85 * util / 100)
        assert cq[key].kwh.get("gpu", 0.0) == pytest.approx(g.gpus * g.elapsed_s * w_gpu / 3.6e6, rel=0.01), (
            key
        )
        assert cq[key].assumptions["gpu_util_slurm_pct"] == pytest.approx(util, abs=0.1), key
    assert seen >= 15


def test_site_dump_is_what_its_generator_makes() -> None:
    """tests/data/sacct/site_like_parsable2.txt is `python -m tests.sitedump`'s output, byte for byte."""
    assert (DATA / "site_like_parsable2.txt").read_text(encoding="utf-8") == sitedump.render()
