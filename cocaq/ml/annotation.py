"""`cocaq.annotate()` and `cocaq tag`: a job declares what it trains, from inside, any number of times.

Values go into the job's annotation file on this node (see cocaq.collector.annotation_files), which the
collector reads while the job runs and the epilog reads at its end. Later values win, so counters such
as `epochs` and `tokens` can be updated as training goes; `None` (or `key=` with `cocaq tag`) removes a
key. Writers on the same node are serialised with flock.

This runs in users' training programs: it imports only the standard library, never raises (a bad value
or a missing file is a warning on stderr and the program goes on), and outside a Slurm job it does
nothing but warn.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_DIR = "/run/cocaq-jobs"  # `[collector] annotate_dir`'s default; the prolog makes the files there


def _warn(msg: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"cocaq: warning: {msg}\n")


def annotate_dir(environ: Mapping[str, str] | None = None) -> str:
    """$COCAQ_ANNOTATE_DIR, else `[collector] annotate_dir` of the site's cocaq.toml, else the default."""
    env = os.environ if environ is None else environ
    if env.get("COCAQ_ANNOTATE_DIR"):
        return env["COCAQ_ANNOTATE_DIR"]
    path = env.get("COCAQ_CONFIG") or "/etc/cocaq/cocaq.toml"
    try:
        import tomllib

        with open(path, "rb") as f:
            d = tomllib.loads(f.read(1 << 20).decode("utf-8")).get("collector", {}).get("annotate_dir")
        if isinstance(d, str) and d:
            return d
    except Exception:  # unreadable or absent: the default
        pass
    return DEFAULT_DIR


def update(values: dict[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Merge `values` into this job's annotation file; True when written. Never raises."""
    try:
        return _update(values, os.environ if environ is None else environ)
    except Exception as exc:  # the user's program must go on
        _warn(f"model metadata not recorded: {type(exc).__name__}: {exc}")
        return False


def _update(values: dict[str, Any], env: Mapping[str, str]) -> bool:
    from cocaq.ml.meta import MAX_FILE, canonical_key, validate

    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not job_id:
        _warn("not in a Slurm job (no SLURM_JOB_ID): model metadata not recorded")
        return False
    if not job_id.isdigit() or len(job_id) > 20:
        _warn(f"SLURM_JOB_ID {job_id[:32]!r} is not a job number: model metadata not recorded")
        return False
    removed = {k for k, v in values.items() if v is None}
    problems: list[str] = []
    good = validate({k: v for k, v in values.items() if v is not None}, problems)
    for p in problems:
        _warn(p)
    path = os.path.join(annotate_dir(env), f"{job_id}.json")
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        _warn(f"{path} does not exist (is the cocaq prolog installed on this node?): not recorded")
        return False
    except OSError as exc:
        _warn(f"cannot open {path}: {exc.strerror}: not recorded")
        return False
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
        old = os.read(fd, MAX_FILE + 1)
        current: dict[str, Any] = {}
        if old.strip():
            try:
                doc = json.loads(old.decode("utf-8"))
                if isinstance(doc, dict) and isinstance(doc.get("values"), dict):
                    current = doc["values"]
            except ValueError:
                _warn(f"{path} held something else than cocaq's JSON; starting it afresh")
        for k in removed:
            current.pop(canonical_key(k), None)
        current.update(good)
        data = json.dumps({"v": 1, "values": current, "updated": time.time()}, sort_keys=True).encode()
        if len(data) > MAX_FILE:
            _warn(f"model metadata would exceed {MAX_FILE} bytes: this update is not recorded")
            return False
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, data)
        return True
    finally:
        os.close(fd)  # releases the lock


def parse_pairs(pairs: list[str]) -> tuple[dict[str, Any], list[str]]:
    """`key=value` words of `cocaq tag` ({key: value or None to remove}, words that are not pairs)."""
    out: dict[str, Any] = {}
    bad = []
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            bad.append(p)
            continue
        out[k.strip()] = v if v != "" else None
    return out, bad
