"""`cocaq demo`: a realistic month of a small GPU cluster (or, --study, six months of a larger site
running the e-mail study), built by cocaq.demo through the real import path, and what cocaq makes of it.

The command parses its options and says what was built; cocaq.demo builds it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from cocaq.cli.app import Ctx
    from cocaq.demo.month import MonthDemo
    from cocaq.demo.study import StudyDemo


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


def run_demo(obj: Any, out_dir: str, *, seed: int = 42, days: int = 30, at: datetime | None = None) -> None:
    """Build the month (cocaq.demo.month) and say what it holds."""
    from rich.console import Console

    from cocaq.demo.month import build_month

    t0 = time.monotonic()
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    m = build_month(obj.cfg.database_url, out_dir, seed=seed, days=days, at=at)
    _say_totals(console, m, seed, days)
    _say_sources(console, m)
    _say_try_next(console, m)
    console.print(f"[dim]({time.monotonic() - t0:.1f} s)[/]")


def _say_totals(console: Any, m: MonthDemo, seed: int, days: int) -> None:
    """The month's import, its totals and its labs' table, and the heaviest user."""
    from rich.table import Table

    from cocaq.accounting.ledger import POSSIBLY_LOST
    from cocaq.db.engine import mask_url
    from cocaq.demo.site import DEMO_CLUSTER
    from cocaq.footprint.advice_words import num
    from cocaq.footprint.words import DRAWN_WORDS, cooling_words

    summary, stats, total = m.month.summary, m.month.stats, m.footprints.total
    console.print(
        f"[bold]cocaq demo[/]: cluster '{DEMO_CLUSTER}', {days} days to {m.end:%Y-%m-%d %H:%M} UTC, "
        f"{len(m.jobs):,} jobs generated (seed {seed}) into {mask_url(m.cfg.database_url)}"
    )
    console.print(
        f"imported {summary.inserted:,} jobs from {m.month.dump} ({stats.steps:,} steps folded); "
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
    for lab_row in m.footprints.labs:
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
    heavy = m.footprints.heavy
    if heavy:
        console.print(
            f"Heaviest user: {heavy.key}, {heavy.totals.energy_kwh:,.0f} kWh {DRAWN_WORDS} "
            f"({heavy.totals.energy_kwh_with_pue:,.0f} kWh "
            f"{cooling_words(heavy.totals.pue_min, heavy.totals.pue_max)}), "
            f"{heavy.totals.co2_kg:,.0f} kg CO2e"
        )


def _say_sources(console: Any, m: MonthDemo) -> None:
    """Where the month's figures come from: samples, intensity, metadata, calibration, the other
    clusters; and the files written."""
    from cocaq.demo import other_clusters as oc

    jobs, out = m.jobs, m.out
    console.print(
        f"GPU samples of the A100 nodes: {m.measured.n_samples:,} (5 min apart); `cocaq aggregate` derived "
        "the daily rollups, utilisation and idle GPUs the reports read"
    )
    console.print(
        f"Carbon intensity: {m.measured.n_hours:,} real hours of Spain's grid (Electricity Maps, 2023) "
        "replayed onto the demo's weeks: each job's CO2 is priced by the hour, with what a cleaner start "
        "would have saved"
    )
    declared = sum(1 for j in jobs if j.comment or j.declared)
    console.print(
        f"Model metadata: {declared:,} ML jobs declared their model (in their comment or with `cocaq tag`), "
        f"the collector detected the framework of {sum(1 for j in jobs if j.detected):,}; "
        f"{m.measured.n_models:,} jobs carry some"
    )
    console.print(
        "GPU jobs on the V100 nodes without energy accounting (v100-04 to -06): their GPUs' energy is "
        "estimated from what the measured ones drew (`cocaq calibrate`: "
        f"{m.measured.learnt.line(m.cfg.estimate.calibrate_min_jobs)[len('calibrate: ') :]})"
    )
    corrected = "; ".join(f"{n} {why}" for why, n in sorted(m.other.summary.clamped.items()))
    console.print(
        f"What real accounting holds, on two more clusters of the site (user {oc.USER}, "
        f"{oc.LAB}; {m.other.dump.name}): '{oc.ATLAS}' has no energy plugin or node hooks and "
        "records its GPUs' use in Slurm (gres/gpuutil, gres/gpumem): an idle job's GPUs are found there; "
        f"'{oc.LEGACY}' records no GPUs at all: a GPU job's count is unknown"
        + (f"; the import corrected {corrected}" if corrected else "")
    )
    console.print(f"Wrote {', '.join(sorted(p.name for p in out.iterdir() if p.is_file()))} to {out}/")


def _say_try_next(console: Any, m: MonthDemo) -> None:
    """The month's reports, and the commands to try on them."""
    from cocaq.demo import other_clusters as oc

    out, reports, users, cfg_path = m.out, m.reports, m.footprints.users, m.cfg_path
    console.print(
        f"Reports of {reports['month']} in {out / 'reports'}/: the admins' interactive page "
        f"{reports['admin_page']}, and e-mails (.html to open in a browser, .eml as sent) for the admins, "
        f"{len(reports['users'])} users ({', '.join(reports['users'])}), labs {', '.join(reports['labs'])} "
        f"and job {reports['job']}"
    )
    first_job = next((j.job_id for j in m.jobs if j.gpus and j.state == "COMPLETED"), m.jobs[0].job_id)
    prog = _prog_name()
    first_user = users[0]["user"] if users else "alice"
    console.print("\nTry next:")
    for cmd in (
        f"cocaq user {users[0]['user'] if users else 'alice'} --since 30d",
        "cocaq user erin --since 30d --format json",
        "cocaq lab lab_nlp --since 30d",
        "cocaq models --since 30d",
        f"cocaq --config {cfg_path} carbon when --hours 6",
        f"cocaq job {first_job}",
        f"cocaq --config {cfg_path} web --user {first_user}   # the same in a browser",
        f"cocaq user {oc.USER} --since 30d   # GPU use by Slurm, unknown GPUs, no CPU time",
        f"cocaq job {oc.IDLE_JOB}   # its GPUs idle, by Slurm's gres/gpuutil",
        f"cocaq --config {cfg_path} import sacct --file {m.month.dump}   # again: nothing is duplicated",
        f"cocaq --config {cfg_path} report user {reports['users'][0]} --month {reports['month']} "
        f"--out {out / 'reports'}",
    ):
        console.print(f"  {prog}{cmd[len('cocaq') :]}", soft_wrap=True)


def run_study_demo(
    obj: Any, out_dir: str, *, seed: int = 42, effect: float = 0.2, copies: int | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Build the study's site (cocaq.demo.study), say what it holds and the study's report; returns what
    was planted and where it went."""
    from rich.console import Console

    from cocaq.demo.study import COPIES, build_study_site

    t0 = time.monotonic()
    console = Console(highlight=False)
    site = build_study_site(
        obj.cfg.database_url, out_dir, seed=seed, effect=effect, copies=COPIES if copies is None else copies,
        now=now,
    )  # fmt: skip
    _say_study(console, site)
    console.print(f"[dim]({time.monotonic() - t0:.1f} s)[/]")
    return site.planted()


def _say_study(console: Any, site: StudyDemo) -> None:
    from datetime import timedelta

    from cocaq.cli.study_report import print_report
    from cocaq.demo.study import SEND_HOUR
    from cocaq.study.analysis import add_months
    from cocaq.study.assign import EMAILED
    from cocaq.study.assign import month_start as _start

    start, end, outbox, reports = site.start, site.end, site.outbox, site.reports
    emailed = sorted(u for u, a in site.planting.arms.items() if a == EMAILED)
    firsts = site.firsts
    opening = _start(start) + timedelta(hours=SEND_HOUR)  # the study's first e-mails
    at_once = sum(1 for t in firsts if t <= opening)
    n_eml = sum(1 for _ in outbox.glob("*.eml"))
    console.print(
        f"The e-mail study on a site of {site.n_users} users over six months: {site.n_jobs:,} jobs, "
        f"{site.n_samples:,} GPU samples (an hour apart); baseline {add_months(start, -3)} to "
        f"{add_months(start, -1)}, study {start} to {end}. Planted: e-mailed users' GPUs idle "
        f"{site.effect:.0%} less of the time from each e-mailed user's first e-mail (delivered to {at_once} "
        f"of {len(emailed)} as the study began, {opening:%Y-%m-%d %H:%M} UTC; {len(firsts) - at_once} later; "
        f"{len(emailed) - len(firsts)} never), in the jobs they started since."
    )
    console.print(
        f"The monthly e-mails of {add_months(start, -1)} to {end}, sent as the scheduler sends them on "
        f"the 1st: {n_eml:,} in the outbox ({outbox}); the user reports {site.ledger.get('sent', 0):,} "
        f"delivered and {site.ledger.get('skipped', 0):,} held back for the hold-out (`sent_reports`)."
    )
    print_report(site.report, console)
    console.print(
        f"Admin report of {end} with the study's section: {reports}/admin-{end}-study.html (and the "
        f"e-mail, .txt and .html). Config: {site.cfg_path}; `cocaq --config {site.cfg_path} study report` "
        "again."
    )


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
        from cocaq.demo.site import require_sqlite

        require_sqlite(obj.cfg.database_url)
        run_study_demo(obj, out_dir, seed=seed, effect=study_effect, now=at)
        return
    run_demo(obj, out_dir, seed=seed, days=days, at=at)
