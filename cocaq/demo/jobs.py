"""The demo's jobs: each user's habits drawn into jobs (kind, size, outcome, run time, measured energy),
from fixed random streams, so the same end time gives the same jobs run to run (scripts/demo-snapshot.sh).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cocaq.demo.site import PARTITIONS, USERS, metered_v100
from cocaq.units import S_PER_HOUR


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


@dataclass(frozen=True)
class _Shape:
    """One submission's partition, size, typical run time and power, planned outcome and name."""

    part: str
    gpus_per: int
    nnodes: int
    hours: float
    limit_h: int
    gpu_w: float  # GPU power as a share of its TDP
    cpu_use: float
    outcome: str
    name: str
    array: list[int | None]  # an array's task ids; empty for a plain job


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
        """One submission of `kind` by `user` at `when`: a job, or an array's tasks."""
        lab, uid, _ = self.users[user]
        r = self.rng
        sh = self._shape(user, kind)
        _, _, gpn, cores = PARTITIONS[sh.part]
        cpus = (
            sh.gpus_per * (cores // max(gpn, 1)) if sh.gpus_per else r.choice([8, 16, 32, 64, 96])
        ) * sh.nnodes
        if sh.array:
            cpus = r.choice([4, 8, 16])
        mem = (sh.gpus_per * 64.0 if sh.gpus_per else cpus * 3.0) * (1 if sh.array else sh.nnodes)
        base = self.next_id
        self.next_id += 1 + len(sh.array)
        for k, task in enumerate(sh.array or [None]):
            run = self._run(sh, when, k)
            if run is None:
                continue
            start, secs, state, running = run
            nodes = self._nodes(sh.part, sh.nnodes)
            # (LLM runs keep their kind's power: their precision comparison rests on it)
            load = (
                sh.gpu_w * self.power_rng.uniform(0.75, 1.25) if sh.gpus_per and kind != "llm" else sh.gpu_w
            )
            if sh.gpus_per and kind not in ("llm", "notebook"):
                load = min(load * self._level(user, sh.name), 0.95)
            energy = self._energy(sh, nodes, cpus, load, secs)
            self.jobs.append(
                DemoJob(
                    job_id=f"{base}_{task}" if task is not None else str(base),
                    raw_id=base + (k + 1 if task is not None else 0),
                    name=sh.name,
                    user=user,
                    uid=uid,
                    account=lab,
                    partition=sh.part,
                    nodes=nodes,
                    cpus=cpus,
                    gpus=sh.gpus_per * sh.nnodes,
                    mem_gb=mem,
                    submit=when,
                    start=start,
                    elapsed=int(secs),
                    state=state,
                    exit_code={"FAILED": "1:0", "OUT_OF_MEMORY": "0:125", "CANCELLED": "0:15"}.get(
                        state, "0:0"
                    ),
                    total_cpu=cpus * secs * sh.cpu_use * r.uniform(0.7, 1.0),
                    energy_j=energy,
                    limit_min=sh.limit_h * 60,
                    running=running,
                    kind=kind,
                    gpu_load=load,
                )
            )

    def _shape(self, user: str, kind: str) -> _Shape:
        """What one submission of `kind` asks for, and how it is meant to end (its tasks draw the rest)."""
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
        return _Shape(part, gpus_per, nnodes, hours, limit_h, gpu_w, cpu_use, outcome, name, array)

    def _run(self, sh: _Shape, when: datetime, k: int) -> tuple[datetime, float, str, bool] | None:
        """Task `k`'s start, run time, state and whether it still runs at the end; None if it starts after."""
        r = self.rng
        start = when + timedelta(minutes=r.expovariate(1 / 20) + (k // 4) * sh.hours * 60)
        secs = sh.hours * S_PER_HOUR * (r.uniform(0.7, 1.3) if sh.array else 1.0)
        state = sh.outcome if not sh.array else self._outcome(0.04, 0.0, 0.0, 0.03)
        if state in ("FAILED", "OUT_OF_MEMORY"):
            secs *= r.uniform(0.02, 0.4)
        elif state == "CANCELLED":
            secs *= r.uniform(0.1, 0.9)
        if state == "TIMEOUT" or secs > sh.limit_h * S_PER_HOUR:
            secs, state = sh.limit_h * float(S_PER_HOUR), "TIMEOUT"
        secs = float(max(int(secs), 20))
        running = start + timedelta(seconds=secs) > self.end
        if start >= self.end:
            return None
        if running:
            secs, state = float(int((self.end - start).total_seconds())), "RUNNING"
        return start, secs, state, running

    def _energy(self, sh: _Shape, nodes: list[str], cpus: int, load: float, secs: float) -> float | None:
        """What Slurm's energy accounting measured, on the nodes that have it (None elsewhere)."""
        if sh.part in ("gpu_a100", "interactive"):  # IPMI energy accounting on the A100 nodes
            base_w = 180.0 * sh.nnodes * sh.gpus_per / 8  # the job's share of fans, NICs, idle CPUs
            gpu_w_each = 400 * load
            watts = (
                base_w + sh.gpus_per * sh.nnodes * gpu_w_each * self.rng.uniform(0.85, 1.1)
                + cpus * sh.cpu_use * 4.4
            )  # fmt: skip
            return watts * secs
        if sh.part == "gpu_v100" and metered_v100(nodes):  # ... and on half the V100 nodes
            pr = self.power_rng
            watts = (
                100.0 * sh.gpus_per / 4
                + sh.gpus_per * 300 * load * pr.uniform(0.85, 1.1)
                + cpus * sh.cpu_use * 7.5
            )
            return watts * secs
        return None

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
