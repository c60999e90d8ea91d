"""The `cocaq` commands users type, run as real processes against real databases."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cocaq.carbon.zones import zone_intensity
from tests.conftest import run_cocaq

# Times are UTC (cluster.timezone = "UTC" in the config below).
DUMP = """JobID|JobIDRaw|JobName|User|UID|Account|Partition|QOS|NodeList|NNodes|AllocCPUS|AllocTRES|ReqMem|Submit|Start|End|ElapsedRaw|State|ExitCode|TotalCPU|Comment|ConsumedEnergyRaw
10|10|a|alice|1|lab_a|gpu|normal|g1|1|4|cpu=4,gres/gpu=1,mem=0,node=1|0|2026-10-31T12:00:00|2026-10-31T12:00:00|2026-11-01T12:00:00|86400|COMPLETED|0:0|||
11|11|b|alice|1|lab_a|gpu|normal|g1|1|2|cpu=2,mem=0,node=1|0|2026-11-05T00:00:00|2026-11-05T00:00:00|2026-11-05T10:00:00|36000|FAILED|1:0|||3600000
11.batch|11.batch|batch||1|lab_a||||1|2|cpu=2,node=1||2026-11-05T00:00:00|2026-11-05T00:00:00|2026-11-05T10:00:00|36000|FAILED|1:0|05:00:00||
12|12|c|bob|2|lab_a|gpu|normal|g2|1|1|cpu=1,mem=0,node=1|0|2026-11-06T00:00:00|2026-11-06T00:00:00|2026-11-06T01:00:00|3600|COMPLETED|0:0|||
13|13|d|carol|3|lab_b|gpu|normal|g2|1|1|cpu=1,mem=0,node=1|0|2026-11-06T00:00:00|2026-11-06T00:00:00|2026-11-06T01:00:00|3600|COMPLETED|0:0|||
"""

CONFIG = """
[cluster]
name = "hal"
carbon_zone = "FRA"
pue = 1.25
timezone = "UTC"
[estimate]
cpu_usage = "allocated"
[partitions.gpu]
cpu_tdp_w_per_core = 10
gpu_tdp_w = 300
"""


@pytest.fixture
def env(cli_env: dict[str, str], migrated_db_url: str, tmp_path: Path) -> dict[str, str]:
    cfg = tmp_path / "cocaq.toml"
    cfg.write_text(CONFIG)
    e = dict(cli_env, COCAQ_DATABASE_URL=migrated_db_url, COCAQ_CONFIG=str(cfg))
    (tmp_path / "dump.txt").write_text(DUMP)
    r = run_cocaq(["import", "sacct", "--file", str(tmp_path / "dump.txt")], e)
    assert r.code == 0, r.err
    assert "imported 4, updated 0, unchanged 0, skipped 0" in r.err
    return e


def test_user_json_prorates_jobs_across_the_window(env: dict[str, str]) -> None:
    r = run_cocaq(["user", "alice", "-S", "2026-11-01", "-E", "2026-12-01", "--format", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    for key in (
        "user",
        "since",
        "until",
        "jobs",
        "cpu_hours",
        "gpu_hours",
        "energy_kwh",
        "measured_energy_fraction",
        "co2_kg",
        "top_jobs",
    ):
        assert key in d
    assert d["user"] == "alice" and d["jobs"] == 2
    # Job 10 ran 2026-10-31 12:00 to 11-01 12:00: half of it falls in November.
    e10 = (4 * 10 + 300) * 86400  # allocated cores x 10 W + 1 GPU x 300 W, whole job
    e11 = 3600000  # measured by Slurm
    assert d["gpu_hours"] == pytest.approx(12.0)
    assert d["cpu_hours"] == pytest.approx(4 * 12 + 2 * 10)
    assert d["energy_kwh"] == pytest.approx((e10 / 2 + e11) / 3.6e6)
    assert d["measured_energy_fraction"] == pytest.approx(e11 / (e10 / 2 + e11))
    fra = zone_intensity("FRA").g_per_kwh
    assert d["co2_kg"] == pytest.approx((e10 / 2 + e11) / 3.6e6 * 1.25 * fra / 1000)
    assert d["failed_energy_kwh"] == pytest.approx(1.0)
    assert [j["job_id"] for j in d["top_jobs"]] == ["10", "11"]
    # October holds the other half: the two months add up to the whole job.
    o = json.loads(
        run_cocaq(["user", "alice", "-S", "2026-10-01", "-E", "2026-11-01", "-o", "json"], env).out
    )
    assert o["jobs"] == 1 and o["energy_kwh"] + d["energy_kwh"] == pytest.approx((e10 + e11) / 3.6e6)


def test_user_table_and_csv(env: dict[str, str]) -> None:
    r = run_cocaq(["user", "alice", "--since", "2026-11-01", "--until", "2026-12-01"], env)
    assert r.code == 0, r.err
    assert "Footprint of user alice" in r.out and "Top jobs by energy" in r.out and "measured" in r.out
    r = run_cocaq(["user", "bob", "-S", "2026-11-01", "-E", "2026-12-01", "--format", "csv"], env)
    rows = list(csv.DictReader(io.StringIO(r.out)))
    assert rows[0]["user"] == "bob" and rows[0]["jobs"] == "1"
    assert float(rows[0]["energy_kwh"]) == pytest.approx(10 * 3600 / 3.6e6)  # 1 core x 10 W, no GPU


def test_user_defaults_to_the_caller(env: dict[str, str]) -> None:
    import getpass

    r = run_cocaq(["user", "-S", "2026-11-01", "-E", "2026-12-01", "-o", "json"], env)
    assert json.loads(r.out)["user"] == getpass.getuser()


def test_lab_lists_its_users(env: dict[str, str]) -> None:
    r = run_cocaq(["lab", "lab_a", "-S", "2026-11-01", "-E", "2026-12-01", "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["lab"] == "lab_a" and d["jobs"] == 3
    assert [u["user"] for u in d["users"]] == ["alice", "bob"]
    assert sum(u["energy_kwh"] for u in d["users"]) == pytest.approx(d["energy_kwh"])
    r = run_cocaq(["lab", "lab_a", "-S", "2026-11-01", "-E", "2026-12-01"], env)
    assert "Users" in r.out and "alice" in r.out and "bob" in r.out and "carol" not in r.out


def test_job_shows_components_and_carbon(env: dict[str, str]) -> None:
    r = run_cocaq(["job", "11", "--format", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["state"] == "FAILED" and d["total_cpu_s"] == 5 * 3600
    assert d["energies"] == [
        {
            "node": "",
            "component": "node",
            "method": "measured",
            "source": "slurm-consumed-energy",
            "energy_j": 3600000.0,
            "energy_kwh": 1.0,
        }
    ]
    assert d["carbon_zone"] == "FRA" and d["pue"] == 1.25 and d["carbon_year"] == zone_intensity("FRA").year
    r = run_cocaq(["job", "10"], env)
    assert r.code == 0
    assert "estimated" in r.out and "estimate from rated power" in r.out and "zone FRA" in r.out
    assert "PUE 1.25" in r.out
    r = run_cocaq(["job", "999"], env)  # a user's words: what cocaq knows, and the command to see one's jobs
    assert r.code == 4 and "no job 999" in r.err and "cocaq user" in r.err and "import" not in r.err
    r = run_cocaq(["job", "abc"], env)
    assert r.code == 2 and "not a Slurm job id" in r.err and "import" not in r.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["user", "alice", "--since", "30x"], "bad duration '30x'"),
        (["user", "alice", "--since", "2026-02-30"], "bad date '2026-02-30'"),
        (["lab", "x", "-S", "1d", "-E", "2d"], "empty window"),
    ],
)
def test_bad_windows_exit_2(env: dict[str, str], args: list[str], message: str) -> None:
    r = run_cocaq(args, env)
    assert r.code == 2
    assert message in r.err and "Traceback" not in r.err and r.err.strip().count("\n") == 0


def test_import_from_stdin_and_bad_input(env: dict[str, str], tmp_path: Path) -> None:
    r = run_cocaq(["import", "sacct", "--file", "-"], env, stdin=DUMP.encode())
    assert r.code == 0 and "imported 0, updated 0, unchanged 4" in r.err
    r = run_cocaq(["import", "sacct", "--file", str(tmp_path / "nope.txt")], env)
    assert r.code == 4 and "cannot read" in r.err
    headerless = "\n".join(DUMP.splitlines()[1:]) + "\n"
    r = run_cocaq(["import", "sacct", "--file", "-"], env, stdin=headerless.encode())
    assert r.code == 4 and "--fields" in r.err and "Traceback" not in r.err
    fields = DUMP.splitlines()[0].replace("|", ",")
    # --parsable style: a trailing delimiter, no header, another delimiter, bytes that are not UTF-8
    body = "\n".join(line.replace("|", ";") + ";" for line in DUMP.splitlines()[1:]) + "\n"
    raw = body.encode().replace(b";a;alice", b";\xff\xfename;alice")
    r = run_cocaq(["import", "sacct", "--file", "-", "--delimiter", ";", "--fields", fields], env, stdin=raw)
    assert r.code == 0, r.err
    assert "updated 1, unchanged 3" in r.err and "not UTF-8" in r.err
    d = json.loads(run_cocaq(["job", "10", "-o", "json"], env).out)
    assert d["name"] == "\ufffd\ufffdname"


def test_import_summary_counts_skips(env: dict[str, str]) -> None:
    bad = (
        DUMP
        + "14|14|p|dave|4|lab_b|gpu|normal|None assigned|0|0||0|2026-11-06T00:00:00|Unknown|Unknown|0|PENDING|0:0|||\n"
    )
    bad += "garbage line without fields\n"
    r = run_cocaq(["import", "sacct", "--file", "-"], env, stdin=bad.encode())
    assert r.code == 0
    assert "skipped 2" in r.err
    assert "skipped 1: pending (not started yet)" in r.err and "skipped 1: wrong number of fields" in r.err


def _close(a: object, b: object, where: str = "") -> None:
    """Equal, floats to rounding (sums in another order), through dicts and lists."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


def test_user_and_lab_read_rollups_after_aggregate_and_agree_with_from_jobs(env: dict[str, str]) -> None:
    window = ["-S", "2026-10-31T06:00", "-E", "2026-11-06T12:00"]  # partial days at both ends
    r = run_cocaq(["user", "alice", *window, "-o", "json"], env)
    assert r.code == 0, r.err
    before = json.loads(r.out)
    assert before["rollups_through"] is None and before["rollup_days"] is None  # never aggregated
    assert (before["jobs_failed"], before["jobs_cancelled"], before["jobs_timeout"]) == (1, 0, 0)
    assert before["energy_other_kwh"] == pytest.approx(1.0)  # job 11's measured node energy
    assert before["energy_measured_kwh"] == pytest.approx(1.0)
    assert before["energy_gpu_kwh"] > 0 and before["energy_cpu_kwh"] > 0
    assert before["co2_embodied_kg"] == 0 and before["gpu_util_pct"] is None
    r = run_cocaq(["aggregate"], env)
    assert r.code == 0, r.err
    for cmd in (["user", "alice"], ["lab", "lab_a"]):
        fast = json.loads(run_cocaq([*cmd, *window, "-o", "json"], env).out)
        slow = json.loads(run_cocaq([*cmd, *window, "-o", "json", "--from-jobs"], env).out)
        assert fast["rollups_through"] is not None and fast["rollup_days"] == {
            "since": "2026-11-01T00:00:00+00:00",
            "until": "2026-11-06T00:00:00+00:00",
        }
        assert slow["rollups_through"] is None and slow["from_jobs"] is True
        for k in ("rollups_through", "rollup_days", "from_jobs"):
            del fast[k], slow[k]
        _close(fast, slow)
    assert fast["jobs"] == 3 and [u["user"] for u in fast["users"]] == ["alice", "bob"]
    r = run_cocaq(["user", "alice", *window], env)
    assert "  GPUs " in r.out and "measured / estimated" in r.out and "1 failed" in r.out
    assert "from the daily totals" in r.out and "did no work" in r.out
    r = run_cocaq(["lab", "lab_a", *window, "--from-jobs"], env)
    assert "GPU use" in r.out and "Computed job by job (--from-jobs)" in r.out
    rows = list(csv.DictReader(io.StringIO(run_cocaq(["user", "bob", *window, "-o", "csv"], env).out)))
    assert rows[0]["jobs"] == "1" and rows[0]["rollups_through"] and "energy_cpu_kwh" in rows[0]


def test_unknown_names_are_errors_and_known_ones_without_jobs_are_zeros(env: dict[str, str]) -> None:
    # a name the database never saw (a typo) is an error, not "no jobs"
    for args, what in (
        (["user", "no-such-user"], "no user 'no-such-user'"),
        (["lab", "no_lab"], "no lab 'no_lab'"),
        (["user", "alice", "-M", "nocluster"], "no cluster named 'nocluster'"),
    ):
        r = run_cocaq([*args, "-S", "2026-11-01", "-E", "2026-12-01", "-o", "json"], env)
        assert r.code == 2 and what in r.err and r.err.strip().count("\n") == 0, r.err
    # a known user and lab with no job in the window: zeros
    r = run_cocaq(["user", "alice", "-S", "2020-11-01", "-E", "2020-12-01", "-o", "json"], env)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["jobs"] == 0 and d["energy_kwh"] == 0 and d["top_jobs"] == [] and d["advice"] == []
    r = run_cocaq(["lab", "lab_a", "-S", "2020-11-01", "-E", "2020-12-01"], env)
    assert r.code == 0 and "No jobs ran in this window" in r.out


def _row(out: str, label: str) -> str:
    """The value of a totals row of `cocaq user/lab` (`label  value`), the label matched whole."""
    for line in out.splitlines():
        if line.startswith(label + "  "):
            return line[len(label) :].strip()
    raise AssertionError(f"no row {label!r} in:\n{out}")


def test_both_energy_figures_say_which_they_are(env: dict[str, str]) -> None:
    """Issue 31: what the hardware drew and the energy with PUE (what Green Algorithms and codecarbon call
    the energy used) are each labelled, the PUE in the label: `cocaq user`, `lab` (60 columns), `job`,
    and the JSON and CSV say the PUE too."""
    from cocaq.cli.terminal import _kwh

    window = ["-S", "2026-11-01", "-E", "2026-12-01"]
    narrow = dict(env, COLUMNS="60")
    for cmd in (["user", "alice"], ["lab", "lab_a"]):
        d = json.loads(run_cocaq([*cmd, *window, "-o", "json"], env).out)
        assert d["pue_min"] == d["pue_max"] == 1.25
        assert d["energy_kwh_with_pue"] == pytest.approx(d["energy_kwh"] * 1.25)
        r = run_cocaq([*cmd, *window], narrow)
        assert r.code == 0, r.err
        assert _row(r.out, "energy drawn by the hardware").startswith(_kwh(d["energy_kwh"]) + " ")
        assert _row(r.out, "with cooling (PUE 1.25)") == _kwh(d["energy_kwh_with_pue"])
        assert max(map(len, r.out.splitlines())) <= 60, r.out
        (row, *_) = csv.DictReader(io.StringIO(run_cocaq([*cmd, *window, "-o", "csv"], env).out))
        assert float(row["pue_min"]) == float(row["pue_max"]) == 1.25
    kwh = (4 * 10 + 300) * 86400 / 3.6e6  # job 10: 4 cores x 10 W + 1 GPU x 300 W for a day
    r = run_cocaq(["job", "10"], narrow)
    assert r.code == 0, r.err
    out = " ".join(r.out.split())
    assert f"Energy drawn by the hardware: {_kwh(kwh)} (" in out, r.out
    assert f"Energy with cooling (PUE 1.25): {_kwh(kwh * 1.25)}" in out, r.out
    assert max(map(len, r.out.splitlines())) <= 60, r.out
    d = json.loads(run_cocaq(["job", "10", "-o", "json"], env).out)
    assert d["energy_kwh_with_pue"] == pytest.approx(kwh * 1.25) and d["pue"] == 1.25
    # no job in the window: no PUE to name
    d = json.loads(
        run_cocaq(["user", "alice", "-S", "2020-11-01", "-E", "2020-12-01", "-o", "json"], env).out
    )
    assert d["pue_min"] is None and d["pue_max"] is None


def test_a_window_of_jobs_with_different_pue_names_the_range(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    """A partition with its own PUE: a window with jobs on both says `with cooling (PUE 1.10-1.25)`, and the
    energy with PUE is each job's energy x its own PUE."""
    from cocaq.cli.terminal import _kwh

    cfg = tmp_path / "cocaq.toml"
    cfg.write_text(CONFIG + "[partitions.green]\ncpu_tdp_w_per_core = 10\npue = 1.1\n")
    e = dict(cli_env, COCAQ_DATABASE_URL=db_url, COCAQ_CONFIG=str(cfg))
    assert run_cocaq(["db", "upgrade"], e).code == 0
    green = "14|14|e|alice|1|lab_a|green|normal|g3|1|1|cpu=1,mem=0,node=1|0|2026-11-07T00:00:00|2026-11-07T00:00:00|2026-11-07T01:00:00|3600|COMPLETED|0:0|||\n"  # fmt: skip
    (tmp_path / "dump.txt").write_text(DUMP + green)
    r = run_cocaq(["import", "sacct", "--file", str(tmp_path / "dump.txt")], e)
    assert r.code == 0, r.err
    window = ["-S", "2026-11-01", "-E", "2026-12-01"]
    d = json.loads(run_cocaq(["lab", "lab_a", *window, "-o", "json"], e).out)
    assert (d["pue_min"], d["pue_max"]) == (1.1, 1.25)
    users = {u["user"]: u for u in d["users"]}
    assert (users["alice"]["pue_min"], users["alice"]["pue_max"]) == (1.1, 1.25)
    assert users["bob"]["pue_min"] == users["bob"]["pue_max"] == 1.25
    green_kwh = 10 * 3600 / 3.6e6  # 1 core x 10 W for an hour
    assert d["energy_kwh_with_pue"] == pytest.approx((d["energy_kwh"] - green_kwh) * 1.25 + green_kwh * 1.1)
    for cmd in (["user", "alice"], ["lab", "lab_a"]):
        r = run_cocaq([*cmd, *window], dict(e, COLUMNS="60"))
        assert r.code == 0, r.err
        j = json.loads(run_cocaq([*cmd, *window, "-o", "json"], e).out)
        assert _row(r.out, "with cooling (PUE 1.10-1.25)") == _kwh(j["energy_kwh_with_pue"])
        assert max(map(len, r.out.splitlines())) <= 60, r.out
    r = run_cocaq(["user", "bob", *window], e)
    assert "with cooling (PUE 1.25)" in r.out
