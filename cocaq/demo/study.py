"""`cocaq demo --study`: the demo's site, larger and over six months, running the e-mail study
(docs/study.md) with a known effect planted, so that a newcomer sees the study's report filled and a
test can check that the analysis finds what was planted. What the command says about it is the
command's (cocaq/cli/demo.py).

Three baseline months, then three study months ending with the last whole month; the demo's ten users
and nineteen more of each GPU user (their own habits around the originals'), drawn into the arms by the
real draw (cocaq.study.assign) when the study's first e-mails go and as they first run jobs.

The site is built month by month, as a real one fills, so that every e-mail agrees with the data as it
was when it went. The jobs are imported first (as sacct shows them once they have ended, each dated as
if the scheduler's reconcile had imported it then), then the GPU samples of the jobs that started before
the study, aggregated. Then at the start of each month from the study's first to the one after its end,
at 06:00 UTC as the scheduler's `reports-monthly` job runs, the month before's user, lab and admin
e-mails are sent by the real sender (cocaq.reports.batch.send_month) to an outbox of .eml files
(`outbox/` in the demo's directory): the hold-out's reports are held back and recorded, so that the
ledger (`sent_reports`) holds what a real site's would, each e-mailed user's delivered reports and each
held-out user's skipped ones. Then the samples of the jobs that started in that month, with the effect
planted, and the aggregator's incremental run (new samples: their jobs and days only).

The effect: an e-mailed user's jobs that start after their first study e-mail was delivered
(cocaq.study.assign.first_contacts, read from the ledger as each month begins) idle a fifth less of the
time (`effect`): their idle GPU time, both the share of samples that find a GPU idle and the chance of
leaving GPUs unused, is scaled by 1 - effect (the time turned busy: they use the GPUs they hold better;
cocaq.demo.gpu_samples.write_samples). Nothing for the hold-out, nothing before the e-mail: a user first
e-mailed as the study begins (a job in the month before) changes from then, a user whose first job
comes later from the e-mail about that month. Samples are an hour apart here (five minutes in the
one-month demo) to keep six months of a 150-user site quick to build, and the config's collector step
says so, so that each stands for its hour.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, func, or_, select, update

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.db.schema import Cluster, Job, NodeShipment, Sample, SentReport, StudyArm
from cocaq.demo.carbon_series import demo_series
from cocaq.demo.gpu_samples import write_samples
from cocaq.demo.jobs import DemoJob, Generator
from cocaq.demo.sacct import sacct_lines
from cocaq.demo.site import DEMO_CLUSTER, DEMO_CONFIG, population
from cocaq.reports.admin_report import admin_month
from cocaq.reports.data import AdminMonth
from cocaq.slurm.sacct import ParseStats, iter_parsable
from cocaq.study.analysis import StudyReport, add_months, study_report
from cocaq.study.assign import EMAILED, HOLDOUT, first_contacts, hold_out_reason, study_id
from cocaq.study.assign import month_start as _start

SAMPLE_STEP_S = 3600.0
COPIES = 20
SEND_HOUR = 6  # the scheduler's reports-monthly job: the 1st of each month at 06:00 (cocaq.scheduler.jobs)


def _stopped(t: datetime) -> Callable[[], datetime]:
    """A clock that says `t`: the e-mails of a past month, sent then (their Date and ledger rows)."""
    return lambda: t


@dataclass
class Planting:
    """The planted effect as the months go by: who is e-mailed and since when, and the jobs it touched."""

    effect: float
    planted: set[int] = field(default_factory=set)  # the jobs with the effect (raw ids)
    reached: dict[str, datetime] = field(default_factory=dict)  # e-mailed user -> first study e-mail
    arms: dict[str, str] = field(default_factory=dict)

    def idle_factor(self, j: DemoJob) -> float:
        if j.user in self.reached and self.arms.get(j.user) == EMAILED and j.start >= self.reached[j.user]:
            self.planted.add(j.raw_id)
            return 1.0 - self.effect
        return 1.0


@dataclass
class StudyDemo:
    """What `cocaq demo --study` built, for the command to say and a test to check."""

    start: str  # the study's first month, YYYY-MM
    end: str  # its last
    effect: float
    n_users: int
    n_jobs: int
    n_samples: int
    planting: Planting
    outbox: Path
    ledger: dict[str, int]  # the user reports of the study's e-mails: status -> count
    report: StudyReport
    reports: Path  # the admin report's page and e-mail
    cfg_path: Path

    @property
    def firsts(self) -> list[datetime]:
        """Each reached e-mailed user's first study e-mail, in order."""
        return sorted(self.planting.reached.values())

    def planted(self) -> dict[str, Any]:
        """What was planted and where it went (what a test checks against the database)."""
        arms = self.planting.arms
        firsts = self.firsts
        return {
            "start": self.start,
            "end": self.end,
            "effect": self.effect,
            "first_delivery": firsts[0].isoformat() if firsts else None,
            "planted": self.planting.planted,
            "outbox": str(self.outbox),
            "config": str(self.cfg_path),
            "arms": {a: sum(1 for x in arms.values() if x == a) for a in (EMAILED, HOLDOUT)},
        }


def build_study_site(
    url: str, out_dir: str, *, seed: int = 42, effect: float = 0.2, copies: int = COPIES,
    now: datetime | None = None,
) -> StudyDemo:  # fmt: skip
    """Build the site into the SQLite database at `url`, run the study, write its reports to `out_dir`."""
    from cocaq.db import migrate
    from cocaq.db.engine import make_engine

    now = (now or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    current = f"{now:%Y-%m}"
    start, end = add_months(current, -3), add_months(current, -1)
    first = _start(add_months(start, -3))
    out = Path(out_dir)
    cfg_path, outbox = _write_config(out, seed, start, end)
    cfg = replace(load_config(cfg_path, environ={}), database_url=url)
    engine = make_engine(cfg.database_url)
    migrate.upgrade(engine)
    users = population(copies, seed)
    jobs = Generator(seed, now, (now - first).days, users).generate()
    key = _import_site(engine, cfg, out, users, jobs)
    demo_series(engine, now)
    planting = Planting(effect)
    n_samples = _run_months(engine, cfg, key, jobs, seed, planting, start, now)
    with engine.connect() as conn:
        rep = study_report(conn, cfg, now)
        adm = admin_month(conn, cfg, _start(end), DEMO_CLUSTER)
        ledger = _ledger(conn, key, start)
    reports = _write_admin_report(adm, cfg, out, end)
    return StudyDemo(start, end, effect, len(users), len(jobs), n_samples, planting, outbox, ledger, rep,
                     reports, cfg_path)  # fmt: skip


def _write_config(out: Path, seed: int, start: str, end: str) -> tuple[Path, Path]:
    """The demo's config with the study's section, its samples an hour apart and an outbox of its own."""
    out.mkdir(parents=True, exist_ok=True)
    outbox = out / "outbox"
    outbox.mkdir(exist_ok=True)
    for old in outbox.glob("*.eml"):  # an earlier run's e-mails
        old.unlink()
    cfg_path = out / "cocaq-demo-study.toml"
    # the samples are an hour apart: each stands for its hour (the one-month demo's are 5 minutes apart)
    config = DEMO_CONFIG.replace("\ninterval_s = 300 ", f"\ninterval_s = {SAMPLE_STEP_S:.0f}")
    assert config != DEMO_CONFIG, "the demo's [collector] interval_s moved"
    mail = '\n[mail]\ntransport = "outbox"\n'
    assert mail in config, "the demo's [mail] transport moved"
    config = config.replace(mail, f"{mail}outbox_dir = {json.dumps(str(outbox.resolve()))}\n")
    cfg_path.write_text(
        config + f'\n[study]\nstart = "{start}"\nend = "{end}"\nholdout_share = 0.2\nseed = {seed}\n'
    )
    return cfg_path, outbox


def _import_site(engine: Engine, cfg: Config, out: Path, users: dict[str, Any], jobs: list[DemoJob]) -> str:
    """The site's jobs in place of the previous demo site, study and e-mails; returns the study's key."""
    dump = out / "sacct-demo-study.txt"
    dump.write_text("\n".join(sacct_lines(jobs)) + "\n")
    addresses = {*cfg.reports.admins, *(a for heads in cfg.reports.lab_heads.values() for a in heads)}
    with engine.begin() as conn:  # reuse the database: replace the previous demo site, study and e-mails
        cid = conn.execute(select(Cluster.id).where(Cluster.name == DEMO_CLUSTER)).scalar()
        if cid is not None:
            conn.execute(delete(Job).where(Job.cluster_id == cid))
            conn.execute(delete(Sample).where(Sample.cluster_id == cid))
            conn.execute(delete(NodeShipment).where(NodeShipment.cluster_id == cid))
        key = study_id(conn, cfg.study).key  # the demo's seed is its own: "START/seed 42"
        conn.execute(delete(StudyArm).where(StudyArm.study == key))
        conn.execute(delete(SentReport).where(SentReport.user_name.in_(sorted(users))))
        conn.execute(delete(SentReport).where(SentReport.recipient.in_(sorted(addresses))))
    with open(dump, "rb") as fh:
        records = iter_parsable(fh, tz=UTC, default_cluster=DEMO_CLUSTER, stats=ParseStats())
        import_records(engine, records, cfg, source="demo")
    with engine.begin() as conn:
        # Each job as if the scheduler's reconcile had imported it as it ended (a running one, as it
        # began), not all a minute ago: the aggregator's incremental runs then derive what they would on
        # a real site, the jobs with new samples, rather than six months of jobs each time.
        cid = conn.execute(select(Cluster.id).where(Cluster.name == DEMO_CLUSTER)).scalar_one()
        when = func.coalesce(Job.end_time, Job.start_time, Job.submit_time)
        conn.execute(update(Job).where(Job.cluster_id == cid).values(updated_at=when))
    return key


def _shipped_by(engine: Engine, t: datetime) -> None:
    """The samples just aggregated, as if shipped by `t` (as their month went by), not a minute ago: the
    aggregator's next incremental run reads the new ones only (its margin is 10 minutes)."""
    with engine.begin() as conn:
        cid = conn.execute(select(Cluster.id).where(Cluster.name == DEMO_CLUSTER)).scalar_one()
        N = NodeShipment
        conn.execute(update(N).where(N.cluster_id == cid, N.shipped_at > t).values(shipped_at=t))


def _run_months(
    engine: Engine, cfg: Config, key: str, jobs: list[DemoJob], seed: int, planting: Planting, start: str,
    now: datetime,
) -> int:  # fmt: skip
    """The baseline's samples, aggregated; then from the study's first month to the one after its end, the
    month before's e-mails as it begins, then the month's samples, the effect from each e-mailed user's
    first delivered e-mail. Returns the samples written."""
    from cocaq.reports.batch import send_month

    study_from = _start(start)
    n_samples = write_samples(
        engine, [j for j in jobs if j.start < study_from], seed, SAMPLE_STEP_S, planting.idle_factor,
        keep=True,
    )  # fmt: skip
    run_aggregate(engine, cfg, full=True, rescan_samples=True)  # the baseline's GPU-hours stratify the draw
    _shipped_by(engine, study_from)
    for k in range(4):
        month = add_months(start, k)
        at = min(_start(month) + timedelta(hours=SEND_HOUR), now)
        send_month(engine, cfg, _start(add_months(month, -1)), now=at, clock=_stopped(at))
        with engine.connect() as conn:
            q = select(StudyArm.user_name, StudyArm.arm).where(StudyArm.study == key)
            planting.arms = {str(u): str(a) for u, a in conn.execute(q)}
            planting.reached = {
                u: t
                for u, t in first_contacts(conn, cfg.study, key).items()
                if planting.arms.get(u) == EMAILED
            }
        lo, hi = _start(month), _start(month, 1)
        batch = [j for j in jobs if lo <= j.start < hi]
        n_samples += write_samples(engine, batch, seed, SAMPLE_STEP_S, planting.idle_factor, keep=True)
        run_aggregate(engine, cfg)
        _shipped_by(engine, min(hi, now))
    return n_samples


def _ledger(conn: Any, key: str, start: str) -> dict[str, int]:
    """The study's user reports in `sent_reports`: delivered, and held back for the hold-out."""
    from cocaq.reports.batch import USER_KIND

    S = SentReport
    return dict(
        conn.execute(
            select(S.status, func.count())
            .where(S.kind == USER_KIND, S.period_start >= _start(add_months(start, -1)))
            .where(or_(S.status == "sent", S.error == hold_out_reason(key)))
            .group_by(S.status)
        ).all()
    )


def _write_admin_report(adm: AdminMonth, cfg: Config, out: Path, end: str) -> Path:
    """The admin report of the study's last month, with the study's section: the page and the e-mail."""
    from cocaq.reports.render import render_admin_email, render_admin_html

    reports = out / "reports"
    reports.mkdir(exist_ok=True)
    admin_mail = render_admin_email(adm, cfg)
    (reports / f"admin-{end}-study-email.txt").write_text(admin_mail.text)
    (reports / f"admin-{end}-study-email.html").write_text(admin_mail.html)
    (reports / f"admin-{end}-study.html").write_text(render_admin_html(adm, cfg))
    return reports
