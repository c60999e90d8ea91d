"""Running jobs, measured so far: what `cocaq job` on a running job, `cocaq watch` and /v1/live show.

While a job runs, the collector ships its GPUs' samples and its energy so far (node_energy: the GPU
counter since the prolog's snapshot, else the integral of the sampled power; RAPL's share for CPU and
DRAM) every shipping interval. One statement reads all of it for a set of jobs (`fetch`), so that a
`cocaq watch` refresh costs the database one query whatever the number of jobs and GPUs; `views` turns
the rows into one dict per job (JSON as it is: the read API sends the same). A job Slurm's accounting
has not been imported for yet is found by its prolog record, so watching works from the job's first
shipment, not from the next `cocaq reconcile`.

Every figure says whether it was measured or estimated: parts the collector did not measure (no RAPL
on the node, a GPU without NVML) are the importer's TDP estimate over the run so far, and the projection
to the time limit is an estimate (the power of the last minutes held to the limit).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from cocaq.collector.records import GPU_SOURCE_RANK
from cocaq.footprint import dbsql
from cocaq.units import G_PER_KG, J_PER_KWH, co2_grams

if TYPE_CHECKING:
    from cocaq.config import Config
    from cocaq.db.dbapi import Db

WINDOW_S = 600.0  # the recent samples read: power now, utilisation and memory "over the last minutes"
BINS = 60  # the power history's resolution (a sparkline's width)
LOOKBACK_S = 30 * 86400.0  # prolog records of jobs not imported yet are looked for this far back
MAX_JOBS = 100  # jobs one query may ask for (the read API's limit too)
METRICS = ("power_w", "util_pct", "mem_used_mb", "cpu_cores", "mem_mb")
BASIS = {
    "nvml": "GPU energy counter since the prolog",
    "nvml-power-integral": "integral of the sampled GPU power",
    "nvml-power-edges": "the prolog's and the epilog's power readings",
    "rapl": "RAPL, the job's share of the node",
    "tdp-estimate": "rated power x run time so far",
}
NOT_ESTIMATED = "allocation not known yet (the job is not in cocaq's import of Slurm's accounting)"


@dataclass(frozen=True)
class Ask:
    """Which jobs: by id (as sacct shows it, 123_4 included, or the raw id) or a user's running jobs."""

    job_ids: tuple[str, ...] = ()
    user: str | None = None
    cluster: str | None = None


def _raw(job_id: str) -> int:
    """The raw id a plain numeric id may be (-1: none, an array or het-job notation)."""
    return int(job_id) if job_id.isdigit() and len(job_id) < 19 else -1


def _job_picks(db: Db, ask: Ask, p: dict[str, Any], cluster_j: str) -> tuple[list[str], str]:
    """The SELECTs of the jobs rows `ask` names, and the condition on prolog records that finds the
    running jobs not imported yet; fills in their parameters in `p`."""
    pick = "SELECT j.cluster_id AS cid, j.job_id_raw AS raw FROM jobs j WHERE j.job_id_raw IS NOT NULL"
    if ask.job_ids:
        ids, nums, raws = [], [], []
        for i, jid in enumerate(ask.job_ids[:MAX_JOBS]):
            p[f"id{i}"] = jid
            ids.append(f"%(id{i})s")
            if _raw(jid) >= 0:
                p[f"raw{i}"] = _raw(jid)
                nums.append(f"%(id{i})s")
                raws.append(f"%(raw{i})s")
        # as sacct shows it (123_4) or the raw id: two index lookups (an OR would scan jobs)
        jobs = [f"{pick} AND j.job_id IN ({', '.join(ids)}){cluster_j}"]
        if raws:
            jobs.append(f"{pick} AND j.job_id_raw IN ({', '.join(raws)}){cluster_j}")
        return jobs, f"s.job_id IN ({', '.join(nums)})" if nums else "1 = 0"
    if ask.user is None:
        raise ValueError("ask for job ids or a user")
    p["user"], p["open"] = ask.user, True
    jobs = [
        f"{pick} AND j.user_name = %(user)s AND j.is_open = %(open)s AND j.start_time IS NOT NULL{cluster_j}"
    ]
    user = dbsql.json_text(db, "s.payload", "job", "user")
    # a running job not imported yet has prolog records not linked to a jobs row (job_pk NULL: an
    # index); an imported one comes through its jobs row
    return jobs, (
        f"s.job_pk IS NULL AND {user} = %(user)s AND NOT EXISTS (SELECT 1 FROM node_events e WHERE"
        " e.cluster_id = s.cluster_id AND e.job_id = s.job_id AND e.node = s.node AND e.event = 'end'"
        " AND e.ts >= s.ts)"
    )


def fetch(db: Db, ask: Ask, now: float, window_s: float = WINDOW_S) -> list[tuple[Any, ...]]:
    """The rows of every job `ask` names (its jobs row, prolog/epilog records, energy so far and the
    last `window_s` of samples), in one statement."""
    from datetime import UTC, datetime

    p: dict[str, Any] = {
        "since": datetime.fromtimestamp(now - LOOKBACK_S, UTC),
        "from": datetime.fromtimestamp(now - window_s, UTC),
        "cluster": ask.cluster,
    }
    # (the cluster is named even when any will do: the indexes on jobs and node_events lead with it)
    clusters = "SELECT id FROM clusters" + (" WHERE name = %(cluster)s" if ask.cluster is not None else "")
    cluster_j = f" AND j.cluster_id IN ({clusters})"
    cluster_s = f" AND s.cluster_id IN ({clusters})"
    jobs, events_where = _job_picks(db, ask, p, cluster_j)
    ep = dbsql.epoch
    text = dbsql.text_type(db)
    as_text = f"CAST(ids.raw AS {text})"
    sql = f"""
WITH ids AS (
  {" UNION ".join(jobs)}
  UNION
  SELECT s.cluster_id, CAST(s.job_id AS BIGINT) FROM node_events s
   WHERE s.event = 'start' AND s.ts >= %(since)s AND {events_where}{cluster_s}
)
SELECT 'j', j.cluster_id, {as_text}, j.node_list, j.user_name, j.account, j.partition, j.state,
       j.job_id, j.carbon_zone, c.name, j.time_limit_s, j.energy_j, j.energy_measured_j,
       CAST(j.alloc_gpus AS FLOAT), CAST(j.alloc_cpus AS FLOAT), j.req_mem_mb, j.pue, j.carbon_g_per_kwh,
       {ep(db, "j.start_time")}, {ep(db, "j.end_time")}, {ep(db, "j.submit_time")},
       CASE WHEN j.is_open THEN 1 ELSE 0 END
  FROM jobs j JOIN ids ON ids.cid = j.cluster_id AND ids.raw = j.job_id_raw
  JOIN clusters c ON c.id = j.cluster_id
UNION ALL
SELECT 'v', ev.cluster_id, {as_text}, ev.node, ev.event, NULL, NULL,
       CASE WHEN ev.event = 'start' THEN CAST(ev.payload AS {text}) END, NULL, NULL, c.name,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, {ep(db, "ev.ts")}, NULL, NULL, NULL
  FROM node_events ev JOIN ids ON ids.cid = ev.cluster_id AND ev.job_id = {as_text}
  JOIN clusters c ON c.id = ev.cluster_id
 WHERE ev.event IN ('start', 'end') AND ev.ts >= %(since)s
UNION ALL
SELECT 'e', ne.cluster_id, {as_text}, ne.node, ne.component, ne.device, ne.source, NULL, NULL, NULL, NULL,
       NULL, ne.energy_j, NULL, NULL, NULL, NULL, NULL, NULL,
       {ep(db, "ne.job_start")}, {ep(db, "ne.t1")}, NULL, CASE WHEN ne.final THEN 1 ELSE 0 END
  FROM node_energy ne JOIN ids ON ids.cid = ne.cluster_id AND ne.job_id = {as_text}
 WHERE ne.job_start >= %(since)s
UNION ALL
SELECT 's', sa.cluster_id, {as_text}, sa.node, sa.source, sa.device, sa.metric, NULL, NULL, NULL, NULL,
       NULL, sa.value, NULL, NULL, NULL, NULL, NULL, NULL, {ep(db, "sa.ts")}, NULL, NULL, NULL
  FROM samples sa JOIN ids ON ids.cid = sa.cluster_id AND sa.job_id = {as_text}
 WHERE sa.ts >= %(from)s AND sa.metric IN ({", ".join(f"'{m}'" for m in METRICS)})
UNION ALL
SELECT 'n', ids.cid, {as_text}, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, {ep(db, "max(sa.ts)")}, NULL, NULL, NULL
  FROM samples sa JOIN ids ON ids.cid = sa.cluster_id AND sa.job_id = {as_text}
 WHERE sa.ts >= %(since)s
 GROUP BY ids.cid, ids.raw
"""
    return db.rows(sql, p)


def _payload(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        d = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _group(rows: Iterable[tuple[Any, ...]]) -> dict[tuple[int, str], dict[str, list[tuple[Any, ...]]]]:
    out: dict[tuple[int, str], dict[str, list[tuple[Any, ...]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        out[(int(r[1]), str(r[2]))][str(r[0])].append(r)
    return out


def views(
    rows: Iterable[tuple[Any, ...]], cfg: Config, now: float, window_s: float = WINDOW_S
) -> list[dict[str, Any]]:
    """One live view per job in `fetch`'s rows, newest start first."""
    out = [_view(cid, raw, kinds, cfg, now, window_s) for (cid, raw), kinds in _group(rows).items()]
    found = [v for v in out if v is not None]
    return sorted(found, key=lambda v: (-(v["start_ts"] or 0.0), v["job_id"]))


Rows = list[tuple[Any, ...]]
Samples = dict[tuple[str, str, str], list[tuple[float, float]]]
Best = dict[tuple[str, str, str], tuple[float, str, float, bool]]


@dataclass(frozen=True)
class _Run:
    """The run of the id a view is of (ids are reused): its jobs row (None until Slurm's accounting is
    imported), its nodes' prolog records and epilog times, who ran it, and where it stands."""

    row: tuple[Any, ...] | None
    starts: dict[str, tuple[float, dict[str, Any]]]  # node: (prolog time, prolog payload)
    ends: dict[str, float]  # node: epilog time
    cluster: str
    user: Any
    account: Any
    partition: Any
    is_open: bool
    running: bool
    state: str
    start: float
    end: float | None
    t_now: float  # the end of the run so far: now, or its end
    elapsed: float
    limit: float | None


def _run_starts(events: Rows, start: float | None) -> dict[str, tuple[float, dict[str, Any]]]:
    """The prolog records of this run of the id, per node: from the jobs row's start on (ids are
    reused), else the newest start's run."""
    starts_all = sorted(
        ((float(r[19]), str(r[3]), _payload(r[7])) for r in events if r[4] == "start"), key=lambda x: x[0]
    )
    if start is not None:
        starts_all = [s for s in starts_all if s[0] >= start - 120.0]
    elif starts_all:
        newest = starts_all[-1][0]
        starts_all = [s for s in starts_all if s[0] >= newest - 86400.0]
    return {node: (ts, payload) for ts, node, payload in starts_all}


def _run(kinds: dict[str, Rows], now: float) -> _Run | None:
    """Which run the rows are of and where it stands; None when there is neither a jobs row nor a
    prolog record, or when nothing has started (a pending job's row, no prolog yet: nothing to watch)."""
    jrows = sorted(kinds.get("j", []), key=lambda r: _num(r[21]) or 0.0)
    row = jrows[-1] if jrows else None
    start = _num(row[19]) if row else None
    starts = _run_starts(kinds.get("v", []), start)
    if not starts and (row is None or start is None):
        return None
    ends = {
        str(r[3]): float(r[19])
        for r in sorted(kinds.get("v", []), key=lambda r: float(r[19]))
        if r[4] == "end" and str(r[3]) in starts and float(r[19]) >= starts[str(r[3])][0]
    }
    if start is None:
        start = min(s[0] for s in starts.values())
    info: dict[str, Any] = {}
    if starts:
        info = _payload(next(iter(starts.values()))[1].get("job"))
    is_open = bool(row[22]) if row else True
    node_ended = bool(starts) and all(n in ends for n in starts)
    running = is_open and not node_ended
    if row is not None and not is_open:
        state = str(row[7])
    elif running:
        state = "RUNNING"
    else:
        state = "ENDED"  # the epilogs have run; Slurm's final state comes with the next import
    end = (_num(row[20]) if row else None) or (max(ends.values()) if node_ended else None)
    t_now = now if running or end is None else end
    return _Run(
        row=row,
        starts=starts,
        ends=ends,
        cluster=str((row or kinds["v"][0])[10]),
        user=row[4] if row else info.get("user"),
        account=row[5] if row else info.get("account"),
        partition=row[6] if row else info.get("partition"),
        is_open=is_open,
        running=running,
        state=state,
        start=start,
        end=end,
        t_now=t_now,
        elapsed=max(t_now - start, 0.0),
        limit=_num(row[11]) if row else None,
    )


def _best_energy(energy: Rows, run: _Run) -> Best:
    """Energy so far, per node/component/device, of this run: the counter where there is one, else the
    integral (the better source as the accounting ranks them, then the later row)."""
    best: Best = {}
    rank = GPU_SOURCE_RANK.get
    for r in energy:
        node, comp, dev, src = str(r[3]), str(r[4]), str(r[5] or ""), str(r[6])
        js = _num(r[19])
        if js is None:
            continue
        if node in run.starts and abs(js - run.starts[node][0]) > 1.0:
            continue  # another run of the id on this node
        if node not in run.starts and js < run.start - 120.0:
            continue
        key = (node, comp, dev)
        cand = (float(r[12]), src, float(r[20]), bool(r[22]))
        have = best.get(key)
        if have is None or (rank(src, 9), -cand[2]) < (rank(have[1], 9), -have[2]):
            best[key] = cand
    return best


def _samples(sampled: Rows, start: float) -> Samples:
    """The window's samples since the run's start, per node/device/metric, oldest first."""
    samples: Samples = defaultdict(list)
    for r in sampled:
        v = _num(r[12])
        if v is not None and float(r[19]) >= start - 1.0:
            samples[(str(r[3]), str(r[5]), str(r[6]))].append((float(r[19]), v))
    for ser in samples.values():
        ser.sort()
    return samples


def _gpus(run: _Run, best: Best, samples: Samples, cfg: Config, now: float) -> list[dict[str, Any]]:
    """The GPUs: what the prolog recorded (Slurm's index), what was measured and sampled; a power
    "now" only from a recent sample of a running job."""
    index: dict[tuple[str, str], Any] = {}
    for node, (_, payload) in run.starts.items():
        listed = payload.get("gpus")
        for g in listed if isinstance(listed, list) else []:
            if isinstance(g, dict) and isinstance(g.get("uuid"), str):
                index[(node, g["uuid"])] = g.get("slurm_index", g.get("minor"))
    gpu_keys = sorted(
        {(n, d) for (n, c, d) in best if c == "gpu"}
        | {(n, d) for (n, d, m) in samples if m == "power_w"}
        | set(index)
    )
    recent = max(3.0 * cfg.collector.interval_s, 30.0)
    gpus = []
    for node, uuid in gpu_keys:
        e = best.get((node, "gpu", uuid))
        power = samples.get((node, uuid, "power_w"), [])
        util = samples.get((node, uuid, "util_pct"), [])
        mem = samples.get((node, uuid, "mem_used_mb"), [])
        fresh = power[-1] if power and now - power[-1][0] <= recent else None
        gpus.append(
            {
                "node": node,
                "uuid": uuid,
                "index": index.get((node, uuid)),
                "energy_j": e[0] if e else None,
                "source": e[1] if e else None,
                "as_of_ts": e[2] if e else None,
                "power_w": fresh[1] if fresh and run.running else None,
                "power_ts": power[-1][0] if power else None,
                "util_pct": util[-1][1] if util else None,
                "util_pct_mean": sum(v for _, v in util) / len(util) if util else None,
                "mem_used_mb": mem[-1][1] if mem else None,
                "mem_used_mb_max": max(v for _, v in mem) if mem else None,
            }
        )
    return gpus


def _measured_parts(best: Best, start: float) -> tuple[list[dict[str, Any]], set[str]]:
    """The components the collector measured (GPU, CPU, DRAM), and which they are."""
    parts: list[dict[str, Any]] = []
    by_comp: dict[str, list[tuple[float, str, float]]] = defaultdict(list)
    for (_node, comp, _dev), (ej, src, t1, _final) in sorted(best.items()):
        by_comp[comp].append((ej, src, t1))
    for comp in ("gpu", "cpu", "dram"):
        got = by_comp.get(comp)
        if not got:
            continue
        sources = sorted({s for _, s, _ in got})
        t1 = max(t for _, _, t in got)
        ej = sum(e for e, _, _ in got)
        w = None
        if comp != "gpu" and t1 > start:
            w = ej / max(t1 - start, 1.0)  # RAPL's share is a counter: its average since the start
        parts.append(
            {
                "component": comp,
                "method": "measured",
                "source": "+".join(sources),
                "basis": "; ".join(BASIS.get(s, s) for s in sources),
                "energy_j": ej,
                "as_of_ts": t1,
                "power_w": w,
                "power_basis": None if w is None else "average since the start",
            }
        )
    return parts, set(by_comp)


def _estimated_parts(run: _Run, cfg: Config, measured: set[str]) -> list[dict[str, Any]]:
    """The components not measured, as the importer estimates them: rated power over the run so far
    (the allocation comes from the jobs row: a job not imported yet has no estimate)."""
    row = run.row
    if row is None:
        return []
    from cocaq.accounting.estimate import tdp_components

    hw, _ = cfg.hardware_for(run.partition, sorted(run.starts) or None)
    gpus_alloc, cpus_alloc = int(row[14] or 0), int(row[15] or 0)
    cpu_j, gpu_j, mem_j, *_ = tdp_components(
        run.elapsed, None, cpus_alloc, gpus_alloc, _num(row[16]), cfg.estimate, hw, running=True
    )
    return [
        {
            "component": comp,
            "method": "estimated",
            "source": "tdp-estimate",
            "basis": BASIS["tdp-estimate"],
            "energy_j": ej,
            "as_of_ts": run.t_now,
            "power_w": ej / run.elapsed if run.elapsed > 0 else None,
            "power_basis": "rated power",
        }
        for comp, ej in (("gpu", gpu_j), ("cpu", cpu_j), ("dram", mem_j))
        if comp not in measured and ej > 0
    ]


def _carbon(run: _Run, cfg: Config) -> dict[str, Any]:
    """The job's zone, intensity and PUE as the import chose them, else the configuration's."""
    row = run.row
    if row is not None and _num(row[18]) is not None:
        zone, g_per_kwh, pue = str(row[9] or ""), float(row[18]), float(row[17] or 1.0)
        return {"zone": zone, "g_per_kwh": g_per_kwh, "pue": pue, "source": "the job's record"}
    from datetime import UTC, datetime

    from cocaq.carbon.zones import zone_intensity

    hw, _ = cfg.hardware_for(run.partition, sorted(run.starts) or None)
    zone = cfg.zone_and_pue(hw)[0]
    pue = cfg.pue_at(hw, datetime.fromtimestamp(run.start, UTC))
    ci = zone_intensity(zone)
    return {"zone": ci.zone, "g_per_kwh": ci.g_per_kwh, "pue": pue, "source": ci.source}


def _power_terms(
    gpus: list[dict[str, Any]], parts: list[dict[str, Any]]
) -> tuple[list[float], list[float], list[float]]:
    """The terms of the power now: the GPUs' last samples, the other parts' averages, and the GPUs'
    rated-power estimate where they were not measured."""
    gpu_now: list[float] = [float(g["power_w"]) for g in gpus if g["power_w"] is not None]
    other_w: list[float] = [
        p["power_w"] for p in parts if p["component"] != "gpu" and p["power_w"] is not None
    ]
    est_gpu_w: list[float] = [
        p["power_w"] or 0.0 for p in parts if p["component"] == "gpu" and p["method"] == "estimated"
    ]
    return gpu_now, other_w, est_gpu_w


def _power_series(
    samples: Samples, cfg: Config, run: _Run, now: float, window_s: float
) -> tuple[float, list[tuple[float, float | None]]]:
    """The power history's span (a young job's is its whole run) and its BINS bins (none for a job
    that no longer runs), no bin narrower than the sampling interval."""
    span = min(window_s, max(now - run.start, 60.0))
    gaps = sorted(
        b[0] - a[0] for (_, _, m), ser in samples.items() if m == "power_w" for a, b in pairwise(ser)
    )
    step = max(cfg.collector.interval_s, gaps[len(gaps) // 2] if gaps else 0.0)  # the sampling interval
    return span, _power_bins(samples, now, span, step) if run.running else []


def _projection(
    run: _Run,
    energy_j: float,
    terms: tuple[list[float], list[float], list[float]],
    series: list[tuple[float, float | None]],
    carbon: dict[str, Any],
    window_s: float,
) -> dict[str, Any] | None:
    """The energy and CO2e at the time limit, an estimate: the power of the last minutes held to it."""
    if not (run.running and run.limit and run.limit > run.elapsed):
        return None
    gpu_now, other_w, est_gpu_w = terms
    gpu_recent = [w for _, w in series if w is not None]
    w_recent = (sum(gpu_recent) / len(gpu_recent) if gpu_recent else sum(gpu_now)) + sum(other_w)
    w_recent += sum(est_gpu_w)
    left = run.limit - run.elapsed
    proj_j = energy_j + w_recent * left
    return {
        "method": "estimated",
        "basis": f"the power of the last {window_s / 60:.0f} min held to the time limit",
        "until_ts": run.start + run.limit,
        "energy_j": proj_j,
        "energy_kwh": proj_j / J_PER_KWH,
        "co2_kg": co2_grams(proj_j, carbon["pue"], carbon["g_per_kwh"]) / G_PER_KG,
    }


def _view(
    cid: int, raw: str, kinds: dict[str, Rows], cfg: Config, now: float, window_s: float
) -> dict[str, Any] | None:
    """One job's live view (the dict /v1/live sends): every figure measured or estimated, and said so."""
    run = _run(kinds, now)
    if run is None:
        return None
    row = run.row
    best = _best_energy(kinds.get("e", []), run)
    samples = _samples(kinds.get("s", []), run.start)
    parts, measured = _measured_parts(best, run.start)
    parts += _estimated_parts(run, cfg, measured)
    measured_j = sum(p["energy_j"] for p in parts if p["method"] == "measured")
    estimated_j = sum(p["energy_j"] for p in parts if p["method"] == "estimated")
    energy_j = measured_j + estimated_j
    carbon = _carbon(run, cfg)
    gpus = _gpus(run, best, samples, cfg, now)
    terms = _power_terms(gpus, parts)
    gpu_now, other_w, est_gpu_w = terms
    # the part of the power that is a rated-power estimate, not a measurement: said as such, never as "now"
    est_other_w = [
        p["power_w"] for p in parts if p["component"] != "gpu" and p["method"] == "estimated" and p["power_w"]
    ]
    span, series = _power_series(samples, cfg, run, now, window_s)
    cpu_cores = [s[-1][1] for (n, d, m), s in samples.items() if m == "cpu_cores" and s]
    return {
        "cluster": run.cluster,
        "job_id": str(row[8]) if row else raw,
        "job_id_raw": raw,
        "user": run.user,
        "account": run.account,
        "partition": run.partition,
        "state": run.state,
        "running": run.running,
        "in_accounting": row is not None,
        "nodes": sorted(run.starts) or ([str(row[3])] if row and row[3] else []),
        "start_ts": run.start,
        "end_ts": run.end,
        "now_ts": now,
        "elapsed_s": run.elapsed,
        "time_limit_s": run.limit,
        "energy_j": energy_j,
        "energy_kwh": energy_j / J_PER_KWH,
        "energy_measured_kwh": measured_j / J_PER_KWH,
        "energy_estimated_kwh": estimated_j / J_PER_KWH,
        "parts": parts,
        "estimate_note": None if row is not None else NOT_ESTIMATED,
        "gpus": gpus,
        "power_w": (sum(gpu_now) + sum(other_w) + sum(est_gpu_w)) if run.running else None,
        "power_estimated_w": (sum(est_gpu_w) + sum(est_other_w)) if run.running else None,
        "power_series": series,
        "power_series_span_s": span if run.running else None,
        "window_s": window_s,
        "cpu_cores": sum(cpu_cores) if cpu_cores else None,
        "co2_kg": co2_grams(energy_j, carbon["pue"], carbon["g_per_kwh"]) / G_PER_KG,
        "carbon": carbon,
        "projection": _projection(run, energy_j, terms, series, carbon, window_s),
        "newest_sample_ts": max((s[-1][0] for s in samples.values()), default=None),
        # the newest sample at all ('n': before the window too): a collector that shipped and then
        # stopped is not one that never shipped
        "last_sample_ts": max(
            (float(r[19]) for r in kinds.get("n", []) if float(r[19]) >= run.start - 1.0), default=None
        ),
        "final": None,
        "accounted": row is not None and not run.is_open,
    }


def _power_bins(
    samples: dict[tuple[str, str, str], list[tuple[float, float]]], now: float, span_s: float, step_s: float
) -> list[tuple[float, float | None]]:
    """The job's GPU power over the last `span_s` in at most BINS bins, none narrower than the sampling
    interval `step_s`: per GPU the mean of its samples in a bin, summed over GPUs; None where no GPU had
    a sample."""
    n = max(min(BINS, int(span_s // max(step_s, 1e-3))), 1)
    width = span_s / n
    lo = now - span_s
    sums = [0.0] * n
    seen = [False] * n
    for (_, _, metric), series in samples.items():
        if metric != "power_w":
            continue
        acc: dict[int, list[float]] = defaultdict(list)
        for ts, w in series:
            b = int((ts - lo) // width)
            if 0 <= b < n:
                acc[b].append(w)
        for b, ws in acc.items():
            sums[b] += sum(ws) / len(ws)
            seen[b] = True
    return [(lo + (b + 1) * width, sums[b] if seen[b] else None) for b in range(n)]


def live(db: Db, cfg: Config, ask: Ask, now: float | None = None, window_s: float = WINDOW_S) -> list[dict]:
    """The live views of the jobs `ask` names: one query (`fetch`) and the arithmetic (`views`)."""
    import time

    t = time.time() if now is None else now
    found = views(fetch(db, ask, t, window_s), cfg, t, window_s)
    if not found and ask.cluster is not None:  # an unknown cluster is a typo (UnknownName), not "no job"
        from cocaq.footprint.lookup import check_names

        check_names(db, cluster=ask.cluster)
    return found
