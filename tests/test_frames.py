"""cocaq.frames and `cocaq export` (issue 22): the same numbers as `cocaq user`/`lab`, the same frame from
the database and from the read API, the API's access rules, CSV and parquet, on both databases."""

from __future__ import annotations

import io
import json
import pwd
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import Engine, insert, select

from cocaq import frames
from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.api.client import ApiRefused
from cocaq.config import Config
from cocaq.db.schema import Job, ModelMetadata, SentReport, StudyArm
from cocaq.errors import UsageError
from tests.builders import config
from tests.builders import job as _job
from tests.conftest import ROOT, run_cocaq

# Midnight UTC ten days ago: the aggregator (run now) has rolled up every day of the data.
DAY0 = (datetime.now(UTC) - timedelta(days=10)).replace(hour=0, minute=0, second=0, microsecond=0)
H = timedelta(hours=1)
_cfg = partial(config, cluster={"carbon_zone": "FR", "pue": 1.2})
# windows that cut jobs at both ends, and one of whole days (read from the rollups by the CLI)
WINDOWS = [(DAY0 + 20 * H, DAY0 + 3 * 24 * H + H), (DAY0, DAY0 + 5 * 24 * H)]


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _fill(engine: Engine, tmp_path: Path, **sections: Any) -> Config:
    """alice and bob in lab_a and lab_b; jobs across days and window edges; one job of no run time; model
    metadata, sent reports and study arms; the aggregator run (rollups up to today)."""
    cfg = _cfg(tmp_path, _url(engine), **sections)
    recs = [
        _job(1, DAY0 + 10 * H, 30.0, user="alice", account="lab_a", gpus=2, name="alice-long"),
        _job(2, DAY0 + 70 * H, 5.0, user="alice", account="lab_a", name="alice-short"),
        _job(3, DAY0 + 27 * H, 50.0, user="bob", account="lab_a", gpus=4, cpus=16),
        _job(4, DAY0 + 72 * H, 2.0, user="bob", account="lab_b", name="bob-secret"),
        _job(5, DAY0 + 36 * H, 0.0, user="alice", account="lab_a", state="FAILED"),
        _job(6, DAY0 + 50 * H, 8.0, user="alice", account="lab_b", gpus=8, consumed_energy_j=9.0e7),
    ]
    import_records(engine, recs, cfg, source="sacct-json")
    with engine.begin() as c:
        pks = dict(c.execute(select(Job.job_id_raw, Job.id)).all())

        def many(table: Any, rows: list[dict[str, Any]]) -> None:
            for row in rows:  # (one by one: the rows name different columns)
                c.execute(insert(table).values(**row))

        many(
            ModelMetadata,
            [{"job_pk": pks[1], "model_name": "llama-7b", "framework": "pytorch", "epochs": 3.0,
              "tokens": 1_200_000_000, "precision": "bf16", "batch_size": 32},
             {"job_pk": pks[4], "model_name": "bert-base", "task": "train"}],
        )  # fmt: skip
        many(
            SentReport,
            [{"kind": "user-monthly", "recipient": "alice@example.org", "user_name": "alice",
              "period_start": DAY0, "period_end": DAY0 + 24 * H, "sent_at": DAY0 + 25 * H, "status": "sent",
              "message_id": "<m1@x>"},
             {"kind": "lab-monthly", "recipient": "head@example.org", "user_name": None, "period_start": DAY0,
              "period_end": DAY0 + 24 * H, "sent_at": None, "status": "failed", "error": "refused"}],
        )  # fmt: skip
        c.execute(
            insert(StudyArm),
            [{"study": "s/seed 7", "user_name": u, "arm": arm, "stratum": k, "gpu_hours_before": 3.5 * k,
              "draw": 0.25 * k, "assigned_at": DAY0 - 24 * H, "opted_out_at": None if k else DAY0}
             for k, (u, arm) in enumerate([("alice", "emailed"), ("bob", "hold-out")])],
        )  # fmt: skip
    run_aggregate(engine, cfg)
    return cfg


def _cli_json(url: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    r = run_cocaq([*args, "-o", "json"], dict(env, COCAQ_DATABASE_URL=url))
    assert r.code == 0, r.err
    return json.loads(r.out)  # type: ignore[no-any-return]


def _weighted(df: pd.DataFrame, col: str) -> float:
    return float((df[col] * df["share"]).sum())


def test_frames_equal_the_cli_for_users_and_labs(
    engine: Engine, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    cfg = _fill(engine, tmp_path)
    url = _url(engine)
    for since, until in WINDOWS:
        s, u = since.isoformat(), until.isoformat()
        for scope, key in (("user", "alice"), ("user", "bob"), ("account", "lab_a"), ("account", "lab_b")):
            cmd = "user" if scope == "user" else "lab"
            cli = _cli_json(url, cli_env, cmd, key, "-S", s, "-E", u)
            kw = {scope: key}
            jobs = frames.jobs(since, until, cfg=cfg, **kw)
            ledger = frames.job_energy(since, until, cfg=cfg, **kw)
            assert cli["energy_kwh"] > 0 and len(jobs) == cli["jobs"], (key, since)
            assert (jobs["share"] > 0).all() and (jobs["share"] <= 1).all()
            approx = partial(pytest.approx, rel=1e-9, abs=1e-12)
            assert _weighted(jobs, "energy_kwh") == approx(cli["energy_kwh"]), (key, since)
            assert _weighted(jobs, "co2_kg") == approx(cli["co2_kg"]), (key, since)
            assert _weighted(jobs, "gpu_hours") == approx(cli["gpu_hours"]), (key, since)
            assert _weighted(jobs, "cpu_hours") == approx(cli["cpu_hours"]), (key, since)
            assert _weighted(jobs, "energy_kwh_with_pue") == approx(cli["energy_kwh_with_pue"])
            assert _weighted(ledger, "energy_kwh") == approx(cli["energy_kwh"]), (key, since)
            gpu = ledger[ledger["component"] == "gpu"]
            assert _weighted(gpu, "energy_kwh") == approx(cli["energy_gpu_kwh"]), (key, since)
    # the window of whole days: its rollups add up to the CLI's figures (read from the same rollups)
    since, until = WINDOWS[1]
    cli = _cli_json(url, cli_env, "user", "alice", "-S", since.isoformat(), "-E", until.isoformat())
    assert cli["rollup_days"] is not None
    days = frames.rollups(since, until, user="alice", cfg=cfg)
    assert set(days["day"]) <= {pd.Timestamp(since + timedelta(days=i)) for i in range(5)}
    assert float(days["energy_kwh"].sum()) == pytest.approx(cli["energy_kwh"], rel=1e-9)
    assert float(days["co2_kg"].sum()) == pytest.approx(cli["co2_kg"], rel=1e-9)


def test_typed_columns_and_the_whole_job_figures(engine: Engine, tmp_path: Path) -> None:
    cfg = _fill(engine, tmp_path)
    since, until = WINDOWS[0]
    jobs = frames.jobs(since, until, user="alice", cfg=cfg).set_index("job_id")
    assert str(jobs["start_time"].dtype) == "datetime64[ns, UTC]" and jobs["energy_kwh"].dtype == "float64"
    assert str(jobs["alloc_gpus"].dtype) == "Int64" and str(jobs["user"].dtype) == "string"
    # job 1 ran 10:00 on day 0 for 30 h; the window starts at 20:00: 20 of its 30 h are inside
    assert jobs.loc["1", "share"] == pytest.approx(20 / 30)
    assert jobs.loc["1", "start_time"] == pd.Timestamp(DAY0 + 10 * H)
    assert jobs.loc["1", "gpu_hours"] == pytest.approx(60.0)  # the whole job's: 2 GPUs x 30 h
    assert jobs.loc["5", "share"] == 1.0  # no run time: whole where it started
    assert jobs.loc["2", "share"] == pytest.approx(3 / 5)  # 70 h to 75 h, the window ends at 73 h
    models = frames.models(DAY0, DAY0 + 10 * 24 * H, cfg=cfg).set_index("job_id")
    assert models.loc["1", "model"] == "llama-7b" and models.loc["1", "tokens"] == 1_200_000_000
    assert pd.isna(models.loc["4", "epochs"]) and models.loc["4", "task"] == "train"
    assert list(frames.sent(DAY0, DAY0 + 24 * H, cfg=cfg)["status"]) == ["sent", "failed"]
    arms = frames.study_arms(DAY0, DAY0 + 24 * H, cfg=cfg)
    assert list(arms["arm"]) == ["emailed", "hold-out"] and str(arms["stratum"].dtype) == "Int64"
    # an empty window still has every column, typed
    empty = frames.jobs(DAY0 - 30 * 24 * H, DAY0 - 29 * 24 * H, cfg=cfg)
    assert empty.empty and list(empty.columns) == list(frames.frame("jobs", since, until, cfg=cfg).columns)
    assert str(empty["end_time"].dtype) == "datetime64[ns, UTC]"
    with pytest.raises(UsageError, match="no table 'nope': export one of jobs, job_energy, rollups"):
        frames.frame("nope", cfg=cfg)
    with pytest.raises(UsageError, match="empty window"):
        frames.jobs(until, since, cfg=cfg)


def test_paged_reads_give_the_same_frame(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _fill(engine, tmp_path)
    since, until = DAY0, DAY0 + 6 * 24 * H
    whole = {t: frames.frame(t, since, until, cfg=cfg) for t in ("jobs", "job_energy", "rollups")}
    monkeypatch.setattr(frames, "PAGE_ROWS", 2)
    for t, df in whole.items():
        assert len(df) > 2
        pd.testing.assert_frame_equal(frames.frame(t, since, until, cfg=cfg), df)


def test_without_pandas_one_line_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(UsageError, match=r"^cocaq.frames needs pandas: pip install 'cocaq\[analysis\]'$"):
        frames.jobs("30d")


# --- the read API ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    """`cocaq serve`'s app on a port in this process. The credential is real (this process's munged);
    the server takes its caller from `as_user`, so one test speaks as several users."""

    def __init__(self, cfg: Config) -> None:
        import uvicorn

        from cocaq.api import munge
        from cocaq.api.server import create_app

        self.as_user = "root"

        def decode(cred: str) -> tuple[int, bytes]:
            c = munge.decode(cred, socket=cfg.api.munge_socket)
            return pwd.getpwnam(self.as_user).pw_uid, c.payload

        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(cfg, decode=decode), host="127.0.0.1", port=cfg.api.port, log_level="warning"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Api:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the API did not start in 30 s"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Iterator[tuple[Api, Config, Config]]:
    """The API over the filled database: (server, a client's config with [api] url, the database's)."""
    from tests.test_api import need_munge_and_users

    need_munge_and_users()  # alice and bob are Unix users; munged runs
    port = _free_port()
    api = {"port": port, "admin_users": ["root"], "lab_heads": {"lab_b": ["daemon"]}}
    db_cfg = _fill(engine, tmp_path, api=api)
    client_cfg = _cfg(
        tmp_path, _url(engine), name="client.toml", api={**api, "url": f"http://127.0.0.1:{port}"}
    )
    with Api(db_cfg) as server:
        yield server, client_cfg, db_cfg


def test_the_api_gives_the_same_frames_as_the_database(api: tuple[Api, Config, Config]) -> None:
    _, via_api, via_db = api
    since, until = WINDOWS[0][0], WINDOWS[1][1]
    for table in frames.TABLES:
        for kw in ({}, {"user": "alice"}, {"account": "lab_a", "cluster": "c"}):
            if table in ("sent", "study_arms") and "account" in kw:
                continue
            want = frames.frame(table, since, until, cfg=via_db, **kw)
            pd.testing.assert_frame_equal(frames.frame(table, since, until, cfg=via_api, **kw), want)
            assert table in ("sent", "study_arms", "models") or len(want) > 0


def test_the_api_pages(api: tuple[Api, Config, Config], monkeypatch: pytest.MonkeyPatch) -> None:
    _, via_api, via_db = api
    want = frames.job_energy(DAY0, DAY0 + 6 * 24 * H, cfg=via_db)
    monkeypatch.setattr(frames, "PAGE_ROWS", 2)
    assert len(want) > 4
    pd.testing.assert_frame_equal(frames.job_energy(DAY0, DAY0 + 6 * 24 * H, cfg=via_api), want)


def test_the_api_applies_its_access_rules(api: tuple[Api, Config, Config]) -> None:
    server, via_api, via_db = api
    since, until = DAY0, DAY0 + 6 * 24 * H
    jobs = partial(frames.jobs, since, until, cfg=via_api)
    server.as_user = "alice"  # a user: their own rows; nobody else's, no lab's, no admin tables
    mine = jobs()
    pd.testing.assert_frame_equal(mine, frames.jobs(since, until, user="alice", cfg=via_db))
    assert set(mine["user"]) == {"alice"}
    pd.testing.assert_frame_equal(
        jobs(account="lab_a", user="alice"),
        frames.jobs(since, until, user="alice", account="lab_a", cfg=via_db),
    )
    with pytest.raises(ApiRefused, match=r": 403: alice may not see user bob's rows$"):
        jobs(user="bob")
    with pytest.raises(ApiRefused, match=r": 403: alice does not head lab lab_a"):
        jobs(account="lab_a")
    for table in ("sent", "study_arms"):
        with pytest.raises(ApiRefused, match=rf": 403: alice is not an admin: {table} is for admins$"):
            frames.frame(table, since, until, cfg=via_api)
    server.as_user = "daemon"  # lab_b's head: its rows, and of a member only their jobs in lab_b
    pd.testing.assert_frame_equal(
        jobs(account="lab_b"), frames.jobs(since, until, account="lab_b", cfg=via_db)
    )
    bob = jobs(user="bob")
    assert list(bob["job_id"]) == ["4"] and list(bob["name"]) == ["bob-secret"]
    with pytest.raises(ApiRefused, match="403"):
        frames.rollups(since, until, account="lab_a", cfg=via_api)
    with pytest.raises(ApiRefused, match="403"):
        frames.sent(since, until, cfg=via_api)
    server.as_user = "root"  # an admin: everything
    pd.testing.assert_frame_equal(
        frames.sent(since, until, cfg=via_api), frames.sent(since, until, cfg=via_db)
    )


# --- cocaq export --------------------------------------------------------------------------------------


def test_export_csv_through_the_cli(engine: Engine, tmp_path: Path, cli_env: dict[str, str]) -> None:
    cfg = _fill(engine, tmp_path)
    env = dict(cli_env, COCAQ_DATABASE_URL=_url(engine))
    since, until = (d.isoformat() for d in WINDOWS[0])
    r = run_cocaq(["export", "jobs", "-S", since, "-E", until, "-u", "alice"], env)
    assert r.code == 0, r.err
    got = pd.read_csv(io.StringIO(r.out))
    want = frames.jobs(WINDOWS[0][0], WINDOWS[0][1], user="alice", cfg=cfg)
    assert list(got.columns) == list(want.columns) and list(got["job_id"].astype(str)) == list(want["job_id"])
    assert _weighted(got, "energy_kwh") == pytest.approx(_weighted(want, "energy_kwh"), rel=1e-12)
    cli = _cli_json(_url(engine), cli_env, "user", "alice", "-S", since, "-E", until)
    assert _weighted(got, "energy_kwh") == pytest.approx(cli["energy_kwh"], rel=1e-9)
    assert pd.to_datetime(got["start_time"], utc=True).tolist() == want["start_time"].tolist()
    out = tmp_path / "ledger.csv"
    r = run_cocaq(["export", "job_energy", "-S", since, "-E", until, "-A", "lab_a", "-o", str(out)], env)
    assert r.code == 0 and r.out == "", r.err
    assert len(pd.read_csv(out)) == len(
        frames.job_energy(WINDOWS[0][0], WINDOWS[0][1], account="lab_a", cfg=cfg)
    )
    r = run_cocaq(["export", "users"], env)
    assert r.code == 2 and r.err.strip().count("\n") == 0, r.err
    assert "no table 'users': export one of jobs, job_energy, rollups, models, sent, study_arms" in r.err
    r = run_cocaq(["export", "jobs", "-o", "csv"], env)
    assert r.code == 2 and "-o names the output file" in r.err and not (ROOT / "csv").exists(), r.err
    r = run_cocaq(["export", "jobs", "--format", "parquet"], env)
    assert r.code == 2 and ("-o FILE.parquet" in r.err or "pyarrow" in r.err), r.err


def test_export_parquet_round_trip(engine: Engine, tmp_path: Path, cli_env: dict[str, str]) -> None:
    pytest.importorskip(
        "pyarrow", reason="parquet needs pyarrow (the [analysis] extra), not in requirements.lock"
    )
    cfg = _fill(engine, tmp_path)
    env = dict(cli_env, COCAQ_DATABASE_URL=_url(engine))
    since, until = WINDOWS[1]
    for table in frames.TABLES:
        out = tmp_path / f"{table}.parquet"
        r = run_cocaq(
            ["export", table, "-S", since.isoformat(), "-E", until.isoformat(), "-o", str(out)], env
        )
        assert r.code == 0, r.err
        pd.testing.assert_frame_equal(pd.read_parquet(out), frames.frame(table, since, until, cfg=cfg))
