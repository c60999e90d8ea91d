"""`cocaq user` and `cocaq lab` read only the jobs their advice can count (cocaq.footprint.advice_jobs), and
`advise` runs only the rules whose suggestion it can show (cocaq.footprint.advice.SHOWN): the same output
as the whole computation (every job of the window, whole, through every rule), byte for byte.

On the demo's month (SQLite: samples, model metadata, notebooks, every way of ending badly) and on a
generated year of the benchmark's site (bench/gen_sacct.py, PostgreSQL, with an hourly carbon series:
when-to-run figures), under the site's configuration and under others that let every suggestion through
and move the rules' thresholds; for every user and every lab of the window, as JSON and as the table.
"""

from __future__ import annotations

import importlib.util
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cocaq.accounting.sessions import Sessions
from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.db import dbapi
from cocaq.footprint import advice, jobfacts
from cocaq.footprint.advice import REPEATED, SHOWN, Thresholds
from cocaq.footprint.lookup import add_advice
from cocaq.footprint.totals import Footprint, Window, lab_footprint, user_footprint
from tests.conftest import ROOT, built_demo, new_database, run_cocaq

# Thresholds that let many more jobs count (and a few fewer), so that each rule's reading of only some
# jobs is tried where it fires on many of them.
LOOSE = Thresholds(
    amp_min_gpu_kwh=0.01, amp_unknown_min_gpu_hours=1.0, amp_busy_idle_share=0.9, fail_early_h=2.0,
    repeat_min_jobs=1, idle_min_share=0.05, min_sampled_share=0.1, loader_max_util_pct=95.0,
    loader_min_cpu_usage=0.05, loader_min_elapsed_h=0.01, mem_max_use=0.95, mem_min_req_gb=0.5,
)  # fmt: skip
STRICT = Thresholds(
    amp_min_gpu_kwh=50.0, amp_unknown_min_gpu_hours=10.0, idle_min_share=0.9, loader_max_util_pct=10.0,
    mem_max_use=0.1, mem_min_req_gb=64.0, fail_early_h=0.1, repeat_min_jobs=2,
)  # fmt: skip


def everything(cfg: Config) -> Config:
    """The site's configuration with no floor: every suggestion and when-to-run shown, whatever it saves."""
    return replace(
        cfg,
        advice=replace(cfg.advice, min_share=0.0, min_kwh=0.0),
        shifting=replace(cfg.shifting, min_share=0.0, min_kg=0.0),
    )


CONFIGS = (
    ("site", lambda c: c, None),
    ("everything", everything, None),
    ("everything-loose", everything, LOOSE),
    ("everything-strict", everything, STRICT),
    ("site-loose", lambda c: c, LOOSE),
)


@dataclass
class Site:
    url: str
    cfg: Config
    window: Window
    users: list[str]
    labs: list[str]


def _names(url: str, w: Window) -> tuple[list[str], list[str]]:
    with dbapi.connect(url) as db:
        rows = db.rows(
            "SELECT DISTINCT user_name, account FROM jobs WHERE start_time < %(u)s "
            "AND (end_time >= %(s)s OR end_time IS NULL)",
            {"s": w.since, "u": w.until},
        )
    return sorted({r[0] for r in rows}), sorted({r[1] for r in rows if r[1]})


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Site:
    tmp = tmp_path_factory.mktemp("fast-demo")
    _env, url = built_demo(tmp)
    cfg = replace(load_config(tmp / "demo" / "cocaq-demo.toml", {}), database_url=url)
    until = datetime.fromisoformat(json.loads((tmp / "demo" / "summary.json").read_text())["until"])
    w = Window(until - timedelta(days=30), until)
    return Site(url, cfg, w, *_names(url, w))


def _gen_sacct() -> Any:
    spec = importlib.util.spec_from_file_location("gen_sacct", ROOT / "bench" / "gen_sacct.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def generated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """A year of the benchmark's site, 6,000 jobs, on PostgreSQL, with an hourly carbon series for both of
    its zones (so that the aggregator writes every batch job's when-to-run figures)."""
    tmp = tmp_path_factory.mktemp("fast-generated")
    url = new_database("postgresql", tmp, request)
    end = datetime(2026, 11, 1, tzinfo=UTC)
    sacct = tmp / "sacct.txt"
    with open(sacct, "w", encoding="utf-8", newline="\n") as fh:
        _gen_sacct().generate(fh, jobs=6000, lines=None, seed=20261204, end=end.timestamp())
    series = tmp / "intensity.csv"
    first = end - timedelta(days=400)
    with open(series, "w", encoding="utf-8") as fh:
        fh.write("zone,datetime,gco2_per_kwh\n")
        for zone, base in (("DEU", 380.0), ("FRA", 60.0)):
            for h in range(402 * 24):
                t = first + timedelta(hours=h)
                fh.write(
                    f"{zone},{t:%Y-%m-%dT%H:%M:%SZ},{base * (1 + 0.25 * (t.hour - 12) ** 2 / 144):.2f}\n"
                )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("COCAQ_")}
    env.update(HOME=str(tmp), COCAQ_DATABASE_URL=url)
    cfg_path = ROOT / "bench" / "bench.toml"
    for argv in (
        ["db", "upgrade"],
        ["import", "sacct", "--file", str(sacct)],
        ["carbon", "import", str(series)],
        ["aggregate", "--full"],
    ):
        r = run_cocaq(["--config", str(cfg_path), *argv], env, cwd=tmp)
        assert r.code == 0, (argv, r.err)
    cfg = replace(load_config(cfg_path, {}), database_url=url)
    w = Window(end - timedelta(days=30), end)
    yield Site(url, cfg, w, *_names(url, w))


def _both(db: dbapi.Db, cfg: Config, fp: Any, kind: str, key: str, th: Thresholds | None) -> list[str]:
    """The footprint's JSON and table, from the whole computation and from the fast path."""
    from rich.console import Console

    from cocaq.cli import terminal

    out = []
    for whole in (True, False):
        f = fp(db, key)
        add_advice(db, cfg, f, whole=whole, thresholds=th)
        d = json.loads(terminal.to_json(f.as_dict()))
        buf = io.StringIO()
        terminal.print_footprint(Footprint.from_dict(d), Console(file=buf, width=160, color_system=None))
        out.append(terminal.to_json(d) + "\n" + buf.getvalue())
    return out


def _compare(site: Site) -> int:
    """Every user and lab of the site's window under every configuration; how many suggestions showed."""
    shown = 0
    sessions = Sessions.of(site.cfg.advice)
    with dbapi.connect(site.url) as db:
        for name, change, th in CONFIGS:
            cfg = change(site.cfg)
            for kind, keys in (("user", site.users), ("lab", site.labs)):
                for key in keys:
                    if kind == "user":

                        def fp(db: dbapi.Db, key: str) -> Footprint:
                            return user_footprint(db, key, site.window, sessions=sessions)
                    else:

                        def fp(db: dbapi.Db, key: str) -> Footprint:
                            return lab_footprint(db, key, site.window, sessions=sessions)

                    whole, fast = _both(db, cfg, fp, kind, key, th)
                    assert fast == whole, f"{name}: {kind} {key}"
                    shown += whole.count('"saving_kwh"')
    return shown


def test_the_fast_path_says_what_the_whole_computation_says_on_the_demo(demo: Site) -> None:
    assert len(demo.users) >= 8 and len(demo.labs) >= 4
    assert _compare(demo) > 50  # (the configurations let many suggestions through: a comparison of them)


def test_the_fast_path_says_what_the_whole_computation_says_on_a_generated_site(generated: Site) -> None:
    assert len(generated.users) >= 20
    assert _compare(generated) > 50


def test_when_to_run_is_compared_where_it_fires(demo: Site, generated: Site) -> None:
    """The comparisons above include when-to-run suggestions (no floor), on both sites."""
    for site in (demo, generated):
        with dbapi.connect(site.url) as db:
            fired = 0
            for u in site.users:
                f = user_footprint(db, u, site.window, sessions=Sessions.of(site.cfg.advice))
                add_advice(db, everything(site.cfg), f)
                fired += f.when_to_run is not None
        assert fired >= 3, site.url


@pytest.mark.parametrize("th", [None, LOOSE, STRICT], ids=["default", "loose", "strict"])
def test_the_rules_advise_does_not_run_never_claim_a_saving(demo: Site, generated: Site, th: Any) -> None:
    """`advise` leaves out the rules not in SHOWN: on every user of both sites, what they find claims no
    saving and is no repeated bad ending, so `advise` could never have shown it (their `saves` and
    `repeated` flags, of which SHOWN is made, say what they do)."""
    left_out = [r for r in advice.RULES if r not in SHOWN]
    assert len(left_out) == 8 and set(SHOWN) < set(advice.RULES)
    found = 0
    for site in (demo, generated):
        with dbapi.connect(site.url) as db:
            for u in site.users:
                jobs = jobfacts.load(db, site.cfg, site.window.since, site.window.until, user=u)
                ctx = advice.site_context(site.cfg, site.window.since, site.window.until, thresholds=th)
                for rule in left_out:
                    a = rule.over_window(jobs, ctx)
                    if a is not None:
                        found += 1
                        assert a.saving_kwh is None and a.id not in REPEATED, (u, a.id)
    assert found > 10


def test_the_advice_read_beside_the_footprint_says_the_same(generated: Site) -> None:
    """The read API reads the advice's jobs on a second connection while the footprint's query runs
    (cocaq.db.alongside, in the first connection's snapshot): the same answer as one connection, for every
    user and lab of the generated site."""
    from cocaq.api.pool import Pool
    from cocaq.footprint.lookup import lab_answer, user_answer

    pool = Pool(generated.url, size=2)
    try:
        for kind, keys in (("user", generated.users), ("lab", generated.labs)):
            answer = user_answer if kind == "user" else lab_answer
            for key in keys:
                with pool.db() as db:
                    alone = answer(db, generated.cfg, key, generated.window)
                with pool.db() as db, pool.spare() as beside:
                    assert beside is not None
                    two = answer(db, generated.cfg, key, generated.window, beside=beside)
                assert two == alone, f"{kind} {key}"
    finally:
        pool.close()
