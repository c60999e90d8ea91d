"""`cocaq demo`'s month, built: a small GPU cluster's month run through the real import path, measured,
aggregated and reported, as a site's month would be.

The month is written as a `sacct --parsable2` dump (cocaq.demo.sacct), then imported with the same parser
and importer a site uses, so the demo shows what cocaq makes of accounting data rather than of hand-made
rows. Then the GPU samples, the carbon intensity and the ML metadata, the aggregator, the calibration of
the unmeasured GPUs, the month's reports and the totals the command prints. Fixed seed: the same day
gives the same month. What the command says about it is the command's (cocaq/cli/demo.py).
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, func, select

from cocaq.accounting.calibrate import Learnt
from cocaq.accounting.importer import ImportSummary, import_records
from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.db.schema import Cluster, Job, ModelMetadata
from cocaq.demo import other_clusters
from cocaq.demo.carbon_series import demo_series
from cocaq.demo.gpu_samples import write_samples
from cocaq.demo.jobs import DemoJob, Generator
from cocaq.demo.ml_metadata import model_metadata, ship_metadata
from cocaq.demo.sacct import sacct_lines
from cocaq.demo.site import DEMO_CLUSTER, DEMO_CONFIG, require_sqlite
from cocaq.footprint.totals import Footprint, Totals, Window
from cocaq.slurm.sacct import ParseStats, iter_parsable


@dataclass
class Imported:
    """A sacct dump as imported: its file, what the parser folded and skipped, what the importer did."""

    dump: Path
    stats: ParseStats
    summary: ImportSummary


@dataclass
class Measured:
    """What the month's measurements added: intensity hours, GPU samples, jobs with model metadata, and
    the GPU power learnt from the measured jobs."""

    n_hours: int
    n_samples: int
    n_models: int
    learnt: Learnt


@dataclass
class Footprints:
    """The month's totals on the demo cluster: the whole, per lab, user and partition, the heaviest user."""

    window: Window
    total: Totals
    labs: list[dict[str, Any]]
    users: list[dict[str, Any]]
    parts: list[dict[str, Any]]
    heavy: Footprint | None


@dataclass
class MonthDemo:
    """What `cocaq demo` built, for the command to say."""

    out: Path
    cfg_path: Path
    cfg: Config
    end: datetime
    jobs: list[DemoJob]
    month: Imported
    other: Imported
    measured: Measured
    reports: dict[str, Any]
    footprints: Footprints


def build_month(
    url: str, out_dir: str, *, seed: int = 42, days: int = 30, at: datetime | None = None
) -> MonthDemo:
    """Generate the month ending at `at` (default: this hour), import, measure, aggregate and report it
    into the SQLite database at `url`, and write its files to `out_dir`."""
    from cocaq.db import migrate
    from cocaq.db.engine import make_engine

    require_sqlite(url)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "cocaq-demo.toml"
    cfg_path.write_text(DEMO_CONFIG)
    cfg = replace(load_config(cfg_path, environ={}), database_url=url)
    engine = make_engine(url)
    migrate.upgrade(engine)
    end = (at or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    jobs = Generator(seed, end, days).generate()
    model_metadata(jobs, seed)
    month = _import_month(engine, cfg, out, jobs)
    other = _import_other_clusters(engine, cfg, out, end)
    measured = _measure(engine, cfg, jobs, seed, end, days)
    reports = write_month_reports(engine, cfg, out / "reports", end, days)
    footprints = _footprints(url, cfg, Window(end - timedelta(days=days), end))
    _write_tables(out, footprints, month)
    return MonthDemo(out, cfg_path, cfg, end, jobs, month, other, measured, reports, footprints)


def _import_month(engine: Engine, cfg: Config, out: Path, jobs: list[DemoJob]) -> Imported:
    """The month's sacct dump, imported in place of the previous demo month (the database is reused)."""
    dump = out / "sacct-demo.txt"
    dump.write_text("\n".join(sacct_lines(jobs)) + "\n")
    with engine.begin() as conn:
        cid = conn.execute(select(Cluster.id).where(Cluster.name == DEMO_CLUSTER)).scalar()
        if cid is not None:
            conn.execute(delete(Job).where(Job.cluster_id == cid))
    stats = ParseStats()
    with open(dump, "rb") as fh:
        summary = import_records(
            engine, iter_parsable(fh, tz=UTC, default_cluster=DEMO_CLUSTER, stats=stats), cfg, source="demo"
        )
    return Imported(dump, stats, summary)


def _import_other_clusters(engine: Engine, cfg: Config, out: Path, end: datetime) -> Imported:
    """Two more clusters of the site, with what real accounting holds (cocaq.demo.other_clusters)."""
    other = out / "sacct-other-clusters.txt"
    other.write_text("\n".join(other_clusters.shape_lines(end)) + "\n")
    with engine.begin() as conn:
        for name in (other_clusters.ATLAS, other_clusters.LEGACY):
            cid = conn.execute(select(Cluster.id).where(Cluster.name == name)).scalar()
            if cid is not None:
                conn.execute(delete(Job).where(Job.cluster_id == cid))
                conn.execute(delete(Cluster).where(Cluster.id == cid))
    stats = ParseStats()
    with open(other, "rb") as fh:
        summary = import_records(engine, iter_parsable(fh, tz=UTC, stats=stats), cfg, source="demo")
    return Imported(other, stats, summary)


def _measure(
    engine: Engine, cfg: Config, jobs: list[DemoJob], seed: int, end: datetime, days: int
) -> Measured:
    """The intensity, the samples and the metadata, joined to the jobs and aggregated; then the A100s'
    measured draw learnt and applied to the jobs nothing measured (the scheduler's weekly `calibrate`
    job), and those jobs' days rolled up again."""
    from cocaq.accounting import calibrate
    from cocaq.accounting import measured as node_measurements
    from cocaq.accounting.aggregate import run_aggregate
    from cocaq.accounting.recompute import recompute_jobs

    n_hours = demo_series(engine, end)
    n_samples = write_samples(engine, jobs, seed, cfg.collector.interval_s)
    ship_metadata(cfg.database_url, jobs)
    node_measurements.refresh(engine, cfg, since=end - timedelta(days=days + 2))
    with engine.connect() as conn:  # (jobs that carry metadata, whether this run wrote it or an earlier one)
        n_models = conn.execute(
            select(func.count()).select_from(ModelMetadata).join(Job, Job.id == ModelMetadata.job_pk)
            .where(Job.cluster_id == select(Cluster.id).where(Cluster.name == DEMO_CLUSTER).scalar_subquery())
        ).scalar_one()  # fmt: skip
    run_aggregate(engine, cfg, full=True, rescan_samples=True)
    learnt = calibrate.refresh(engine, cfg)
    recompute_jobs(engine, cfg)
    run_aggregate(engine, cfg)
    return Measured(n_hours, n_samples, n_models, learnt)


def _footprints(url: str, cfg: Config, w: Window) -> Footprints:
    from cocaq.accounting.sessions import Sessions
    from cocaq.db.dbapi import connect
    from cocaq.footprint.totals import cluster_totals, group_totals, user_footprint

    with connect(url) as db:
        sessions = Sessions.of(cfg.advice)
        total = cluster_totals(db, w, cluster=DEMO_CLUSTER, sessions=sessions)
        labs = group_totals(db, w, "account", cluster=DEMO_CLUSTER, sessions=sessions)
        users = group_totals(db, w, "user", cluster=DEMO_CLUSTER, sessions=sessions)
        parts = group_totals(db, w, "partition", cluster=DEMO_CLUSTER, sessions=sessions)
        heavy = None
        if users:
            heavy = user_footprint(db, users[0]["user"], w, cluster=DEMO_CLUSTER, sessions=sessions)
    return Footprints(w, total, labs, users, parts, heavy)


def _write_tables(out: Path, f: Footprints, month: Imported) -> None:
    """labs.csv, users.csv, partitions.csv and summary.json."""
    from cocaq.textsafe import csv_value

    for name, rows in (("labs", f.labs), ("users", f.users), ("partitions", f.parts)):
        with open(out / f"{name}.csv", "w", newline="") as fh:
            if rows:  # (text cells as every CSV writes them: no formula a spreadsheet would run)
                wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
                wr.writeheader()
                wr.writerows({k: csv_value(v) for k, v in row.items()} for row in rows)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "cluster": DEMO_CLUSTER,
                "since": f.window.since.isoformat(),
                "until": f.window.until.isoformat(),
                "totals": asdict(f.total),
                "labs": f.labs,
                "users": f.users,
                "partitions": f.parts,
                "import": {
                    "imported": month.summary.inserted,
                    "updated": month.summary.updated,
                    "unchanged": month.summary.unchanged,
                    "skipped": dict(month.stats.skipped),
                },
            },
            indent=2,
        )
    )


def write_month_reports(engine: Any, cfg: Any, out: Path, end: datetime, days: int) -> dict[str, Any]:
    """The month's reports as a site gets them: the admins' interactive page and e-mail, and e-mails of a
    few users (the heaviest, the idlest, the one with most to gain) and labs, and of one job.

    The month is the UTC month holding most of the demo's days. Every user is taken to have had a first
    report nine and a half days before the month's data ends, so the admin report shows its before/after
    section (the demo's users do not change their habits: expect no effect).
    """
    from cocaq.reports.admin_report import admin_month
    from cocaq.reports.data import Month
    from cocaq.reports.files import file_stem, user_address, write_email
    from cocaq.reports.job_report import job_footprint
    from cocaq.reports.lab_report import lab_month
    from cocaq.reports.render import (
        render_admin_email,
        render_admin_html,
        render_jobs,
        render_lab_month,
        render_user_month,
    )
    from cocaq.reports.suggest import suggest_for_user
    from cocaq.reports.user_report import users_month

    month = Month.of(end - timedelta(days=days / 2))
    limit = min(month.end, end)
    if out.exists():
        for old in out.iterdir():
            if old.is_file() and old.suffix in (".html", ".eml"):
                old.unlink()
    with engine.connect() as conn:
        months = users_month(conn, cfg, month.start, cluster=DEMO_CLUSTER)
        first = {u: limit - timedelta(days=9.5) for u, um in months.items() if um.totals.gpu_hours > 0}
        adm = admin_month(conn, cfg, month.start, DEMO_CLUSTER, first_report=first, window_days=7)
        labs = {
            a: lab_month(conn, cfg, a, month.start, cluster=DEMO_CLUSTER) for a in ("lab_nlp", "lab_vision")
        }
        busy = [um for um in months.values() if um.totals.energy_kwh > 0]
        suggestions = {um.user: suggest_for_user(um, cfg) for um in busy}
        picks: list[str] = []
        for key in (
            lambda um: um.totals.energy_kwh,
            lambda um: um.totals.idle_gpu_kwh,
            lambda um: (len(suggestions[um.user]), sum(s.saving_kwh or 0 for s in suggestions[um.user])),
        ):
            for um in sorted(busy, key=key, reverse=True):
                if um.user not in picks:
                    picks.append(um.user)
                    break
        top = next((j for u in picks for j in months[u].top_jobs if j.gpus), None)
        job = job_footprint(conn, cfg, top.pk) if top is not None else None
    label = month.label
    out.mkdir(parents=True, exist_ok=True)
    page = out / f"admin-{label}.html"
    page.write_text(render_admin_html(adm, cfg), encoding="utf-8")
    write_email(out, f"admin-{label}-email", render_admin_email(adm, cfg), cfg, cfg.reports.admins[0])
    for u in picks:
        r = render_user_month(months[u], suggestions[u], cfg)
        write_email(out, file_stem("user", u, label), r, cfg, user_address(engine, cfg, u), user=u)
    for a, lm in labs.items():
        write_email(
            out, file_stem("lab", a, label), render_lab_month(lm, cfg), cfg, cfg.reports.lab_heads[a][0]
        )
    if job is not None:
        write_email(
            out,
            file_stem("job", job.job_id),
            render_jobs([job], cfg),
            cfg,
            user_address(engine, cfg, job.user),
        )
    return {
        "month": label,
        "admin_page": page.name,
        "users": picks,
        "labs": list(labs),
        "job": job.job_id if job is not None else "none",
    }
