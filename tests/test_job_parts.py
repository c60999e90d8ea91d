"""`cocaq job 900` for a heterogeneous job (issue 31): its components and their sum, as `sacct -j 900`
lists them, through the code that shows an array's tasks (cocaq.footprint.job_parts).

The real captures hold only a het job that never started (skipped at import), so the sacct lines below
are HAND-MADE, in the real 22.05 capture's format (tests/data/sacct/slurm2205_parsable2.txt: its header,
its TRES and step lines, a component's raw id, the leader's being the base id as Slurm gives it). They are
imported with the real capture through `cocaq import sacct --file` and read back on SQLite and PostgreSQL,
through the CLI, the read API and the CLI through the API as an ordinary user.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient

from cocaq.accounting import measured
from cocaq.collector.ship import connect
from cocaq.config_load import load_config
from cocaq.db.engine import make_engine
from tests.conftest import DATA, new_database
from tests.test_api import credential, need_munge_and_users, server_config
from tests.test_job_array import Site, as_json, cli, db_sum
from tests.test_measured import _event

CAPTURE = DATA / "sacct" / "slurm2205_parsable2.txt"
T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)

# HAND-MADE sacct lines (no real capture has a het job that ran), in the capture's --parsable2 format.
# 900: alice's pipeline, component 900+0 (raw id 900: the leader's is the base id) on the gpu partition
# with 2 GPUs and 4 CPUs, 900+1 (raw id 901) on the cpu partition with 16 CPUs, an hour each; a step per
# component. 910: bob's, 910+0 FAILED after 30 min, 910+1 still running. On cluster "other" (OTHER), 900
# is another het job, and 10 a het job where cocaqtest has array 10 (the real capture's).
HEADER = CAPTURE.read_text().splitlines()[0]
HET = """\
900+0|900|het_pipeline|alice|1001|lab_vision|gpu|normal|vm|1|4|billing=4,cpu=4,gres/gpu:a100=2,gres/gpu=2,mem=8000M,node=1|billing=4,cpu=4,gres/gpu=2,mem=8000M,node=1|8000M|2026-11-22T09:59:00|2026-11-22T10:00:00|2026-11-22T11:00:00|01:00:00|3600|COMPLETED|0:0|03:00:00|||cocaqtest|02:00:00
900+0.batch|900.batch|batch|||lab_vision|||vm|1|4|cpu=4,gres/gpu:a100=2,gres/gpu=2,mem=8000M,node=1|||2026-11-22T10:00:00|2026-11-22T10:00:00|2026-11-22T11:00:00|01:00:00|3600|COMPLETED|0:0|03:00:00||0|cocaqtest|
900+1|901|het_pipeline|alice|1001|lab_vision|cpu|normal|vm2|1|16|billing=16,cpu=16,mem=32000M,node=1|billing=16,cpu=16,mem=32000M,node=1|32000M|2026-11-22T09:59:00|2026-11-22T10:00:00|2026-11-22T11:00:00|01:00:00|3600|COMPLETED|0:0|12:00:00|||cocaqtest|02:00:00
900+1.0|901.0|prep|||lab_vision|||vm2|1|16|cpu=16,mem=32000M,node=1|||2026-11-22T10:00:00|2026-11-22T10:00:00|2026-11-22T11:00:00|01:00:00|3600|COMPLETED|0:0|12:00:00||0|cocaqtest|
910+0|910|het_nlp|bob|1002|lab_nlp|gpu|normal|vm|1|2|billing=2,cpu=2,gres/gpu:a100=1,gres/gpu=1,mem=4000M,node=1|billing=2,cpu=2,gres/gpu=1,mem=4000M,node=1|4000M|2026-11-22T09:59:00|2026-11-22T10:00:00|2026-11-22T10:30:00|00:30:00|1800|FAILED|1:0|00:20:00|||cocaqtest|02:00:00
910+1|911|het_nlp|bob|1002|lab_nlp|cpu|normal|vm2|1|8|billing=8,cpu=8,mem=16000M,node=1|billing=8,cpu=8,mem=16000M,node=1|16000M|2026-11-22T09:59:00|2026-11-22T10:00:00|Unknown|00:40:00|2400|RUNNING|0:0|00:00:00|||cocaqtest|02:00:00
"""
# (cluster "other"'s lines in a file of their own, as `sacct` on that cluster prints them: one file holds
# each job id once)
OTHER = """\
900+0|900|het_pipeline|alice|1001|lab_vision|gpu|normal|n1|1|4|billing=4,cpu=4,gres/gpu=1,mem=8000M,node=1|billing=4,cpu=4,gres/gpu=1,mem=8000M,node=1|8000M|2026-11-22T09:59:00|2026-11-22T10:00:00|2026-11-22T10:10:00|00:10:00|600|COMPLETED|0:0|00:30:00|||other|02:00:00
900+1|901|het_pipeline|alice|1001|lab_vision|cpu|normal|n2|1|4|billing=4,cpu=4,mem=8000M,node=1|billing=4,cpu=4,mem=8000M,node=1|8000M|2026-11-22T09:59:00|2026-11-22T10:00:00|2026-11-22T10:10:00|00:10:00|600|COMPLETED|0:0|00:30:00|||other|02:00:00
10+0|10|het_other|alice|1001|lab_vision|cpu|normal|n1|1|1|billing=1,cpu=1,mem=1000M,node=1|billing=1,cpu=1,mem=1000M,node=1|1000M|2026-11-22T09:59:00|2026-11-22T10:00:00|2026-11-22T10:10:00|00:10:00|600|COMPLETED|0:0|00:05:00|||other|02:00:00
10+1|11|het_other|alice|1001|lab_vision|cpu|normal|n2|1|1|billing=1,cpu=1,mem=1000M,node=1|billing=1,cpu=1,mem=1000M,node=1|1000M|2026-11-22T09:59:00|2026-11-22T10:00:00|2026-11-22T10:10:00|00:10:00|600|COMPLETED|0:0|00:05:00|||other|02:00:00
"""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Site:
    tmp = tmp_path_factory.mktemp(f"het-{request.param}")
    url = new_database(request.param, tmp, request)
    cfg_path = tmp / "cocaq.toml"
    cfg_path.write_text(server_config(url))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "TZ": "UTC", "PYTHONUNBUFFERED": "1"}
    s = Site(request.param, url, cfg_path, env)
    assert cli(s, "db", "upgrade").code == 0
    het, other = tmp / "het.txt", tmp / "other.txt"
    het.write_text(HEADER + "\n" + HET)
    other.write_text(HEADER + "\n" + OTHER)
    for f in (CAPTURE, het, other):
        r = cli(s, "import", "sacct", "--file", str(f))
        assert r.code == 0, r.err
    # 900+0 measured on its node (by raw id 900 and start), 900+1 estimated
    engine = make_engine(url)
    target = connect(url)
    events = [
        {**e, "cluster": "cocaqtest"} for e in _event(900, T0, {"GPU-a": 900_000.0, "GPU-b": 700_000.0})
    ]
    target.ship_events(target.cluster_id("cocaqtest"), events)
    assert measured.refresh(engine, load_config(cfg_path, {})).jobs_measured == 1
    engine.dispose()
    return s


def test_a_het_base_id_shows_both_components_not_the_leader_alone(site: Site) -> None:
    h = as_json(site, "900", "--cluster", "cocaqtest")
    assert h["kind"] == "het" and h["job_id"] == "900" and h["het_job_id"] == 900 and "tasks" not in h
    assert (h["user_name"], h["account"], h["name"]) == ("alice", "lab_vision", "het_pipeline")
    c = h["components"]
    assert [p["job_id"] for p in c] == ["900+0", "900+1"] and h["n_components"] == 2
    assert [p["job_id_raw"] for p in c] == [900, 901], "the leader's raw id is the base id"
    assert [(p["het_job_offset"], p["partition"], p["alloc_cpus"], p["alloc_gpus"]) for p in c] == [
        (0, "gpu", 4, 2),
        (1, "cpu", 16, 0),
    ]
    assert h["states"] == {"COMPLETED": 2} and h["running"] == 0
    assert (h["span_s"], h["run_time_s"], h["gpu_hours"], h["cpu_hours"]) == (3600, 7200, 2.0, 20.0)
    kwh, measured_kwh, co2 = db_sum(site, "j.het_job_id = 900 AND cl.name = 'cocaqtest'")
    assert h["energy_kwh"] == pytest.approx(kwh) and h["co2_kg"] == pytest.approx(co2) and co2 > 0
    assert h["energy_measured_kwh"] == pytest.approx(measured_kwh) == pytest.approx(1.6e6 / 3.6e6)
    assert 0 < h["measured_share"] < 1
    assert c[0]["energy_measured_kwh"] > 0 and c[1]["energy_measured_kwh"] == 0
    # one component is that component in full, as before
    for part, raw in (("900+1", 901), ("900+0", 900)):
        one = as_json(site, part, "--cluster", "cocaqtest")
        assert (one["job_id"], one["job_id_raw"], one["het_job_id"]) == (part, raw, 900)
        assert "components" not in one and "energies" in one
    # the same id on two clusters: two het jobs; an array's task list never names a het job's part
    assert [(w["cluster"], w["n_components"]) for w in as_json(site, "900")] == [
        ("cocaqtest", 2),
        ("other", 2),
    ]
    none = cli(site, "job", "900_[0-1]")
    assert none.code == 4 and none.err.startswith("cocaq: error: no task of array 900_[0-1]")


def test_an_array_and_a_het_job_of_one_base_id_on_two_clusters(site: Site) -> None:
    both = as_json(site, "10")
    assert [(w["kind"], w["cluster"]) for w in both] == [("array", "cocaqtest"), ("het", "other")]
    assert [t["job_id"] for t in both[0]["tasks"]] == ["10_0", "10_1", "10_2", "10_3"]
    assert [p["job_id"] for p in both[1]["components"]] == ["10+0", "10+1"]
    assert as_json(site, "10_[0-9]")["kind"] == "array", "a task list: the array's tasks only"


def test_the_table_sums_the_het_job_and_lists_each_component(site: Site) -> None:
    r = cli(site, "job", "900", "--cluster", "cocaqtest", columns=100)
    assert r.code == 0 and r.err == "", r.err
    lines = r.out.splitlines()
    assert lines[0] == "Heterogeneous job 900 on cluster cocaqtest: het_pipeline"
    for label, value in (("user", "alice"), ("components", "2 components: 2 COMPLETED"),
                         ("span", "01:00:00 from the first start to the last end"),
                         ("component run time", "02:00:00 in all"), ("GPU-hours", "2.00"),
                         ("energy", "% measured: "), ("CO2e", "CO2e")):  # fmt: skip
        assert any(line.startswith(label.ljust(20)) and value in line for line in lines), (label, r.out)
    head = next(line for line in lines if line.startswith("┃component"))
    assert [c.strip() for c in head.split("┃")[1:-1]][:6] == ["component", "partition", "state", "run time",
                                                               "CPUs", "GPUs"]  # fmt: skip
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
            for line in lines if line.startswith("│900+")}  # fmt: skip
    assert rows["900+0"][1:6] == ["gpu", "COMPLETED", "01:00:00", "4", "2"] and rows["900+0"][-1].endswith(
        "measured"
    )
    assert (
        rows["900+1"][1:6] == ["cpu", "COMPLETED", "01:00:00", "16", "0"] and rows["900+1"][-1] == "estimated"
    )
    assert "Components (" in r.out and "`cocaq job 900+0` shows one component in full." in r.out
    narrow = cli(site, "job", "910", columns=60)
    assert narrow.code == 0 and max(len(line.rstrip()) for line in narrow.out.splitlines()) <= 60, narrow.out
    assert "2 components: 1 FAILED, 1 RUNNING" in narrow.out and "1 component still running" in narrow.out
    # in 60 columns a component's partition and CPUs stay (they set the components apart), its run time goes
    cells = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
             for line in narrow.out.splitlines() if line.startswith("│910+")}  # fmt: skip
    assert cells["910+0"][:4] == ["910+0", "gpu", "FAILED", "2"] and cells["910+1"][:4] == [
        "910+1",
        "cpu",
        "RUNNING",
        "8",
    ]
    assert "(too narrow for: run time, how; --format json has them)" in narrow.out


@pytest.mark.parametrize("bad", ["900+", "900+x", "900+[0-1]", "900+0+1", "+1"])
def test_a_bad_het_id_is_one_line_and_exit_2(site: Site, bad: str) -> None:
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
    cred = credential(who, "GET", f"/v1/jobs/{job_id}")
    return c.get("/v1/jobs/" + quote(job_id, safe=""), headers={"Authorization": f"MUNGE {cred}"})


def test_the_api_shows_a_het_job_to_whom_it_shows_its_components(api: httpx.Client) -> None:
    mine = call(api, "alice", "900").json()
    assert mine["jobs"] == [] and mine["arrays"] == []
    assert [(w["cluster"], [p["job_id"] for p in w["components"]]) for w in mine["het_jobs"]] == [
        ("cocaqtest", ["900+0", "900+1"]),
        ("other", ["900+0", "900+1"]),
    ]
    # bob's het job: to alice as if it did not exist (the same answer as no job at all), whole or a part
    for ask in ("910", "910+1"):
        r = call(api, "alice", ask)
        assert r.status_code == 403 and r.json()["detail"] == f"job {ask}: not found, or not yours", r.text
        assert "bob" not in r.text and "het_nlp" not in r.text
    assert call(api, "bob", "910").json()["het_jobs"][0]["n_components"] == 2
    assert call(api, "daemon", "910").status_code == 200, "the head of lab_nlp"
    assert call(api, "daemon", "900").status_code == 403, "not the head of lab_vision"
    assert call(api, "root", "910").json()["het_jobs"][0]["user_name"] == "bob", "an admin"


def test_an_ordinary_user_through_the_api_sees_what_the_database_shows(site: Site) -> None:
    from tests.test_api_cli import serving
    from tests.userkit import run_as

    need_munge_and_users()
    with serving(site.cfg, "http") as base:
        env = {"COCAQ_API_URL": base, "COLUMNS": "60", "TZ": "UTC"}
        for args in (["900"], ["900", "-o", "json"], ["10", "-o", "json"], ["900+1", "--cluster", "other"]):
            r = run_as("alice", ["job", *args], env)
            direct = cli(site, "job", *args, columns=60)
            assert r.returncode == 0 and direct.code == 0, (r.stderr, direct.err)
            assert r.stdout == direct.out, args
        r = run_as("alice", ["job", "910"], env)
        assert r.returncode == 5 and r.stdout == ""
        assert r.stderr.strip().endswith("403: job 910: not found, or not yours")
