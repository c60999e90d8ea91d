"""One job's report (`job_footprint`): what the job e-mail at job end shows (`reports.jobmail`).

Read from the job's own rows (jobs, job_metrics, job_energy, node_energy, model_metadata), not from the
rollups: its energy by component and method, CO2 and the intensity it rests on, embodied CO2 apart, GPU use
and idling, whether its energy is final, and the notes of what to change next time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Row, Table, func, select

from cocaq.accounting.sessions import Sessions
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import Cluster, Job
from cocaq.errors import UsageError
from cocaq.footprint.one_job import energy_rows, energy_split, facts_and_notes, metrics_row, model_row
from cocaq.reports.data import EnergyPart, JobReport
from cocaq.reports.queries import CL, NE, J, opt_float
from cocaq.slurm.record import FINAL_STATES
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR, co2_grams

if TYPE_CHECKING:
    from cocaq.footprint.one_job import EnergyRow

# --- one job ----------------------------------------------------------------------------------------------


def job_footprint(conn: Connection, cfg: Config, job_pk: int) -> JobReport:
    """One job's energy by component and method, CO2 and its basis, embodied apart, GPU use and idling,
    and whether the energy is final.

    Final means it will not change any more: the job is not open, its state is a final Slurm state (the
    import or `cocaq reconcile` has seen it end), and every measured node record of it (node_energy) is
    the epilog's final one. `metrics_current` says whether the aggregator has derived its metrics (carbon
    over the run, utilisation, idle, embodied) since the job last changed.

    Its rows are read as `cocaq job` reads them (cocaq.footprint.one_job), so both show the same job.
    """
    j = _job_row(conn, job_pk)
    m = metrics_row(conn, job_pk)
    parts = _parts(energy_rows(conn, job_pk))
    reasons = _not_final(conn, j)
    facts, notes = facts_and_notes(conn, cfg, job_pk)
    mm = model_row(conn, job_pk)
    split = energy_split(j.energy_j, j.energy_measured_j, j.energy_est_low_j, j.energy_est_high_j)
    idle_j = float(m["idle_gpu_energy_j"] or 0.0) if m is not None else 0.0
    est_j = float(j.energy_j or 0.0) - float(j.energy_measured_j or 0.0)
    return JobReport(
        pk=int(j.id),
        job_id=j.job_id,
        cluster=j.cluster,
        user=j.user_name,
        account=j.account,
        partition=j.partition,
        name=j.name,
        state=j.state,
        state_detail=j.state_detail,
        is_open=bool(j.is_open),
        submit=as_utc(j.submit_time),
        start=as_utc(j.start_time),
        end=as_utc(j.end_time),
        elapsed_h=max(float(j.elapsed_s or 0.0), 0.0) / S_PER_HOUR,
        time_limit_h=float(j.time_limit_s) / S_PER_HOUR if j.time_limit_s else None,
        cpus=int(j.alloc_cpus or 0),
        gpus=int(j.alloc_gpus or 0),
        gpu_type=j.gpu_type,
        node_list=j.node_list,
        energy_kwh=float(j.energy_j or 0.0) / J_PER_KWH,
        measured_kwh=split["energy_measured_kwh"],
        estimated_kwh=split["energy_estimated_kwh"],
        estimated_low_kwh=split["energy_estimated_low_kwh"],
        estimated_high_kwh=split["energy_estimated_high_kwh"],
        by_component=_sum_by(parts, "component"),
        by_method=_sum_by(parts, "method"),
        parts=parts,
        pue=float(j.pue or 1.0),
        carbon_zone=j.carbon_zone,
        carbon_g_per_kwh=opt_float(j.carbon_g_per_kwh),
        carbon_source=j.carbon_source,
        carbon_year=j.carbon_year,
        carbon_flag=j.carbon_flag,
        carbon_detail=m["carbon_detail"] if m is not None else None,
        co2_kg=float(j.co2_g or 0.0) / G_PER_KG,
        co2_embodied_kg=float(m["co2_embodied_g"] or 0.0) / G_PER_KG if m is not None else None,
        gpu_util_pct=opt_float(m["gpu_util_pct"]) if m is not None else None,
        sampled_gpu_hours=float(m["gpu_samples_s"] or 0.0) / S_PER_HOUR if m is not None else 0.0,
        idle_gpu_hours=float(m["idle_gpu_s"] or 0.0) / S_PER_HOUR if m is not None else 0.0,
        idle_kwh=idle_j / J_PER_KWH,
        idle_co2_kg=co2_grams(idle_j, float(j.pue or 1.0), float(j.carbon_g_per_kwh or 0.0)) / G_PER_KG,
        cpu_usage=facts.cpu_usage if facts is not None else None,  # None while it runs, or not recorded
        hw_profile=j.hw_profile,
        final=not reasons,
        final_reasons=tuple(reasons),
        metrics_current=bool(m is not None and as_utc(m["computed_at"]) >= as_utc(j.updated_at)),
        models=(mm["model_name"],) if mm is not None and mm["model_name"] is not None else (),
        facts=facts,
        interactive=Sessions.of(cfg.advice).job(facts if facts is not None else j),
        notes=tuple(notes),
        gpu_estimate=_gpu_estimate(j, est_j),
    )


def _job_row(conn: Connection, job_pk: int) -> Row[Any]:
    """The job's row with its cluster's name; an unknown id is a usage error."""
    j = conn.execute(
        select(Job.__table__, CL.name.label("cluster"))
        .join_from(cast(Table, Job.__table__), cast(Table, Cluster.__table__), CL.id == J.cluster_id)
        .where(J.id == job_pk)
    ).one_or_none()
    if j is None:
        raise UsageError(f"no job with id {job_pk}")
    return j


def _parts(rows: Iterable[EnergyRow]) -> tuple[EnergyPart, ...]:
    """The job's energy rows as the e-mail lists them: by component, node and source.

    The shared read (one_job.energy_rows) orders by component and node only; the e-mail names the sources
    in the order they first appear and sums each component in this order, so within one node's component
    the rows are put in order of source here."""
    ordered = (
        r for _, same in groupby(rows, key=lambda r: (r.component, r.node)) for r in sorted(same, key=_source)
    )
    return tuple(
        EnergyPart(r.node, r.component, r.method, r.source, float(r.energy_j) / J_PER_KWH) for r in ordered
    )


def _source(r: EnergyRow) -> str:
    return r.source


def _sum_by(parts: Sequence[EnergyPart], attr: str) -> dict[str, float]:
    """kWh per component or method, added in the parts' order."""
    out: dict[str, float] = defaultdict(float)
    for p in parts:
        out[getattr(p, attr)] += p.energy_kwh
    return dict(out)


def _not_final(conn: Connection, j: Row[Any]) -> list[str]:
    """Why the job's energy may still change (none: it is final); see `job_footprint`."""
    reasons = []
    state = (j.state or "").split(" ")[0]
    if j.is_open:
        reasons.append(f"the job is still {state or 'open'}")
    elif state not in FINAL_STATES:
        reasons.append(f"state {state or '?'} is not a final Slurm state")
    if j.job_id_raw is not None and j.start_time is not None:
        start = as_utc(j.start_time)
        end = as_utc(j.end_time) or datetime.now(UTC)
        open_nodes = conn.execute(
            select(func.count()).where(
                NE.cluster_id == j.cluster_id,
                NE.job_id == str(j.job_id_raw),
                NE.final.is_(False),
                NE.job_start >= start - timedelta(minutes=10),
                NE.job_start <= end + timedelta(minutes=10),
            )
        ).scalar()
        if open_nodes:
            reasons.append(f"{open_nodes} measured node record(s) not final yet (no epilog record)")
    return reasons


def _gpu_estimate(j: Any, est_j: float) -> str | None:
    """The sentence on what the estimate of its GPUs rests on, where part of its energy is estimated."""
    import json

    from cocaq.footprint.words import gpu_estimate_words

    if est_j <= 0 or not j.alloc_gpus:
        return None
    a = j.assumptions
    if isinstance(a, str):
        try:
            a = json.loads(a)
        except ValueError:
            return None
    return gpu_estimate_words(a if isinstance(a, dict) else None)
