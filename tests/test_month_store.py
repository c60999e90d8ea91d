"""Kept month answers (cocaq.reports.month_store): served only while the month's data and the site's
settings are what they were built from, on both databases.

The month is tests/test_report_data's March 2025 (six users, two clusters, a job across each end of the
month, model metadata, samples, a carbon series), settled by ending its one running job. Every check
compares what `month_answer` serves with what it computes without the kept answers: after each kind of
change (an import not derived yet, a derived one, another user's job, the month before, model metadata,
the configuration, a template, a cluster's name) the kept answer must not be served.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, select, text, update

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.db.engine import make_engine
from cocaq.db.schema import Cluster, ModelMetadata, MonthAnswer
from cocaq.reports import month_store
from cocaq.reports.month_answer import keep, keep_recent, month_answer
from tests.conftest import migrated_database, run_cocaq
from tests.test_report_data import MONTH, PREV, at, build_month, config, job

USERS = ("alice", "bob", "carol", "dave", "erin", "frank")


@dataclass
class Site:
    engine: Engine
    cfg: Config
    tmp: Path


@pytest.fixture(params=["sqlite", "postgresql"])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    url = migrated_database(request.param, tmp_path, request)
    engine = make_engine(url)
    cfg = config(tmp_path, url)
    build_month(engine, cfg)
    # erin's job running at the month's end ends: the month settles once the aggregator has derived it
    end = job(502, at(31, 23), 2, user="erin", account="lab_b", gpus=0)
    import_records(engine, [end], cfg, source="sacct-json")
    run_aggregate(engine, cfg)
    yield Site(engine, cfg, tmp_path)
    engine.dispose()


def served(s: Site, user: str, *, cfg: Config | None = None, use_kept: bool = True) -> dict[str, Any]:
    with s.engine.connect() as conn:
        return month_answer(conn, cfg or s.cfg, user, MONTH, use_kept=use_kept)


def is_kept(s: Site, user: str, cfg: Config | None = None) -> bool:
    with s.engine.connect() as conn:
        return month_store.kept(conn, cfg or s.cfg, user, MONTH, None) is not None


def rounded(x: Any) -> Any:
    """Sums come out of SQL in the order the database added them: the same to 12 digits."""
    if isinstance(x, float):
        return float(f"{x:.12g}")
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return x


def fresh_is_served(s: Site, user: str, cfg: Config | None = None) -> None:
    """What is served is what is computed now, and it comes from no kept answer."""
    assert not is_kept(s, user, cfg)
    assert rounded(served(s, user, cfg=cfg)) == rounded(served(s, user, cfg=cfg, use_kept=False))


def test_kept_answers_are_the_computed_ones_and_are_served(site: Site) -> None:
    k = keep(site.engine, site.cfg, MONTH)
    assert (k.users, k.unchanged, k.why_not) == (6, False, None)
    assert k.line() == "month answers 2025-03: 6 kept"
    for u in USERS:
        assert is_kept(site, u)
        kept, now = served(site, u), served(site, u, use_kept=False)
        assert rounded(kept) == rounded(now)
        assert kept["email"] == now["email"]  # the e-mail itself, to the byte
    again = keep(site.engine, site.cfg, MONTH)
    assert again.unchanged and again.line() == "month answers 2025-03: up to date"
    # what is served while the stamp holds is the kept row (a planted one shows through)
    with site.engine.begin() as c:
        blob = zlib.compress(json.dumps({"planted": True}).encode())
        c.execute(update(MonthAnswer).where(MonthAnswer.user_name == "carol").values(answer=blob))
    assert served(site, "carol") == {"planted": True}
    # a user with no kept answer (no job in the month) is computed
    assert not is_kept(site, "nobody") and served(site, "nobody")["totals"]["jobs"] == 0


def test_an_unsettled_month_is_neither_kept_nor_served(site: Site) -> None:
    keep(site.engine, site.cfg, MONTH)
    # a job seen late (sacct was down): it started in the month and still runs, its share grows until it ends
    back = job(107, at(30, 10), 30, user="alice", account="lab_a", limit_h=72, name="long", running=True)
    import_records(site.engine, [back], site.cfg, source="sacct-json")
    run_aggregate(site.engine, site.cfg)
    fresh_is_served(site, "alice")
    k = keep(site.engine, site.cfg, MONTH)
    assert (k.users, k.why_not) == (0, "jobs that ran in it are still running")
    assert k.line() == "month answers 2025-03: none kept: jobs that ran in it are still running"
    # the month being made is never settled
    now = datetime.now(UTC)
    k = keep(site.engine, site.cfg, now)
    assert k.why_not == "the aggregator has not rolled the month up to its end"


def test_an_import_not_derived_yet_and_then_derived(site: Site) -> None:
    keep(site.engine, site.cfg, MONTH)
    longer = job(105, at(18, 10), 6, user="alice", account="lab_a", limit_h=24, name="train")
    import_records(site.engine, [longer], site.cfg, source="sacct-json")
    fresh_is_served(site, "alice")  # not derived: no stamp at all
    k = keep(site.engine, site.cfg, MONTH)
    assert k.why_not == "jobs that ran in it changed and the aggregator has not derived them since"
    run_aggregate(site.engine, site.cfg)
    fresh_is_served(site, "alice")  # derived: the month's days were rebuilt, the stamp moved
    before = served(site, "alice")
    assert keep(site.engine, site.cfg, MONTH).users == 6
    assert rounded(served(site, "alice")) == rounded(before)


@pytest.mark.parametrize(
    "change",
    ["peer", "month before", "model metadata", "metadata gone", "cluster name", "config", "template"],
)
def test_each_kind_of_change_stops_the_kept_answer(site: Site, change: str) -> None:
    keep(site.engine, site.cfg, MONTH)
    cfg = site.cfg
    if change == "peer":  # carol's day on 4 GPUs is a day on 2: alice's rank may move
        two = job(301, at(7), 24, user="carol", account="lab_b", gpus=2, cpus=32)
        import_records(site.engine, [two], cfg, source="sacct-json")
        run_aggregate(site.engine, cfg)
    elif change == "month before":  # the trend's February
        longer = job(104, at(5, 10, PREV), 9, user="alice", account="lab_a")
        import_records(site.engine, [longer], cfg, source="sacct-json")
        run_aggregate(site.engine, cfg)
    elif change in ("model metadata", "metadata gone"):
        with site.engine.begin() as c:
            pk = c.execute(text("SELECT id FROM jobs WHERE job_id_raw = 105")).scalar_one()
            mm = ModelMetadata.__table__.c
            if change == "model metadata":  # her bert-base run was in bf16 after all
                later = datetime.now(UTC) + timedelta(seconds=1)
                c.execute(
                    update(ModelMetadata).where(mm.job_pk == pk).values(precision="bf16", updated_at=later)
                )
            else:
                c.execute(delete(ModelMetadata).where(mm.job_pk == pk))
    elif change == "cluster name":
        with site.engine.begin() as c:
            c.execute(update(Cluster).where(Cluster.name == "d").values(name="delta"))
    elif change == "config":
        cfg = replace(cfg, cluster=replace(cfg.cluster, name="elsewhere"))
    else:
        over = site.tmp / "templates"
        over.mkdir()
        (over / "subjects.txt").write_text("Your month, by the site's own template\n")
        cfg = replace(cfg, reports=replace(cfg.reports, template_dir=str(over)))
    fresh_is_served(site, "alice", cfg)
    if change == "template":
        assert served(site, "alice", cfg=cfg)["email"]["subject"] == "Your month, by the site's own template"


def test_what_the_stamp_leaves_out(site: Site) -> None:
    """Where the database is and who may connect are no part of what a report says: a read API configured
    with another URL, its own [api] section and file is served the kept answers."""
    keep(site.engine, site.cfg, MONTH)
    other = replace(site.cfg, database_url="postgresql+psycopg://reader@db/cocaq", source="/etc/other.toml")
    other = replace(other, api=replace(other.api, port=9999), spool_dir="/elsewhere")
    assert is_kept(site, "alice", other)
    # what a report does say: the advice's threshold, the contact in the footer
    for said in (replace(other, advice=replace(other.advice, min_share=0.5)),
                 replace(other, reports=replace(other.reports, contact="help@example.org"))):  # fmt: skip
        fresh_is_served(site, "alice", said)


def test_a_damaged_row_is_computed_again_and_said(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    keep(site.engine, site.cfg, MONTH)
    with site.engine.begin() as c:
        c.execute(update(MonthAnswer).where(MonthAnswer.user_name == "bob").values(answer=b"not zlib"))
    with caplog.at_level(logging.WARNING, logger="cocaq.reports.month_store"):
        got = served(site, "bob")
    assert rounded(got) == rounded(served(site, "bob", use_kept=False))
    assert "month answer of bob for 2025-03-01 00:00:00+00:00 unreadable" in caplog.text


def test_keep_recent_keeps_the_latest_months_and_forgets_older(site: Site) -> None:
    now = datetime(2025, 5, 10, tzinfo=UTC)  # April and March are the latest two
    two = replace(site.cfg, reports=replace(site.cfg.reports, keep_months=2))
    keep(site.engine, site.cfg, PREV)  # February's, to be forgotten
    done = keep_recent(site.engine, two, now)
    assert [k.month for k in done] == ["2025-04", "2025-03"]
    with site.engine.connect() as c:
        months = set(c.execute(select(MonthAnswer.month_start)).scalars())
    assert {m.astimezone(UTC) for m in months} == {MONTH, datetime(2025, 4, 1, tzinfo=UTC)}
    none = replace(site.cfg, reports=replace(site.cfg.reports, keep_months=0))
    assert keep_recent(site.engine, none, now) == []
    with site.engine.connect() as c:
        assert c.execute(select(MonthAnswer.id)).first() is None


def test_the_command(site: Site, cli_env: dict[str, str]) -> None:
    env = dict(cli_env, COCAQ_CONFIG=site.cfg.source)
    r = run_cocaq(["report", "keep", "--month", "2025-03"], env)
    assert (r.code, r.out, r.err) == (0, "", "month answers 2025-03: 6 kept\n"), r.err
    r = run_cocaq(["report", "keep", "--month", "2025-03"], env)
    assert (r.code, r.err) == (0, "month answers 2025-03: up to date\n"), r.err
    assert is_kept(site, "alice")
    for bad, says in (
        (["--month", "2025-13"], "2025-13"),
        (["--month", "2025-03", "-M", "nosuch"], "nosuch"),
    ):
        r = run_cocaq(["report", "keep", *bad], env)
        assert r.code != 0 and r.err.count("\n") == 1 and says in r.err and "Traceback" not in r.err, r.err
    # the scheduler's job: the latest [reports] keep_months months (none of them has jobs here)
    r = run_cocaq(["scheduler", "--once", "month-answers"], env)
    assert r.code == 0, r.err
    assert not is_kept(site, "alice")  # March is older than the latest three months: forgotten


def test_the_settings_digest_reads_through_links(tmp_path: Path) -> None:
    """The code and templates are read as the importer and Jinja read them: an editable install links its
    packages in (cocaq/reports -> ../reports), a site may link a template; a loop is walked once."""
    real = tmp_path / "real"
    (real / "templates").mkdir(parents=True)
    (real / "templates" / "user_month.html").write_text("one")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "reports").symlink_to(real)
    (pkg / "loop").symlink_to(pkg)
    (pkg / "other.txt").symlink_to(real / "templates" / "user_month.html")
    before = month_store._tree_digest(str(pkg), (".html", ".txt"))
    (real / "templates" / "user_month.html").write_text("two")
    assert month_store._tree_digest(str(pkg), (".html", ".txt")) != before
    # the installed package's own templates count (reports/ is linked into cocaq/ in this checkout)
    import cocaq

    names = {rel for rel, _ in month_store.tree_files(str(Path(cocaq.__file__).parent), (".html", ".py"))}
    assert {"reports/templates/user_month.html", "reports/month_store.py", "web/templates/base.html"} <= names
    assert [rel for rel, _ in month_store.tree_files(str(pkg))] == [
        "other.txt",
        "reports/templates/user_month.html",
    ]
