"""GET /metrics of `cocaq serve`: the site's figures for Prometheus, the same numbers as `cocaq lab --since 1d`.

Real databases (SQLite and PostgreSQL), the real app over HTTP in-process, real `promtool check metrics`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, insert

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.api import site_metrics
from cocaq.api.server import create_app
from cocaq.carbon.series_import import parse_csv, write_rows
from cocaq.carbon.zones import zone_intensity
from cocaq.config import Config
from cocaq.db.dbapi import connect
from cocaq.db.schema import SchedulerRun
from cocaq.errors import ConfigError
from cocaq.footprint.lookup import lab_answer
from cocaq.footprint.totals import Window
from tests.builders import config, job
from tests.promkit import promtool_check_metrics

ODD = 'lab "q"\\back{slash}=ünï'  # a Slurm account with what the exposition must escape
USERS = ("zelda-secret", "yusuf-private")  # must never appear in the output
HOUR = timedelta(hours=1)


def _cfg(tmp: Path, url: str, **api: Any) -> Config:
    return config(
        tmp,
        url,
        cluster={"carbon_zone": "FR", "pue": 1.25},
        partitions={"cpu": {"carbon_zone": "DEU"}},
        api={"metrics": True, **api},
    )


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _series(engine: Engine, now: datetime, g: float) -> None:
    """An hourly FR series around now, `g` g/kWh throughout."""
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=48)
    body = "".join(f"FR,{(start + i * HOUR):%Y-%m-%dT%H:%MZ},{g}\n" for i in range(60))
    with engine.begin() as conn:
        write_rows(conn, parse_csv("zone,datetime,gco2_per_kwh\n" + body, "fr.csv"))


def _jobs(now: datetime, *, edges: bool) -> list[Any]:
    """Two clusters, three labs (one with an odd name), ended, running, and (with `edges`) jobs across the
    window's start."""
    a, b = USERS
    recs = [
        job(1, now - 5 * HOUR, 2.0, user=a, account="lab_vision", gpus=4),
        job(2, now - 3 * HOUR, 1.0, user=b, account="lab_vision", partition="cpu", gpus=0, cpus=32),
        job(3, now - 10 * HOUR, 3.0, user=b, account=ODD, state="FAILED"),
        job(4, now - 2 * HOUR, 1.5, user=a, account="lab_nlp", cluster="c2"),
        job(5, now - 1 * HOUR, 0.5, user=a, account="lab_nlp", running=True),
        job(6, now - 40 * HOUR, 2.0, user=a, account="lab_old"),  # ended before the last day
    ]
    if edges:
        recs += [
            job(7, now - 26 * HOUR, 4.0, user=b, account="lab_vision", gpus=2),  # 2 h inside
            job(8, now - 30 * HOUR, 5.0, user=a, account=ODD, cluster="c2"),  # ended 25 h ago: outside
        ]
    return recs


def _values(text: str, *, openmetrics: bool = False) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted labels: value}, from the exposition as Prometheus' own parser reads it."""
    parse = parse_openmetrics if openmetrics else text_string_to_metric_families
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in parse(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _lab(values: dict[str, dict[Any, float]], name: str, cluster: str, account: str) -> float | None:
    return values.get(name, {}).get((("account", account), ("cluster", cluster)))


def test_the_last_day_per_lab_is_what_cocaq_lab_since_1d_says(engine: Engine, tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    cfg = _cfg(tmp_path, _url(engine))
    _series(engine, now, 42.0)
    import_records(engine, _jobs(now, edges=True), cfg, source="t")
    run_aggregate(engine, cfg)  # CO2 from the series, a watermark: the footprint reads rollups where whole
    w = Window(now - timedelta(days=1), now)  # what `--since 1d` is at `now`
    db = connect(_url(engine))
    try:
        with engine.connect() as conn:
            site = site_metrics.read_site(db, conn, cfg, now)
        got = {(lab.cluster, lab.account): lab for lab in site.labs}
        assert set(got) == {
            ("c", "lab_vision"), ("c", ODD), ("c", "lab_nlp"), ("c2", "lab_nlp")
        }, "lab_old ended before the last day; ODD on c2 ended 25 h ago"  # fmt: skip
        for account in ("lab_vision", ODD, "lab_nlp"):
            whole = lab_answer(db, cfg, account, w, top=0)
            mine = [lab for (_, a), lab in got.items() if a == account]
            assert sum(lab.energy_kwh for lab in mine) == pytest.approx(
                whole["energy_kwh"], rel=1e-12, abs=1e-15
            )
            assert sum(lab.co2_kg for lab in mine) == pytest.approx(whole["co2_kg"], rel=1e-12, abs=1e-15)
            for lab in mine:
                one = lab_answer(db, cfg, account, w, cluster=lab.cluster, top=0)
                assert lab.energy_kwh == pytest.approx(one["energy_kwh"], rel=1e-12) and one["energy_kwh"] > 0
                assert lab.co2_kg == pytest.approx(one["co2_kg"], rel=1e-12) and one["co2_kg"] > 0
    finally:
        db.close()
    ended = {k: lab.jobs_ended for k, lab in got.items()}
    assert ended == {("c", "lab_vision"): 3, ("c", ODD): 1, ("c", "lab_nlp"): 0, ("c2", "lab_nlp"): 1}
    assert {k: lab.running for k, lab in got.items() if lab.running} == {("c", "lab_nlp"): 1}
    # the series now for the cluster's zone; the partition's zone, with no series, its annual figure
    assert site.intensity == [("c", "DEU", zone_intensity("DEU").g_per_kwh), ("c", "FR", 42.0)]
    assert site.pue == [("c", 1.25)]


@pytest.fixture
def served(engine: Engine, tmp_path: Path) -> Iterator[tuple[httpx.Client, Engine, Config, datetime]]:
    """The app with metrics on, over jobs that lie wholly inside the last day or outside it (so that the
    window's few seconds of drift between the scrape and the check change nothing)."""
    now = datetime.now(UTC).replace(microsecond=0)
    cfg = _cfg(tmp_path, _url(engine))
    import_records(engine, _jobs(now, edges=False), cfg, source="t")
    run_aggregate(engine, cfg)
    with engine.begin() as conn:
        conn.execute(
            insert(SchedulerRun),
            [
                {"job_id": "reconcile", "started_at": now - 10 * HOUR, "finished_at": now - 10 * HOUR, "status": "ok"},
                {"job_id": "reconcile", "started_at": now - 2 * HOUR, "finished_at": now - HOUR, "status": "ok"},
                {"job_id": "reconcile", "started_at": now - 3 * HOUR, "finished_at": None, "status": "error"},
                {"job_id": "aggregate", "started_at": now - HOUR, "finished_at": None, "status": "running"},
            ],
        )  # fmt: skip
    with TestClient(create_app(cfg), base_url="http://api") as c:
        yield c, engine, cfg, now


def test_metrics_over_http_match_the_footprint_and_pass_promtool(
    served: tuple[httpx.Client, Engine, Config, datetime],
) -> None:
    client, engine, cfg, now = served
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert promtool_check_metrics(r.text) == ""
    for user in USERS:
        assert user not in r.text, "no user names, labs only"
    v = _values(r.text)
    db = connect(_url(engine))
    try:
        t = datetime.now(UTC)
        w = Window(t - timedelta(days=1), t)
        for cluster, account in (("c", "lab_vision"), ("c", ODD), ("c2", "lab_nlp"), ("c", "lab_nlp")):
            want = lab_answer(db, cfg, account, w, cluster=cluster, top=0)
            assert _lab(v, "cocaq_lab_energy_last_day_kwh", cluster, account) == pytest.approx(
                want["energy_kwh"], rel=1e-12
            )
            assert _lab(v, "cocaq_lab_co2_last_day_kg", cluster, account) == pytest.approx(
                want["co2_kg"], rel=1e-12
            )
    finally:
        db.close()
    assert _lab(v, "cocaq_lab_jobs_last_day", "c", ODD) == 1.0  # the odd name came back unchanged
    assert _lab(v, "cocaq_lab_jobs_last_day", "c", "lab_vision") == 2.0
    assert _lab(v, "cocaq_running_jobs", "c", "lab_nlp") == 1.0
    assert _lab(v, "cocaq_lab_energy_last_day_kwh", "c", "lab_old") is None
    assert v["cocaq_pue"] == {(("cluster", "c"),): 1.25}
    fr = v["cocaq_carbon_intensity_grams_per_kwh"][(("cluster", "c"), ("zone", "FR"))]
    assert fr == zone_intensity("FR").g_per_kwh, "no series imported: the zone's annual figure"
    runs = v["cocaq_scheduler_runs_total"]
    assert runs == {
        (("outcome", "running"), ("task", "aggregate")): 1.0,
        (("outcome", "error"), ("task", "reconcile")): 1.0,
        (("outcome", "ok"), ("task", "reconcile")): 2.0,
    }
    last = v["cocaq_scheduler_last_run_timestamp_seconds"]
    assert last[(("outcome", "ok"), ("task", "reconcile"))] == (now - HOUR).timestamp()
    assert last[(("outcome", "error"), ("task", "reconcile"))] == (now - 3 * HOUR).timestamp()
    # OpenMetrics when the scraper asks for it (Prometheus does), with the same values
    om = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    vo = _values(om.text, openmetrics=True)
    assert vo["cocaq_scheduler_runs_total"] == runs
    assert _lab(vo, "cocaq_lab_jobs_last_day", "c", ODD) == 1.0


def test_the_escaping_holds_a_label_value_with_a_newline() -> None:
    """Slurm account names never hold a newline, but a label value that did must not break the format."""
    site = site_metrics.Site(labs=[site_metrics.LabDay("c\nx", 'a"\\\nb', 1, 2.5, 0.5, 0)])
    body, _ = site_metrics.exposition(lambda: site, None)
    text = body.decode()
    assert promtool_check_metrics(text) == ""
    assert _lab(_values(text), "cocaq_lab_energy_last_day_kwh", "c\nx", 'a"\\\nb') == 2.5


def test_metrics_are_off_unless_configured(engine: Engine, tmp_path: Path) -> None:
    cfg = config(tmp_path, _url(engine))
    assert cfg.api.metrics is False
    with TestClient(create_app(cfg), base_url="http://api") as c:
        r = c.get("/metrics")
    assert r.status_code == 404 and "[api] metrics = true" in r.json()["detail"]


def test_a_configured_token_is_required(engine: Engine, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-token-of-the-site\n")
    cfg = _cfg(tmp_path, _url(engine), metrics_token_file=str(token))
    with TestClient(create_app(cfg), base_url="http://api") as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert (
            c.get("/metrics", headers={"Authorization": "Bearer s3cr3t-token-of-the-sit"}).status_code == 401
        )
        assert (
            c.get("/metrics", headers={"Authorization": "Basic s3cr3t-token-of-the-site"}).status_code == 401
        )
        r = c.get("/metrics", headers={"Authorization": "Bearer s3cr3t-token-of-the-site"})
        assert r.status_code == 200 and "cocaq_pue" in r.text
        no = c.get("/metrics")
        assert no.headers["www-authenticate"] == "Bearer" and "s3cr3t" not in no.text
    missing = _cfg(tmp_path, _url(engine), metrics_token_file=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="metrics_token_file: cannot read"):
        create_app(missing)
    token.write_text("\n")
    with pytest.raises(ConfigError, match="must hold one token"):
        create_app(cfg)
