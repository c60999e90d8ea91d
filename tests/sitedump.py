"""A site-like sacct dump: about 100 jobs of 35 users on a made-up cluster, deterministic, in the exact
`--parsable2` format of the real captures (tests/data/sacct/slurm2205_shapes_*), job lines and step lines.

It mixes what a real site's month has and the one-node test cluster cannot make: multi-node CPU jobs, GPU
jobs with Slurm's gres/gpuutil and gres/gpumem in TRESUsageInAve/Max, a GPU partition whose jobs carry no
gres/gpu in AllocTRES (the site does not list it in AccountingStorageTRES), arrays, TIMEOUT jobs, jobs
still RUNNING at the capture, jobs whose TotalCPU is 00:00:00 because Slurm gathered none (long jobs whose
steps all show 0, and allocations with no step at all), and a few jobs measured by acct_gather_energy
(ConsumedEnergyRaw). The numbers are drawn from a seeded random.Random, so the file is the same on every
run:

    .venv/bin/python -m tests.sitedump            # rewrites tests/data/sacct/site_like_parsable2.txt

tests/test_green_algorithms.py checks that the committed file is what this makes.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

OUT = Path(__file__).parent / "data" / "sacct" / "site_like_parsable2.txt"
SEED = 20261031
CLUSTER = "greenhpc"
# A second cluster of the same site, in the same dump (`sacct -L`): its slurm.conf has no gres/gpu in
# AccountingStorageTRES, so its GPU jobs carry no GPU count (AccountingStorageTRES is per cluster).
LEGACY = "greenhpc-legacy"
# The moment the dump was "taken": RUNNING jobs have run until then.
CAPTURE = datetime(2026, 10, 31, 12, 0, 0)
HEADER = (
    "JobID|JobIDRaw|JobName|User|UID|Account|Partition|QOS|NodeList|NNodes|AllocCPUS|AllocTRES|ReqTRES|"
    "ReqMem|Submit|Start|End|Elapsed|ElapsedRaw|State|ExitCode|TotalCPU|Comment|ConsumedEnergyRaw|Cluster|"
    "Timelimit|TRESUsageInAve|TRESUsageInMax|MaxRSS|NTasks"
)
LABS = ("lab_astro", "lab_bio", "lab_chem", "lab_climate", "lab_nlp", "lab_vision", "lab_robotics")
USERS = (
    "aaziz", "abrown", "bchen", "bkaur", "cdiaz", "cmoreau", "dkim", "dnovak", "eito", "eokafor", "fmuller",
    "fsilva", "gpatel", "grossi", "hlee", "hnguyen", "ijensen", "ilopez", "jwang", "jsmith", "kmensah",
    "kyamada", "lbianchi", "lpetrov", "mchen", "mgarcia", "nfischer", "nsato", "oadeyemi", "pkowalski",
    "qzhang", "rsingh", "sdubois", "tnakamura", "vromero",
)  # fmt: skip
# partition -> (node name prefix, nodes, cores per node, GPUs per node, whether AllocTRES lists gres/gpu)
PARTITIONS = {
    "cpu": ("cpu-c", 120, 64, 0, False),
    "gpu-a100": ("gpu-a", 16, 64, 4, True),
    "gpu-v100": ("gpu-v", 8, 32, 4, False),  # on LEGACY, which does not account gres/gpu: no GPU count
}


def fmt_elapsed(s: int) -> str:
    """Elapsed and Timelimit as sacct prints them: [D-]HH:MM:SS."""
    d, rest = divmod(s, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}" if d else f"{h:02d}:{m:02d}:{sec:02d}"


def fmt_cpu(ms: int) -> str:
    """TotalCPU as sacct prints it (Slurm's _elapsed_time): D-HH:MM:SS, HH:MM:SS, MM:SS.mmm or 00:MM:SS."""
    s, msec = divmod(ms, 1000)
    d, rest = divmod(s, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{sec:02d}"
    if h:
        return f"{h:02d}:{m:02d}:{sec:02d}"
    if msec:
        return f"{m:02d}:{sec:02d}.{msec:03d}"
    return f"00:{m:02d}:{sec:02d}"


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S")


def hostlist(prefix: str, first: int, n: int, width: int) -> str:
    if n == 1:
        return f"{prefix}{first:0{width}d}"
    return f"{prefix}[{first:0{width}d}-{first + n - 1:0{width}d}]"


@dataclass
class Step:
    name: str
    suffix: str  # batch, extern, 0, 1
    start: datetime
    elapsed: int
    cpu_ms: int
    ntasks: int
    nodes: str
    nnodes: int
    tres: str
    state: str
    exit_code: str
    usage: str = ""  # TRESUsageInAve
    usage_max: str = ""
    max_rss: str = ""
    energy: int = 0


@dataclass
class Job:
    job_id: str
    raw: int
    name: str
    user: str
    uid: int
    account: str
    partition: str
    nodes: str
    nnodes: int
    cores: int
    alloc_tres: str
    req_mem: str
    submit: datetime
    start: datetime
    elapsed: int
    state: str
    exit_code: str
    timelimit: int
    running: bool = False
    cluster: str = CLUSTER
    energy: int | None = None  # ConsumedEnergyRaw of the job line (None: empty)
    steps: list[Step] = field(default_factory=list)

    def lines(self) -> list[str]:
        cpu_ms = sum(s.cpu_ms for s in self.steps) if not self.running else 0
        end = "Unknown" if self.running else ts(self.start + timedelta(seconds=self.elapsed))
        req_tres = ",".join(p for p in self.alloc_tres.split(",") if not p.startswith("gres/gpu:"))
        energy = "" if self.energy is None else str(self.energy)
        out = [
            "|".join(
                [
                    self.job_id, str(self.raw), self.name, self.user, str(self.uid), self.account,
                    self.partition, "normal", self.nodes, str(self.nnodes), str(self.cores),
                    self.alloc_tres, req_tres, self.req_mem, ts(self.submit), ts(self.start), end,
                    fmt_elapsed(self.elapsed), str(self.elapsed), self.state, self.exit_code, fmt_cpu(cpu_ms),
                    "", energy, self.cluster, fmt_elapsed(self.timelimit), "", "", "", "",
                ]
            )
        ]  # fmt: skip
        for s in self.steps:
            step_end = "Unknown" if self.running else ts(s.start + timedelta(seconds=s.elapsed))
            out.append(
                "|".join(
                    [
                        f"{self.job_id}.{s.suffix}", f"{self.raw}.{s.suffix}", s.name, "", "", self.account,
                        "", "", s.nodes, str(s.nnodes), str(self.cores if s.suffix != "batch" else
                        self.cores // self.nnodes), s.tres, "", "", ts(s.start), ts(s.start), step_end,
                        fmt_elapsed(s.elapsed), str(s.elapsed), s.state, s.exit_code, fmt_cpu(s.cpu_ms), "",
                        str(s.energy), self.cluster, "", s.usage, s.usage_max, s.max_rss, str(s.ntasks),
                    ]
                )
            )  # fmt: skip
        return out


class Site:
    """Draws the jobs: each kind of job a site has, in the numbers a month might show."""

    def __init__(self, seed: int = SEED) -> None:
        self.r = random.Random(seed)
        self.next_id = 4_210_000
        self.jobs: list[Job] = []
        self.users = {u: (31_000 + i, LABS[i % len(LABS)]) for i, u in enumerate(USERS)}

    def new_id(self) -> int:
        self.next_id += self.r.randint(1, 40)
        return self.next_id

    def when(self, elapsed: int, running: bool = False) -> tuple[datetime, datetime]:
        """(submit, start) in October, ending before the capture (or spanning it for a running job)."""
        r = self.r
        if running:
            start = CAPTURE - timedelta(seconds=elapsed)
        else:
            latest = (CAPTURE - datetime(2026, 10, 1)).total_seconds() - elapsed - 3600
            start = datetime(2026, 10, 1) + timedelta(seconds=r.randint(0, max(int(latest), 0)))
        return start - timedelta(seconds=r.randint(0, 7200)), start

    def node_alloc(self, partition: str, nnodes: int) -> tuple[str, int]:
        prefix, n, _, _, _ = PARTITIONS[partition]
        first = self.r.randint(1, n - nnodes + 1)
        return hostlist(prefix, first, nnodes, 3 if partition == "cpu" else 2), first

    def mem(self, cores: int, per_core_gb: int) -> tuple[str, str, float]:
        """(ReqMem, AllocTRES mem, GB): a --mem in G, or a --mem-per-cpu in M shown as the job's total."""
        if self.r.random() < 0.3:
            mb = cores * self.r.choice((2000, 3800, 4000))
            return f"{mb}M", f"{mb}M", mb / 1024
        gb = max(1, cores * per_core_gb)
        return f"{gb}G", f"{gb}G", float(gb)

    def usage(self, cpu_s: float, rss_k: int, gpu: tuple[int, int] | None, unit_bytes: bool) -> str:
        """A step's TRESUsageInAve/Max text, in Slurm's order (cpu, energy, fs/disk, gres/..., mem...)."""
        parts = [f"cpu={fmt_cpu(int(cpu_s * 1000) // 1000 * 1000)}", "energy=0"]
        parts.append(f"fs/disk={self.r.randint(10_000, 90_000_000_000)}")
        if gpu is not None:
            mem_mb, util = gpu
            parts.append(f"gres/gpumem={mem_mb * 1048576}" if unit_bytes else f"gres/gpumem={mem_mb}M")
            parts.append(f"gres/gpuutil={util}")
        parts.append(f"mem={rss_k}K")
        parts.append(f"pages={self.r.randint(0, 4000)}")
        parts.append("vmem=0")
        return ",".join(parts)

    def job(
        self,
        partition: str,
        *,
        name: str,
        cores_per_node: int,
        nnodes: int = 1,
        gpus_per_node: int = 0,
        elapsed: int,
        cpu_share: float,
        state: str = "COMPLETED",
        timelimit: int | None = None,
        running: bool = False,
        no_cpu_gathered: bool = False,
        no_steps: bool = False,
        srun_tasks: int = 0,
        gpu_util: int | None = None,
        energy_w: float | None = None,
        user: str | None = None,
        array: tuple[int, int] | None = None,
        submit_start: tuple[datetime, datetime] | None = None,
    ) -> Job:
        r = self.r
        user = user or r.choice(USERS)
        uid, lab = self.users[user]
        cores = cores_per_node * nnodes
        gpus = gpus_per_node * nnodes
        nodes, _ = self.node_alloc(partition, nnodes)
        req_mem, mem_tres, _ = self.mem(cores, r.choice((2, 4, 8)))
        tracked = PARTITIONS[partition][4]
        tres = f"billing={cores},cpu={cores}"
        if gpus and tracked:
            tres += f",gres/gpu:a100={gpus},gres/gpu={gpus}"
        tres += f",mem={mem_tres},node={nnodes}"
        submit, start = submit_start or self.when(elapsed, running)
        raw = self.new_id()
        job_id = str(raw) if array is None else f"{array[0]}_{array[1]}"
        if timelimit is None:
            timelimit = max(3600, (elapsed // 3600 + r.randint(1, 24)) * 3600)
        exit_code = {"COMPLETED": "0:0", "FAILED": "1:0", "TIMEOUT": "0:0", "RUNNING": "0:0"}.get(
            state, "0:0"
        )
        j = Job(
            job_id, raw, name, user, uid, lab, partition, nodes, nnodes, cores, tres, req_mem, submit, start,
            elapsed, state, exit_code, timelimit, running=running, cluster=CLUSTER if tracked or not gpus else LEGACY,
        )  # fmt: skip
        if no_steps:
            return j
        killed = state == "TIMEOUT"
        step_state = "CANCELLED" if killed else ("RUNNING" if running else state)
        step_exit = "0:15" if killed else exit_code
        step_tres = tres.replace(f"billing={cores},", "")
        first_node = nodes.split("[")[0] + (nodes.split("[")[1].split("-")[0] if "[" in nodes else "")
        total_ms = 0 if (no_cpu_gathered or running) else int(cpu_share * cores * elapsed * 1000)
        gather = not (no_cpu_gathered or running)
        unit_bytes = r.random() < 0.3
        # .batch: the script itself; with srun steps it only waits (a little CPU)
        batch_ms = total_ms if not srun_tasks else min(total_ms, r.randint(200, 90_000))
        batch_cores = cores_per_node
        batch_tres = f"cpu={batch_cores},mem={mem_tres if nnodes == 1 else req_mem},node=1"
        if gpus and tracked:
            batch_tres = f"cpu={batch_cores},gres/gpu:a100={gpus_per_node},gres/gpu={gpus_per_node},mem={mem_tres},node=1"
        rss_k = r.randint(100_000, 40_000_000)
        gpu_use = None
        if gpus and tracked and gpu_util is not None and not srun_tasks:
            gpu_use = (r.randint(2_000, 78_000), gpu_util)
        usage = self.usage(batch_ms / 1000, rss_k, gpu_use, unit_bytes) if gather else ""
        j.steps.append(
            Step("batch", "batch", start, elapsed + r.randint(0, 2) * killed, batch_ms, 1, first_node, 1,
                 batch_tres, step_state, step_exit, usage, usage, f"{rss_k}K" if gather else "")
        )  # fmt: skip
        ext_usage = "energy=0,fs/disk=5329,mem=0,pages=0,vmem=0" if gather else ""
        j.steps.append(
            Step("extern", "extern", start, elapsed, 0 if not gather else r.randint(1, 3), nnodes, nodes, nnodes,
                 tres, "RUNNING" if running else "COMPLETED", "0:0", ext_usage, ext_usage,
                 "0" if gather else "")
        )  # fmt: skip
        if srun_tasks:
            step_ms = total_ms - batch_ms
            rss_t = r.randint(500_000, 60_000_000)
            g_ave = g_max = None
            if gpus and tracked and gpu_util is not None:
                mem_mb = r.randint(4_000, 70_000)
                g_ave, g_max = (mem_mb, gpu_util), (mem_mb + r.randint(0, 3000), min(100, gpu_util + 9))
            per_task = step_ms / 1000 / srun_tasks
            ave = self.usage(per_task, rss_t, g_ave, unit_bytes) if gather else ""
            # one task: its average is its maximum (as in the real captures)
            if srun_tasks == 1:
                g_max, rss_max = g_ave, rss_t
                mx = ave
            else:
                rss_max = int(rss_t * 1.1)
                mx = self.usage(per_task * 1.04, rss_max, g_max, unit_bytes) if gather else ""
            j.steps.append(
                Step(r.choice(("python", "mpirun_app", "torchrun", "lmp")), "0", start + timedelta(seconds=4),
                     max(elapsed - 6, 0), step_ms, srun_tasks, nodes, nnodes, step_tres, step_state, step_exit,
                     ave, mx, f"{rss_max}K" if gather else "")
            )  # fmt: skip
        if energy_w is not None:
            # acct_gather_energy on these nodes: each step and the job carry ConsumedEnergyRaw in J
            joules = int(energy_w * nnodes * elapsed)
            for s in j.steps:
                s.energy = int(energy_w * s.nnodes * s.elapsed)
            j.energy = joules
        elif not running:
            j.energy = 0
        return j

    def build(self) -> list[Job]:
        r = self.r
        jobs = self.jobs
        # ordinary CPU jobs: one core to a node's worth, minutes to a day
        for i in range(30):
            el = r.randint(600, 30 * 3600)
            state = r.choice(("COMPLETED",) * 8 + ("FAILED",))
            jobs.append(self.job("cpu", name=f"sim_{i}", cores_per_node=r.choice((1, 2, 4, 8, 16, 32, 64)),
                                 elapsed=el, cpu_share=r.uniform(0.05, 0.99), state=state,
                                 srun_tasks=r.choice((0, 0, 1))))  # fmt: skip
        # MPI jobs over several nodes
        for i in range(6):
            n = r.randint(2, 4)
            jobs.append(self.job("cpu", name=f"mpi_{i}", cores_per_node=64, nnodes=n, elapsed=r.randint(3600, 40 * 3600),
                                 cpu_share=r.uniform(0.6, 0.98), srun_tasks=64 * n))  # fmt: skip
        # A100 jobs with Slurm's GPU usage (gres/gpuutil, gres/gpumem)
        for i in range(20):
            g = r.choice((1, 1, 2, 4))
            jobs.append(self.job("gpu-a100", name=f"train_{i}", cores_per_node=8 * g, gpus_per_node=g,
                                 elapsed=r.randint(900, 48 * 3600), cpu_share=r.uniform(0.05, 0.6),
                                 gpu_util=r.randint(0, 100), srun_tasks=r.choice((0, g)),
                                 state=r.choice(("COMPLETED",) * 5 + ("FAILED",))))  # fmt: skip
        # V100 jobs: the partition is GPU, but the site does not account gres/gpu (no GPU count anywhere)
        for i in range(8):
            jobs.append(self.job("gpu-v100", name=f"infer_{i}", cores_per_node=r.choice((4, 8, 16)),
                                 gpus_per_node=r.choice((1, 2)), elapsed=r.randint(900, 20 * 3600),
                                 cpu_share=r.uniform(0.1, 0.7)))  # fmt: skip
        # arrays: tasks of a parameter sweep
        for a in range(3):
            base = self.new_id()
            user = r.choice(USERS)
            n = r.randint(4, 6)
            sub = datetime(2026, 10, 3 + 7 * a, 9, 0, 0)
            for t in range(n):
                el = r.randint(300, 4 * 3600)
                start = sub + timedelta(seconds=r.randint(5, 3600) * (t + 1))
                raw = base if t == n - 1 else None  # Slurm gives the last task the array's own id
                jb = self.job("cpu", name=f"sweep_{a}", cores_per_node=r.choice((1, 2, 4)), elapsed=el,
                              cpu_share=r.uniform(0.5, 1.0), user=user, array=(base, t),
                              submit_start=(sub, start))  # fmt: skip
                if raw is not None:
                    jb.raw = raw
                jobs.append(jb)
        # TIMEOUT: ran to the limit and were killed
        for i in range(6):
            limit = r.choice((3600, 4 * 3600, 24 * 3600, 48 * 3600))
            part = r.choice(("cpu", "gpu-a100"))
            g = 1 if part == "gpu-a100" else 0
            jobs.append(self.job(part, name=f"long_{i}", cores_per_node=r.choice((8, 16)), gpus_per_node=g,
                                 elapsed=limit + r.randint(5, 90), timelimit=limit, state="TIMEOUT",
                                 cpu_share=r.uniform(0.3, 0.9), gpu_util=r.randint(20, 99) if g else None))  # fmt: skip
        # TotalCPU 00:00:00 because Slurm gathered none: long jobs on nodes without jobacct_gather
        # (their steps show 0 too), and allocations that ran no step at all (salloc --no-shell)
        for i in range(7):
            part = r.choice(("cpu", "cpu", "gpu-a100", "gpu-v100"))
            g = 0 if part == "cpu" else 1
            jobs.append(self.job(part, name=f"nogather_{i}", cores_per_node=r.choice((16, 32, 64)), gpus_per_node=g,
                                 nnodes=r.choice((1, 1, 2)) if part == "cpu" else 1,
                                 elapsed=r.randint(1800, 72 * 3600), cpu_share=0.0, no_cpu_gathered=True,
                                 state=r.choice(("COMPLETED", "TIMEOUT"))))  # fmt: skip
        for i in range(4):
            el = r.choice((28, 95, 1200, 5400))
            jobs.append(self.job("cpu", name=f"alloc_{i}", cores_per_node=r.choice((1, 4, 16)), elapsed=el,
                                 cpu_share=0.0, no_steps=True, state="CANCELLED"))  # fmt: skip
        # measured by acct_gather_energy (ConsumedEnergyRaw): not estimated
        for i in range(3):
            jobs.append(self.job("gpu-a100", name=f"measured_{i}", cores_per_node=16, gpus_per_node=2,
                                 elapsed=r.randint(3600, 10 * 3600), cpu_share=r.uniform(0.1, 0.4),
                                 gpu_util=r.randint(40, 95), energy_w=r.uniform(600, 1400)))  # fmt: skip
        # still RUNNING at the capture
        for i in range(5):
            part = r.choice(("cpu", "gpu-a100"))
            g = 2 if part == "gpu-a100" else 0
            jobs.append(self.job(part, name=f"running_{i}", cores_per_node=16, gpus_per_node=g,
                                 elapsed=r.randint(600, 30 * 3600), cpu_share=0.5, running=True, state="RUNNING",
                                 gpu_util=50 if g else None))  # fmt: skip
        # every user has at least one job
        seen = {j.user for j in jobs}
        for u in USERS:
            if u not in seen:
                jobs.append(self.job("cpu", name="hello", cores_per_node=1, elapsed=r.randint(60, 900),
                                     cpu_share=r.uniform(0.5, 1.0), user=u))  # fmt: skip
        # sacct lists jobs by submit time
        jobs.sort(key=lambda j: (j.submit, j.raw))
        return jobs


def render(seed: int = SEED) -> str:
    """The dump's text."""
    lines = [HEADER]
    for j in Site(seed).build():
        lines += j.lines()
    return "\n".join(lines) + "\n"


def main() -> None:
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
