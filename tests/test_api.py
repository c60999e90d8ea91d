"""The read API's authentication (real MUNGE credentials made by real Unix users) and authorisation."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from cocaq.accounting.importer import import_records
from cocaq.api.client import payload_for
from cocaq.config_load import load_config
from cocaq.slurm.record import JobRecord
from tests.builders import config_toml, job

NOW = datetime.now(UTC).replace(microsecond=0)
# alice and bob: tests/slurm/cluster.sh's users. daemon (uid 1) heads lab_nlp; bin (uid 2) is an admin by
# its group; root by name.
USERS = ("alice", "bob")


def _job(raw: int, user: str, account: str, name: str, hours_ago: float) -> JobRecord:
    """`user`'s one-hour job `name` in `account`, on node "vm", started `hours_ago` hours before NOW."""
    start = NOW - timedelta(hours=hours_ago)
    return job(raw, start, user=user, account=account, node_list="vm", queued=timedelta(minutes=1), name=name)


def server_config(url: str) -> str:
    """The API tests' cocaq.toml: root an admin by name, bin by its group; daemon heads lab_nlp."""
    return config_toml(
        url, defaults={"gpu_tdp_w": 300, "cpu_tdp_w_per_core": None},
        api={"admin_users": ["root"], "admin_groups": ["bin"], "lab_heads": {"lab_nlp": ["daemon"]}},
    )  # fmt: skip


def need_munge_and_users() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: makes MUNGE credentials as other users with runuser")
    missing = [u for u in USERS if not _exists(u)]
    if missing or subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
        # the one-node Slurm cluster's setup makes the users and starts munged (and installs munge)
        from tests.slurmkit import cluster_lock

        with cluster_lock():  # not while another worker's Slurm tests have hooks in slurm.conf
            r = subprocess.run(["tests/slurm/cluster.sh", "up"], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"tests/slurm/cluster.sh up failed: {r.stdout[-2000:]}{r.stderr[-2000:]}"


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def credential(user: str, method: str, path: str, ttl: int | None = None) -> str:
    """A real credential made by `user`'s own munge client, for this request."""
    payload = payload_for(method, path).decode()
    ttl_args = ["--ttl", str(ttl)] if ttl else []
    r = subprocess.run(
        ["runuser", "-u", user, "--", "munge", "-s", payload, *ttl_args],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def client(engine: Engine, tmp_path: Path) -> Iterator[httpx.Client]:
    need_munge_and_users()
    url = engine.url.render_as_string(hide_password=False)
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(server_config(url))
    cfg = load_config(cfg_path, {})
    import_records(
        engine,
        [
            _job(1, "alice", "lab_vision", "alice-resnet", 5),
            _job(2, "alice", "lab_vision", "alice-vit", 30),
            _job(3, "bob", "lab_nlp", "secret-bob-project", 10),
            _job(4, "bob", "lab_vision", "bob-in-vision", 20),
        ],
        cfg,
        source="t",
    )
    from cocaq.api.server import create_app

    app = create_app(cfg)
    with TestClient(app, base_url="http://api") as c:
        yield c


def call(c: httpx.Client, who: str, path: str, **params: Any) -> httpx.Response:
    cred = credential(who, "GET", path)
    return c.get(path, params=params, headers={"Authorization": f"MUNGE {cred}"})


def test_users_see_their_own_footprint_and_jobs_and_nobody_elses(client: httpx.Client) -> None:
    r = call(client, "alice", "/v1/users/alice")
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["user"] == "alice" and d["jobs"] == 2
    assert {j["name"] for j in d["top_jobs"]} == {"alice-resnet", "alice-vit"}
    r = call(client, "alice", "/v1/users/bob")
    assert r.status_code == 403 and r.json()["detail"] == "alice may not see user bob's footprint"
    assert call(client, "alice", "/v1/jobs/1").json()["jobs"][0]["name"] == "alice-resnet"
    # Someone else's job and no job at all: the same answer.
    theirs, absent = call(client, "alice", "/v1/jobs/3"), call(client, "alice", "/v1/jobs/999")
    assert (theirs.status_code, absent.status_code) == (403, 403)
    assert theirs.json()["detail"] == "job 3: not found, or not yours"
    assert absent.json()["detail"] == "job 999: not found, or not yours"
    assert "secret" not in theirs.text and "bob" not in theirs.text
    assert call(client, "bob", "/v1/jobs/3").status_code == 200


def test_a_lab_head_sees_the_lab_and_its_users_a_member_only_its_totals(client: httpx.Client) -> None:
    # bob's jobs in lab_nlp, never his job in lab_vision (the head of lab_nlp once saw both)
    r = call(client, "daemon", "/v1/users/bob")
    assert r.status_code == 200 and r.json()["jobs"] == 1, r.text
    assert r.json()["within_labs"] == ["lab_nlp"] and "bob-in-vision" not in r.text
    assert [j["name"] for j in r.json()["top_jobs"]] == ["secret-bob-project"]
    assert call(client, "daemon", "/v1/users/alice").status_code == 403, "alice is not in lab_nlp"
    lab = call(client, "daemon", "/v1/labs/lab_nlp").json()
    assert lab["jobs"] == 1 and [u["user"] for u in lab["users"]] == ["bob"]
    assert lab["top_jobs"][0]["name"] == "secret-bob-project" and "restricted" not in lab
    # alice is a member of lab_vision: its totals (bob's job there counts), no other member or job
    vis = call(client, "alice", "/v1/labs/lab_vision").json()
    assert vis["jobs"] == 3 and vis["restricted"] is True and vis["top_jobs"] == []
    assert [u["user"] for u in vis["users"]] == ["alice"]
    assert "bob-in-vision" not in json.dumps(vis)
    r = call(client, "alice", "/v1/labs/lab_nlp")
    assert r.status_code == 403 and r.json()["detail"] == "alice is not a member of lab lab_nlp"
    assert (
        call(client, "alice", "/v1/labs/no_such_lab").json()["detail"]
        == "alice is not a member of lab no_such_lab"
    )


def test_admins_by_name_or_group_see_everything(client: httpx.Client) -> None:
    for admin in ("root", "bin"):
        assert call(client, admin, "/v1/whoami").json()["admin"] is True
        assert call(client, admin, "/v1/users/bob").json()["jobs"] == 2
        assert call(client, admin, "/v1/jobs/3").json()["jobs"][0]["name"] == "secret-bob-project"
        top = call(client, admin, "/v1/top", by="account").json()
        assert [r["account"] for r in top["rows"]] == ["lab_vision", "lab_nlp"]
    assert call(client, "alice", "/v1/whoami").json() == {
        "user": "alice", "uid": pwd.getpwnam("alice").pw_uid, "admin": False, "lab_head_of": [],
    }  # fmt: skip
    assert call(client, "daemon", "/v1/whoami").json()["lab_head_of"] == ["lab_nlp"]
    r = call(client, "alice", "/v1/top")
    assert r.status_code == 403 and "not an admin" in r.json()["detail"]


def test_models_are_scoped_like_the_rest(client: httpx.Client) -> None:
    assert call(client, "alice", "/v1/models").json()["user"] == "alice"
    assert call(client, "alice", "/v1/models", user="bob").status_code == 403
    assert call(client, "alice", "/v1/models", account="lab_vision").status_code == 403, (
        "members: totals only"
    )
    assert call(client, "daemon", "/v1/models", account="lab_nlp").status_code == 200
    # a head asks for the lab: asking for a member would show their runs in other labs too
    r = call(client, "daemon", "/v1/models", user="bob")
    assert r.status_code == 403 and "account=LAB" in r.json()["detail"]


def test_bad_expired_replayed_and_misdirected_credentials_are_refused(client: httpx.Client) -> None:
    path = "/v1/users/alice"
    assert client.get(path).status_code == 401
    assert "authenticate with MUNGE" in client.get(path).json()["detail"]
    for header in ("MUNGE", "MUNGE garbage", "Bearer x", "MUNGE MUNGE:AAAA:"):
        r = client.get(path, headers={"Authorization": header})
        assert r.status_code == 401, (header, r.text)
    cred = credential("alice", "GET", path)
    first = client.get(path, headers={"Authorization": f"MUNGE {cred}"})
    again = client.get(path, headers={"Authorization": f"MUNGE {cred}"})
    assert first.status_code == 200 and again.status_code == 401
    assert "replayed" in again.json()["detail"], again.text
    # made for another request: refused, even though it is alice's and valid
    other = credential("alice", "GET", "/v1/whoami")
    r = client.get(path, headers={"Authorization": f"MUNGE {other}"})
    assert r.status_code == 401 and "another request" in r.json()["detail"]
    short = credential("alice", "GET", path, ttl=1)
    time.sleep(3)  # never used before it expired (a use would make a later one a replay)
    r = client.get(path, headers={"Authorization": f"MUNGE {short}"})
    assert r.status_code == 401 and "expired" in r.json()["detail"], r.text


def test_bad_parameters_are_400_or_422_never_500(client: httpx.Client) -> None:
    for path, params in (
        ("/v1/users/alice", {"since": "yesterday-ish"}),
        ("/v1/users/alice", {"since": "1d", "until": "2d"}),
        ("/v1/users/alice", {"top": "-1"}),
        ("/v1/top", {"by": "gpu"}),
    ):
        r = call(client, "root", path, **params)
        assert r.status_code in (400, 422), (path, params, r.status_code, r.text)
    assert client.get("/openapi.json").status_code == 200


# Who asks (MUNGE user) -> what they are here: alice and bob are members of lab_vision, bob also of
# lab_nlp; daemon heads lab_nlp (and is no member of anything); carol... is not a unix user here, so a
# former member is alice in lab_nlp: her only job there ended 700 days ago (the `former` fixture).
MATRIX: list[tuple[str, str, dict[str, str], dict[str, int]]] = [
    # path, params, {caller: status}; None caller = no credential (401 for every path)
    ("/v1/whoami", {}, {"alice": 200, "bob": 200, "daemon": 200, "root": 200}),
    ("/v1/users/alice", {}, {"alice": 200, "bob": 403, "daemon": 200, "root": 200}),
    ("/v1/users/bob", {}, {"alice": 403, "bob": 200, "daemon": 200, "root": 200}),
    ("/v1/labs/lab_vision", {}, {"alice": 200, "bob": 200, "daemon": 403, "root": 200}),
    ("/v1/labs/lab_nlp", {}, {"alice": 200, "bob": 200, "daemon": 200, "root": 200}),
    ("/v1/jobs/1", {}, {"alice": 200, "bob": 403, "daemon": 403, "root": 200}),
    ("/v1/jobs/3", {}, {"alice": 403, "bob": 200, "daemon": 200, "root": 200}),
    ("/v1/jobs/4", {}, {"alice": 403, "bob": 200, "daemon": 403, "root": 200}),
    ("/v1/models", {"user": "bob"}, {"alice": 403, "bob": 200, "daemon": 403, "root": 200}),
    ("/v1/models", {"account": "lab_nlp"}, {"alice": 403, "bob": 403, "daemon": 200, "root": 200}),
    ("/v1/models", {"account": "lab_vision"}, {"alice": 403, "bob": 403, "daemon": 403, "root": 200}),
    ("/v1/top", {}, {"alice": 403, "bob": 403, "daemon": 403, "root": 200}),
]


def test_access_matrix(client: httpx.Client, engine: Engine, tmp_path: Path) -> None:
    """Every endpoint x {self, a member of the same lab, the head of another lab, a former member, an
    admin, no credential, a replayed credential}: the expected answer, and what a refusal or a
    restricted answer never contains."""
    cfg = load_config(None, {"COCAQ_DATABASE_URL": engine.url.render_as_string(hide_password=False)})
    import_records(engine, [_job(5, "alice", "lab_nlp", "alice-old-nlp", 700 * 24)], cfg, source="t")
    for path, params, expect in MATRIX:
        for who, status in expect.items():
            r = call(client, who, path, **params)
            assert r.status_code == status, (path, params, who, r.status_code, r.text[:300])
            if status != 200:
                assert not any(s in r.text for s in ("secret-bob", "bob-in-vision", "alice-resnet")), r.text
        assert client.get(path, params=params).status_code == 401, (path, "no credential")
        cred = credential("root", "GET", path)
        first = client.get(path, params=params, headers={"Authorization": f"MUNGE {cred}"})
        again = client.get(path, params=params, headers={"Authorization": f"MUNGE {cred}"})
        assert first.status_code == 200 and again.status_code == 401, (path, "replayed")
    # what the allowed but restricted answers hold
    head_on_alice = call(client, "daemon", "/v1/users/alice").json()
    assert head_on_alice["jobs"] == 0 and head_on_alice["within_labs"] == ["lab_nlp"]
    assert "alice-resnet" not in json.dumps(head_on_alice) and "alice-vit" not in json.dumps(head_on_alice)
    # `cocaq user bob` through the API, as the head reads it: the restriction is said
    from rich.console import Console

    from cocaq.cli.terminal import print_footprint
    from cocaq.footprint.totals import Footprint

    con = Console(record=True, width=100)
    print_footprint(Footprint.from_dict(call(client, "daemon", "/v1/users/bob").json()), con)
    assert "Only their jobs in lab_nlp (the labs you head)." in con.export_text()
    former = call(client, "alice", "/v1/labs/lab_nlp").json()
    assert (
        former["restricted"] is True and former["top_jobs"] == [] and "secret-bob" not in json.dumps(former)
    )
    assert [u["user"] for u in former["users"]] == []
    member = call(client, "bob", "/v1/labs/lab_vision").json()
    assert member["restricted"] is True and "alice" not in json.dumps(member["users"])
