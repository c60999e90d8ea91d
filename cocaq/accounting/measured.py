"""Joining what the nodes measured to the jobs Slurm accounted.

Node records carry Slurm's raw job id and the time the job started on the node; `jobs` rows come from
sacct. A node record belongs to the job with that raw id whose run (submit to end, with a margin) holds
the record's time, so a job id Slurm reuses after a wrap-around cannot collect another job's energy.

A job's energy is then: measured per component where a node measured it (GPU from NVML per device;
CPU and DRAM from RAPL shares), and the TDP estimate only for what nothing measured (GPUs without a
record, in proportion). Rerunning gives the same rows: estimates are rebuilt from the configuration
each time, never scaled in place.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, bindparam, delete, insert, literal, select, tuple_, update
from sqlalchemy.exc import SQLAlchemyError

from cocaq.accounting.estimate import SOURCE_CALIBRATED, SOURCE_TDP, tdp_components
from cocaq.collector.records import GPU_SOURCE_RANK
from cocaq.config import Config
from cocaq.db.coltypes import as_utc
from cocaq.db.schema import Job, JobEnergy, NodeEnergy, NodeEvent
from cocaq.hostlist import expand_hostlist
from cocaq.units import co2_grams

log = logging.getLogger(__name__)

MARGIN = timedelta(minutes=10)
# When one device has several measured sources, the better one wins (exact counter over integrated power).
SOURCE_RANK = GPU_SOURCE_RANK
# The epilog's trapezoid of the two edge readings: only for a GPU that nothing else measured.
EDGES_ONLY = "nvml-power-edges"


@dataclass
class LinkSummary:
    events_linked: int = 0
    events_unmatched: int = 0
    jobs_measured: int = 0
    models: int = 0  # jobs whose model metadata was written
    unmatched_examples: list[str] = field(default_factory=list)


def _pick(cands: Sequence[Any], ts: datetime, now: datetime) -> int | None:
    """The job whose run holds `ts` (closest start first)."""
    best: tuple[float, int] | None = None
    for pk, submit, start, end in cands:
        lo = (as_utc(submit) or as_utc(start) or ts) - MARGIN
        hi = (as_utc(end) or now) + MARGIN
        if lo <= ts <= hi:
            d = abs(((as_utc(start) or as_utc(submit) or ts) - ts).total_seconds())
            if best is None or d < best[0]:
                best = (d, pk)
    return None if best is None else best[1]


def _candidates(conn: Connection, cluster_id: int, raw_ids: Iterable[str]) -> dict[str, list[Any]]:
    j = cast(Table, Job.__table__).c
    ids = sorted({int(x) for x in raw_ids if x.isdigit()})
    out: dict[str, list[Any]] = defaultdict(list)
    for i in range(0, len(ids), 500):
        q = select(j.job_id_raw, j.job_id, j.id, j.submit_time, j.start_time, j.end_time).where(
            j.cluster_id == cluster_id, j.job_id_raw.in_(ids[i : i + 500])
        )
        for raw, _jid, pk, sub, start, end in conn.execute(q):
            out[str(raw)].append((pk, sub, start, end))
    return out


def link_events(
    conn: Connection, now: datetime | None = None, limit: int = 20_000, max_events: int = 1_000_000
) -> LinkSummary:
    """Give unlinked hook events their job; events of jobs sacct has not shown yet stay unlinked.

    Every unlinked event is looked at, newest first, `limit` at a time (keyset pages, up to `max_events` a
    run): events that never match (a job sacct never showed, a hidden array) cannot hold back the others,
    as the oldest 20,000 once did for everyone.
    """
    now = now or datetime.now(UTC)
    ev = cast(Table, NodeEvent.__table__).c
    t = cast(Table, NodeEvent.__table__)
    res = LinkSummary()
    after: tuple[Any, str] | None = None
    seen = 0
    while seen < max_events:
        q = select(ev.uid, ev.cluster_id, ev.job_id, ev.ts).where(ev.job_pk.is_(None))
        if after is not None:
            q = q.where(tuple_(ev.ts, ev.uid) < tuple_(literal(after[0], ev.ts.type), literal(after[1])))
        page = min(limit, max_events - seen)
        rows = conn.execute(q.order_by(ev.ts.desc(), ev.uid.desc()).limit(page)).all()
        if not rows:
            break
        seen += len(rows)
        after = (rows[-1].ts, rows[-1].uid)
        by_cluster: dict[int, list[Any]] = defaultdict(list)
        for r in rows:
            by_cluster[r.cluster_id].append(r)
        updates = []
        for cid, evs in by_cluster.items():
            cands = _candidates(conn, cid, (e.job_id for e in evs))
            for e in evs:
                pk = _pick(cands.get(e.job_id, []), as_utc(e.ts) or now, now)
                if pk is None:
                    res.events_unmatched += 1
                    if len(res.unmatched_examples) < 5:
                        res.unmatched_examples.append(e.uid)
                else:
                    updates.append({"_uid": e.uid, "job_pk": pk})
        if updates:
            conn.execute(
                update(t).where(t.c.uid == bindparam("_uid")).values(job_pk=bindparam("job_pk")), updates
            )
        res.events_linked += len(updates)
        if len(rows) < page:
            break
    return res


def _device_key(r: Any) -> tuple[str, str, str]:
    """A measured device: a GPU by its UUID alone (unique on any node: the same GPU stored under Slurm's
    node name and the host's, by an older collector, is one GPU), anything else by node and name."""
    dev = r.device or ""
    if r.component == "gpu" and dev.startswith(("GPU-", "MIG-")):
        return ("", r.component, dev)
    return (r.node, r.component, dev)


def _best_per_device(rows: Iterable[Any]) -> list[Any]:
    """One value per device: the one that covers the most of the job (latest `t1`), then the exact one.

    (A counter that reset mid-job leaves an early exact value behind; the later integral is the whole.)
    The epilog's two-reading trapezoid of a short job counts only where the device has nothing else.
    """
    rows = list(rows)
    covered = {_device_key(r) for r in rows if r.source != EDGES_ONLY}
    best: dict[tuple[str, str, str], Any] = {}
    for r in rows:
        key = _device_key(r)
        if r.source == EDGES_ONLY and key in covered:
            continue
        cur = best.get(key)
        if cur is None or (as_utc(r.t1), -SOURCE_RANK.get(r.source, 5)) > (
            as_utc(cur.t1),
            -SOURCE_RANK.get(cur.source, 5),
        ):
            best[key] = r
    return list(best.values())


def apply_measured(conn: Connection, cfg: Config, job_pks: Iterable[int]) -> int:
    """Rewrite the energy rows and totals of jobs that have node measurements; returns how many."""
    jt = cast(Table, Job.__table__)
    et = cast(Table, JobEnergy.__table__)
    ne = cast(Table, NodeEnergy.__table__).c
    pks = sorted(set(job_pks))
    cal: list[Any] = []  # the calibration table, read when a partly measured job first needs it
    done = 0
    for i in range(0, len(pks), 500):
        jobs = conn.execute(select(jt).where(jt.c.id.in_(pks[i : i + 500]))).all()
        by_key: dict[tuple[int, str], list[Any]] = defaultdict(list)
        for job in jobs:
            if job.job_id_raw is not None:
                by_key[(job.cluster_id, str(job.job_id_raw))].append(job)
        measured: dict[int, list[Any]] = defaultdict(list)
        for cid in {k[0] for k in by_key}:
            ids = [k[1] for k in by_key if k[0] == cid]
            q = select(
                ne.node, ne.job_id, ne.job_start, ne.component, ne.device, ne.source, ne.energy_j, ne.t1
            ).where(ne.cluster_id == cid, ne.job_id.in_(ids))
            now = datetime.now(UTC)
            for r in conn.execute(q):
                cands = [(j.id, j.submit_time, j.start_time, j.end_time) for j in by_key[(cid, r.job_id)]]
                pk = _pick(cands, as_utc(r.job_start) or now, now)
                if pk is not None:
                    measured[pk].append(r)
        for job in jobs:
            rows = _plausible(cfg, job, _best_per_device(measured.get(job.id, [])))
            if not rows:
                continue
            try:  # one job's failure is logged and leaves the others' measurements applied
                with conn.begin_nested():
                    _rewrite(conn, cfg, job, rows, jt, et, cal)
            except (SQLAlchemyError, ValueError, TypeError, OverflowError) as exc:
                log.warning("job %s: measurements not applied: %s", job.id, str(exc).splitlines()[0][:300])
                continue
            done += 1
    return done


def _plausible(cfg: Config, job: Any, rows: list[Any]) -> list[Any]:
    """The node measurements a job can have drawn: finite, not negative, and at most its run time x the
    site's maximum power of a node per row (a counter gone wrong once claimed exajoules)."""
    cap = (max(float(job.elapsed_s or 0.0), 0.0) + 600.0) * cfg.estimate.max_node_power_w
    out = []
    for r in rows:
        try:
            e = float(r.energy_j)
        except (TypeError, ValueError):
            e = math.nan
        if math.isfinite(e) and 0.0 <= e <= cap:
            out.append(r)
        else:
            log.warning(
                "job %s: %s measurement of %r J on %s dropped (implausible)", job.id, r.component, e, r.node
            )
    return out


def _rewrite(
    conn: Connection, cfg: Config, job: Any, rows: list[Any], jt: Table, et: Table, cal: list[Any]
) -> None:
    sums: dict[tuple[str, str, str], float] = defaultdict(float)
    gpus_covered = set()
    comps = set()
    for r in rows:
        sums[(r.node, r.component, r.source)] += max(float(r.energy_j), 0.0)
        comps.add(r.component)
        if r.component == "gpu":
            gpus_covered.add((r.node, r.device))
    try:
        nodes = expand_hostlist(job.node_list or "")
    except ValueError:
        nodes = []
    hw, _profile = cfg.hardware_for(job.partition, nodes)
    cpu_j, gpu_j, mem_j, *_ = tdp_components(
        max(job.elapsed_s or 0.0, 0.0),
        job.total_cpu_s,
        job.alloc_cpus,
        job.alloc_gpus,
        job.req_mem_mb,
        cfg.estimate,
        hw,
        bool(job.is_open),
    )
    new: list[dict[str, Any]] = [
        {"job_pk": job.id, "node": n, "component": c, "method": "measured", "source": s, "energy_j": e}
        for (n, c, s), e in sorted(sums.items())
    ]
    # What nothing measured keeps its estimate: the unmeasured share of the GPUs, CPU and DRAM if absent.
    # The GPUs' at the power the site's measured jobs drew (cocaq.accounting.calibrate), at the measured GPUs'
    # utilisation where the aggregator knows it; else TDP x utilisation.
    low_high = None
    assumptions = None
    if job.alloc_gpus and len(gpus_covered) < job.alloc_gpus:
        share = (job.alloc_gpus - len(gpus_covered)) / job.alloc_gpus
        gpu_s = job.alloc_gpus * max(job.elapsed_s or 0.0, 0.0) * share
        power = calibrated_share(conn, cfg, job, hw, cal)
        if power is None:
            new.append(_est(job.id, "gpu", gpu_j * share))
        else:
            new.append(_est(job.id, "gpu", gpu_s * power.w, SOURCE_CALIBRATED))
            low_high = (gpu_s * power.w_low, gpu_s * power.w_high, gpu_s * power.w)
            if isinstance(job.assumptions, dict):  # the basis of this share (its utilisation bucket)
                assumptions = {**job.assumptions, **power.assumptions()}
    if "cpu" not in comps and cpu_j > 0:
        new.append(_est(job.id, "cpu", cpu_j))
    if "dram" not in comps and mem_j > 0:
        new.append(_est(job.id, "dram", mem_j))
    conn.execute(delete(et).where(et.c.job_pk == job.id))
    conn.execute(insert(et), new)
    energy = sum(r["energy_j"] for r in new)
    meas = sum(r["energy_j"] for r in new if r["method"] == "measured")
    pue = job.pue or 1.0
    g = job.carbon_g_per_kwh
    co2 = co2_grams(energy, pue, g) if g is not None else 0.0
    est_range: dict[str, Any] = {"energy_est_low_j": None, "energy_est_high_j": None}
    if low_high is not None:  # the estimated part's range: the GPUs' from the table, the rest as estimated
        rest = energy - meas - low_high[2]
        est_range = {"energy_est_low_j": rest + low_high[0], "energy_est_high_j": rest + low_high[1]}
    if assumptions is not None:
        est_range["assumptions"] = assumptions
    conn.execute(
        update(jt)
        .where(jt.c.id == job.id)
        .values(energy_j=energy, energy_measured_j=meas, co2_g=co2, **est_range)
    )


def calibrated_share(conn: Connection, cfg: Config, job: Any, hw: Any, cal: list[Any]) -> Any:
    """The calibrated power of a partly measured job's other GPUs (cocaq.accounting.calibrate), at the
    utilisation
    the aggregator found on its measured ones; None where the estimate stays TDP x utilisation. `cal`
    holds the table once read (one read per `apply_measured`, not one per job)."""
    from cocaq.accounting import calibrate
    from cocaq.accounting.estimate import gpu_power
    from cocaq.db.schema import JobMetrics

    if not cal:
        cal.append(calibrate.load(conn, cfg))
    if cal[0] is None:
        return None
    util = conn.execute(select(JobMetrics.gpu_util_pct).where(JobMetrics.job_pk == job.id)).scalar()
    power = gpu_power(cal[0], cfg, job.gpu_type, job.partition, hw, util)
    return None if power.basis == calibrate.BASIS_TDP else power


def _est(pk: int, component: str, joules: float, source: str = SOURCE_TDP) -> dict[str, Any]:
    return {
        "job_pk": pk,
        "node": "",
        "component": component,
        "method": "estimated",
        "source": source,
        "energy_j": joules,
    }


def jobs_with_measurements(conn: Connection, since: datetime | None = None) -> list[int]:
    """Jobs with linked hook events, and jobs the collector measured even if no hook saw them."""
    ev = cast(Table, NodeEvent.__table__).c
    q = select(ev.job_pk).where(ev.job_pk.is_not(None)).distinct()
    if since is not None:
        q = q.where(ev.ts >= since)
    pks = {r[0] for r in conn.execute(q)}
    ne = cast(Table, NodeEnergy.__table__).c
    q2 = select(ne.cluster_id, ne.job_id, ne.job_start).distinct()
    if since is not None:
        q2 = q2.where(ne.t1 >= since)
    by_cluster: dict[int, list[Any]] = defaultdict(list)
    for cid, jid, start in conn.execute(q2):
        by_cluster[cid].append((jid, start))
    now = datetime.now(UTC)
    for cid, items in by_cluster.items():
        cands = _candidates(conn, cid, (jid for jid, _ in items))
        for jid, start in items:
            pk = _pick(cands.get(jid, []), as_utc(start) or now, now)
            if pk is not None:
                pks.add(pk)
    return sorted(pks)


def has_node_data(conn: Connection) -> bool:
    ev = cast(Table, NodeEvent.__table__).c
    ne = cast(Table, NodeEnergy.__table__).c
    return (
        conn.execute(select(ev.uid).limit(1)).first() is not None
        or conn.execute(select(ne.id).limit(1)).first() is not None
    )


def refresh(engine: Engine, cfg: Config, since: datetime | None = None) -> LinkSummary:
    """Link new node records and rewrite the energy of every job with measurements since `since`."""
    with engine.begin() as conn:
        res = link_events(conn)
    with engine.begin() as conn:
        res.jobs_measured = apply_measured(conn, cfg, jobs_with_measurements(conn, since))
    from cocaq.ml import store as modelmeta_store

    with engine.begin() as conn:  # what jobs declared from inside, and what the collector detected
        res.models = modelmeta_store.refresh_since(conn, since)
    return res
