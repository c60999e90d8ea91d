"""Real output of Slurm 22.05's and 25.11's sacct (tests/data/sacct/slurm2205_*, slurm2511_*, see its
README) parses and imports.

For each version the same jobs were captured as `--json`, `--parsable2` and `--parsable --noheader`: all
three must give the same jobs, and a snapshot taken while jobs ran must be brought up to date by the final
capture.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from cocaq.accounting.importer import import_records
from cocaq.config_load import load_config
from cocaq.db.schema import Job
from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import SACCT_FIELDS, ParseStats, iter_json, iter_parsable

DATA = Path(__file__).parent / "data" / "sacct"
# The --format the captures were taken with (the README's FMT): SACCT_FIELDS has grown since.
CAPTURE_FORMAT = (
    "JobID,JobIDRaw,JobName,User,UID,Account,Partition,QOS,NodeList,NNodes,AllocCPUS,AllocTRES,ReqTRES,"
    "ReqMem,Submit,Start,End,Elapsed,ElapsedRaw,State,ExitCode,TotalCPU,Comment,ConsumedEnergyRaw,Cluster,"
    "Timelimit"
)


def from_json(name: str) -> tuple[dict[str, JobRecord], ParseStats]:
    st = ParseStats()
    with open(DATA / name, "rb") as fh:
        return {r.job_id: r for r in iter_json(fh, stats=st)}, st


def from_text(name: str, fields: list[str] | None = None) -> tuple[dict[str, JobRecord], ParseStats]:
    st = ParseStats()
    with open(DATA / name, "rb") as fh:  # captured with TZ=UTC
        return {r.job_id: r for r in iter_parsable(fh, tz=UTC, fields=fields, stats=st)}, st


ALL = (
    {"1", "2", "3", "4", "5", "6", "7", "8", "9", "14", "15", "16", "17"}
    | {f"10_{i}" for i in range(4)}
    | {f"11_{i}" for i in range(10)}
)
# The same script's jobs on Slurm 25.11.7 (job ids 24-40; the het job is 35+0/35+1)
ALL_2511 = (
    {"24", "25", "26", "27", "28", "29", "30", "31", "32", "37", "38", "39", "40"}
    | {f"33_{i}" for i in range(4)}
    | {f"34_{i}" for i in range(10)}
)
NEVER_STARTED = {"never started (ended before it ran)": 2}
CAPTURES = {  # prefix -> (its jobs, what its JSON skips, what its midway snapshot has open, and its size)
    "slurm2205": (ALL, NEVER_STARTED, {"1", "11_1"}, 15),
    # 25.11's JSON gives the cancelled het job no node at all ("None assigned"): skipped for that
    "slurm2511": (ALL_2511, {"never started (no node assigned)": 2}, {"24"}, 14),
}


@pytest.mark.parametrize("prefix", sorted(CAPTURES))
def test_three_forms_give_the_same_jobs(prefix: str) -> None:
    jobs, json_skips, _, _ = CAPTURES[prefix]
    js, jst = from_json(f"{prefix}_sacct.json")
    p2, pst = from_text(f"{prefix}_parsable2.txt")
    nh, nst = from_text(f"{prefix}_parsable_noheader.txt", fields=CAPTURE_FORMAT.split(","))
    assert set(js) == set(p2) == set(nh) == jobs
    # The het job was cancelled before it could start: skipped, and counted.
    assert jst.skipped == json_skips
    for st in (pst, nst):
        assert st.skipped == NEVER_STARTED
    for st in (jst, pst, nst):
        assert st.steps == 31
    for jid in jobs:
        a, b, c = js[jid], p2[jid], nh[jid]
        for f in (
            "user_name",
            "account",
            "partition",
            "state",
            "alloc_gpus",
            "gpu_type",
            "alloc_cpus",
            "req_mem_mb",
            "start_time",
            "end_time",
            "submit_time",
            "elapsed_s",
            "node_list",
            "job_id_raw",
            "array_job_id",
            "array_task_id",
            "comment",
            "cluster",
            "is_open",
            "name",
            "time_limit_s",
            "n_nodes",
        ):
            assert getattr(a, f) == getattr(b, f) == getattr(c, f), (jid, f)
        assert a.exit_signal == b.exit_signal == c.exit_signal, jid
        if prefix != "slurm2205":  # 22.05's JSON has a failed job's exit code wrong (test_real_values)
            assert a.exit_code == b.exit_code == c.exit_code, jid
        assert a.total_cpu_s == pytest.approx(b.total_cpu_s, abs=1e-3)  # text output rounds to ms
        assert b == c  # --parsable with its trailing delimiter and no header == --parsable2


def test_real_values() -> None:
    p2, _ = from_text("slurm2205_parsable2.txt")
    js, _ = from_json("slurm2205_sacct.json")
    assert p2["1"].state == "TIMEOUT" and p2["1"].elapsed_s == 89 and p2["1"].time_limit_s == 60
    assert p2["2"].state == "CANCELLED" and p2["2"].state_detail == "CANCELLED by 0"
    assert js["2"].state_detail == "CANCELLED by root"
    assert (p2["4"].alloc_gpus, p2["4"].gpu_type) == (1, "a100")  # --gres=gpu:1
    assert (p2["5"].alloc_gpus, p2["5"].gpu_type) == (2, "a100")  # --gres=gpu:2
    assert p2["8"].comment == "Übersetzung de→日本語, café ✓" == js["8"].comment
    assert p2["9"].state == "FAILED" and p2["9"].exit_code == 3
    # Slurm 22.05's JSON reports the job's exit code as 0 for this failed job; only the text has it.
    assert js["9"].exit_code == 0
    assert p2["10_3"].job_id_raw == 10 and p2["10_0"].job_id_raw == 18 and p2["10_0"].array_job_id == 10
    assert p2["14"].req_mem_mb == 2048  # --mem=2G
    assert p2["15"].req_mem_mb == 1000 and p2["15"].alloc_cpus == 2  # -n 2 --mem-per-cpu=500M
    assert p2["3"].total_cpu_s == pytest.approx(0.032)
    assert p2["16"].start_time == datetime(2026, 11, 21, 7, 45, 32, tzinfo=UTC)


def test_real_values_2511() -> None:
    """Slurm 25.11.7 (data_parser v0.0.44): what differs from 22.05, and what must not."""
    p2, _ = from_text("slurm2511_parsable2.txt")
    js, _ = from_json("slurm2511_sacct.json")
    # a failed job's exit code is right in 25.11's JSON too: reconcile reads --json from 23.02 on
    assert p2["32"].state == js["32"].state == "FAILED" and p2["32"].exit_code == js["32"].exit_code == 3
    assert p2["24"].state == "TIMEOUT" and p2["24"].time_limit_s == 60 and p2["24"].elapsed_s == 76
    assert p2["25"].state_detail == "CANCELLED by 0" and js["25"].state_detail == "CANCELLED by root"
    assert (js["28"].alloc_gpus, js["28"].gpu_type) == (2, "a100") == (p2["28"].alloc_gpus, p2["28"].gpu_type)
    assert js["31"].comment == p2["31"].comment == "Übersetzung de→日本語, café ✓"
    assert p2["33_0"].job_id_raw == 41 and p2["33_3"].job_id_raw == 33 and js["33_0"].array_job_id == 33
    assert js["37"].req_mem_mb == 2048 and js["38"].req_mem_mb == 1000 and js["38"].alloc_cpus == 2
    assert js["40"].name == "interactive" and js["40"].time_limit_s == 120
    assert js["26"].total_cpu_s == pytest.approx(p2["26"].total_cpu_s, abs=1e-3)


@pytest.mark.parametrize("prefix", sorted(CAPTURES))
def test_midway_snapshot(prefix: str) -> None:
    _, _, open_jobs, n = CAPTURES[prefix]
    for recs, st in (from_json(f"{prefix}_midway.json"), from_text(f"{prefix}_midway_parsable2.txt")):
        assert {j for j, r in recs.items() if r.is_open} == open_jobs
        first = min(open_jobs, key=len)
        assert recs[first].end_time is None and recs[first].state == "RUNNING"
        assert st.skipped == {"pending (not started yet)": 7}
        assert len(recs) == n


@pytest.mark.parametrize(
    ("prefix", "midway", "final", "timeout_job", "timeout_end"),
    [
        ("slurm2205", (15, 0), (12, 2), "1", datetime(2026, 11, 21, 7, 35, 32, tzinfo=UTC)),
        # 25.11's midway snapshot caught one more task finished: 14 then 13 new, 1 (the TIMEOUT) updated
        ("slurm2511", (14, 0), (13, 1), "24", datetime(2026, 11, 26, 15, 2, 57, tzinfo=UTC)),
    ],
)
def test_midway_then_final_import(
    engine: Engine,
    prefix: str,
    midway: tuple[int, int],
    final: tuple[int, int],
    timeout_job: str,
    timeout_end: datetime,
) -> None:
    cfg = load_config(None, environ={})
    for name, expect in ((f"{prefix}_midway_parsable2.txt", midway), (f"{prefix}_parsable2.txt", final)):
        st = ParseStats()
        with open(DATA / name, "rb") as fh:
            s = import_records(engine, iter_parsable(fh, tz=UTC, stats=st), cfg, source="sacct-parsable")
        assert (s.inserted, s.updated) == expect
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Job)).scalar() == 27
        assert conn.execute(select(func.count()).select_from(Job).where(Job.is_open)).scalar() == 0
        state, end = conn.execute(select(Job.state, Job.end_time).where(Job.job_id == timeout_job)).one()
    assert state == "TIMEOUT" and end == timeout_end
    # The JSON capture of the same jobs adds no job.
    with open(DATA / f"{prefix}_sacct.json", "rb") as fh:
        s = import_records(engine, iter_json(fh), cfg, source="sacct-json")
    assert s.inserted == 0


REPLAY = """#!/bin/sh
# Stands in for sacct: records its arguments and replays real captured output.
if [ "$1" = "--version" ]; then {version_branch}; exit 0; fi
printf '%s\\n' "$@" >> "{log}"
for a in "$@"; do
  if [ "$a" = "--json" ]; then
    {json_branch}
  fi
done
cat "{data}/slurm2205_parsable2.txt"
"""


@pytest.mark.parametrize("has_json", [True, False])
def test_import_runs_sacct_itself(has_json: bool, tmp_path: Path, cli_env: dict[str, str]) -> None:
    from tests.conftest import run_cocaq

    log = tmp_path / "argv.log"
    branch = (
        f'cat "{DATA}/slurm2205_sacct.json"; exit 0'
        if has_json
        else "echo \"sacct: unrecognized option '--json'\" >&2; exit 1"
    )
    fake = tmp_path / "sacct"
    # A sacct that says it is 23.11 (whose --json cocaq trusts), and one that cannot say (an old one).
    version = 'echo "slurm 23.11.4"' if has_json else "true"
    fake.write_text(REPLAY.format(log=log, data=DATA, json_branch=branch, version_branch=version))
    fake.chmod(0o755)
    env = dict(cli_env, COCAQ_DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite'}", TZ="UTC")
    assert run_cocaq(["db", "upgrade"], env).code == 0
    r = run_cocaq(
        ["import", "sacct", "--sacct", str(fake), "-a", "-S", "2026-11-21T07:00", "-E", "2026-11-21T08:00"],
        env,
    )
    assert r.code == 0, r.err
    assert "imported 27" in r.err and ("sacct json" if has_json else "sacct parsable") in r.err
    argv = log.read_text().split("\n")
    assert argv[:5] == ["-S", "2026-11-21T07:00:00", "-E", "2026-11-21T08:00:00", "--allusers"]
    assert ("--json" in argv) and (("--parsable2" in argv) != has_json)
    if not has_json:
        assert f"--format={SACCT_FIELDS}" in argv
