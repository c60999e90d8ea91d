"""The Grafana dashboard the server role provisions (ansible/roles/cocaq_server/files/grafana/cocaq.json).

Every query is handed to a real Prometheus (tests/promkit.py), with Grafana's variables filled in, so a
PromQL mistake fails here and not on a site's wall screen; every metric it reads is one that cocaq's
code exposes (the read API's GET /metrics, cocaq.api.site_metrics, and the collector's endpoint,
cocaq.collector.metrics), collected from those modules' own collectors rather than from a list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.promkit import PromError, Prometheus

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "ansible/roles/cocaq_server/files/grafana/cocaq.json"
# Grafana's own variables, and a value each stands for in a query
BUILTINS = {"__rate_interval": "1m", "__interval": "30s", "__range": "1h", "__range_s": "3600"}
SAMPLES = {"cluster": "c", "account": "lab_nlp", "job_id": "4242", "datasource": "prom"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "Inf", "NaN"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])  # a collapsed row holds its panels


def _exprs(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(d) for t in p.get("targets", []) if "expr" in t]


def _variables(d: dict[str, Any]) -> set[str]:
    return {v["name"] for v in d["templating"]["list"]}


def _fill(expr: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return BUILTINS.get(name) or SAMPLES[name]

    return VARIABLE.sub(sub, expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords, label
    names (in matchers and by/on/... lists) or inside strings and ranges."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    out = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        if m.start() > 0 and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "$"):
            continue  # 1e3, a leftover $variable
        if s[m.end() :].lstrip().startswith("(") or m.group(0) in KEYWORDS:
            continue
        out.add(m.group(0))
    return out


def exposed_names() -> set[str]:
    """Every series name cocaq's two endpoints expose, from their collectors (a counter family `x` is
    the series `x_total`)."""
    from cocaq.api.site_metrics import Site, SiteCollector
    from cocaq.collector.metrics import Snapshot, SnapshotCollector

    families = [*SiteCollector(lambda: Site()).collect(), *SnapshotCollector(Snapshot(("c", "n"))).collect()]
    return {f.name + "_total" if f.type == "counter" else f.name for f in families}


def test_metric_name_extraction() -> None:
    e = 'sum by (account) (rate(a_total{x="y{z}", job=~"$j"}[$__rate_interval])) / on (cluster) group_left () b'
    assert metric_names(e) == {"a_total", "b"}
    assert metric_names('time() - c_seconds{n="1"} * 1e3 > bool 0') == {"c_seconds"}


def test_the_dashboard_is_well_formed() -> None:
    d = _dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]  # Grafana 9.x/10+ dashboard JSON
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert variables["job_id"]["type"] in ("textbox", "query")
    assert {"cluster", "account"} <= set(variables)
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for p in _panels(d):
        if p["type"] == "row":
            continue
        assert p.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    # every variable a query or a title uses is defined (or one of Grafana's own)
    texts = [e for _, e in _exprs(d)] + [p["title"] for p in _panels(d)]
    texts += [v.get("definition", "") for v in d["templating"]["list"]]
    used = {m.group(1) or m.group(2) or m.group(3) for t in texts for m in VARIABLE.finditer(t)}
    assert used - set(BUILTINS) <= _variables(d), used - set(BUILTINS) - _variables(d)


def test_the_job_energy_panel_is_there_as_the_end_to_end_test_finds_it() -> None:
    found = [p for p in _panels(_dashboard()) if p["title"] == "Job GPU energy so far (J)"]
    assert len(found) == 1 and found[0]["type"] == "stat"
    assert [t["expr"] for t in found[0]["targets"]] == [
        'sum(cocaq_job_gpu_energy_joules_total{job_id="$job_id"})'
    ]


def test_every_metric_the_dashboard_reads_is_one_cocaq_exposes() -> None:
    exposed = exposed_names()
    assert {"cocaq_lab_energy_last_day_kwh", "cocaq_job_gpu_energy_joules_total"} <= exposed
    d = _dashboard()
    used: set[str] = set()
    for title, expr in _exprs(d):
        names = metric_names(_fill(expr))
        assert names, f"{title}: reads no metric? {expr}"
        assert names <= exposed, f"{title}: {sorted(names - exposed)} are exposed by nothing in cocaq"
        used |= names
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["definition"])
            assert m, v["definition"]
            assert metric_names(_fill(m.group(1))) <= exposed, v["definition"]
    # the panels the dashboard promises: power, CO2 rate, the labs' day, one job, collector health
    assert {
        "cocaq_job_gpu_power_watts", "cocaq_carbon_intensity_grams_per_kwh", "cocaq_pue",
        "cocaq_lab_energy_last_day_kwh", "cocaq_lab_co2_last_day_kg", "cocaq_job_gpu_utilization_ratio",
        "cocaq_job_gpu_memory_used_bytes", "cocaq_collector_spool_backlog_records",
        "cocaq_collector_last_ship_timestamp_seconds", "cocaq_collector_hook_failures_total",
        "cocaq_collector_source_up",
    } <= used  # fmt: skip


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with Prometheus(tmp_path_factory.mktemp("prom"), []) as p:
        yield p


def test_prometheus_accepts_every_query(prometheus: Prometheus) -> None:
    d = _dashboard()
    exprs = _exprs(d)
    assert len(exprs) >= 20
    for title, expr in exprs:
        try:
            prometheus.query(_fill(expr))
        except PromError as exc:
            pytest.fail(f"{title}: Prometheus refused {_fill(expr)!r}: {exc}")
    with pytest.raises(PromError):  # (and it does refuse a bad one)
        prometheus.query("sum by (account (cocaq_pue)")
