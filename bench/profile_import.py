#!/usr/bin/env python3
"""Where `cocaq import sacct` spends its time, and whether a parser change kept its output (issue 34).

    .venv/bin/python bench/profile_import.py cpu --file F --db NAME     # CPU of each process of one import
    .venv/bin/python bench/profile_import.py stages --file F            # serial, in-process, stage by stage
    .venv/bin/python bench/profile_import.py parser-ab --file F --rev R # the parser alone, R and now in turn
    .venv/bin/python bench/profile_import.py digest --rev R [F ...]     # same records and counts as at R?

`cpu` runs the import (fresh database NAME) and samples /proc every 0.2 s for the CPU seconds of the cocaq
process, its forked parser and its PostgreSQL backend, then times reference D (the one-column COPY of the
same lines) right after it. `stages` times reading, parsing, the plausibility rules, the estimates and the
COPY rows (with the record hash alone) one after the other in this process. `parser-ab` and `digest` run
cocaq as of git revision R (git archive into a temporary folder) against the tree: `digest` prints, per
file and time zone, whether an md5 of every record's fields and of the parse counts (skips, their first
line numbers, replaced bytes) is the same.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / _TICK


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            out += [int(x) for x in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        pass
    return out


def cpu(path: Path, db: str) -> None:
    import psycopg
    from bench_import import one_column_copy

    env = c.cocaq_env(db)
    c.recreate_database(db)
    c.run_process([c.COCAQ, "--config", str(c.CONFIG), "db", "upgrade"], env)
    argv = [c.COCAQ, "--config", str(c.CONFIG), "import", "sacct", "--file", str(path)]
    last: dict[str, float] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    with psycopg.connect(c.ADMIN_URL, autocommit=True) as admin:
        while proc.poll() is None:
            pids = {"cocaq process": proc.pid} | {f"its child {k}": k for k in _children(proc.pid)}
            rows = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (db,)
            ).fetchall()
            pids |= {f"PostgreSQL backend {r[0]}": r[0] for r in rows}
            for name, pid in pids.items():
                v = _cpu_s(pid)
                if v is not None:
                    last[name] = v
            time.sleep(0.2)
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    ref_d, _ = one_column_copy(db, path)
    print(f"import wall {wall:.1f} s; ref D (one-column COPY) right after it {ref_d:.2f} s")
    for name, v in sorted(last.items()):
        print(f"  {name}: {v:.1f} s CPU")
    print(f"  all: {sum(last.values()):.1f} CPU-seconds")
    print("".join(line for line in err.splitlines(keepends=True) if "records read" in line), end="")
    c.drop_database(db)


def stages(path: Path) -> None:
    import gc
    from datetime import UTC

    from cocaq.accounting import importer
    from cocaq.accounting.estimate import Estimator
    from cocaq.config_load import load_config
    from cocaq.slurm.plausible import Tally, checked
    from cocaq.slurm.sacct import ParseStats, iter_parsable

    cfg = load_config(c.CONFIG)
    gc.set_threshold(20_000, 10, 10)  # as import_records does
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        n = sum(1 for _ in fh)
    times["reading the lines"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        recs = list(iter_parsable(fh, tz=UTC, stats=ParseStats()))
    times["parsing (iter_parsable)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    recs = list(checked(recs, Tally(), max_node_power_w=cfg.estimate.max_node_power_w))
    times["plausibility rules"] = time.perf_counter() - t0
    est = Estimator(cfg, None)
    t0 = time.perf_counter()
    vals = [est.values(r) for r in recs]
    times["estimates"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r, v in zip(recs, vals, strict=True):
        importer._pg_row(r, v, "sacct-parsable", est.assumptions_json, 0)
    times["COPY rows (with the record hash)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r, v in zip(recs, vals, strict=True):
        importer._hash_values(r, v)
    times["the record hash alone"] = time.perf_counter() - t0
    print(f"{n:,} lines -> {len(recs):,} jobs")
    for name, secs in times.items():
        print(f"  {name}: {secs:.2f} s")


def _tree_at(rev: str, root: Path) -> None:
    names = ["cocaq", "collector", "prolog_epilog", "reports", "migrations", "pyproject.toml"]
    archive = subprocess.run(
        ["git", "archive", rev, "--", *names], cwd=c.ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)


_PARSE = """
import sys, time, gc
from datetime import UTC
from cocaq.slurm.sacct import ParseStats, iter_parsable
gc.set_threshold(20000, 10, 10)
t0 = time.perf_counter()
with open(sys.argv[1], "rb") as fh:
    n = sum(1 for _ in iter_parsable(fh, tz=UTC, stats=ParseStats()))
print(time.perf_counter() - t0, n)
"""

_DIGEST = """
import hashlib, operator, sys
from datetime import UTC
from zoneinfo import ZoneInfo
from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import ParseStats, iter_parsable
fields = operator.attrgetter(*JobRecord.__slots__)
for f in sys.argv[1:]:
    for tz in (UTC, ZoneInfo("Europe/Berlin")):
        st, h = ParseStats(), hashlib.md5()
        with open(f, "rb") as fh:
            try:
                for r in iter_parsable(fh, tz=tz, stats=st):
                    h.update(repr(fields(r)).encode())
            except Exception as exc:
                h.update(repr(exc).encode())
        h.update(repr((st.lines, st.jobs, st.steps, sorted(st.skipped.items()), sorted(st.examples.items()),
                       st.replaced_bytes_lines)).encode())
        print(f, tz, h.hexdigest())
"""


def _run_at(code: str, args: list[str], where: Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(where or c.ROOT)
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
    ).stdout


def parser_ab(path: Path, rev: str, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cocaq-rev-") as tmp:
        _tree_at(rev, Path(tmp))
        print(f"| run | {rev} | now | now / {rev} |")
        print("|---|---:|---:|---:|")
        for i in range(repeat):
            before = float(_run_at(_PARSE, [str(path)], Path(tmp)).split()[0])
            now = float(_run_at(_PARSE, [str(path)], None).split()[0])
            print(f"| {i + 1} | {before:.2f} s | {now:.2f} s | {now / before:.2f} |")


def digest(files: list[str], rev: str) -> int:
    files = files or sorted(
        f for f in glob.glob(str(c.ROOT / "tests/data/sacct/*")) if not f.endswith((".json", ".md"))
    )
    with tempfile.TemporaryDirectory(prefix="cocaq-rev-") as tmp:
        _tree_at(rev, Path(tmp))
        before = _run_at(_DIGEST, files, Path(tmp)).splitlines()
    now = _run_at(_DIGEST, files, None).splitlines()
    differ = [b.rsplit(" ", 1)[0] for b, n in zip(before, now, strict=True) if b != n]
    print(f"{len(now)} file and zone pairs: {len(now) - len(differ)} the same as at {rev}")
    for d in differ:
        print(f"  DIFFERENT: {d}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    a_cpu = sub.add_parser("cpu")
    a_cpu.add_argument("--file", type=Path, required=True)
    a_cpu.add_argument("--db", default="cocaq_profile_import")
    a_st = sub.add_parser("stages")
    a_st.add_argument("--file", type=Path, required=True)
    a_ab = sub.add_parser("parser-ab")
    a_ab.add_argument("--file", type=Path, required=True)
    a_ab.add_argument("--rev", required=True)
    a_ab.add_argument("--repeat", type=int, default=2)
    a_dg = sub.add_parser("digest")
    a_dg.add_argument("--rev", required=True)
    a_dg.add_argument("files", nargs="*")
    a = p.parse_args(argv)
    if a.what == "cpu":
        cpu(a.file, a.db)
    elif a.what == "stages":
        stages(a.file)
    elif a.what == "parser-ab":
        parser_ab(a.file, a.rev, a.repeat)
    else:
        return digest(a.files, a.rev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
