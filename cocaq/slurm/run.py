"""Running Slurm's own CLIs without a shell; Slurm's JSON interface first, its text output otherwise."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime

from cocaq.errors import InputError
from cocaq.slurm.sacct import SACCT_FIELDS


def _sacct_bin(explicit: str | None) -> str:
    path = explicit or shutil.which("sacct") or "/usr/bin/sacct"
    if not shutil.which(path):
        raise InputError(f"sacct not found ({path}): run this on a Slurm login node, or use --file")
    return path


JSON_TRUSTED_FROM = (23, 2)


def slurm_version(exe: str) -> tuple[int, int] | None:
    """(major, minor) from `sacct --version` ("slurm 22.05.8"; Debian: "slurm-wlm 22.05.8"), or None."""
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = proc.stdout.decode("utf-8", "replace").split()
    if len(parts) < 2 or not parts[0].lower().startswith("slurm"):
        return None
    nums = parts[1].split(".")
    try:
        return int(nums[0]), int(nums[1])
    except (IndexError, ValueError):
        return None


def _fmt(t: datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")  # sacct reads local time


def run_sacct(
    start: datetime, end: datetime, *, all_users: bool, sacct: str | None = None, use_json: bool = True
) -> tuple[str, bytes]:
    """('json'|'parsable', output) of sacct for [start, end]; falls back to --parsable2 without --json."""
    exe = _sacct_bin(sacct)
    base = [exe, "-S", _fmt(start), "-E", _fmt(end)]
    if all_users:
        base.append("--allusers")
    version = slurm_version(exe)
    if version is not None and version < JSON_TRUSTED_FROM:
        use_json = False  # 22.05's --json reports a failed job's exit code as 0; its text output is right
    if use_json:
        proc = subprocess.run([*base, "--json"], capture_output=True, timeout=3600, check=False)
        if proc.returncode == 0 and proc.stdout.lstrip()[:1] == b"{":
            return "json", proc.stdout
    proc = subprocess.run(
        [*base, "--parsable2", f"--format={SACCT_FIELDS}"], capture_output=True, timeout=3600, check=False
    )
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"sacct failed (exit {proc.returncode}): {msg[0] if msg else 'no message'}")
    return "parsable", proc.stdout
