#!/usr/bin/env python3
"""Deterministic generator of realistic `sacct --parsable2` dumps for benchmarks.

    python bench/gen_sacct.py --lines 1000000 --out /tmp/sacct-1m.txt
    python bench/gen_sacct.py --jobs 1000000 --out /tmp/sacct-1mjobs.txt   # 1M job lines + 2M step lines

The columns are cocaq's SACCT_FIELDS, with a header line, as `cocaq import sacct` asks sacct for them.
Every job line is followed by its `.batch` and `.extern` steps (so about 1/3 of the lines are jobs).
The cluster ("bench", times in UTC) has GPU partitions (A100, H100, V100; `gres/gpu` in the TRES), CPU
partitions, a big-memory partition and an `interactive` partition that `bench/bench.toml` leaves out (so
the import's default-profile path is exercised too).  About 500 users in 40 accounts submit with a
Zipf-like skew (user rank r gets weight 1/r), so a few users are heavy; array jobs, a few
heterogeneous jobs, and states COMPLETED / FAILED / TIMEOUT / OUT_OF_MEMORY / NODE_FAIL /
"CANCELLED by UID" / RUNNING (and a handful PENDING or cancelled before starting, which the parser skips).
Submit times span the year ending at --end (default: now, rounded down to the hour).  A100/H100 nodes
have IPMI energy accounting (ConsumedEnergyRaw); elsewhere it is 0 or empty, as sacct prints it.

The same --seed and --end give the same bytes.  Pure standard library; about 1 M lines per 10 s.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
import time
from datetime import UTC, datetime
from itertools import accumulate

from cocaq.timeparse import format_slurm_duration

FIELDS = [
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
]
CLUSTER = "bench"
YEAR_S = 365 * 86400

# name -> (node prefix, node count, GPUs per node, GPU type, cores per node, GB per node, IPMI energy)
PARTITIONS: dict[str, tuple[str, int, int, str | None, int, int, bool]] = {
    "gpu_a100": ("a100-", 48, 8, "a100", 128, 1024, True),
    "gpu_h100": ("h100-", 24, 8, "h100", 96, 2048, True),
    "gpu_v100": ("v100-", 64, 4, "v100", 40, 384, False),
    "cpu": ("cpu-", 400, 0, None, 192, 768, False),
    "bigmem": ("bigmem-", 8, 0, None, 128, 4096, False),
    "interactive": ("a100-", 48, 8, "a100", 128, 1024, True),  # not in bench.toml: default profile
}
GPU_PARTS = ("gpu_a100", "gpu_a100", "gpu_h100", "gpu_v100", "gpu_v100", "interactive")
CPU_PARTS = ("cpu", "cpu", "cpu", "cpu", "bigmem")
QOS = ("normal", "normal", "normal", "high", "low", "debug")
NAMES_GPU = (
    "train",
    "resnet50",
    "vit-b16",
    "llama-ft",
    "pretrain",
    "sft",
    "eval",
    "bert-base",
    "jupyter",
    "sweep",
)
NAMES_CPU = ("align", "bam-sort", "wrf", "gromacs", "lammps", "preproc", "qc", "tokenize", "cesm", "R")

N_USERS = 500
N_ACCOUNTS = 40


def _fmt_cpu(s: float) -> str:
    """TotalCPU as sacct prints it: with milliseconds under an hour (MM:SS.mmm), [D-]HH:MM:SS above."""
    if s < 3600:
        m, sec = divmod(s, 60)
        return f"{int(m):02d}:{sec:06.3f}"
    return format_slurm_duration(s)


def _ts(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def _hostlist(prefix: str, first: int, n: int) -> str:
    if n == 1:
        return f"{prefix}{first:03d}"
    return f"{prefix}[{first:03d}-{first + n - 1:03d}]"


class Users:
    """~500 users in ~40 accounts; user rank r submits with weight 1/r (Zipf, s=1)."""

    def __init__(self, rng: random.Random) -> None:
        self.names = [f"u{i:03d}" for i in range(N_USERS)]  # u000 is the heaviest
        self.uids = [10_000 + i for i in range(N_USERS)]
        # Accounts are Zipf-sized too: account a gets users in proportion to 1/(a+1).
        acc_w = list(accumulate(1 / (a + 1) for a in range(N_ACCOUNTS)))
        self.accounts = [f"lab{bisect.bisect(acc_w, rng.random() * acc_w[-1]):02d}" for _ in range(N_USERS)]
        self.gpu_share = [rng.choice((0.05, 0.3, 0.6, 0.8, 0.95)) for _ in range(N_USERS)]
        self.cum = list(accumulate(1 / (r + 1) for r in range(N_USERS)))

    def pick(self, rng: random.Random) -> int:
        return bisect.bisect(self.cum, rng.random() * self.cum[-1])


def _state(rng: random.Random) -> str:
    x = rng.random()
    if x < 0.70:
        return "COMPLETED"
    if x < 0.80:
        return "FAILED"
    if x < 0.86:
        return "TIMEOUT"
    if x < 0.93:
        return "CANCELLED"
    if x < 0.975:
        return "OUT_OF_MEMORY"
    if x < 0.978:
        return "NODE_FAIL"
    return "COMPLETED"


def _structure(seed: int, jobs: int | None, lines: int | None) -> list[tuple[int, int, tuple[bool, ...]]]:
    """Submission groups: (kind 0 plain / 1 array / 2 het, size, never-started flag per job).

    Drawn first, from their own random stream, so the groups can be spread over the whole year and the
    dump still ends at --end whatever --lines or --jobs asks for.
    """
    rng = random.Random(seed * 7919 + 1)
    out: list[tuple[int, int, tuple[bool, ...]]] = []
    n_jobs = n_lines = 0
    while (jobs is not None and n_jobs < jobs) or (lines is not None and n_lines < lines):
        x = rng.random()
        if x < 0.004:
            kind, size = 2, 2
        elif x < 0.044:
            kind, size = 1, rng.choice((2, 4, 8, 10, 16, 20, 32, 50))
        else:
            kind, size = 0, 1
        # ~0.5% are cancelled while pending: Start is Unknown, no steps, and the parser skips them.
        never = tuple(rng.random() < 0.005 for _ in range(size))
        out.append((kind, size, never))
        n_jobs += size
        n_lines += sum(1 if n else 3 for n in never)
    return out


def _size(rng: random.Random, cpart: str, task: int | None) -> tuple[int, int, int, int]:
    """(nodes, GPUs per node, CPUs, memory GB) of one job on partition `cpart` (an array task: one node)."""
    _prefix, _n_nodes, gpn, _gtype, cores, node_gb, _ipmi = PARTITIONS[cpart]
    nn = 1 if (task is not None or rng.random() < 0.85) else rng.choice((2, 2, 4, 8))
    if gpn:
        gpus_per = rng.choice((1, 1, 2, 4, gpn)) if nn == 1 else gpn
        cpus = gpus_per * (cores // gpn) * nn
        mem_gb = gpus_per * (node_gb // gpn // 2) * nn
    else:
        gpus_per = 0
        cpus = rng.choice((1, 2, 4, 8, 16, 32, 64, cores)) * nn
        mem_gb = max(1, cpus * (node_gb // cores)) if cpart != "bigmem" else rng.choice((512, 1024, 2048))
    return nn, gpus_per, cpus, mem_gb


def _run(rng: random.Random, secs: float, outcome: str, task: int | None, limit_h: int) -> tuple[int, str]:
    """(seconds run, state) of one job planned to run `secs`: a failure or cancellation cuts it short,
    the time limit stops it (TIMEOUT). An array task draws its own outcome."""
    state = outcome if task is None else _state(rng)
    if state in ("FAILED", "OUT_OF_MEMORY", "NODE_FAIL"):
        secs *= rng.uniform(0.01, 0.5)
    elif state == "CANCELLED":
        secs *= rng.uniform(0.05, 0.9)
    if state == "TIMEOUT" or secs > limit_h * 3600:
        secs, state = limit_h * 3600.0, "TIMEOUT"
    return max(int(secs), 1), state


def _as_printed(
    pending: bool,
    never: bool,
    running: bool,
    uid: int,
    state: str,
    start: float,
    secs: int,
    nodelist: str,
    tres: str,
) -> tuple[str, str, str, int, str, str]:
    """(State, Start, End, elapsed seconds, NodeList, AllocTRES) as sacct prints them for a job pending
    at the end, cancelled before it started, or run (to its end or still running)."""
    if pending:
        return "PENDING", "Unknown", "Unknown", 0, "None assigned", ""
    if never:
        return f"CANCELLED by {uid}", "Unknown", _ts(start), 0, "None assigned", ""
    return (
        {"CANCELLED": f"CANCELLED by {uid}"}.get(state, state),
        _ts(start),
        "Unknown" if running else _ts(start + secs),
        secs,
        nodelist,
        tres,
    )


def generate(out, *, jobs: int | None, lines: int | None, seed: int, end: float) -> tuple[int, int]:
    """Write the header and data lines; stop after `jobs` job lines or `lines` data lines."""
    rng = random.Random(seed)
    users = Users(rng)
    groups = _structure(seed, jobs, lines)
    n_groups = len(groups)
    starts = sorted(rng.random() for _ in range(n_groups))
    next_id = 1_000_000
    n_lines = n_jobs = 0
    write = out.write
    write("|".join(FIELDS) + "\n")
    buf: list[str] = []

    def emit(row: list[str]) -> bool:
        nonlocal n_lines
        if lines is not None and n_lines >= lines:
            return False
        buf.append("|".join(row))
        n_lines += 1
        if len(buf) >= 4096:
            write("\n".join(buf) + "\n")
            buf.clear()
        return True

    g = 0
    while True:
        if jobs is not None and n_jobs >= jobs:
            break
        if lines is not None and n_lines >= lines:
            break
        # Past the planned groups (jobs still pending at --end took fewer lines): pending jobs at the end.
        kind, size, never_flags = groups[g] if g < n_groups else (0, 1, (False,))
        frac = starts[g] if g < n_groups else 1.0
        g += 1
        submit = end - YEAR_S + frac * YEAR_S
        u = users.pick(rng)
        user, uid, account = users.names[u], users.uids[u], users.accounts[u]
        gpu = rng.random() < users.gpu_share[u]
        part = rng.choice(GPU_PARTS if gpu else CPU_PARTS)
        het, array = kind == 2, (size if kind == 1 else 0)
        mean_h = rng.choice((0.1, 0.5, 1.0, 2.0, 4.0, 8.0))
        # Users ask for a limit well above what they expect (a few lognormal tails still hit it).
        limits = [h for h in (1, 2, 4, 8, 12, 24, 24, 48, 72) if h >= 4 * mean_h] or [72]
        limit_h = rng.choice(limits)
        # Components: (job id, raw id, partition, array task)
        comps: list[tuple[str, int, str, int | None]] = []
        base = next_id
        if het:
            comps = [(f"{base}+0", base, part, None), (f"{base}+1", base + 1, "cpu", None)]
            next_id += 2
        elif array:
            comps = [(f"{base}_{k}", base + k + 1, part, k) for k in range(array)]
            next_id += array + 1
        else:
            comps = [(str(base), base, part, None)]
            next_id += 1
        outcome = _state(rng)
        name = rng.choice(NAMES_GPU if gpu else NAMES_CPU)
        qos = rng.choice(QOS)
        for (job_id, raw, cpart, task), never in zip(comps, never_flags, strict=True):
            if jobs is not None and n_jobs >= jobs:
                break
            prefix, n_nodes_part, gpn, gtype, _cores, _node_gb, ipmi = PARTITIONS[cpart]
            nn, gpus_per, cpus, mem_gb = _size(rng, cpart, task)
            gpus = gpus_per * nn
            first = rng.randrange(1, n_nodes_part - nn + 2)
            nodelist = _hostlist(prefix, first, nn)
            wait = rng.expovariate(1 / 600.0) if rng.random() < 0.7 else rng.expovariate(1 / 14400.0)
            start = submit + wait + (0 if task is None else (task // 8) * mean_h * 3600)
            secs, state = _run(rng, rng.lognormvariate(math.log(mean_h * 3600), 0.9), outcome, task, limit_h)
            running = start + secs > end
            pending = start > end - 60
            if running:
                secs = max(int(end - start), 0)
                state = "RUNNING"
            util = rng.uniform(0.05, 0.98)
            total_cpu = 0.0 if (running or pending or never) else cpus * secs * util
            energy = ""
            if ipmi and not (running or pending or never):
                watts = nn * 180.0 * (gpus_per / gpn) + gpus * 400 * rng.uniform(0.3, 1.0) + cpus * util * 4.4
                energy = str(int(watts * secs))
            elif rng.random() < 0.5:
                energy = "0"
            tres = f"billing={cpus},cpu={cpus},mem={mem_gb}G,node={nn}"
            if gpus:
                tres += (
                    f",gres/gpu={gpus}" if rng.random() < 0.5 else f",gres/gpu={gpus},gres/gpu:{gtype}={gpus}"
                )
            sstate, st_start, st_end, el, nl, alloc = _as_printed(
                pending, never, running, uid, state, start, secs, nodelist, tres
            )
            exit_code = {
                "FAILED": "1:0",
                "OUT_OF_MEMORY": "0:125",
                "CANCELLED": "0:15",
                "TIMEOUT": "0:0",
                "NODE_FAIL": "0:0",
            }.get(state, "0:0")
            row = [
                job_id,
                str(raw),
                name,
                user,
                str(uid),
                account,
                cpart,
                qos,
                nl,
                str(nn if alloc else 1),
                str(cpus if alloc else 0),
                alloc,
                tres,
                f"{mem_gb}G",
                _ts(submit),
                st_start,
                st_end,
                format_slurm_duration(el),
                str(el),
                sstate,
                exit_code,
                _fmt_cpu(total_cpu),
                "",
                "" if running else energy,
                CLUSTER,
                format_slurm_duration(limit_h * 3600),
            ]
            if not emit(row):
                break
            n_jobs += 1
            if pending or never:
                continue  # no steps for a job that never ran
            step_state = (
                "RUNNING" if running else ("CANCELLED" if state in ("TIMEOUT", "CANCELLED") else state)
            )
            batch_energy = "" if running or not energy or energy == "0" else str(int(int(energy) * 0.98))
            first_node = nodelist.split("[")[0] + f"{first:03d}" if nn > 1 else nodelist
            for step, s_nodes, s_nn, s_cpus, s_cpu_s, s_energy, s_state in (
                ("batch", first_node, 1, cpus // nn, total_cpu, batch_energy, step_state),
                (
                    "extern",
                    nodelist,
                    nn,
                    cpus,
                    0.01 * nn,
                    "" if running else energy,
                    "RUNNING" if running else "COMPLETED",
                ),
            ):
                srow = [
                    f"{job_id}.{step}",
                    f"{raw}.{step}",
                    step,
                    "",
                    str(uid),
                    account,
                    "",
                    "",
                    s_nodes,
                    str(s_nn),
                    str(s_cpus),
                    f"cpu={s_cpus},mem={mem_gb}G,node={s_nn}",
                    "",
                    "",
                    _ts(start),
                    _ts(start),
                    st_end,
                    format_slurm_duration(secs),
                    str(secs),
                    s_state,
                    "0:0" if step == "extern" else exit_code,
                    _fmt_cpu(0.0 if running else s_cpu_s),
                    "",
                    s_energy,
                    "",
                    "",
                ]
                if not emit(srow):
                    break
    if buf:
        write("\n".join(buf) + "\n")
    return n_lines, n_jobs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--lines", type=int, help="data lines to write (plus the header)")
    size.add_argument("--jobs", type=int, help="job lines to write, each followed by its steps")
    p.add_argument("--out", default="-", help="output file ('-': stdout)")
    p.add_argument("--seed", type=int, default=20261121)
    p.add_argument(
        "--end", default=None, help="last submit time, ISO (default: now, rounded down to the hour)"
    )
    a = p.parse_args(argv)
    if a.end:
        e = datetime.fromisoformat(a.end)
        end = (e if e.tzinfo else e.replace(tzinfo=UTC)).timestamp()
    else:
        end = float(int(time.time()) // 3600 * 3600)
    t0 = time.perf_counter()
    fh = sys.stdout if a.out == "-" else open(a.out, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
    try:
        n_lines, n_jobs = generate(fh, jobs=a.jobs, lines=a.lines, seed=a.seed, end=end)
    finally:
        if fh is not sys.stdout:
            fh.close()
    print(
        f"gen_sacct: {n_lines:,} data lines ({n_jobs:,} job lines) to {a.out} "
        f"in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
