"""The demo's synthetic month: a small GPU cluster's users and their habits, their jobs as `sacct
--parsable2` prints them (with .batch/.extern steps), the ML metadata some jobs declare, and the GPU
samples the collector of the metered nodes would have written.

Fixed seeds: the same end time gives the same month, so the demo's numbers can be compared run to run
(scripts/demo-snapshot.sh). cocaq.cli.demo runs this month through the real import path and reports.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select

from cocaq.slurm.sacct import SACCT_FIELDS
from cocaq.timeparse import format_slurm_duration

DEMO_CLUSTER = "demo"

# partition -> (node prefix, nodes, GPUs per node, cores per node)
PARTITIONS = {
    "gpu_a100": ("a100-", 4, 8, 128),
    "gpu_v100": ("v100-", 6, 4, 40),
    "cpu": ("cpu-", 12, 0, 192),
    "interactive": ("a100-", 4, 8, 128),  # not in the config: shows the default-profile warning
}

# The V100 nodes with IPMI energy accounting and the collector (the newer half): their jobs are measured,
# and the GPU energy of the jobs on the other V100 nodes is estimated from what these drew
# (cocaq.accounting.calibrate) rather than from the V100's rated power.
METERED_V100 = {"v100-01", "v100-02", "v100-03"}


def metered_v100(nodes: list[str]) -> bool:
    return bool(nodes) and all(n in METERED_V100 for n in nodes)


DEMO_CONFIG = """\
# The demo cluster's description; a real site writes one like it to /etc/cocaq/cocaq.toml.
[cluster]
name = "demo"
carbon_zone = "ES"       # Spain: its hourly intensity (real 2023 hours, replayed onto the demo's weeks)
pue = 1.35
timezone = "UTC"

[estimate]
gpu_utilisation = 0.8    # share of GPU TDP assumed when nothing measured the GPUs

[partitions.gpu_a100]     # nodes with IPMI energy accounting: Slurm measures their energy
cpu_model = "AMD EPYC 7763 (64 cores, 280 W)"
cpu_tdp_w_per_core = 4.4
gpu_model = "NVIDIA A100-SXM4-80GB"
gpu_tdp_w = 400
gpu_mem_gb = 80
mem_gb = 1024

[partitions.gpu_v100]
cpu_model = "Intel Xeon Gold 6248 (20 cores, 150 W)"
cpu_tdp_w_per_core = 7.5
gpu_model = "NVIDIA V100-SXM2-32GB"
gpu_tdp_w = 300
gpu_mem_gb = 32
mem_gb = 384

[partitions.cpu]
cpu_model = "AMD EPYC 9654 (96 cores, 360 W)"
cpu_tdp_w_per_core = 3.75
gpu_tdp_w = 0
mem_gb = 768

[advice]                 # slurm.conf's MaxTime per partition: no --time the advice proposes goes above it
partition_max_time = { gpu_a100 = "2-00:00:00", gpu_v100 = "1-00:00:00", cpu = "1-00:00:00" }

[collector]
interval_s = 300         # the demo's GPU samples (A100 nodes) are 5 minutes apart; a real collector: 10 s

[embodied]               # manufacturing (scope 3), reported apart from operational CO2
g_per_gpu_hour = 25
g_per_node_hour = 10

[mail]
transport = "outbox"
address_template = "{user}@example.org"
from_address = "Demo cluster reports <hpc-reports@demo-cluster.example.org>"
reply_to = "Demo cluster HPC support <hpc-support@example.org>"   # where replies and "unsubscribe" go

[reports]
site_name = "Demo cluster"
contact = "hpc-support@example.org"
admins = ["hpc-admins@example.org"]
lab_heads = { lab_nlp = ["nlp-head@example.org"], lab_vision = ["vision-head@example.org"] }
"""


DEMO_SERIES = "ES_2023-04-03_6weeks_hourly.csv"  # in cocaq/carbon/data, with its NOTICE.md


def demo_series(engine: Any, end: datetime) -> int:
    """Import six real weeks of Spain's hourly intensity (Electricity Maps, 2023) with `cocaq carbon
    import`'s parser, moved by whole weeks to end four days after `end` (weekdays and hours of the day
    kept): the demo's jobs get their CO2 by the hour and when-to-run figures, and `cocaq carbon when`
    has hours ahead. The source says it is a replay. Returns the hours written."""
    from dataclasses import replace as dc_replace
    from importlib.resources import files

    from cocaq.carbon.series_import import parse_csv, write_rows

    data = files("cocaq.carbon").joinpath("data", DEMO_SERIES).read_bytes()
    parsed = parse_csv(data, DEMO_SERIES, basis="lca")
    last = max(r.end for r in parsed.rows)
    week = 7 * 86400.0
    shift = math.ceil(((end + timedelta(days=4)).timestamp() - last) / week) * week
    parsed.rows = [dc_replace(r, start=r.start + shift, end=r.end + shift) for r in parsed.rows]
    parsed.source = "Electricity Maps ES 2023-04-03..05-14, replayed onto the demo's weeks (ODbL)"
    with engine.begin() as conn:
        write_rows(conn, parsed)
    return len(parsed.rows)


# user -> (lab, uid, habits: kind -> jobs per day)
USERS: dict[str, tuple[str, int, dict[str, float]]] = {
    "alice": ("lab_vision", 2001, {"train": 1.2, "debug": 2.0}),
    "bob": ("lab_vision", 2002, {"train": 0.4, "debug": 1.0, "preprocess": 0.2}),
    "carol": ("lab_vision", 2003, {"debug": 3.0, "train": 0.1}),
    "dave": ("lab_nlp", 2004, {"llm": 0.35, "train": 0.8, "debug": 1.5}),
    "erin": ("lab_nlp", 2005, {"notebook": 1.0, "debug": 0.5}),
    "frank": ("lab_nlp", 2006, {"train": 0.5, "debug": 0.8}),
    "grace": ("lab_genomics", 2007, {"preprocess": 1.2, "cpu_sim": 0.4}),
    "heidi": ("lab_genomics", 2008, {"preprocess": 0.3, "cpu_sim": 0.1}),
    "ivan": ("lab_climate", 2009, {"cpu_sim": 0.8, "train": 0.2}),
    "judy": ("lab_climate", 2010, {"notebook": 0.3, "debug": 0.4}),
}


@dataclass
class DemoJob:
    job_id: str
    raw_id: int
    name: str
    user: str
    uid: int
    account: str
    partition: str
    nodes: list[str]
    cpus: int
    gpus: int
    mem_gb: float
    submit: datetime
    start: datetime
    elapsed: int
    state: str
    exit_code: str
    total_cpu: float
    energy_j: float | None
    limit_min: int
    running: bool = False
    kind: str = ""  # what the user was doing (the GPU samples follow it)
    gpu_load: float = 0.0  # share of the GPUs' TDP they drew
    comment: str = ""  # `cocaq: model=...` when the user declared the model at submission
    declared: dict[str, Any] | None = None  # what `cocaq.annotate`/`cocaq tag` wrote from inside
    detected: dict[str, str] | None = None  # what the collector saw in the job's processes


def _ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def population(copies: int, seed: int) -> dict[str, tuple[str, int, dict[str, float]]]:
    """USERS, and `copies - 1` more of each GPU user (alice2, alice3, ...) with their own habits (the
    rates times a factor around 1): a site large enough for the e-mail study's arms (cocaq.cli.demo_study).
    The CPU-only users are not copied: the study's outcomes are about GPUs."""
    rng = random.Random(seed + 11)
    out = dict(USERS)
    gpu_kinds = {"llm", "train", "debug", "notebook"}
    for k in range(2, copies + 1):
        for user, (lab, uid, habits) in USERS.items():
            if not gpu_kinds & set(habits):
                continue
            mine = {kind: r * rng.lognormvariate(0.0, 0.35) for kind, r in habits.items()}
            out[f"{user}{k}"] = (lab, uid + 100 * k, mine)
    return out


class Generator:
    def __init__(
        self,
        seed: int,
        end: datetime,
        days: int,
        users: dict[str, tuple[str, int, dict[str, float]]] | None = None,
    ) -> None:
        self.users = USERS if users is None else users
        self.rng = random.Random(seed)
        self.end = end
        self.begin = end - timedelta(days=days)
        self.days = days
        self.next_id = 410_000
        self.jobs: list[DemoJob] = []
        # How hard each GPU job drives its GPUs around its kind's typical share of TDP (model size, batch
        # size, input pipeline): a stream of its own, so that everything else the demo draws stays as it was.
        self.power_rng = random.Random(seed + 5)
        # What one user's job of one name draws, against its kind's typical share: as on real clusters,
        # runs of one model differ by model size, batch, precision and code (real runs of one workload on
        # 8 H100s drew 143 to 441 W per GPU), so the job's kind alone does not say its power (issue 35).
        self.level_rng = random.Random(seed + 7)
        self._levels: dict[tuple[str, str], float] = {}

    def _level(self, user: str, name: str) -> float:
        key = (user, name)
        if key not in self._levels:
            self._levels[key] = math.exp(self.level_rng.gauss(0.0, 0.35))
        return self._levels[key]

    def _nodes(self, partition: str, n: int) -> list[str]:
        prefix, count, _, _ = PARTITIONS[partition]
        first = self.rng.randrange(1, count - n + 2)
        return [f"{prefix}{i:02d}" for i in range(first, first + n)]

    def _outcome(self, fail: float, timeout: float, cancel: float, oom: float) -> str:
        x = self.rng.random()
        for state, p in (
            ("FAILED", fail),
            ("TIMEOUT", timeout),
            ("CANCELLED", cancel),
            ("OUT_OF_MEMORY", oom),
        ):
            if x < p:
                return state
            x -= p
        return "COMPLETED"

    def add(self, user: str, kind: str, when: datetime) -> None:
        lab, uid, _ = self.users[user]
        r = self.rng
        array: list[int | None] = []
        hours: float
        limit_h: int
        gpu_w: float  # GPU power as a share of its TDP
        cpu_use: float
        if kind == "llm":
            part, gpus_per, nnodes = "gpu_a100", 8, r.choice([1, 2, 2, 4])
            hours, limit_h, gpu_w, cpu_use = r.lognormvariate(math.log(14), 0.5), 48, 0.82, 0.35
            outcome = self._outcome(0.10, 0.12, 0.05, 0.02)
            name = r.choice(["llama-ft", "pretrain-7b", "mistral-sft", "rlhf-ppo"])
        elif kind == "train":
            part = r.choice(["gpu_a100", "gpu_v100", "gpu_v100"])
            gpus_per, nnodes = r.choice([1, 2, 4, 4] if part == "gpu_v100" else [1, 2, 4, 8]), 1
            # (measured A100 training draws well under TDP: ~250 W of 400 at high utilisation)
            hours, limit_h, gpu_w, cpu_use = r.lognormvariate(math.log(5), 0.8), 24, 0.62, 0.5
            if user == "frank":  # a data loader too slow for the GPUs: CPUs saturated, GPUs waiting
                gpu_w, cpu_use = 0.32, 0.97
            outcome = self._outcome(0.08, 0.06, 0.05, 0.02)
            name = r.choice(["resnet50", "vit-b16", "unet-seg", "detr", "bert-base", "gnn-train"])
        elif kind == "debug":
            part = r.choice(["gpu_v100", "gpu_a100"])
            gpus_per, nnodes = 1, 1
            hours, limit_h, gpu_w, cpu_use = r.uniform(0.05, 0.7), 1, 0.45, 0.6
            outcome = self._outcome(0.35, 0.03, 0.10, 0.04)
            name = r.choice(["test", "debug", "try-lr", "smoke"])
        elif kind == "notebook":  # holds GPUs for hours and mostly leaves them idle
            part = "interactive" if r.random() < 0.25 else "gpu_a100"
            gpus_per, nnodes = r.choice([1, 1, 2]), 1
            hours, limit_h, gpu_w, cpu_use = r.uniform(3, 10), 12, 0.16, 0.03
            outcome = r.choice(["TIMEOUT", "CANCELLED", "COMPLETED"])
            name = "jupyter"
        elif kind == "preprocess":
            part, gpus_per, nnodes = "cpu", 0, 1
            hours, limit_h, gpu_w, cpu_use = r.uniform(0.3, 1.5), 4, 0.0, 0.85
            outcome = self._outcome(0.05, 0.02, 0.02, 0.03)
            name = r.choice(["align", "bam-sort", "qc", "tokenize"])
            array = list(range(r.randint(8, 40)))
        else:  # cpu_sim
            part, gpus_per, nnodes = "cpu", 0, r.choice([1, 1, 2])
            hours, limit_h, gpu_w, cpu_use = r.lognormvariate(math.log(6), 0.6), 24, 0.0, 0.9
            outcome = self._outcome(0.06, 0.05, 0.03, 0.0)
            name = r.choice(["wrf", "cesm-run", "gromacs", "lammps"])
        _, _, gpn, cores = PARTITIONS[part]
        cpus = (gpus_per * (cores // max(gpn, 1)) if gpus_per else r.choice([8, 16, 32, 64, 96])) * nnodes
        if array:
            cpus = r.choice([4, 8, 16])
        mem = (gpus_per * 64.0 if gpus_per else cpus * 3.0) * (1 if array else nnodes)
        base = self.next_id
        self.next_id += 1 + len(array)
        for k, task in enumerate(array or [None]):
            start = when + timedelta(minutes=r.expovariate(1 / 20) + (k // 4) * hours * 60)
            secs = hours * 3600 * (r.uniform(0.7, 1.3) if array else 1.0)
            state = outcome if not array else self._outcome(0.04, 0.0, 0.0, 0.03)
            if state in ("FAILED", "OUT_OF_MEMORY"):
                secs *= r.uniform(0.02, 0.4)
            elif state == "CANCELLED":
                secs *= r.uniform(0.1, 0.9)
            if state == "TIMEOUT" or secs > limit_h * 3600:
                secs, state = limit_h * 3600.0, "TIMEOUT"
            secs = float(max(int(secs), 20))
            running = start + timedelta(seconds=secs) > self.end
            if start >= self.end:
                continue
            if running:
                secs, state = float(int((self.end - start).total_seconds())), "RUNNING"
            nodes = self._nodes(part, nnodes)
            energy = None
            # (LLM runs keep their kind's power: their precision comparison rests on it)
            load = gpu_w * self.power_rng.uniform(0.75, 1.25) if gpus_per and kind != "llm" else gpu_w
            if gpus_per and kind not in ("llm", "notebook"):
                load = min(load * self._level(user, name), 0.95)
            if part in ("gpu_a100", "interactive"):  # IPMI energy accounting on the A100 nodes
                base_w = 180.0 * nnodes * gpus_per / 8  # the job's share of fans, NICs, idle CPUs
                gpu_w_each = 400 * load
                watts = base_w + gpus_per * nnodes * gpu_w_each * r.uniform(0.85, 1.1) + cpus * cpu_use * 4.4
                energy = watts * secs
            elif part == "gpu_v100" and metered_v100(nodes):  # ... and on half the V100 nodes
                pr = self.power_rng
                watts = (
                    100.0 * gpus_per / 4
                    + gpus_per * 300 * load * pr.uniform(0.85, 1.1)
                    + cpus * cpu_use * 7.5
                )
                energy = watts * secs
            job_id = f"{base}_{task}" if task is not None else str(base)
            self.jobs.append(
                DemoJob(
                    job_id=job_id,
                    raw_id=base + (k + 1 if task is not None else 0),
                    name=name,
                    user=user,
                    uid=uid,
                    account=lab,
                    partition=part,
                    nodes=nodes,
                    cpus=cpus,
                    gpus=gpus_per * nnodes,
                    mem_gb=mem,
                    submit=when,
                    start=start,
                    elapsed=int(secs),
                    state=state,
                    exit_code={"FAILED": "1:0", "OUT_OF_MEMORY": "0:125", "CANCELLED": "0:15"}.get(
                        state, "0:0"
                    ),
                    total_cpu=cpus * secs * cpu_use * r.uniform(0.7, 1.0),
                    energy_j=energy,
                    limit_min=limit_h * 60,
                    running=running,
                    kind=kind,
                    gpu_load=load,
                )
            )

    def generate(self) -> list[DemoJob]:
        for user, (_, _, habits) in self.users.items():
            for kind, per_day in habits.items():
                n = self._poisson(per_day * self.days)
                for _ in range(n):
                    when = self.begin + timedelta(seconds=self.rng.uniform(0, self.days * 86400))
                    self.add(user, kind, when)
        self.jobs.sort(key=lambda j: (j.submit, j.job_id))
        return self.jobs

    def _poisson(self, lam: float) -> int:
        # Knuth's method is too slow for large lambda; the normal approximation is fine there.
        if lam > 30:
            return max(0, round(self.rng.gauss(lam, math.sqrt(lam))))
        k, p, limit = 0, 1.0, math.exp(-lam)
        while True:
            p *= self.rng.random()
            if p <= limit:
                return k
            k += 1


# Job name -> (model, task, parameters, GPU-hours per epoch in bf16/fp16) of the ML jobs; tokens per
# GPU-second for the LLMs instead of epochs. fp32 runs take ~1.7x as long per epoch on the same GPUs.
_MODELS: dict[str, tuple[str, str, float, float]] = {
    "llama-ft": ("llama-3-8b", "finetune", 8.0e9, 0.0),
    "pretrain-7b": ("mistral-7b", "pretrain", 7.2e9, 0.0),
    "mistral-sft": ("mistral-7b", "sft", 7.2e9, 0.0),
    "rlhf-ppo": ("llama-3-8b", "rlhf", 8.0e9, 0.0),
    "resnet50": ("resnet50", "train", 25.6e6, 0.9),
    "vit-b16": ("vit-b16", "train", 86e6, 1.6),
    "unet-seg": ("unet", "segmentation", 31e6, 0.5),
    "detr": ("detr-r50", "detection", 41e6, 2.2),
    "bert-base": ("bert-base", "finetune", 110e6, 0.3),
    "gnn-train": ("gin", "train", 2e6, 0.2),
}
_SLOWER = {"fp32": 1.7, "bf16": 1.0, "fp16": 1.0}


def model_metadata(jobs: list[DemoJob], seed: int) -> None:
    """Give the ML jobs model metadata the three ways a site gets it: about half declare it in their
    comment, a quarter from inside with `cocaq tag` (epochs and tokens as they go), and the collector
    detects the framework of all of them. A separate random stream: the jobs themselves do not change."""
    r = random.Random(seed + 7)
    for j in jobs:
        spec = _MODELS.get(j.name)
        if spec is None or not j.gpus:
            continue
        model, task, params, epoch_gpu_h = spec
        precision = r.choice(["bf16", "bf16", "fp32"] if j.kind == "llm" else ["fp16", "bf16", "fp32"])
        batch = r.choice([8, 16] if j.kind == "llm" else [32, 64, 128])
        gpu_s = j.gpus * j.elapsed
        counters: dict[str, Any] = {}
        if epoch_gpu_h:
            counters["epochs"] = round(gpu_s / 3600 / (epoch_gpu_h * _SLOWER[precision]), 2)
        else:
            counters["tokens"] = int(gpu_s * 2600 / _SLOWER[precision])
        how = r.random()
        if how < 0.55:
            j.comment = (
                f"cocaq: model={model} task={task} params={params:.3g} framework=pytorch "
                f"precision={precision} batch_size={batch}"
            )
            j.declared = counters if r.random() < 0.7 else None
        elif how < 0.8:
            j.declared = {"model": model, "precision": precision, "batch_size": batch, **counters}
        j.detected = {"framework": "pytorch", "framework_version": r.choice(["2.3.1", "2.3.1", "2.1.2"]),
                      "launcher": "torchrun" if j.gpus > 1 else "python"}  # fmt: skip


def ship_metadata(url: str, jobs: list[DemoJob]) -> int:
    """The collector's `meta` records of the jobs, shipped as a node would ship them."""
    from cocaq.collector.ship import connect

    records = []
    for j in jobs:
        for source in ("detected", "api"):
            values = j.detected if source == "detected" else j.declared
            if not values:
                continue
            ts = j.start.timestamp() + (60 if source == "detected" else j.elapsed * 0.95)
            records.append(
                {
                    "uid": f"{DEMO_CLUSTER}/{j.nodes[0]}/{j.raw_id}/meta/{int(ts * 1e9)}-{source}",
                    "event": "meta",
                    "cluster": DEMO_CLUSTER,
                    "node": j.nodes[0],
                    "job_id": str(j.raw_id),
                    "ts": ts,
                    "meta": {source: values},
                }
            )
    target = connect(url)
    try:
        return target.ship_events(target.cluster_id(DEMO_CLUSTER), records)
    finally:
        target.close()


def sacct_lines(jobs: list[DemoJob]) -> list[str]:
    """The jobs as `sacct --parsable2 --format=SACCT_FIELDS` would print them, steps included.

    Memory use (MaxRSS, per task, on the steps) comes from a random stream of each job's own, so that
    it changes nothing else the demo draws: most jobs use 20-60 % of the memory they asked for, CPU jobs
    40-95 %, carol's debug jobs and every job that ran out of memory all of it.
    """
    fields = SACCT_FIELDS.split(",")
    out = ["|".join(fields)]
    for j in jobs:
        nodelist = _compress(j.nodes)
        end = "Unknown" if j.running else _ts(j.start + timedelta(seconds=j.elapsed))
        tres = f"billing={j.cpus},cpu={j.cpus},mem={int(j.mem_gb)}G,node={len(j.nodes)}"
        if j.gpus:
            tres += f",gres/gpu={j.gpus}"
        energy = "" if j.energy_j is None else str(int(j.energy_j))
        state = "CANCELLED by " + str(j.uid) if j.state == "CANCELLED" else j.state
        row = {
            "JobID": j.job_id,
            "JobIDRaw": str(j.raw_id),
            "JobName": j.name,
            "User": j.user,
            "UID": str(j.uid),
            "Account": j.account,
            "Partition": j.partition,
            "QOS": "normal",
            "NodeList": nodelist,
            "NNodes": str(len(j.nodes)),
            "AllocCPUS": str(j.cpus),
            "AllocTRES": tres,
            "ReqTRES": tres,
            "ReqMem": f"{int(j.mem_gb)}G",
            "Submit": _ts(j.submit),
            "Start": _ts(j.start),
            "End": end,
            "Elapsed": format_slurm_duration(j.elapsed),
            "ElapsedRaw": str(j.elapsed),
            "State": state,
            "ExitCode": j.exit_code,
            "TotalCPU": "" if j.running else format_slurm_duration(j.total_cpu),
            "Comment": j.comment,
            "ConsumedEnergyRaw": "" if j.running else energy,
            "Cluster": DEMO_CLUSTER,
            "Timelimit": format_slurm_duration(j.limit_min * 60),
            "MaxRSS": "",  # sacct leaves both empty on the job line
            "NTasks": "",
            "TRESUsageInAve": "",  # the demo's site records no GPU use in Slurm (its collector does)
            "TRESUsageInMax": "",
            "TRESUsageInMin": "",  # nor the least-used task of each step (cocaq.slurm.idle_nodes)
            "TRESUsageInMinNode": "",
            "TRESUsageInMinTask": "",
        }
        out.append("|".join(row[f] for f in fields))
        if j.running:
            continue
        mem_rng = random.Random(f"{j.job_id}/{_ts(j.submit)}")
        if j.state == "OUT_OF_MEMORY":
            used = mem_rng.uniform(0.97, 1.04)
        elif j.user == "carol" and j.kind == "debug":
            used = mem_rng.uniform(0.9, 1.0)
        elif j.kind in ("preprocess", "cpu_sim"):
            used = mem_rng.uniform(0.4, 0.95)
        else:
            used = mem_rng.uniform(0.2, 0.6)
        node_kb = used * j.mem_gb * 1024**2 / len(j.nodes)
        # A multi-node GPU job runs its work in an srun step (`.0`), one task per GPU; the batch script
        # itself only launches it.
        srun = j.gpus > 0 and len(j.nodes) > 1
        steps = ("batch", "extern", "0") if srun else ("batch", "extern")
        for step in steps:
            if step == "batch":
                rss_kb, ntasks = (mem_rng.uniform(2e5, 9e5) if srun else node_kb), 1
            elif step == "extern":
                rss_kb, ntasks = mem_rng.uniform(800, 1200), len(j.nodes)
            else:
                rss_kb, ntasks = node_kb / (j.gpus // len(j.nodes)), j.gpus
            srow = dict(
                row,
                JobID=f"{j.job_id}.{step}",
                JobIDRaw=f"{j.raw_id}.{step}",
                JobName=step,
                User="",
                Account=j.account,
                Partition="",
                QOS="",
                Submit=_ts(j.start),
                Comment="",
                AllocTRES=f"cpu={j.cpus},mem={int(j.mem_gb)}G,node={len(j.nodes)}",
                ReqTRES="",
                ReqMem="",
                Timelimit="",
                Cluster="",
                State=j.state if j.state != "TIMEOUT" else "CANCELLED",
                TotalCPU=format_slurm_duration(j.total_cpu if step == "batch" else 0.1),
                MaxRSS=f"{int(rss_kb)}K",
                NTasks=str(ntasks),
            )
            if step == "0":
                srow.update(JobName="python", TotalCPU=format_slurm_duration(j.total_cpu * 0.97))
            out.append("|".join(srow[f] for f in fields))
    return out


def _compress(nodes: list[str]) -> str:
    if len(nodes) == 1:
        return nodes[0]
    prefix = nodes[0].rstrip("0123456789")
    nums = [n[len(prefix) :] for n in nodes]
    return f"{prefix}[{nums[0]}-{nums[-1]}]"


# GPU behaviour per kind of job, for the samples: (share of the time busy, utilisation when busy).
GPU_USE = {
    "llm": (0.97, (48.0, 66.0)),  # communication-bound: partly busy, near full power (a power cap helps)
    "train": (0.97, (82.0, 97.0)),
    "debug": (0.6, (25.0, 70.0)),
    "notebook": (0.1, (30.0, 85.0)),  # held for hours, used now and then
}


# GPU memory a kind of job holds on each of its GPUs, in GB (A100s of 80 GB): LLMs fill them, notebooks
# and debugging hold a little, training in between.
_GPU_MEM_GB = {"llm": (62.0, 76.0), "train": (9.0, 38.0), "debug": (3.0, 14.0), "notebook": (1.5, 6.0)}


def write_samples(
    engine: Any,
    jobs: list[DemoJob],
    seed: int,
    step_s: float,
    idle_factor: Callable[[DemoJob], float] | None = None,
    *,
    keep: bool = False,
) -> int:
    """NVML samples (power, utilisation) of the GPU jobs on the A100 nodes, as the collector ships them:
    one per GPU every `step_s`, each job's GPUs named by their index on the node.

    The demo's samples are replaced by these; with `keep`, they are added to those already there (the
    study demo writes a month's jobs at a time, cocaq.cli.demo_study): each job then draws from random
    streams of its own (from `seed` and its id), so that what it gets does not depend on the jobs
    written with it or before it, and each node's samples are recorded as a shipped batch naming its
    jobs (node_shipments, as the collector's shipper records them; each job whole, its samples all
    written at once), so that the aggregator's incremental run derives those jobs' GPU use again.
    Without it the streams run through the jobs in turn, as they always have.

    `idle_factor(job)` is the e-mail study's planted effect (cocaq.cli.demo_study): it scales a job's idle
    GPU time (0.8 = a fifth less), both the GPUs left unused and the share of samples that find a GPU
    idle. With it, each job's idle time is its expected share, spread evenly through its samples
    (systematic, from a random phase): no coin flip per sample (an hour-apart sample that flips a coin
    stands for a whole hour, a measurement noise a collector sampling every few seconds does not have)
    and no job drawn to leave its extra GPUs unused (a fifth of their time in each such job instead). A
    site of 150 users is too small to see a planted fifth through those per-job draws (docs/study.md:
    the study demo's site is less noisy than a real one). Without it (the one-month demo) the draws are
    as they always were.

    What they show: notebooks that hold GPUs idle, training that keeps them busy, some training with one
    GPU doing nothing (the `fewer-gpus` suggestion), a data-starved user (frank) and communication-bound
    LLM jobs drawing most of their power at moderate utilisation (`power-cap`).
    """
    from cocaq.db.schema import Cluster, Sample

    rng = random.Random(seed + 1)
    mem_rng = random.Random(seed + 3)  # (a stream of its own: the power and utilisation stay as they were)
    v100_rng = random.Random(seed + 4)  # (the metered V100 nodes': the A100s' stay as they were)
    step = max(int(step_s), 1)
    with engine.begin() as conn:
        cid = conn.execute(select(Cluster.id).where(Cluster.name == DEMO_CLUSTER)).scalar_one()
        if not keep:
            conn.execute(delete(Sample).where(Sample.cluster_id == cid))
        rows: list[dict[str, Any]] = []
        n = 0
        for j in jobs:
            if keep:
                rng, mem_rng, v100_rng = (random.Random(f"{seed}/{j.raw_id}/{k}") for k in (1, 3, 4))
            factor = None if idle_factor is None else idle_factor(j)
            if j.gpus and j.partition == "gpu_v100" and metered_v100(j.nodes) and j.elapsed >= step:
                rows += _v100_samples(j, cid, step, v100_rng, factor)
            if not j.gpus or j.partition not in ("gpu_a100", "interactive") or j.elapsed < step:
                continue
            busy_share, (lo, hi) = GPU_USE.get(j.kind, (0.8, (40.0, 90.0)))
            if j.user == "frank" and j.kind == "train":
                busy_share, (lo, hi) = 0.95, (22.0, 36.0)
            if factor is not None:
                busy_share = 1.0 - (1.0 - busy_share) * factor
            per_node = max(j.gpus // len(j.nodes), 1)
            # a fifth of the multi-GPU training jobs left GPUs after the first unused (single-GPU code); with
            # the planted effect, a fifth of those GPUs' time in each such job, as the idle samples
            spread = factor is not None
            unused = 0.2 * (1.0 if factor is None else factor)
            eligible = j.kind == "train" and per_node > 1 and j.user != "frank"
            one_gpu = eligible and not spread and rng.random() < unused
            offset = j.raw_id % step  # jobs' samples interleave rather than collide on a shared node
            lo_gb, hi_gb = _GPU_MEM_GB.get(j.kind, (4.0, 30.0))
            mem_mb = mem_rng.uniform(lo_gb, hi_gb) * 1024  # what the job's GPUs hold once it is loaded
            for node in j.nodes:
                for k in range(per_node):
                    dev = f"GPU-{k}"
                    busy = busy_share * (1.0 - unused) if spread and eligible and k > 0 else busy_share
                    idle_at = _idle_draw(busy, rng, spread)
                    for i in range(int(j.elapsed // step)):
                        ts = j.start + timedelta(seconds=offset + i * step)
                        if (one_gpu and k > 0) or idle_at(i):
                            util = rng.uniform(0.0, 2.0)
                            power = rng.uniform(52.0, 66.0)
                        else:
                            util = rng.uniform(lo, hi)
                            power = 60.0 + (400.0 * max(j.gpu_load, 0.3) - 60.0) * rng.uniform(0.9, 1.1)
                        base = {"ts": ts, "cluster_id": cid, "node": node, "source": "nvml", "device": dev,
                                "job_id": str(j.raw_id)}  # fmt: skip
                        rows.append({**base, "metric": "power_w", "value": round(power, 1)})
                        rows.append({**base, "metric": "util_pct", "value": round(util, 1)})
                        held = mem_mb * (0.5 if i == 0 else 1.0) * (0.2 if one_gpu and k > 0 else 1.0)
                        rows.append({**base, "metric": "mem_used_mb", "value": round(held, 0)})
            if len(rows) >= 20_000:
                n += _insert_samples(conn, cid, rows, keep)
                rows = []
        if rows:
            n += _insert_samples(conn, cid, rows, keep)
    return n


def _insert_samples(conn: Any, cid: int, rows: list[dict[str, Any]], shipped: bool) -> int:
    """Insert the samples; `shipped`: and record them as one batch per node naming its jobs, as the
    collector's shipper does (cocaq.collector.ship), each without a time (the aggregator derives the
    whole job again: its samples are all here)."""
    import hashlib

    from sqlalchemy import insert

    from cocaq.db.schema import NodeShipment, Sample

    conn.execute(insert(Sample).prefix_with("OR IGNORE"), rows)
    if shipped:
        jobs: dict[str, set[str]] = {}
        count: dict[str, int] = {}
        for r in rows:
            jobs.setdefault(r["node"], set()).add(r["job_id"])
            count[r["node"]] = count.get(r["node"], 0) + 1
        batches = []
        for node, ids in sorted(jobs.items()):
            text = " ".join(sorted(ids))
            batch = "demo-" + hashlib.sha1(text.encode()).hexdigest()[:24]
            batches.append(
                {"cluster_id": cid, "node": node, "batch": batch, "rows": count[node], "job_ids": text}
            )
        conn.execute(insert(NodeShipment).prefix_with("OR IGNORE"), batches)
    return len(rows)


def _idle_draw(busy_share: float, rng: random.Random, spread: bool) -> Callable[[int], bool]:
    """Whether sample i of a GPU finds it idle: a coin flip per sample, or (`spread`) the idle share of
    its samples spread evenly from a random phase (write_samples says why)."""
    if not spread:
        return lambda _i: rng.random() > busy_share
    share, phase = 1.0 - busy_share, rng.random()
    return lambda i: math.floor(phase + (i + 1) * share) > math.floor(phase + i * share)


def _v100_samples(
    j: DemoJob, cid: int, step: int, rng: random.Random, idle_factor: float | None = None
) -> list[dict[str, Any]]:
    """NVML samples of a job on a metered V100 node (300 W TDP, ~40 W idle), as write_samples' A100s."""
    busy_share, (lo, hi) = GPU_USE.get(j.kind, (0.8, (40.0, 90.0)))
    if j.user == "frank" and j.kind == "train":
        busy_share, (lo, hi) = 0.95, (22.0, 36.0)
    if idle_factor is not None:
        busy_share = 1.0 - (1.0 - busy_share) * idle_factor
    rows: list[dict[str, Any]] = []
    offset = j.raw_id % step
    for node in j.nodes:
        for k in range(max(j.gpus // len(j.nodes), 1)):
            idle_at = _idle_draw(busy_share, rng, idle_factor is not None)
            for i in range(int(j.elapsed // step)):
                ts = j.start + timedelta(seconds=offset + i * step)
                if idle_at(i):
                    util, power = rng.uniform(0.0, 2.0), rng.uniform(36.0, 45.0)
                else:
                    util = rng.uniform(lo, hi)
                    power = 40.0 + (300.0 * max(j.gpu_load, 0.3) - 40.0) * rng.uniform(0.9, 1.1)
                base = {"ts": ts, "cluster_id": cid, "node": node, "source": "nvml", "device": f"GPU-{k}",
                        "job_id": str(j.raw_id)}  # fmt: skip
                rows.append({**base, "metric": "power_w", "value": round(power, 1)})
                rows.append({**base, "metric": "util_pct", "value": round(util, 1)})
    return rows
