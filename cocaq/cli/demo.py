"""`cocaq demo`: a realistic month of a small GPU cluster, run through the real import path.

The month is written as a `sacct --parsable2` dump (job lines with their .batch/.extern steps), then
imported with the same parser and importer a site uses, so the demo shows what cocaq makes of
accounting data rather than of hand-made rows.  Fixed seed: the same day gives the same month.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
from sqlalchemy import delete, func, select
from sqlalchemy.engine import make_url

from cocaq.cli.app import Ctx
from cocaq.cli.demo_month import (
    DEMO_CLUSTER,
    DEMO_CONFIG,
    Generator,
    demo_series,
    model_metadata,
    sacct_lines,
    ship_metadata,
    write_samples,
)
from cocaq.config_load import load_config
from cocaq.errors import UsageError


def _prog_name() -> str:
    """How the user can call cocaq again: `cocaq` if it is on PATH, else the path they ran."""
    me = os.path.abspath(sys.argv[0])
    if os.path.basename(me) != "cocaq":
        return "cocaq"
    on_path = shutil.which("cocaq")
    if on_path and os.path.abspath(on_path) == me:
        return "cocaq"
    rel = os.path.relpath(me)
    return rel if len(rel) < len(me) else me


def require_sqlite(url: str) -> None:
    """Either demo writes made-up jobs: never into a site's real database."""
    from cocaq.db.engine import mask_url

    if make_url(url).get_backend_name() != "sqlite":
        raise UsageError(
            "cocaq demo writes made-up jobs, so it only uses an embedded SQLite database, "
            f"not {mask_url(url)}: "
            "unset COCAQ_DATABASE_URL (or point it at a sqlite:/// file) to run it"
        )


def run_demo(obj: Any, out_dir: str, *, seed: int = 42, days: int = 30, at: datetime | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from cocaq.accounting.importer import import_records
    from cocaq.accounting.ledger import POSSIBLY_LOST
    from cocaq.accounting.sessions import Sessions
    from cocaq.db import migrate
    from cocaq.db.dbapi import connect
    from cocaq.db.engine import make_engine, mask_url
    from cocaq.db.schema import Cluster, Job
    from cocaq.footprint.advice_words import num
    from cocaq.footprint.totals import Window, cluster_totals, group_totals, user_footprint
    from cocaq.footprint.words import DRAWN_WORDS, cooling_words
    from cocaq.slurm.sacct import ParseStats, iter_parsable

    t0 = time.monotonic()
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    url = obj.cfg.database_url
    require_sqlite(url)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "cocaq-demo.toml"
    cfg_path.write_text(DEMO_CONFIG)
    cfg = load_config(cfg_path, environ={})
    from dataclasses import replace

    cfg = replace(cfg, database_url=url)

    engine = make_engine(url)
    migrate.upgrade(engine)
    end = (at or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    jobs = Generator(seed, end, days).generate()
    model_metadata(jobs, seed)
    dump = out / "sacct-demo.txt"
    dump.write_text("\n".join(sacct_lines(jobs)) + "\n")

    with engine.begin() as conn:  # reuse the database: replace the previous demo month
        cid = conn.execute(select(Cluster.id).where(Cluster.name == DEMO_CLUSTER)).scalar()
        if cid is not None:
            conn.execute(delete(Job).where(Job.cluster_id == cid))
    stats = ParseStats()
    with open(dump, "rb") as fh:
        summary = import_records(
            engine, iter_parsable(fh, tz=UTC, default_cluster=DEMO_CLUSTER, stats=stats), cfg, source="demo"
        )

    # Two more clusters of the site, with what real accounting holds (cocaq.cli.demo_shapes)
    from cocaq.cli import demo_shapes

    other = out / "sacct-other-clusters.txt"
    other.write_text("\n".join(demo_shapes.shape_lines(end)) + "\n")
    with engine.begin() as conn:
        for name in (demo_shapes.ATLAS, demo_shapes.LEGACY):
            cid = conn.execute(select(Cluster.id).where(Cluster.name == name)).scalar()
            if cid is not None:
                conn.execute(delete(Job).where(Job.cluster_id == cid))
                conn.execute(delete(Cluster).where(Cluster.id == cid))
    with open(other, "rb") as fh:
        other_summary = import_records(
            engine, iter_parsable(fh, tz=UTC, stats=ParseStats()), cfg, source="demo"
        )

    n_hours = demo_series(engine, end)
    n_samples = write_samples(engine, jobs, seed, cfg.collector.interval_s)
    from cocaq.accounting import measured as node_measurements

    ship_metadata(url, jobs)
    node_measurements.refresh(engine, cfg, since=end - timedelta(days=days + 2))
    with engine.connect() as conn:  # (jobs that carry metadata, whether this run wrote it or an earlier one)
        from cocaq.db.schema import ModelMetadata

        n_models = conn.execute(
            select(func.count()).select_from(ModelMetadata).join(Job, Job.id == ModelMetadata.job_pk)
            .where(Job.cluster_id == select(Cluster.id).where(Cluster.name == DEMO_CLUSTER).scalar_subquery())
        ).scalar_one()  # fmt: skip
    from cocaq.accounting.aggregate import run_aggregate

    run_aggregate(engine, cfg, full=True, rescan_samples=True)
    # What the measured A100 jobs drew, learnt and applied to the estimates of the jobs nothing measured
    # (the scheduler's weekly `calibrate` job), then those jobs' days rolled up again.
    from cocaq.accounting import calibrate
    from cocaq.accounting.recompute import recompute_jobs

    learnt = calibrate.refresh(engine, cfg)
    recompute_jobs(engine, cfg)
    run_aggregate(engine, cfg)
    reports = _write_reports(engine, cfg, out / "reports", end, days)

    w = Window(end - timedelta(days=days), end)
    with connect(url) as db:
        sessions = Sessions.of(cfg.advice)
        total = cluster_totals(db, w, cluster=DEMO_CLUSTER, sessions=sessions)
        labs = group_totals(db, w, "account", cluster=DEMO_CLUSTER, sessions=sessions)
        users = group_totals(db, w, "user", cluster=DEMO_CLUSTER, sessions=sessions)
        parts = group_totals(db, w, "partition", cluster=DEMO_CLUSTER, sessions=sessions)
        heavy = None
        if users:
            heavy = user_footprint(db, users[0]["user"], w, cluster=DEMO_CLUSTER, sessions=sessions)

    from cocaq.textsafe import csv_value

    for name, rows in (("labs", labs), ("users", users), ("partitions", parts)):
        with open(out / f"{name}.csv", "w", newline="") as fh:
            if rows:  # (text cells as every CSV writes them: no formula a spreadsheet would run)
                wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
                wr.writeheader()
                wr.writerows({k: csv_value(v) for k, v in row.items()} for row in rows)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "cluster": DEMO_CLUSTER,
                "since": w.since.isoformat(),
                "until": w.until.isoformat(),
                "totals": asdict(total),
                "labs": labs,
                "users": users,
                "partitions": parts,
                "import": {
                    "imported": summary.inserted,
                    "updated": summary.updated,
                    "unchanged": summary.unchanged,
                    "skipped": dict(stats.skipped),
                },
            },
            indent=2,
        )
    )

    console.print(
        f"[bold]cocaq demo[/]: cluster '{DEMO_CLUSTER}', {days} days to {end:%Y-%m-%d %H:%M} UTC, "
        f"{len(jobs):,} jobs generated (seed {seed}) into {mask_url(url)}"
    )
    console.print(
        f"imported {summary.inserted:,} jobs from {dump} ({stats.steps:,} steps folded); "
        "partition 'interactive' is not configured: "
        f"{summary.unknown_partitions.get('interactive', 0):,} jobs "
        "used the default hardware profile"
    )
    measured = total.measured_energy_fraction or 0.0
    console.print(
        f"Total: {total.jobs:,} jobs, {total.gpu_hours:,.0f} GPU-h, {total.cpu_hours:,.0f} CPU-h, "
        f"{total.energy_kwh:,.0f} kWh {DRAWN_WORDS} ({measured:.0%} measured), "
        f"{total.energy_kwh_with_pue:,.0f} kWh {cooling_words(total.pue_min, total.pue_max)}, "
        f"[bold]{total.co2_kg:,.0f} kg CO2e[/]; {num(total.wasted_energy_kwh)} kWh did no work (idle GPUs, "
        f"failed, out of memory, cancelled; {num(total.failed_energy_kwh)} kWh of it jobs that failed), and "
        f"{num(total.timeout_energy_kwh)} kWh {POSSIBLY_LOST}"
    )
    t = Table(title=f"Labs (kWh {DRAWN_WORDS})", title_justify="left")
    for c in ("lab", "jobs", "GPU-h", "kWh", "kg CO2e", "measured"):
        t.add_column(c, justify="left" if c == "lab" else "right")
    for lab_row in labs:
        frac = lab_row["measured_energy_fraction"]
        t.add_row(
            lab_row["account"],
            f"{lab_row['jobs']:,}",
            f"{lab_row['gpu_hours']:,.0f}",
            f"{lab_row['energy_kwh']:,.0f}",
            f"{lab_row['co2_kg']:,.0f}",
            f"{frac or 0:.0%}",
        )
    console.print(t)
    if heavy:
        console.print(
            f"Heaviest user: {heavy.key}, {heavy.totals.energy_kwh:,.0f} kWh {DRAWN_WORDS} "
            f"({heavy.totals.energy_kwh_with_pue:,.0f} kWh "
            f"{cooling_words(heavy.totals.pue_min, heavy.totals.pue_max)}), "
            f"{heavy.totals.co2_kg:,.0f} kg CO2e"
        )
    console.print(
        f"GPU samples of the A100 nodes: {n_samples:,} (5 min apart); `cocaq aggregate` derived the daily "
        "rollups, utilisation and idle GPUs the reports read"
    )
    console.print(
        f"Carbon intensity: {n_hours:,} real hours of Spain's grid (Electricity Maps, 2023) replayed onto "
        "the demo's weeks: each job's CO2 is priced by the hour, with what a cleaner start would have saved"
    )
    declared = sum(1 for j in jobs if j.comment or j.declared)
    console.print(
        f"Model metadata: {declared:,} ML jobs declared their model (in their comment or with `cocaq tag`), "
        f"the collector detected the framework of {sum(1 for j in jobs if j.detected):,}; "
        f"{n_models:,} jobs carry some"
    )
    console.print(
        "GPU jobs on the V100 nodes without energy accounting (v100-04 to -06): their GPUs' energy is "
        "estimated from what the measured ones drew (`cocaq calibrate`: "
        f"{learnt.line(cfg.estimate.calibrate_min_jobs)[len('calibrate: ') :]})"
    )
    corrected = "; ".join(f"{n} {why}" for why, n in sorted(other_summary.clamped.items()))
    console.print(
        f"What real accounting holds, on two more clusters of the site (user {demo_shapes.USER}, "
        f"{demo_shapes.LAB}; {other.name}): '{demo_shapes.ATLAS}' has no energy plugin or node hooks and "
        "records its GPUs' use in Slurm (gres/gpuutil, gres/gpumem): an idle job's GPUs are found there; "
        f"'{demo_shapes.LEGACY}' records no GPUs at all: a GPU job's count is unknown"
        + (f"; the import corrected {corrected}" if corrected else "")
    )
    console.print(f"Wrote {', '.join(sorted(p.name for p in out.iterdir() if p.is_file()))} to {out}/")
    console.print(
        f"Reports of {reports['month']} in {out / 'reports'}/: the admins' interactive page "
        f"{reports['admin_page']}, and e-mails (.html to open in a browser, .eml as sent) for the admins, "
        f"{len(reports['users'])} users ({', '.join(reports['users'])}), labs {', '.join(reports['labs'])} "
        f"and job {reports['job']}"
    )
    first_job = next((j.job_id for j in jobs if j.gpus and j.state == "COMPLETED"), jobs[0].job_id)
    prog = _prog_name()
    console.print("\nTry next:")
    for cmd in (
        f"cocaq user {users[0]['user'] if users else 'alice'} --since 30d",
        "cocaq user erin --since 30d --format json",
        "cocaq lab lab_nlp --since 30d",
        "cocaq models --since 30d",
        f"cocaq --config {cfg_path} carbon when --hours 6",
        f"cocaq job {first_job}",
        f"cocaq user {demo_shapes.USER} --since 30d   # GPU use by Slurm, unknown GPUs, no CPU time",
        f"cocaq job {demo_shapes.IDLE_JOB}   # its GPUs idle, by Slurm's gres/gpuutil",
        f"cocaq --config {cfg_path} import sacct --file {dump}   # again: nothing is duplicated",
        f"cocaq --config {cfg_path} report user {reports['users'][0]} --month {reports['month']} "
        f"--out {out / 'reports'}",
    ):
        console.print(f"  {prog}{cmd[len('cocaq') :]}", soft_wrap=True)
    console.print(f"[dim]({time.monotonic() - t0:.1f} s)[/]")


def _write_reports(engine: Any, cfg: Any, out: Path, end: datetime, days: int) -> dict[str, Any]:
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


@click.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="cocaq-demo", show_default=True)
@click.option("--seed", default=42, show_default=True, type=int)
@click.option("--days", default=30, show_default=True, type=click.IntRange(1, 366))
@click.option(
    "--study",
    is_flag=True,
    help="Instead: a larger site over six months running the e-mail study, with a known effect planted "
    "(docs/study.md).",
)
@click.option(
    "--study-effect",
    default=0.2,
    show_default=True,
    type=click.FloatRange(0.0, 0.9),
    help="With --study: how much less of the time e-mailed users' GPUs sit idle from their first e-mail "
    "(0: none, an A/A run).",
)
@click.option(
    "--at",
    "at_text",
    metavar="TIME",
    help="Build it as if it were this hour (ISO 8601, UTC unless it says): the same outputs every time, "
    "whatever the day (the month the e-mails are about takes more or fewer of its days). Default: now.",
)
@click.pass_obj
def demo(
    obj: Ctx, out_dir: str, seed: int, days: int, study: bool, study_effect: float, at_text: str | None
) -> None:
    """Fill a database with a realistic month of a small GPU cluster and show what cocaq makes of it."""
    at = None
    if at_text is not None:
        try:
            at = datetime.fromisoformat(at_text.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(
                f"expected an ISO 8601 time like 2026-12-05T12:00, got {at_text!r}"
            ) from None
        at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    if study:
        from cocaq.cli.demo_study import run_study_demo

        require_sqlite(obj.cfg.database_url)
        run_study_demo(obj, out_dir, seed=seed, effect=study_effect, now=at)
        return
    run_demo(obj, out_dir, seed=seed, days=days, at=at)
