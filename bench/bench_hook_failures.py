#!/usr/bin/env python3
"""Benchmark: a Prolog/Epilog hook that cannot write its record, as a whole process (the tests' old budget).

    .venv/bin/python bench/bench_hook_failures.py

A hook whose spool is unusable must still return to slurmd at once (it logs, counts and exits 0), so:

  (a) the spool path is a file, not a directory (tests/test_node_reliability.py's case): the prolog.
  (b) the spool's file system is full (a 16 KiB tmpfs, as tests/test_hooks.py mounts it; needs root,
      else skipped): the prolog with two GPUs, then the epilog.

Each hook runs --runs times through its shim (`/bin/sh cocaq-prolog`, slurmd's environment only), timed
from spawn to exit. Target: every run < 2 s (what the unit tests once asserted; they now check, without a
clock, that such a hook sleeps, spawns, connects and locks nothing and imports nothing new:
tests/nodekit.py's assert_fails_fast). Whole-process times of the healthy hooks: bench/bench_hooks.py.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.nodekit import make_node

TARGET_S = 2.0


def spool_is_a_file(d: Path, runs: int) -> list[float]:
    blocker = d / "spool"
    blocker.write_text("a file where the spool directory should be\n")
    node = make_node(d / "node", spool=blocker)
    return [node.hook("prolog", 77 + i) for i in range(runs)]


def disk_full(d: Path, runs: int) -> list[float] | None:
    mnt = d / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)]).returncode != 0:
        return None
    try:
        (mnt / "spool").mkdir(mode=0o755)
        with open(mnt / "filler", "wb") as fh, contextlib.suppress(OSError):
            fh.write(b"\0" * 64 * 1024)
        node = make_node(d / "node", spool=mnt / "spool")
        took = []
        for i in range(runs):
            took += [node.hook("prolog", 110 + i, SLURM_JOB_GPUS="0,1"), node.hook("epilog", 110 + i)]
        return took
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        for name, took in (("(a) spool is a file", spool_is_a_file(Path(a), args.runs)),
                           ("(b) disk full", disk_full(Path(b), args.runs))):  # fmt: skip
            if took is None:
                print(f"{name}: skipped (cannot mount a tmpfs here)")
                continue
            ok = ok and max(took) < TARGET_S
            print(
                f"{name}: {len(took)} hooks, median {statistics.median(took) * 1000:.0f} ms, "
                f"max {max(took) * 1000:.0f} ms (target < {TARGET_S * 1000:.0f} ms each)"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
