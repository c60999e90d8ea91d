"""Which of sacct's outputs `cocaq import sacct` and `cocaq reconcile` trust, by Slurm version."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from cocaq.slurm.run import run_sacct

FAKE_SACCT = """#!/bin/sh
case "$*" in
  *--version*) echo "slurm{version}" ;;
  *--json*) echo '{{"meta": {{}}, "jobs": []}}' ;;
  *) echo "JobID|State" ;;
esac
"""


@pytest.mark.parametrize(
    ("version", "kind"),
    [("22.05.8", "parsable"), ("-wlm 22.05.8", "parsable"), ("23.02.7", "json"), ("24.11.1", "json")],
)
def test_slurm_22_05_json_is_not_used_for_its_wrong_exit_codes(
    tmp_path: Path, version: str, kind: str
) -> None:
    exe = tmp_path / "sacct"
    exe.write_text(FAKE_SACCT.format(version=version if version.startswith("-") else " " + version))
    exe.chmod(0o755)
    t = datetime(2026, 11, 1, tzinfo=UTC)
    got, _ = run_sacct(t, t, all_users=True, sacct=str(exe))
    assert got == kind
