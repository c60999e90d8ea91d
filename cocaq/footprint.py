"""Per-user, per-lab and per-job footprints over a time window, computed in SQL.

A job counts in the window it ran in: a job that ran across the window's edge contributes the share of
its CPU/GPU-hours, energy and CO2 that falls inside (pro rata of run time), so months add up exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Connection,
    Float,
    Integer,
    String,
    and_,
    case,
    column,
    func,
    literal,
    or_,
    select,
    table,
)

from cocaq.dbtypes import UTCDateTime
from cocaq.sqlfuncs import epoch, greatest, least

# The columns these queries read, as light Core constructs: `cocaq user` runs on every login node, and
# importing the ORM and the mapped classes would cost it ~0.1 s.  tests/test_footprint_tables.py checks
# that they match cocaq.models.
JOBS = table(
    "jobs",
    column("id", Integer),
    column("cluster_id", Integer),
    column("job_id", String),
    column("name", String),
    column("user_name", String),
    column("account", String),
    column("partition", String),
    column("state", String),
    column("is_open", Boolean),
    column("submit_time", UTCDateTime()),
    column("start_time", UTCDateTime()),
    column("end_time", UTCDateTime()),
    column("elapsed_s", Float),
    column("alloc_cpus", Integer),
    column("alloc_gpus", Integer),
    column("energy_j", Float),
    column("energy_measured_j", Float),
    column("pue", Float),
    column("co2_g", Float),
)
CLUSTERS = table("clusters", column("id", Integer), column("name", String))
J = JOBS.c
C = CLUSTERS.c

# Everyday equivalents (US EPA Greenhouse Gas Equivalencies Calculator).
CAR_KG_PER_KM = 0.400 / 1.609344  # "about 400 grams of CO2 per mile" for a typical passenger vehicle
PHONE_CHARGE_KG = 8.22e-3  # kg CO2 per smartphone charge


@dataclass
class Window:
    since: datetime
    until: datetime

    @property
    def since_s(self) -> float:
        return self.since.timestamp()

    @property
    def until_s(self) -> float:
        return self.until.timestamp()


def _overlap(w: Window) -> tuple[ColumnElement[float], ColumnElement[float]]:
    run_start = epoch(J.start_time)
    run_end = run_start + J.elapsed_s
    overlap = greatest(
        literal(0.0), least(run_end, literal(w.until_s)) - greatest(run_start, literal(w.since_s))
    )
    frac = case((J.elapsed_s > 0, overlap / J.elapsed_s), else_=literal(1.0))
    return overlap, frac


def window_clause(w: Window) -> ColumnElement[bool]:
    return and_(
        J.start_time < w.until,
        or_(J.end_time >= w.since, J.end_time.is_(None)),
    )


def _totals_columns(w: Window) -> list[Any]:
    overlap, frac = _overlap(w)
    counted = case((or_(overlap > 0, J.elapsed_s == 0), 1), else_=0)
    return [
        func.coalesce(func.sum(counted), 0).label("jobs"),
        func.coalesce(func.sum(J.alloc_cpus * overlap), 0.0).label("cpu_s"),
        func.coalesce(func.sum(J.alloc_gpus * overlap), 0.0).label("gpu_s"),
        func.coalesce(func.sum(J.energy_j * frac), 0.0).label("energy_j"),
        func.coalesce(func.sum(J.energy_j * J.pue * frac), 0.0).label("facility_j"),
        func.coalesce(func.sum(J.energy_measured_j * frac), 0.0).label("measured_j"),
        func.coalesce(func.sum(J.co2_g * frac), 0.0).label("co2_g"),
        func.coalesce(
            func.sum(
                case(
                    (J.state.in_(("FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT")), J.energy_j * frac),
                    else_=0.0,
                )
            ),
            0.0,
        ).label("failed_j"),
    ]


@dataclass
class Totals:
    jobs: int
    cpu_hours: float
    gpu_hours: float
    energy_kwh: float
    energy_kwh_with_pue: float
    measured_energy_fraction: float | None
    co2_kg: float
    failed_energy_kwh: float

    @classmethod
    def from_row(cls, r: Any) -> Totals:
        e = float(r.energy_j)
        return cls(
            jobs=int(r.jobs),
            cpu_hours=float(r.cpu_s) / 3600,
            gpu_hours=float(r.gpu_s) / 3600,
            energy_kwh=e / 3.6e6,
            energy_kwh_with_pue=float(r.facility_j) / 3.6e6,
            measured_energy_fraction=(float(r.measured_j) / e) if e > 0 else None,
            co2_kg=float(r.co2_g) / 1000,
            failed_energy_kwh=float(r.failed_j) / 3.6e6,
        )


def equivalents(co2_kg: float) -> dict[str, float]:
    return {
        "car_km": co2_kg / CAR_KG_PER_KM,
        "smartphone_charges": co2_kg / PHONE_CHARGE_KG,
    }


@dataclass
class TopJob:
    job_id: str
    cluster: str
    name: str | None
    partition: str | None
    state: str
    start: datetime | None
    elapsed_h: float
    gpus: int
    energy_kwh: float
    co2_kg: float
    measured: bool


@dataclass
class Footprint:
    scope: str  # user, account
    key: str
    since: datetime
    until: datetime
    totals: Totals
    top_jobs: list[TopJob] = field(default_factory=list)
    members: list[dict[str, Any]] = field(default_factory=list)  # per user, for a lab

    def as_dict(self) -> dict[str, Any]:
        t = asdict(self.totals)
        d: dict[str, Any] = {
            self.scope: self.key,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            **t,
            "equivalents": equivalents(self.totals.co2_kg),
            "top_jobs": [
                {**asdict(j), "start": j.start.isoformat() if j.start else None} for j in self.top_jobs
            ],
        }
        if self.scope == "account":
            d["lab"] = self.key
            d["users"] = self.members
        return d


def _cluster_filter(cluster: str | None) -> list[ColumnElement[bool]]:
    if not cluster:
        return []
    return [J.cluster_id == select(C.id).where(C.name == cluster).scalar_subquery()]


def _top_jobs(conn: Connection, where: list[Any], w: Window, n: int) -> list[TopJob]:
    _, frac = _overlap(w)
    e = (J.energy_j * frac).label("e")
    q = (
        select(
            J.job_id,
            C.name,
            J.name,
            J.partition,
            J.state,
            J.start_time,
            J.elapsed_s,
            J.alloc_gpus,
            e,
            (J.co2_g * frac).label("c"),
            J.energy_measured_j,
            J.energy_j,
        )
        .join(CLUSTERS, C.id == J.cluster_id)
        .where(*where)
        .order_by(e.desc())
        .limit(n)
    )
    return [
        TopJob(
            job_id=r[0],
            cluster=r[1],
            name=r[2],
            partition=r[3],
            state=r[4],
            start=r[5],
            elapsed_h=float(r[6]) / 3600,
            gpus=int(r[7]),
            energy_kwh=float(r[8]) / 3.6e6,
            co2_kg=float(r[9]) / 1000,
            measured=bool(r[11]) and float(r[10]) >= float(r[11]) * 0.999,
        )
        for r in conn.execute(q)
    ]


def user_footprint(
    conn: Connection, user: str, w: Window, *, cluster: str | None = None, top: int = 5
) -> Footprint:
    where = [J.user_name == user, window_clause(w), *_cluster_filter(cluster)]
    row = conn.execute(select(*_totals_columns(w)).where(*where)).one()
    return Footprint("user", user, w.since, w.until, Totals.from_row(row), _top_jobs(conn, where, w, top))


def lab_footprint(
    conn: Connection, account: str, w: Window, *, cluster: str | None = None, top: int = 5
) -> Footprint:
    where = [J.account == account, window_clause(w), *_cluster_filter(cluster)]
    row = conn.execute(select(*_totals_columns(w)).where(*where)).one()
    members = []
    q = select(J.user_name, *_totals_columns(w)).where(*where).group_by(J.user_name)
    for r in conn.execute(q):
        t = Totals.from_row(r)
        members.append({"user": r.user_name, **asdict(t)})
    members.sort(key=lambda m: m["energy_kwh"], reverse=True)
    return Footprint(
        "account", account, w.since, w.until, Totals.from_row(row), _top_jobs(conn, where, w, top), members
    )


def find_jobs(conn: Connection, job_id: str, cluster: str | None = None) -> list[dict[str, Any]]:
    """Every stored job with this id (ids repeat across clusters and after a reset), newest first."""
    from sqlalchemy.orm import Session

    from cocaq.models import Cluster, Job, JobEnergy

    q = (
        select(Job, Cluster.name)
        .join(Cluster, Cluster.id == Job.cluster_id)
        .where(Job.job_id == job_id, *_cluster_filter(cluster))
        .order_by(Job.submit_time.desc())
    )
    out = []
    for job, cname in Session(bind=conn).execute(q).tuples().all():
        energies = conn.execute(
            select(
                JobEnergy.node, JobEnergy.component, JobEnergy.method, JobEnergy.source, JobEnergy.energy_j
            )
            .where(JobEnergy.job_pk == job.id)
            .order_by(JobEnergy.component, JobEnergy.node)
        ).all()
        d = {c.name: getattr(job, c.name) for c in Job.__table__.columns if c.name not in ("record_hash",)}
        d["cluster"] = cname
        d["energy_kwh"] = job.energy_j / 3.6e6
        d["co2_kg"] = job.co2_g / 1000
        d["energies"] = [
            {
                "node": e[0],
                "component": e[1],
                "method": e[2],
                "source": e[3],
                "energy_j": e[4],
                "energy_kwh": e[4] / 3.6e6,
            }
            for e in energies
        ]
        d["gpus"] = _measured_gpus(conn, job.id)
        d["metrics"] = _job_metrics(conn, job.id)
        out.append(d)
    return out


def _job_metrics(conn: Connection, job_pk: int) -> dict[str, Any] | None:
    """What the aggregator derived for the job (None until it has run)."""
    from cocaq.models import JobMetrics

    m = conn.execute(select(JobMetrics).where(JobMetrics.job_pk == job_pk)).mappings().first()
    if m is None:
        return None
    return {
        "co2_embodied_kg": (m["co2_embodied_g"] or 0.0) / 1000,
        "gpu_util_pct": m["gpu_util_pct"],
        "idle_gpu_hours": (m["idle_gpu_s"] or 0.0) / 3600,
        "idle_gpu_energy_kwh": (m["idle_gpu_energy_j"] or 0.0) / 3.6e6,
        "carbon_detail": m["carbon_detail"],
    }


def _measured_gpus(conn: Connection, job_pk: int) -> list[dict[str, Any]]:
    """The GPUs the node hooks saw the job get (Slurm index, UUID) and each one's measured energy."""
    from cocaq.models import NodeEnergy, NodeEvent

    starts = conn.execute(
        select(NodeEvent.cluster_id, NodeEvent.node, NodeEvent.job_id, NodeEvent.ts, NodeEvent.payload).where(
            NodeEvent.job_pk == job_pk, NodeEvent.event == "start"
        )
    ).all()
    out = []
    for cid, node, jid, ts, payload in starts:
        energy: dict[str, tuple[float, str]] = {}
        rows = conn.execute(
            select(NodeEnergy.device, NodeEnergy.energy_j, NodeEnergy.source, NodeEnergy.job_start).where(
                NodeEnergy.cluster_id == cid,
                NodeEnergy.node == node,
                NodeEnergy.job_id == jid,
                NodeEnergy.component == "gpu",
            )
        ).all()
        for dev, e, src, start in rows:
            if abs((start - ts).total_seconds()) < 1.0 and (dev not in energy or src == "nvml"):
                energy[dev] = (e, src)
        gpus = payload.get("gpus") if isinstance(payload, dict) else None
        for g in gpus if isinstance(gpus, list) else []:
            if not isinstance(g, dict):
                continue
            e_src = energy.get(str(g.get("uuid")))
            out.append(
                {
                    "node": node,
                    "slurm_index": g.get("slurm_index"),
                    "uuid": g.get("uuid"),
                    "pci_bus_id": g.get("pci_bus_id"),
                    "name": g.get("name"),
                    "energy_kwh": None if e_src is None else e_src[0] / 3.6e6,
                    "source": None if e_src is None else e_src[1],
                }
            )
    return out


def now_utc() -> datetime:
    return datetime.now(UTC)


def group_totals(conn: Connection, w: Window, by: str, *, cluster: str | None = None) -> list[dict[str, Any]]:
    """Totals per user, account (lab) or partition, largest energy first."""
    col = {"user": J.user_name, "account": J.account, "partition": J.partition}[by]
    q = select(col.label("key"), *_totals_columns(w)).where(window_clause(w), *_cluster_filter(cluster))
    rows = [{by: r.key, **asdict(Totals.from_row(r))} for r in conn.execute(q.group_by(col))]
    rows = [r for r in rows if r["jobs"]]
    rows.sort(key=lambda r: r["energy_kwh"], reverse=True)
    return rows


def cluster_totals(conn: Connection, w: Window, *, cluster: str | None = None) -> Totals:
    row = conn.execute(select(*_totals_columns(w)).where(window_clause(w), *_cluster_filter(cluster))).one()
    return Totals.from_row(row)
