"""The samples' lifecycle: raw GPU samples go once they are old and summarised; the summaries stay.

What a site keeps for ever is per job and per hour (job_metrics, job_energy, job_gpu_hours and the daily
rollups): what every report, `cocaq user` and a recompute read. The raw samples (`samples`, about 4 rows
per GPU every 10 s) are needed only until the aggregator has summarised them into job_gpu_hours, and
for the recent views that read them raw (`cocaq watch`, idle alerts). `[retention] samples_days` says
how long they stay:

* PostgreSQL: a monthly partition goes whole (DETACH PARTITION, then DROP TABLE: no DELETE, no bloat,
  no vacuum) once its upper bound is older than now - samples_days. SQLite (the one-machine trial):
  the rows older than the cut-off, on an hour's start, are deleted in bounded batches.
* Only what the aggregator has summarised: it derives job_gpu_hours from the samples of the batches
  shipped (`node_shipments`) since its last run (`aggregator_state` 'gpu_hours', less its MARGIN). A
  batch shipped since then is not summarised yet, and the samples from the hour before its earliest one
  on are kept (the aggregator re-reads that hour): the month that holds them is kept, and why is logged.
  Nothing goes before the aggregator's first run.
* The horizon: the start of the first hour that still has samples is recorded (`aggregator_state`
  'samples_from', cocaq.accounting.gpu_hours), and the aggregator never derives an hour before it again,
  even on `--rescan-samples` or new idle-threshold parameters: those hours' job_gpu_hours rows are all
  that is left of their samples.
* node_shipments, the shipping log, goes with the samples: rows shipped before the cut-off and before
  the aggregator's last run. The shipper's replay protection needs a row only until the node has
  forgotten the batch (at once, after the commit); a batch replayed later still cannot duplicate a sample
  (the samples' primary key), and the aggregator reads only the rows since its last run.
* PostgreSQL also gets the coming months' partitions (cocaq.db.partitions.ensure_sample_partitions), so
  that samples never pile into samples_default, whose rows retention never touches.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, delete, func, insert, literal_column, select, update
from sqlalchemy.exc import OperationalError

from cocaq.accounting.aggregate import GPU_HOURS, MARGIN
from cocaq.accounting.gpu_hours import SAMPLES_FROM, samples_horizon
from cocaq.config import Config
from cocaq.db import partitions
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import AggregatorState, NodeShipment, Sample
from cocaq.db.sqlfuncs import utcnow
from cocaq.db.status import size_text
from cocaq.units import S_PER_HOUR

log = logging.getLogger(__name__)

AHEAD = 2  # months of partitions made ahead (as `cocaq db upgrade` does)
BATCH = 50_000  # rows per DELETE on SQLite and in node_shipments: short transactions, the shipper goes on
HOUR = float(S_PER_HOUR)

S = cast(Table, Sample.__table__)
NS = cast(Table, NodeShipment.__table__)
ST = cast(Table, AggregatorState.__table__)


@dataclass
class Month:
    """An old month of samples (PostgreSQL) and what retention does with it."""

    name: str
    month: str
    rows: int | None  # pg_class.reltuples
    bytes: int
    action: str  # "drop" (dry run), "dropped", "keep"
    reason: str = ""
    seconds: float = 0.0  # DETACH + DROP, committed


@dataclass
class RetentionSummary:
    dialect: str
    samples_days: int
    cutoff: datetime | None  # samples older than this may go (None: kept for ever)
    dry_run: bool = False
    months: list[Month] = field(default_factory=list)  # PostgreSQL: the months old enough to go
    created: list[str] = field(default_factory=list)  # partitions made (or, dry run, to make)
    deleted: int = 0  # SQLite: samples deleted (or, dry run, to delete)
    deleted_before: datetime | None = None  # SQLite: ... those older than this
    shipments: int = 0  # node_shipments rows deleted (or to delete)
    kept: str = ""  # why samples older than the cut-off stay (nothing summarised yet, a pending batch)
    seconds: float = 0.0

    def line(self) -> str:
        verb = "would drop" if self.dry_run else "dropped"
        if self.cutoff is None:
            head = "samples kept for ever ([retention] samples_days = 0)"
        elif self.dialect == "postgresql":
            gone = [m for m in self.months if m.action in ("drop", "dropped")]
            size = sum(m.bytes for m in gone)
            what = ", ".join(m.month for m in gone) if gone else "no month"
            head = (
                f"samples older than {self.samples_days} days (before {self.cutoff:%Y-%m-%d %H:%M} UTC):"
                f" {verb} {what}" + (f" ({size_text(size)})" if gone else "")
            )
            kept: dict[str, list[str]] = {}
            for m in self.months:
                if m.action == "keep":
                    kept.setdefault(m.reason, []).append(m.month)
            for reason, months in kept.items():
                head += f"; kept {', '.join(months)}: {reason}"
        else:
            before = self.deleted_before
            deleted = "would delete" if self.dry_run else "deleted"
            head = f"samples older than {self.samples_days} days: {deleted} {self.deleted:,} rows" + (
                f" before {before:%Y-%m-%d %H:%M} UTC" if before is not None else ""
            )
            if self.kept:
                head += f"; kept older ones: {self.kept}"
        parts = [head]
        if self.dialect == "postgresql" and self.created:
            parts.append(f"{'would make' if self.dry_run else 'made'} partitions {', '.join(self.created)}")
        if self.shipments:
            parts.append(
                f"{'would delete' if self.dry_run else 'deleted'} {self.shipments:,} node_shipments rows"
            )
        return "; ".join(parts) + f" in {self.seconds:.1f} s"


# --- what the aggregator has summarised ------------------------------------------------------------


@dataclass(frozen=True)
class Summarised:
    """Up to when samples may go: before `before` (None: nothing may), and why not later."""

    before: datetime | None
    reason: str = ""  # empty where nothing holds samples back
    aggregated_at: datetime | None = None  # the aggregator's GPU-hours watermark, less its margin


def summarised(conn: Connection) -> Summarised:
    """Which samples the aggregator has summarised into job_gpu_hours, as it records it itself.

    Its 'gpu_hours' watermark is when it last derived them; the batches shipped since (less MARGIN, as
    the aggregator reads them) are pending: from the hour before the earliest sample of each on, the
    samples must stay. A batch that names a job without its first sample's time holds back everything.
    """
    wm = as_utc(conn.execute(select(ST.c.watermark).where(ST.c.name == GPU_HOURS)).scalar())
    if wm is None:
        return Summarised(None, "the aggregator has not summarised any samples yet (run `cocaq aggregate`)")
    since = wm - MARGIN
    horizon = samples_horizon(conn)
    earliest: float | None = None
    who = ""
    q = select(NS.c.node, NS.c.job_ids).where(NS.c.shipped_at >= since, NS.c.job_ids.is_not(None))
    for node, ids in conn.execute(q):
        for token in ids.split():
            jid, _, t = token.partition("@")
            if not t.isdigit():
                return Summarised(
                    None, f"a batch from {node} not aggregated yet names job {jid} without its time", since
                )
            need = (float(t) // HOUR - 1) * HOUR  # the aggregator re-reads the hour before
            if horizon is not None:
                need = max(need, horizon.timestamp())  # (it never reads before the horizon)
            if earliest is None or need < earliest:
                earliest, who = need, f"job {jid} on {node}"
    if earliest is None:
        return Summarised(datetime.max.replace(tzinfo=UTC), "", since)
    at = datetime.fromtimestamp(earliest, UTC)
    return Summarised(at, f"samples from {at:%Y-%m-%d %H:%M} UTC ({who}) not aggregated yet", since)


# --- the run ---------------------------------------------------------------------------------------


def run_retention(
    engine: Engine, cfg: Config, *, now: datetime | None = None, dry_run: bool = False
) -> RetentionSummary:
    """Drop (or, dry run, list) the samples older than `[retention] samples_days` that the aggregator has
    summarised, the shipping log's rows that went with them, and make the coming months' partitions."""
    t0 = time.monotonic()
    days = cfg.retention.samples_days
    dialect = engine.dialect.name
    with engine.connect() as conn:
        now = now or as_utc(conn.execute(select(utcnow())).scalar_one())
    cutoff = None if days == 0 else now - timedelta(days=days)
    res = RetentionSummary(dialect, days, cutoff, dry_run)
    if dialect == "postgresql":
        if dry_run:
            with engine.connect() as conn:
                res.created = partitions.missing_sample_partitions(conn, now, AHEAD)
        else:
            res.created = partitions.ensure_sample_partitions(engine, now, AHEAD)
    if cutoff is not None:
        with engine.connect() as conn:
            done = summarised(conn)
        if dialect == "postgresql":
            _drop_months(engine, res, cutoff, done)
        else:
            _delete_rows(engine, res, cutoff, done)
        _prune_shipments(engine, res, cutoff, done)
    res.seconds = time.monotonic() - t0
    log.info("retention: %s", res.line())
    return res


def _drop_months(engine: Engine, res: RetentionSummary, cutoff: datetime, done: Summarised) -> None:
    """PostgreSQL: the months wholly older than the cut-off go, oldest first, while they are summarised."""
    with engine.connect() as conn:
        old = [p for p in partitions.sample_partitions(conn) if p.hi is not None and p.hi <= cutoff]
    blocked = ""
    for p in old:
        m = Month(p.name, p.month, p.rows, p.bytes, "drop" if res.dry_run else "dropped")
        res.months.append(m)
        assert p.hi is not None
        if not blocked and (done.before is None or p.hi > done.before):
            blocked = done.reason
        if blocked:  # (a newer month never goes before an older one: the horizon is one instant)
            m.action, m.reason = "keep", blocked
            log.warning("retention: kept %s (%s): %s", p.name, p.month, blocked)
            continue
        if res.dry_run:
            continue
        t = time.monotonic()
        try:
            with engine.begin() as conn:
                partitions.drop_partition(conn, p.name)
                _move_horizon(conn, p.hi)
        except OperationalError as exc:  # lock_timeout: a long query holds `samples`
            blocked = f"busy: {str(exc.orig or exc).strip().splitlines()[0]}; tried again tomorrow"
            m.action, m.reason = "keep", blocked
            log.warning("retention: kept %s (%s): %s", p.name, p.month, blocked)
            continue
        m.seconds = time.monotonic() - t
        log.info("retention: dropped %s (%s, %s) in %.2f s", p.name, p.month, size_text(p.bytes), m.seconds)


def _delete_rows(engine: Engine, res: RetentionSummary, cutoff: datetime, done: Summarised) -> None:
    """SQLite: the rows before the cut-off (an hour's start) go, in batches, while they are summarised."""
    cut = _hour_floor(cutoff)
    if done.before is None:
        res.kept = done.reason
        log.warning("retention: kept every sample: %s", done.reason)
        return
    if done.before < cut:
        cut = _hour_floor(done.before)
        res.kept = done.reason
        log.warning("retention: kept the samples from %s UTC on: %s", f"{cut:%Y-%m-%d %H:%M}", done.reason)
    res.deleted_before = cut
    if res.dry_run:
        with engine.connect() as conn:
            res.deleted = int(
                conn.execute(select(func.count()).select_from(S).where(S.c.ts < cut)).scalar_one()
            )
        return
    rowid: Any = literal_column("rowid")
    while True:
        with engine.begin() as conn:
            batch = select(rowid).select_from(S).where(S.c.ts < cut).limit(BATCH)
            n = conn.execute(delete(S).where(rowid.in_(batch))).rowcount or 0
            if n == 0:
                _move_horizon(conn, cut)
                return
        res.deleted += n


def _prune_shipments(engine: Engine, res: RetentionSummary, cutoff: datetime, done: Summarised) -> None:
    """node_shipments shipped before the cut-off and before the aggregator's last run, in batches."""
    if done.aggregated_at is None:
        return
    before = min(cutoff, done.aggregated_at)
    old = NS.c.shipped_at < before
    if res.dry_run:
        with engine.connect() as conn:
            res.shipments = int(conn.execute(select(func.count()).select_from(NS).where(old)).scalar_one())
        return
    while True:
        with engine.begin() as conn:
            batch = select(NS.c.id).where(old).limit(BATCH)
            n = conn.execute(delete(NS).where(NS.c.id.in_(batch))).rowcount or 0
        if n == 0:
            return
        res.shipments += n


def _hour_floor(d: datetime) -> datetime:
    return datetime.fromtimestamp(d.timestamp() // HOUR * HOUR, UTC)


def _move_horizon(conn: Connection, to: datetime) -> None:
    """Record that the samples before `to` (an hour's start) are gone; it only ever moves later."""
    values: dict[str, Any] = {"watermark": to, "params": None}
    got = conn.execute(select(ST.c.watermark).where(ST.c.name == SAMPLES_FROM)).first()
    if got is None:
        conn.execute(insert(ST).values(name=SAMPLES_FROM, **values))
    elif got[0] is None or as_utc(got[0]) < to:
        conn.execute(update(ST).where(ST.c.name == SAMPLES_FROM).values(values))
