"""Which of sacct's outputs `cocaq import sacct` and `cocaq reconcile` trust, by Slurm version."""

from __future__ import annotations

import sys
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
    got, _, _ = run_sacct(t, t, all_users=True, sacct=str(exe))
    assert got == kind


# sacct 22.05 without --json: it prints values as they are, the delimiter and newlines included.
FAKE_PARSABLE = r"""#!/usr/bin/env python3
import sys
args = sys.argv[1:]
if "--version" in args:
    print("slurm 22.05.8"); sys.exit(0)
d = next((a.split("=", 1)[1] for a in args if a.startswith("--delimiter=")), "|")
fields = next(a.split("=", 1)[1] for a in args if a.startswith("--format=")).split(",")
def row(jid, name):
    v = {f: "" for f in fields}
    v.update(JobID=jid, JobIDRaw=jid, JobName=name, User="mallory", Account="lab", Partition="gpu",
             NodeList="n1", NNodes="1", AllocCPUS="4", Submit="2026-11-01T09:00:00",
             Start="2026-11-01T10:00:00", End="2026-11-01T11:00:00", ElapsedRaw="3600", State="COMPLETED",
             ExitCode="0:0")
    return d.join(v[f] for f in fields)
print(d.join(fields))
print(row("1", "train|v2"))
print(row("2", "a|b|c|" * 5))
print(row("3", "two\nlines"))
print(row("4", "plain"))
"""


def test_a_delimiter_in_a_job_name_cannot_hide_the_job(tmp_path: Path) -> None:
    """sacct does not escape its delimiter: with `|`, a job named `train|v2` had the wrong number of
    fields and was skipped, so a user could keep jobs out of the accounting. The fields are now
    separated by a delimiter drawn at random each run, and a newline in a name joins its lines again."""
    from cocaq.slurm.sacct import ParseStats, iter_parsable

    exe = tmp_path / "sacct"
    exe.write_text(FAKE_PARSABLE.replace("/usr/bin/env python3", sys.executable, 1))
    exe.chmod(0o755)
    t = datetime(2026, 11, 1, tzinfo=UTC)
    out = run_sacct(t, t, all_users=True, sacct=str(exe))
    assert out.kind == "parsable" and len(out.delimiter) > 10 and "|" not in out.delimiter.strip("|")
    assert run_sacct(t, t, all_users=True, sacct=str(exe)).delimiter != out.delimiter
    st = ParseStats()
    jobs = {
        r.job_id: r.name
        for r in iter_parsable(out.data.splitlines(keepends=True), tz=UTC, delimiter=out.delimiter, stats=st)
    }
    assert jobs == {"1": "train|v2", "2": "a|b|c|" * 5, "3": "two\nlines", "4": "plain"}, (jobs, st.skipped)
    assert not st.skipped and st.lines == 4
