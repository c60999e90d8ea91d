"""`cocaq job 123` for a job array (issue 31): its tasks and their sum, as `sacct -j 123` lists them.

Real sacct captures imported through the CLI (tests/data/sacct/slurm2205_parsable2.txt: alice's array 10,
whose tasks 10_0..10_3 have raw ids 18, 19, 20 and 10; bob's array 11 of ten tasks), plus a GPU array
with a measured task and a running one; on SQLite and PostgreSQL, through the CLI, the read API and the
CLI through the API as an ordinary user.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from cocaq.accounting import measured
from cocaq.accounting.importer import import_records
from cocaq.collector.ship import connect
from cocaq.config_load import load_config
from cocaq.db.engine import make_engine
from cocaq.slurm.record import JobRecord
from tests.builders import job
from tests.conftest import DATA, Result, new_database, run_cocaq
from tests.test_api import credential, need_munge_and_users, server_config
from tests.test_measured import _event

CAPTURE = DATA / "sacct" / "slurm2205_parsable2.txt"
T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


@dataclass
class Site:
    kind: str
    url: str
    cfg: Path
    env: dict[str, str]


def _task(
    base: int, task: int, raw: int, start: datetime, cluster: str = "cocaqtest", **kw: Any
) -> JobRecord:
    """Task `base`_`task` of alice's two-GPU array in lab_vision, one hour on node vm."""
    r = job(raw, start, user="alice", account="lab_vision", gpus=2, node_list="vm", cluster=cluster,
            queued=timedelta(minutes=1), name="sweep", **kw)  # fmt: skip
    r.job_id, r.array_job_id, r.array_task_id = f"{base}_{task}", base, task
    r.submit_time = T0 - timedelta(minutes=1)  # an array's tasks share its submission
    return r


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Site:
    tmp = tmp_path_factory.mktemp(f"arrays-{request.param}")
    url = new_database(request.param, tmp, request)
    cfg_path = tmp / "cocaq.toml"
    cfg_path.write_text(server_config(url))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "TZ": "UTC", "PYTHONUNBUFFERED": "1"}
    s = Site(request.param, url, cfg_path, env)
    assert cli(s, "db", "upgrade").code == 0
    r = cli(s, "import", "sacct", "--file", str(CAPTURE))
    assert r.code == 0, r.err
    # Array 700: task 700_2 has the base id as its raw id (as Slurm gives the last task), 700_0 was
    # measured on the node, 700_3 still runs; array 700 of another cluster is another array.
    cfg = load_config(cfg_path, {})
    engine = make_engine(url)
    tasks = [
        _task(700, 0, 701, T0),
        _task(700, 1, 702, T0 + timedelta(hours=1), state="FAILED"),
        _task(700, 2, 700, T0 + timedelta(hours=2)),
        _task(700, 3, 703, T0 + timedelta(hours=3), running=True),
        _task(700, 0, 801, T0, cluster="other"),
    ]
    import_records(engine, tasks, cfg, source="t")
    target = connect(url)
    gpu_j = {"GPU-a": 900_000.0, "GPU-b": 700_000.0}
    events = [{**e, "cluster": "cocaqtest"} for e in _event(701, T0, gpu_j)]
    target.ship_events(target.cluster_id("cocaqtest"), events)
    assert measured.refresh(engine, cfg).jobs_measured == 1
    engine.dispose()
    return s


def cli(s: Site, *args: str, columns: int | None = None) -> Result:
    env = s.env if columns is None else {**s.env, "COLUMNS": str(columns)}
    return run_cocaq(["--config", str(s.cfg), *args], env)


def as_json(s: Site, *args: str) -> Any:
    r = cli(s, "job", *args, "-o", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)


def db_sum(s: Site, where: str) -> tuple[float, float, float]:
    engine = make_engine(s.url)
    try:
        with engine.connect() as c:
            row = c.execute(
                text(
                    "SELECT sum(j.energy_j), sum(j.energy_measured_j), sum(j.co2_g) FROM jobs j "
                    f"JOIN clusters cl ON cl.id = j.cluster_id WHERE {where}"
                )
            ).one()
    finally:
        engine.dispose()
    return float(row[0]) / 3.6e6, float(row[1]) / 3.6e6, float(row[2]) / 1000


def test_a_base_id_shows_every_task_not_the_task_whose_raw_id_it_is(site: Site) -> None:
    a = as_json(site, "10")
    assert a["kind"] == "array" and a["job_id"] == "10" and a["cluster"] == "cocaqtest"
    assert (a["user_name"], a["account"], a["name"]) == ("alice", "lab_vision", "arr4")
    assert [t["job_id"] for t in a["tasks"]] == ["10_0", "10_1", "10_2", "10_3"]
    assert [t["job_id_raw"] for t in a["tasks"]] == [18, 19, 20, 10]
    assert a["n_tasks"] == 4 and a["states"] == {"COMPLETED": 4} and a["running"] == 0
    # the span: the first task started 07:34:29, the last ended 07:34:40; each ran 2 s
    assert (a["start_time"], a["end_time"]) == ("2026-11-21T07:34:29+00:00", "2026-11-21T07:34:40+00:00")
    assert a["span_s"] == 11 and a["run_time_s"] == 8 and a["gpu_hours"] == 0
    kwh, measured_kwh, co2 = db_sum(site, "j.array_job_id = 10")
    assert a["energy_kwh"] == pytest.approx(kwh) and kwh > 0
    assert a["energy_kwh"] == pytest.approx(sum(t["energy_kwh"] for t in a["tasks"]))
    assert a["co2_kg"] == pytest.approx(co2) and measured_kwh == a["energy_measured_kwh"] == 0
    assert a["measured_share"] == 0
    # a task id is that one task, in full, as before; the task with raw id 10 is 10_3
    one = as_json(site, "10_3")
    assert (one["job_id"], one["job_id_raw"], one["array_job_id"]) == ("10_3", 10, 10) and "tasks" not in one
    r = cli(site, "job", "10_2")
    assert r.code == 0 and r.out.startswith("Job 10_2 on cluster cocaqtest: arr4") and "10_1" not in r.out
    plain = as_json(site, "5")  # a job that is no array: as before
    assert plain["job_id"] == "5" and "kind" not in plain


def test_the_table_sums_the_array_and_lists_each_task_in_60_columns(site: Site) -> None:
    r = cli(site, "job", "11", columns=60)
    assert r.code == 0 and r.err == "", r.err
    lines = r.out.splitlines()
    assert lines[0] == "Job array 11 on cluster cocaqtest: arr10_throttled"
    assert max(len(line.rstrip()) for line in lines) <= 60, r.out
    for label, value in (("user", "bob"), ("lab (account)", "lab_nlp"), ("tasks", "10 tasks: 10 COMPLETED"),
                         ("first start", "2026-11-21 07:34:41"), ("last end", "2026-11-21 07:35:20"),
                         ("span", "00:00:39 from the first start to the last end"),
                         ("task run time", "00:00:30 in all"), ("GPU-hours", "0.00"),
                         ("energy", "Wh (all estimated)"), ("with cooling", "(PUE "), ("CO2e", " g")):  # fmt: skip
        assert any(line.startswith(label.ljust(15)) and value in line for line in lines), (label, r.out)
    rows = [line for line in lines if line.startswith("│11_")]
    assert [row.split("│")[1].strip() for row in rows] == [f"11_{i}" for i in range(10)]
    assert all("COMPLETED" in row and "00:00:03" in row for row in rows)
    assert "Tasks (Wh drawn by the hardware)" in r.out and "`cocaq job 11_0` shows one task in full." in r.out


def test_a_gpu_array_its_gpu_hours_measured_share_and_running_task(site: Site) -> None:
    both = as_json(site, "700")
    assert [(a["cluster"], a["n_tasks"]) for a in both] == [("cocaqtest", 4), ("other", 1)], "one per cluster"
    a = as_json(site, "700", "--cluster", "cocaqtest")
    assert [t["job_id"] for t in a["tasks"]] == ["700_0", "700_1", "700_2", "700_3"]
    assert [t["job_id_raw"] for t in a["tasks"]] == [701, 702, 700, 703]
    assert a["states"] == {"COMPLETED": 2, "FAILED": 1, "RUNNING": 1} and a["running"] == 1
    assert a["end_time"] is None and a["span_s"] is None, "a running task: no end yet"
    assert a["gpu_hours"] == pytest.approx(8.0)  # four tasks of two GPUs, an hour each
    kwh, measured_kwh, co2 = db_sum(site, "j.array_job_id = 700 AND cl.name = 'cocaqtest'")
    assert a["energy_measured_kwh"] == pytest.approx(1.6e6 / 3.6e6) == pytest.approx(measured_kwh)
    assert a["energy_kwh"] == pytest.approx(kwh) and a["co2_kg"] == pytest.approx(co2)
    assert a["measured_share"] == pytest.approx(measured_kwh / kwh) and 0 < a["measured_share"] < 1
    assert a["tasks"][0]["energy_measured_kwh"] > 0 and a["tasks"][2]["energy_measured_kwh"] == 0
    r = cli(site, "job", "700", "--cluster", "cocaqtest", columns=100)
    assert r.code == 0, r.err
    assert f"{a['measured_share']:.0%} measured" in r.out and "2 COMPLETED, 1 FAILED, 1 RUNNING" in r.out
    assert "1 task still running" in r.out and "GPU-hours      8.00" in r.out
    row = {line.split("│")[1].strip(): line for line in r.out.splitlines() if line.startswith("│700_")}
    assert "measured" in row["700_0"] and "estimated" in row["700_2"] and "RUNNING" in row["700_3"]
    assert "Tasks (Wh drawn by the hardware)" in r.out, "each task's figures under 1 kWh: in Wh"


def test_a_pasted_task_list_shows_those_tasks(site: Site) -> None:
    assert [t["job_id"] for t in as_json(site, "10_[1-2]")["tasks"]] == ["10_1", "10_2"]
    assert as_json(site, "11_[0-9%2]")["n_tasks"] == 10, "squeue's throttle is no filter"
    some = as_json(site, "11_[3,5-6]")
    assert [t["job_id"] for t in some["tasks"]] == ["11_3", "11_5", "11_6"] and some["asked"] == "11_[3,5-6]"
    r = cli(site, "job", "11_[3,5-6]", columns=60)
    assert r.code == 0 and "3 tasks of 11_[3,5-6]: 3 COMPLETED" in r.out, r.out
    none = cli(site, "job", "10_[7-9]")
    assert none.code == 4 and none.out == ""
    assert none.err.startswith("cocaq: error: no task of array 10_[7-9] in cocaq's records")
    assert cli(site, "job", "12345").err.startswith("cocaq: error: no job 12345 in cocaq's records")
    assert "task range 3-1 runs backwards" in cli(site, "job", "10_[3-1]").err


@pytest.mark.parametrize("bad", ["10_[3-1]", "10_[", "10_[]", "10_[a]", "10_*", "10_[1]x"])
def test_a_bad_task_list_is_one_line_and_exit_2(site: Site, bad: str) -> None:
    r = cli(site, "job", bad)
    assert r.code == 2 and r.out == "" and len(r.err.splitlines()) == 1, r.err
    assert r.err.startswith(f"cocaq: error: {bad!r}") and "Traceback" not in r.err


@pytest.fixture
def api(site: Site) -> Any:
    need_munge_and_users()
    from cocaq.api.server import create_app

    with TestClient(create_app(load_config(site.cfg, {})), base_url="http://api") as c:
        yield c


def call(c: httpx.Client, who: str, job_id: str) -> httpx.Response:
    path = f"/v1/jobs/{job_id}"
    cred = credential(who, "GET", path)
    return c.get("/v1/jobs/" + quote(job_id, safe=""), headers={"Authorization": f"MUNGE {cred}"})


def test_the_api_shows_an_array_to_whom_it_shows_its_tasks(api: httpx.Client) -> None:
    mine = call(api, "alice", "10")
    assert mine.status_code == 200, mine.text
    [a] = mine.json()["arrays"]
    assert mine.json()["jobs"] == [] and [t["job_id"] for t in a["tasks"]] == ["10_0", "10_1", "10_2", "10_3"]
    [two] = call(api, "alice", "10_[0-1]").json()["arrays"]
    assert [t["job_id"] for t in two["tasks"]] == ["10_0", "10_1"]
    # bob's array: to alice as if it did not exist (the same answer as no job at all), tasks and lists alike
    for ask in ("11", "11_[0-9]", "11_4"):
        r = call(api, "alice", ask)
        assert r.status_code == 403 and r.json()["detail"] == f"job {ask}: not found, or not yours", r.text
        assert "bob" not in r.text and "arr10" not in r.text
    assert call(api, "alice", "999").json()["detail"] == "job 999: not found, or not yours"
    assert call(api, "bob", "11").json()["arrays"][0]["n_tasks"] == 10
    assert call(api, "daemon", "11").status_code == 200, "the head of lab_nlp"
    assert call(api, "daemon", "10").status_code == 403, "not the head of lab_vision"
    assert call(api, "root", "10").json()["arrays"][0]["user_name"] == "alice", "an admin"
    assert call(api, "alice", "10_[3-1]").status_code == 400


def test_an_ordinary_user_through_the_api_sees_what_the_database_shows(site: Site, tmp_path: Path) -> None:
    from tests.test_api_cli import serving
    from tests.userkit import run_as

    need_munge_and_users()
    with serving(site.cfg, "http") as base:
        env = {"COCAQ_API_URL": base, "COLUMNS": "60", "TZ": "UTC"}
        for args in (["10"], ["10", "-o", "json"], ["10_[1-2]", "-o", "json"], ["10_2", "-o", "json"]):
            r = run_as("alice", ["job", *args], env)
            direct = cli(site, "job", *args, columns=60)
            assert r.returncode == 0 and direct.code == 0, (r.stderr, direct.err)
            assert r.stdout == direct.out, args
        r = run_as("alice", ["job", "11"], env)
        assert r.returncode == 5 and r.stdout == ""
        assert r.stderr.strip().endswith("403: job 11: not found, or not yours")
        assert run_as("bob", ["job", "11_[0-1]", "-o", "json"], env).returncode == 0
