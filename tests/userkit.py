"""Running cocaq as an ordinary Unix user (runuser), as on a compute or login node."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def user_python() -> str:
    """This venv's interpreter as another user can run it; a pyenv Python under /root (0700) is not.
    A shell word sequence: `PYTHONPATH=... /usr/bin/python3.11` in that case."""
    real = os.path.realpath(sys.executable)
    parents = Path(real).parents
    if all(os.stat(p).st_mode & 0o001 for p in parents) and os.stat(real).st_mode & 0o005 == 0o005:
        return sys.executable
    # The system Python of the same minor version, with this checkout and the venv's packages on its path.
    site = sysconfig.get_paths()["purelib"]
    return f"PYTHONPATH={ROOT}:{site} /usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


def run_as(
    user: str, args: list[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m cocaq ARGS` as `user`, with only `env` (and what runuser sets) in its environment."""
    words = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    cmd = f"cd /tmp && env -i PATH=/usr/bin:/bin HOME=/tmp {words} {user_python()} -m cocaq " + shlex.join(
        args
    )
    return subprocess.run(
        ["runuser", "-u", user, "--", "/bin/sh", "-c", cmd], capture_output=True, text=True, timeout=timeout
    )
