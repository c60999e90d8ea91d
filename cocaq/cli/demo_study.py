"""`cocaq demo --study`: the demo's site, larger and over six months, running the e-mail study
(docs/study.md) with a known effect planted, so that a newcomer sees the study's report filled and a
test can check that the analysis finds what was planted.

Three baseline months, then three study months ending with the last whole month; the demo's ten users
and nineteen more of each GPU user (their own habits around the originals'), drawn into the arms by
the real draw (cocaq.study.assign) at the study's start and as they first run jobs. The effect: from
the month after their first e-mail (the study's second month: the first e-mail goes out as its first
month begins), e-mailed users' GPUs are idle a fifth less of the time (`effect`): their jobs' idle
GPU time, both the share of samples that find a GPU idle and the chance of leaving GPUs unused, is
scaled by 1 - effect (the time turned busy: they use the GPUs they hold better; cocaq.cli.demo_month.
write_samples). Samples are an hour apart here (five minutes in the one-month demo) to keep six months
of a 150-user site quick to build, and the config's collector step says so, so that each stands for
its hour.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SAMPLE_STEP_S = 3600.0
COPIES = 20


def run_study_demo(
    obj: Any, out_dir: str, *, seed: int = 42, effect: float = 0.2, copies: int = COPIES,
    now: datetime | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Build the site, run the study, write its reports; returns what was planted and where it went."""
    from dataclasses import replace

    from rich.console import Console
    from sqlalchemy import delete, select

    from cocaq.accounting.aggregate import run_aggregate
    from cocaq.accounting.importer import import_records
    from cocaq.cli.demo_month import (
        DEMO_CLUSTER,
        DEMO_CONFIG,
        Generator,
        demo_series,
        population,
        sacct_lines,
        write_samples,
    )
    from cocaq.cli.study_report import print_report
    from cocaq.config_load import load_config
    from cocaq.db import migrate
    from cocaq.db.engine import make_engine
    from cocaq.db.schema import Cluster, Job, StudyArm
    from cocaq.reports.admin_report import admin_month
    from cocaq.reports.render import render_admin_email, render_admin_html
    from cocaq.slurm.sacct import ParseStats, iter_parsable
    from cocaq.study.analysis import add_months, study_report
    from cocaq.study.assign import assign, study_id
    from cocaq.study.assign import month_start as _start

    t0 = time.monotonic()
    console = Console(highlight=False)
    now = (now or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    current = f"{now:%Y-%m}"
    start, end = add_months(current, -3), add_months(current, -1)
    first = _start(add_months(start, -3))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "cocaq-demo-study.toml"
    # the samples are an hour apart: each stands for its hour (the one-month demo's are 5 minutes apart)
    config = DEMO_CONFIG.replace("\ninterval_s = 300 ", f"\ninterval_s = {SAMPLE_STEP_S:.0f}")
    assert config != DEMO_CONFIG, "the demo's [collector] interval_s moved"
    cfg_path.write_text(
        config + f'\n[study]\nstart = "{start}"\nend = "{end}"\nholdout_share = 0.2\nseed = {seed}\n'
    )
    cfg = replace(load_config(cfg_path, environ={}), database_url=obj.cfg.database_url)
    engine = make_engine(cfg.database_url)
    migrate.upgrade(engine)
    users = population(copies, seed)
    jobs = Generator(seed, now, (now - first).days, users).generate()
    dump = out / "sacct-demo-study.txt"
    dump.write_text("\n".join(sacct_lines(jobs)) + "\n")
    with engine.begin() as conn:  # reuse the database: replace the previous demo site and study
        cid = conn.execute(select(Cluster.id).where(Cluster.name == DEMO_CLUSTER)).scalar()
        if cid is not None:
            conn.execute(delete(Job).where(Job.cluster_id == cid))
        key = study_id(conn, cfg.study).key  # the demo's seed is its own: "START/seed 42"
        conn.execute(delete(StudyArm).where(StudyArm.study == key))
    with open(dump, "rb") as fh:
        records = iter_parsable(fh, tz=UTC, default_cluster=DEMO_CLUSTER, stats=ParseStats())
        import_records(engine, records, cfg, source="demo")
    demo_series(engine, now)
    run_aggregate(engine, cfg, full=True)  # the baseline's GPU-hours stratify the draw
    with engine.begin() as conn:
        assign(conn, cfg, _start(start))  # the draw, as the study begins
        assign(conn, cfg, now)  # and the users who first ran a job since
        arms = dict(conn.execute(select(StudyArm.user_name, StudyArm.arm).where(StudyArm.study == key)).all())
    effect_from = _start(add_months(start, 1))

    def idle_factor(j: Any) -> float:
        return 1.0 - effect if arms.get(j.user) == "emailed" and j.start >= effect_from else 1.0

    n_samples = write_samples(engine, jobs, seed, SAMPLE_STEP_S, idle_factor)
    run_aggregate(engine, cfg, full=True, rescan_samples=True)
    with engine.connect() as conn:
        rep = study_report(conn, cfg, now)
        adm = admin_month(conn, cfg, _start(end), DEMO_CLUSTER)
    reports = out / "reports"
    reports.mkdir(exist_ok=True)
    mail = render_admin_email(adm, cfg)
    (reports / f"admin-{end}-study-email.txt").write_text(mail.text)
    (reports / f"admin-{end}-study-email.html").write_text(mail.html)
    (reports / f"admin-{end}-study.html").write_text(render_admin_html(adm, cfg))
    console.print(
        f"The e-mail study on a site of {len(users)} users over six months: {len(jobs):,} jobs, "
        f"{n_samples:,} GPU samples (an hour apart); baseline {add_months(start, -3)} to "
        f"{add_months(start, -1)}, study {start} to {end}. Planted: e-mailed users' GPUs idle "
        f"{effect:.0%} less of the time from {effect_from:%Y-%m} (the month after their first e-mail)."
    )
    print_report(rep, console)
    console.print(
        f"Admin report of {end} with the study's section: {reports}/admin-{end}-study.html (and the "
        f"e-mail, .txt and .html). Config: {cfg_path}; `cocaq --config {cfg_path} study report` again."
    )
    console.print(f"[dim]({time.monotonic() - t0:.1f} s)[/]")
    return {
        "start": start,
        "end": end,
        "effect": effect,
        "effect_from": f"{effect_from:%Y-%m}",
        "config": str(cfg_path),
    }
