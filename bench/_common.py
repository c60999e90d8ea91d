"""Helpers shared by the benchmark scripts: databases, machine facts, timing a whole process."""

from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
CONFIG = BENCH / "bench.toml"
VENV_BIN = Path(sys.executable).parent
COCAQ = str(VENV_BIN / "cocaq") if (VENV_BIN / "cocaq").exists() else "cocaq"
# The code the benchmarks measure: a change here that is not committed is named next to the commit.
CODE_DIRS = ("cocaq", "collector", "prolog_epilog", "migrations")
ADMIN_URL = os.environ.get("COCAQ_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def pg_url(dbname: str, *, sqlalchemy: bool = True) -> str:
    base = ADMIN_URL.rsplit("/", 1)[0]
    if sqlalchemy:
        base = base.replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{dbname}"


def recreate_database(dbname: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{dbname}"')


def drop_database(dbname: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def database_exists(dbname: str) -> bool:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as c:
        return c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone() is not None


def cocaq_env(dbname: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env["COCAQ_DATABASE_URL"] = pg_url(dbname)
    return env


def machine() -> dict[str, str]:
    import psycopg

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with psycopg.connect(ADMIN_URL) as c:
        pg = c.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        shared = c.execute("SHOW shared_buffers").fetchone()[0]  # type: ignore[index]
        sync = c.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *CODE_DIRS], cwd=ROOT, capture_output=True, text=True
        ).stdout
        changed = sorted({line[3:].split("/")[0] + "/" for line in dirty.splitlines() if line[3:]})
        commit += " + uncommitted changes in " + ", ".join(changed) if changed else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": f"{mem_gb:.0f} GiB",
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "postgresql": f"{pg} (shared_buffers {shared}, synchronous_commit {sync}), local, TCP 127.0.0.1",
        "kernel": platform.release(),
        "commit": commit,
    }


def print_machine(m: dict[str, str]) -> None:
    print("machine:")
    for k, v in m.items():
        print(f"  {k:10s} {v}")


@dataclass
class Run:
    wall_s: float
    user_s: float
    sys_s: float
    max_rss_mb: float | None
    rc: int
    stdout: str
    stderr: str


_TIME = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)


def run_process(
    argv: list[str], env: dict[str, str], *, rss: bool = False, check: bool = True, cwd: Path = ROOT
) -> Run:
    """Run argv to completion; wall clock around the whole process, CPU from rusage of the child.

    With `rss`, under GNU time -v for the peak resident set size (falls back to RUSAGE_CHILDREN).
    """
    cmd = [_TIME, "-v", *argv] if rss and _TIME else argv
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    err = p.stderr
    max_rss = None
    if rss and _TIME:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
        max_rss = int(m.group(1)) / 1024 if m else None
        err = err.split("\tCommand being timed:")[0]
    elif rss:
        max_rss = after.ru_maxrss / 1024  # the largest child so far: good enough without GNU time
    if check and p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}):\n{err}")
    return Run(
        wall,
        after.ru_utime - before.ru_utime,
        after.ru_stime - before.ru_stime,
        max_rss,
        p.returncode,
        p.stdout,
        err,
    )


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def p90(xs: list[float]) -> float:
    """90th percentile, nearest rank (of 15 runs: the 14th fastest)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-9 * len(s) // 10) - 1))
    return s[k]


def write_shims(d: Path, cfg: Path, env: dict[str, str]) -> dict[str, str]:
    """`cocaq hook shims` into d/shims, as a site would run it: {"cocaq-prolog": path, ...}."""
    out = subprocess.run(
        [COCAQ, "hook", "shims", "--dir", str(d / "shims"), "--hook-config", str(cfg)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {Path(p).name: p for p in out}


def users_by_jobs(dbname: str, since: datetime) -> tuple[list[tuple[str, int]], str]:
    """Users with jobs in the window, most jobs first (as heavy_user counts them), and one without jobs:
    an account of this machine (`nobody`) that ran none, as `cocaq user` refuses a name that is nowhere
    (exit 2) and takes a local account with no jobs as all zeros."""
    import psycopg

    with psycopg.connect(pg_url(dbname, sqlalchemy=False)) as conn:
        rows = conn.execute(
            "SELECT user_name, count(*) FROM jobs WHERE start_time < now() "
            "AND (end_time >= %s OR end_time IS NULL) GROUP BY 1 ORDER BY 2 DESC, 1",
            (since,),
        ).fetchall()
        import pwd

        known = {r[0] for r in conn.execute("SELECT DISTINCT user_name FROM jobs").fetchall()}
        local = [p.pw_name for p in pwd.getpwall() if p.pw_name not in known]
        if not local:
            raise SystemExit("bench: every account of this machine has jobs: no user without jobs to time")
        nobody = "nobody" if "nobody" in local else sorted(local)[0]
    return [(str(u), int(n)) for u, n in rows], nobody


def prolog_env(i: int, partition: str, gpus: str | None = None, node: str = "gpu-n001") -> dict[str, str]:
    """slurmd's environment for the prolog of the benchmarks' job number i (id 4000 + i, user{i})."""
    env = {
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURM_JOB_ID": str(4000 + i),
        "SLURM_JOB_USER": f"user{i}",
        "SLURM_JOB_UID": str(2000 + i),
        "SLURM_JOB_GID": str(2000 + i),
        "SLURM_JOB_ACCOUNT": "lab",
        "SLURM_JOB_PARTITION": partition,
        "SLURMD_NODENAME": node,
    }
    if gpus:
        env["SLURM_JOB_GPUS"] = gpus
    return env


def hourly_csv(path: Path, basis: str = "lca") -> tuple[float, list[float]]:
    """An hourly intensity export as (its first hour, epoch s; the values), read by `cocaq carbon
    import`'s own parser; a file that is not one value per hour stops the benchmark."""
    from itertools import pairwise

    from cocaq.carbon.series_import import parse_csv, read_file

    parsed = parse_csv(read_file(path), path.name, basis=basis)
    rows = sorted(parsed.rows, key=lambda r: r.start)
    if (
        not rows
        or parsed.skipped
        or any(b.start != a.end or a.end - a.start != 3600 for a, b in pairwise(rows))
    ):
        raise SystemExit(f"{path.name}: not one value per hour ({dict(parsed.skipped)} rows skipped)")
    return rows[0].start, [r.g_per_kwh for r in rows]
