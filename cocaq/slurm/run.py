"""Running Slurm's own CLIs without a shell; Slurm's JSON interface first, its text output otherwise."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from datetime import datetime
from typing import NamedTuple

from cocaq.errors import InputError
from cocaq.slurm.sacct import SACCT_FIELDS


def find_sacct(explicit: str | None) -> str | None:
    """The sacct binary to run (the one given, else PATH's, else /usr/bin/sacct), or None where none is."""
    return shutil.which(explicit or shutil.which("sacct") or "/usr/bin/sacct")


def _sacct_bin(explicit: str | None) -> str:
    path = find_sacct(explicit)
    if path is None:
        shown = explicit or "/usr/bin/sacct"
        raise InputError(f"sacct not found ({shown}): run this on a Slurm login node, or use --file")
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


class SacctOutput(NamedTuple):
    kind: str  # "json" or "parsable"
    data: bytes
    delimiter: str  # of the parsable output's fields


def run_sacct(
    start: datetime, end: datetime, *, all_users: bool, sacct: str | None = None, use_json: bool = True
) -> SacctOutput:
    """sacct's output for [start, end]: JSON, or --parsable2 where there is no trustworthy --json.

    sacct does not escape its delimiter inside values, so a job named `train|v2` would break a `|`
    line, and a user could keep jobs out of the accounting by naming them so: the fields are separated by
    a delimiter drawn at random for each run, which nobody can put in a name in advance."""
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
            return SacctOutput("json", proc.stdout, "")
    delimiter = f"|{secrets.token_hex(8)}|"
    proc = subprocess.run(
        [*base, "--parsable2", f"--delimiter={delimiter}", f"--format={SACCT_FIELDS}"],
        capture_output=True,
        timeout=3600,
        check=False,
    )
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"sacct failed (exit {proc.returncode}): {msg[0] if msg else 'no message'}")
    header = proc.stdout.lstrip()[:4096].split(b"\n", 1)[0]
    if delimiter.encode() not in header and b"|" in header:
        # a sacct (or a wrapper of it) that ignored --delimiter: its `|` it is, with the old weakness
        delimiter = "|"
    return SacctOutput("parsable", proc.stdout, delimiter)
