"""One job as `cocaq job`, the read API's /v1/jobs and the job e-mail show it.

Every stored job with an id (ids repeat across clusters and after a reset): its columns, energy by
component with the measured and estimated parts, the GPUs the node hooks saw it get, what the aggregator
derived, its ML model metadata and, with a config, its ledger (the energy that did no work), memory use
and jobstats-style notes (`job_notes`, the per-job advice of cocaq.footprint.job_advice). Unlike the window
footprints of cocaq.footprint.totals, one job is a few small reads, so the ORM is fine here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cocaq.ml.meta import KNOWN
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy import Connection, Row, RowMapping

    from cocaq.config import Config
    from cocaq.db.dbapi import Db
    from cocaq.footprint.jobfacts import JobFacts

    # a job_energy row as `energy_rows` reads it: node, component, method, source, energy_j
    EnergyRow = Row[str, str, str, str, float]


def find_jobs(
    conn: Connection, job_id: str, cluster: str | None = None, cfg: Config | None = None
) -> list[dict[str, Any]]:
    """Every stored job with this id (ids repeat across clusters and after a reset), newest first; with
    `cfg`, each with its ledger (`waste`), memory use and jobstats-style `notes`
    (cocaq.footprint.job_advice)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from cocaq.db.schema import Cluster, Job

    q = (
        select(Job, Cluster.name)
        .join(Cluster, Cluster.id == Job.cluster_id)
        .where(Job.job_id == job_id)
        .order_by(Job.submit_time.desc())
    )
    if cluster:
        q = q.where(Cluster.name == cluster)
    out = []
    for job, cname in Session(bind=conn).execute(q).all():
        energies = energy_rows(conn, job.id)
        d = {c.name: getattr(job, c.name) for c in Job.__table__.columns if c.name not in ("record_hash",)}
        d["cluster"] = cname
        if not job.alloc_gpus and isinstance(d.get("assumptions"), dict):
            # the profile's GPU power is no part of a job without GPUs: not said as if it were
            d["assumptions"] = {k: v for k, v in d["assumptions"].items() if not k.startswith("gpu_")}
        d["energy_kwh"] = job.energy_j / J_PER_KWH  # drawn by the hardware (IT energy)
        # with the data centre's cooling and power losses: x the job's PUE, as its CO2 counts it
        d["energy_kwh_with_pue"] = job.energy_j * (1.0 if job.pue is None else job.pue) / J_PER_KWH
        d.update(
            energy_split(job.energy_j, job.energy_measured_j, job.energy_est_low_j, job.energy_est_high_j)
        )
        d["co2_kg"] = job.co2_g / G_PER_KG
        d["energies"] = [
            {
                "node": e[0],
                "component": e[1],
                "method": e[2],
                "source": e[3],
                "energy_j": e[4],
                "energy_kwh": e[4] / J_PER_KWH,
            }
            for e in energies
        ]
        d["gpus"] = _measured_gpus(conn, job.id)
        d["metrics"] = _job_metrics(conn, job.id)
        d["model"] = _model_metadata(conn, job.id)
        if cfg is not None:
            d.update(_ledger_and_notes(conn, cfg, job.id))
            if job.is_open and job.start_time is not None and job.job_id_raw is not None:
                d["live"] = _live(conn, cfg, str(job.job_id_raw), cname, job.start_time)
        if job.is_open and job.start_time is not None:
            # a running job's run time is now minus its start, the live view's to the second: the
            # import's elapsed_s is sacct's at the last import, minutes old
            v = d.get("live")
            start = job.start_time if job.start_time.tzinfo else job.start_time.replace(tzinfo=UTC)
            d["elapsed_s"] = v["elapsed_s"] if v else max((datetime.now(UTC) - start).total_seconds(), 0.0)
        out.append(d)
    return out


# --- the reads `cocaq job`, the API and the job e-mail (reports.job_report) share --------------------------


def energy_rows(conn: Connection, job_pk: int) -> Sequence[EnergyRow]:
    """The job's energy rows (node, component, method, source, energy_j) by component, then node: the one
    read of them, so that `cocaq job`, the API and the job e-mail show the same parts."""
    from sqlalchemy import select

    from cocaq.db.schema import JobEnergy

    e = JobEnergy
    return conn.execute(
        select(e.node, e.component, e.method, e.source, e.energy_j)
        .where(e.job_pk == job_pk)
        .order_by(e.component, e.node)
    ).all()


def metrics_row(conn: Connection, job_pk: int) -> RowMapping | None:
    """The job's job_metrics row as stored (None until the aggregator has derived it)."""
    from sqlalchemy import select

    from cocaq.db.schema import JobMetrics

    t = JobMetrics.__table__
    return conn.execute(select(t).where(t.c.job_pk == job_pk)).mappings().first()


def model_row(conn: Connection, job_pk: int) -> RowMapping | None:
    """The job's model_metadata row as stored (one per job; None: no metadata)."""
    from sqlalchemy import select

    from cocaq.db.schema import ModelMetadata

    t = ModelMetadata.__table__
    return conn.execute(select(t).where(t.c.job_pk == job_pk)).mappings().first()


def facts_and_notes(conn: Connection, cfg: Config, job_pk: int) -> tuple[JobFacts | None, list[Any]]:
    """The job's facts (cocaq.footprint.jobfacts: None where it has none) and its notes (`job_notes`)."""
    from cocaq.db.dbapi import wrap
    from cocaq.footprint import jobfacts

    db = wrap(conn)
    facts = jobfacts.one(db, cfg, job_pk)
    return facts, job_notes(db, cfg, facts) if facts is not None else []


# --- what `cocaq job` and the API add ----------------------------------------------------------------------


def _live(conn: Connection, cfg: Config, raw: str, cluster: str, start: datetime) -> dict[str, Any] | None:
    """A running job's energy so far, power now and projection (cocaq.footprint.live)."""
    from cocaq.db.dbapi import wrap
    from cocaq.footprint.live import Ask, live

    for v in live(wrap(conn), cfg, Ask((raw,), cluster=cluster)):
        if v["in_accounting"] and abs((v["start_ts"] or 0.0) - start.timestamp()) < 1.0:
            return v
    return None


def energy_split(
    energy_j: float | None, measured_j: float | None, low_j: float | None, high_j: float | None
) -> dict[str, float]:
    """A job's measured and estimated kWh, the estimated part with its range (the estimate itself where it
    has none): what `cocaq job` and the job e-mail show."""
    est = float(energy_j or 0.0) - float(measured_j or 0.0)
    return {
        "energy_measured_kwh": float(measured_j or 0.0) / J_PER_KWH,
        "energy_estimated_kwh": est / J_PER_KWH,
        "energy_estimated_low_kwh": (est if low_j is None else low_j) / J_PER_KWH,
        "energy_estimated_high_kwh": (est if high_j is None else high_j) / J_PER_KWH,
    }


# the user's runs the precision and time-limit notes compare a job with: ended this long before
NOTE_RUNS = timedelta(days=90)


def job_notes(db: Db, cfg: Config, j: Any) -> list[Any]:
    """cocaq.footprint.job_advice.job_notes for one job (a cocaq.footprint.jobfacts.JobFacts), its precision
    and time limit compared with the user's own runs that ended in the NOTE_RUNS before it: what `cocaq
    job` and the job e-mail say."""
    from cocaq.footprint import advice, job_advice, jobfacts

    end = j.end or datetime.now(UTC)
    runs: list[Any] = []
    since, until = end - NOTE_RUNS, end + timedelta(seconds=1)
    if j.precision == "full":
        runs = jobfacts.load(db, cfg, since, until, user=j.user)
    elif j.outcome == "timeout" or (j.state.startswith("COMPLETED") and j.time_limit_h):
        # its time limit is sized on the user's runs of the same kind (cocaq.footprint.own_limits)
        runs = jobfacts.load(db, cfg, since, until, user=j.user, name=j.name or "")
    ctx = advice.site_context(cfg, end - NOTE_RUNS, end + timedelta(seconds=1))
    return job_advice.job_notes(j, ctx, [r for r in runs if not r.is_open and r.end is not None])


def _ledger_and_notes(conn: Connection, cfg: Config, pk: int) -> dict[str, Any]:
    """A job's disjoint parts that did no work (cocaq.accounting.ledger), its memory and its notes
    (cocaq.footprint.job_advice)."""
    from cocaq.accounting.ledger import waste
    from cocaq.accounting.sessions import Sessions

    j, notes = facts_and_notes(conn, cfg, pk)
    if j is None:
        return {"waste": None, "memory": None, "notes": []}
    interactive = Sessions.of(cfg.advice).job(j)
    w = waste(j.state, j.energy_kwh, j.idle_kwh, interactive)
    return {
        "waste": {
            "idle_gpu_kwh": w.idle,
            "failed_kwh": w.failed,
            "oom_kwh": w.oom,
            "timeout_kwh": w.timeout,  # possibly lost (hit its time limit): never in wasted_kwh
            "cancelled_kwh": w.cancelled,
            "wasted_kwh": w.total,  # did no work, certainly: idle GPUs, failed, out of memory, cancelled
            "interactive": interactive,  # a session: its time limit is how it ends (no energy lost)
        },
        "memory": {
            "requested_mb": j.req_mem_mb,
            "requested_per_node_mb": j.mem_req_per_node_mb,
            "max_rss_mb": j.max_rss_mb,
            "used_per_node_mb": j.mem_used_per_node_mb,
            "gpu_peak_mb": j.gpu_mem_peak_mb,
            "gpu_total_mb": j.gpu_mem_gb * 1024 if j.gpu_mem_gb else None,
        },
        "cpu_usage": j.cpu_usage,
        "notes": [a.as_dict() for a in notes],
    }


# model_metadata column -> the key its `sources` (and `cocaq job`'s output) calls it
MODEL_COLUMNS = {spec[0]: key for key, spec in KNOWN.items()}


def _model_metadata(conn: Connection, job_pk: int) -> dict[str, Any] | None:
    """What the job trained or served (None: no metadata), keyed as its `sources` name each value, so
    that `sources[key]` says where each came from (comment, api, detected)."""
    m = model_row(conn, job_pk)
    if m is None:
        return None
    out: dict[str, Any] = {key: m[col] for col, key in MODEL_COLUMNS.items()}
    out["extra"] = m["extra"] if isinstance(m["extra"], dict) else {}
    out["sources"] = m["sources"] if isinstance(m["sources"], dict) else {}
    out["recorded_at"] = m["recorded_at"]
    out["updated_at"] = m["updated_at"]
    return out


def _job_metrics(conn: Connection, job_pk: int) -> dict[str, Any] | None:
    """What the aggregator derived for the job (None until it has run)."""
    m = metrics_row(conn, job_pk)
    if m is None:
        return None
    return {
        "co2_embodied_kg": (m["co2_embodied_g"] or 0.0) / G_PER_KG,
        "gpu_util_pct": m["gpu_util_pct"],
        "gpu_util_source": m["gpu_util_source"],  # "samples" (the collector), "slurm" (gres/gpuutil)
        "idle_gpu_hours": (m["idle_gpu_s"] or 0.0) / S_PER_HOUR,
        "idle_gpu_energy_kwh": (m["idle_gpu_energy_j"] or 0.0) / J_PER_KWH,
        "carbon_detail": m["carbon_detail"],
        # when to run (cocaq.accounting.shifting): "ok" with figures, else why none
        "when_to_run": {
            "state": m["shift_state"],
            "slack_h": None if m["shift_slack_s"] is None else m["shift_slack_s"] / S_PER_HOUR,
            "g_per_kwh_as_run": m["shift_now_g"],
            "best_start": m["shift_best_start"].isoformat() if m["shift_best_start"] is not None else None,
            "g_per_kwh_best_start": m["shift_best_g"],
            "g_per_kwh_pausing": m["shift_pause_g"],
            "saved_kg": (m["shift_saved_g"] or 0.0) / G_PER_KG,
            "pause_saved_kg": (m["shift_pause_saved_g"] or 0.0) / G_PER_KG,
        },
    }


def _measured_gpus(conn: Connection, job_pk: int) -> list[dict[str, Any]]:
    """The GPUs the node hooks saw the job get (Slurm index, UUID) and each one's measured energy."""
    from sqlalchemy import select

    from cocaq.db.schema import NodeEnergy, NodeEvent

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
                    "energy_kwh": None if e_src is None else e_src[0] / J_PER_KWH,
                    "source": None if e_src is None else e_src[1],
                }
            )
    return out
