"""What each job of a window did, as the advice (cocaq.footprint.advice) and the reports read it: one row per
job.

Every figure is the ledger's (cocaq.accounting.ledger): energy by component from `job_energy` (so the GPU
energy
of a job whose node Slurm measured is the aggregator's GPU share of it), idle GPU energy at most the
job's energy, CO2 per kWh from the job's own CO2. Whole-job figures are kept whole; `share` is the part
of the job's run inside the window (the footprint's and rollups' pro rata), for the figures a window adds
up (`in_window`).

One statement on plain DB-API connections (cocaq.db.dbapi: psycopg, sqlite3), so that `cocaq user` on a
login node can afford it; the reports hand it their SQLAlchemy connection's driver connection.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cocaq.accounting.ledger import outcome_of
from cocaq.accounting.window import overlap_sql, share_sql
from cocaq.footprint.dbsql import epoch, greatest, labs_bound, least, planner_fence
from cocaq.slurm.record import NOT_STARTED_STATES, OPEN_STATES
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR

if TYPE_CHECKING:
    from cocaq.config import Config
    from cocaq.db.dbapi import Db

# model_metadata.precision (and, for rows of the first shape, these keys of `extra`) says it.
PRECISION_KEYS = ("precision", "dtype", "mixed_precision", "amp")
_REDUCED = (
    "bf16", "bfloat16", "fp16", "float16", "half", "mixed", "amp", "fp8", "float8", "int8", "int4", "nf4",
)  # fmt: skip
_FULL = ("fp32", "float32", "tf32", "single", "full", "fp64", "float64", "double")
_NOT_ENDED = OPEN_STATES | NOT_STARTED_STATES


@dataclass(slots=True)
class DeviceUse:
    """One GPU of a job, from its samples (util_pct and power_w of that device)."""

    node: str
    device: str
    samples: int  # utilisation samples
    hours: float  # the time they cover: first to last sample, plus one spacing
    idle_share: float  # of those samples, the share under the idle threshold
    mean_util_pct: float
    mean_power_w: float | None
    energy_kwh: float | None  # mean power x the time covered


@dataclass(slots=True)
class JobFacts:
    """One job: whole-job figures, and `share`, the part of its run inside the window."""

    pk: int
    job_id: str
    job_id_raw: int | None
    cluster_id: int
    cluster: str
    name: str | None
    user: str
    account: str | None
    partition: str | None
    node_list: str | None
    state: str  # as Slurm said it: "CANCELLED by 5"
    exit_code: int | None
    start: datetime | None
    end: datetime | None
    is_open: bool
    cpus: int
    gpus: int
    nodes: int
    elapsed_h: float
    time_limit_h: float | None
    req_mem_mb: float | None  # the job's, all nodes
    max_rss_mb: float | None  # sacct MaxRSS: one task's peak
    rss_tasks_per_node: int | None
    total_cpu_s: float | None
    share: float  # of the run inside the window (0-1)
    energy_kwh: float  # IT energy, whole job
    gpu_kwh: float
    cpu_kwh: float
    dram_kwh: float
    other_kwh: float  # the rest of a node-level measurement
    measured_kwh: float
    gpu_source: str | None  # the GPU energy's source (the largest row's): nvml, nvml-samples, tdp-estimate
    co2_kg: float  # operational, whole job
    gpu_util_pct: float | None  # energy-weighted over its samples
    sampled_share: float  # GPU-time that samples cover / allocated GPU-time
    idle_gpu_hours: float  # whole job
    idle_kwh: float  # whole job, the ledger's (at most its energy)
    gpu_mem_peak_mb: float | None
    mean_gpu_power_w: float | None  # per GPU, from its samples
    gpu_tdp_w: float = 0.0  # of its hardware profile (config)
    gpu_mem_gb: float = 0.0  # of one GPU, from the config (0: unknown)
    model: str | None = None
    precision: str | None = None  # "reduced" | "full" | None (unknown)
    precision_label: str | None = None  # what the metadata said: bf16, fp32...
    batch_size: int | None = None
    epochs: float | None = None
    tokens: int | None = None
    devices: tuple[DeviceUse, ...] = ()  # filled only where the reports examined the GPUs one by one
    # When to run (cocaq.accounting.shifting; whole job): "ok" where it has figures, else why not
    shift_state: str | None = None
    shift_slack_h: float | None = None
    shift_best_start: datetime | None = None
    shift_now_g: float | None = None  # g/kWh over its run, and at its best start
    shift_best_g: float | None = None
    shift_saved_kg: float = 0.0  # what its best start, and pausing, would have saved
    shift_pause_saved_kg: float = 0.0
    # where gpu_util_pct and the idle figures come from: "samples" (cocaq's collector) or "slurm" (Slurm's
    # gres/gpuutil: one mean over the run); None without GPU figures
    gpu_util_source: str | None = None
    gpus_unknown: bool = False  # no GPU in its TRES on a GPU partition of a cluster that records none
    qos: str | None = None
    gpu_type: str | None = None  # from its TRES (gres/gpu:a100); the profile's gpu_model is the fallback
    gpu_model: str | None = None  # of its hardware profile (config)
    # sacct showed a `.batch` step; False: steps and none batch (srun --pty, salloc); None: not known
    batch_step: bool | None = None
    # its node as its hardware profile describes it (config; 0: not said), for a GPU's share of a node
    node_cores: int = 0
    node_gpus: int = 0
    node_mem_gb: float = 0.0
    # the nodes of a multi-node job on which Slurm accounted no CPU time in any step (sacct's per-step
    # minimum, cocaq.slurm.idle_nodes); () where none, or its steps cannot tell
    zero_cpu_nodes: tuple[str, ...] = ()

    # --- derived -------------------------------------------------------------------------------------

    @property
    def outcome(self) -> str | None:
        return outcome_of(self.state)

    @property
    def kg_per_kwh(self) -> float:
        """The job's CO2 per kWh of IT energy (its intensity x PUE): what a saving of its energy avoids."""
        return self.co2_kg / self.energy_kwh if self.energy_kwh > 0 else 0.0

    @property
    def gpu_hours(self) -> float:
        """Allocated GPU-hours, whole job."""
        return self.gpus * self.elapsed_h

    @property
    def ended(self) -> bool:
        """Whether the job has ended. Slurm adds a step's TotalCPU and MaxRSS only when the step ends, so
        a running job's are partial: nothing that sizes CPUs, memory or time may read them before."""
        return not self.is_open and self.state.split(" ")[0] not in _NOT_ENDED

    @property
    def cpu_usage(self) -> float | None:
        """TotalCPU / (allocated CPUs x elapsed): 1 = every allocated core busy all the time. None where
        Slurm recorded no CPU time, or the job has not ended (its TotalCPU is partial)."""
        if self.total_cpu_s is None or not self.cpus or self.elapsed_h <= 0 or not self.ended:
            return None
        return self.total_cpu_s / (self.cpus * self.elapsed_h * S_PER_HOUR)

    @property
    def idle_when(self) -> str:
        """Over what its idle share was measured, in words: the samples' time, or Slurm's whole-run mean."""
        if self.gpu_util_source == "slurm":
            util = f"{self.gpu_util_pct:.0f}%" if self.gpu_util_pct is not None else "?"
            return f"of the run (Slurm gres/gpuutil: a mean of {util} per GPU)"
        return "of the sampled time"

    @property
    def idle_share(self) -> float | None:
        """Of the GPU time its samples cover, the share under the idle threshold."""
        covered = self.sampled_share * self.gpu_hours
        return self.idle_gpu_hours / covered if covered > 0 else None

    @property
    def mem_used_per_node_mb(self) -> float | None:
        """An upper bound of the memory it used on a node: MaxRSS x the tasks per node of that step."""
        if self.max_rss_mb is None:
            return None
        return self.max_rss_mb * max(self.rss_tasks_per_node or 1, 1)

    @property
    def mem_req_per_node_mb(self) -> float | None:
        if not self.req_mem_mb:
            return None
        return self.req_mem_mb / max(self.nodes, 1)

    def in_window(self, kwh: float) -> float:
        return kwh * self.share

    def with_devices(self, devices: tuple[DeviceUse, ...]) -> JobFacts:
        return replace(self, devices=devices)


def precision_of(precision: str | None, extra: Any = None) -> tuple[str | None, str | None]:
    """("reduced" | "full" | None, the value read) from a model_metadata row's precision (and `extra`,
    where rows of the first shape kept it under one of PRECISION_KEYS)."""
    if isinstance(precision, str) and precision.strip():
        return _classify(precision)
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError:
            extra = None
    if not isinstance(extra, dict):
        return None, None
    for key in PRECISION_KEYS:
        v = extra.get(key)
        if isinstance(v, bool):
            return ("reduced" if v else "full"), f"{key}={v}".lower()
        if isinstance(v, str) and v.strip():
            return _classify(v)
    return None, None


def _classify(value: str) -> tuple[str | None, str]:
    t = value.strip().lower().replace("torch.", "")
    if any(w in t for w in _REDUCED):
        return "reduced", t
    if any(w in t for w in _FULL):
        return "full", t
    return None, t


# --- the query -------------------------------------------------------------------------------------------


def scope_where(scope: str | None, cluster: bool, within: int = 0) -> str:
    """The window's jobs of a user or lab (`scope` "user" or "account": %(key)s; None: everyone), of the
    cluster %(cluster)s, and in the `within` labs %(in0)s... (a lab head's view of a member), as SQL
    conditions to add to a WHERE over `jobs j`."""
    where = ""
    if scope == "user":
        where += " AND j.user_name = %(key)s"
    elif scope == "account":
        where += " AND j.account = %(key)s"
    if cluster:
        where += " AND j.cluster_id = (SELECT id FROM clusters WHERE name = %(cluster)s)"
    if within:
        where += f" AND j.account IN ({', '.join(f'%(in{i})s' for i in range(within))})"
    return where


def _sql(
    db: Db,
    scope: str | None,
    cluster: bool,
    pk: bool = False,
    within: int = 0,
    name: bool = False,
    ids: Sequence[int] | None = None,
) -> str:
    """The window's jobs, one row each, in JobFacts' field order up to `mean_gpu_power_w`, converted to
    its units here (SQL arithmetic is cheaper than Python's for the heavy users' 10,000 jobs a month),
    then the hardware key, the model metadata and the window's share of the job's energy for the sort."""
    where = scope_where(scope, cluster, within)
    if pk:
        where += " AND j.id = %(pk)s"
    if name:  # one kind of job (its runs size its time limit)
        where += " AND j.name = %(name)s"
    if ids is not None:  # only these (cocaq.footprint.advice_jobs: the ones the advice reads whole)
        where += f" AND j.id IN ({', '.join(str(int(i)) for i in ids) or 'NULL'})"
    el = greatest(db, "coalesce(j.elapsed_s, 0.0)", "0.0")
    t0 = epoch(db, "j.start_time")
    # the job's share of the window (cocaq.accounting.window), at most 1 (float rounding)
    ov = overlap_sql("y.t0", "y.el", "%(since)s", "%(until)s", db.dialect)
    f = share_sql("y.t0", "y.el", ov, [("%(since)s", "%(until)s")])
    fence = planner_fence(db, "\n        ")
    share = least(db, greatest(db, f, "0.0"), "1.0")
    sums = """
           sum(CASE WHEN q.component = 'gpu' THEN q.energy_j ELSE 0.0 END) AS gpu,
           sum(CASE WHEN q.component = 'cpu' THEN q.energy_j ELSE 0.0 END) AS cpu,
           sum(CASE WHEN q.component = 'dram' THEN q.energy_j ELSE 0.0 END) AS dram,
           sum(CASE WHEN q.component NOT IN ('gpu', 'cpu', 'dram') THEN q.energy_j ELSE 0.0 END) AS other,
           max(CASE WHEN q.component = 'gpu' THEN q.source END) AS gpu_source"""
    if db.dialect == "postgresql":
        # per job through its primary key: cheaper than grouping job_energy by the window's ids
        energy = f"LEFT JOIN LATERAL (SELECT {sums}\n    FROM job_energy q WHERE q.job_pk = w.id) c ON true"
        c_cte = ""
    else:  # SQLite has no LATERAL
        energy = "LEFT JOIN c ON c.job_pk = w.id"
        c_cte = f""", c AS (
    SELECT q.job_pk, {sums}
    FROM job_energy q WHERE q.job_pk IN (SELECT id FROM w WHERE f > 0) GROUP BY q.job_pk
)"""
    held = "w.gpus * w.el"
    per_h, per_kg = f"{S_PER_HOUR}.0", f"{G_PER_KG}.0"  # SQL's float literals: divisions in floating point
    energy_j = greatest(db, "w.energy", "0.0")
    idle = greatest(db, "0.0", least(db, "coalesce(m.idle_gpu_energy_j, 0.0)", energy_j))
    busy = least(db, f"coalesce(m.gpu_samples_s, 0.0) / ({held})", "1.0")
    return f"""
WITH y AS (
    SELECT j.id, j.job_id, j.job_id_raw, j.cluster_id, c.name AS cluster, j.name, j.user_name, j.account,
           j.partition, j.node_list, coalesce(j.state, '') AS state, j.exit_code, j.start_time, j.end_time,
           j.is_open, coalesce(j.alloc_cpus, 0) AS cpus, coalesce(j.alloc_gpus, 0) AS gpus,
           coalesce(j.n_nodes, 0) AS nn, j.time_limit_s, j.req_mem_mb, j.max_rss_mb, j.rss_tasks_per_node,
           j.total_cpu_s, coalesce(j.energy_j, 0.0) AS energy, coalesce(j.energy_measured_j, 0.0) AS measured,
           coalesce(j.co2_g, 0.0) AS co2, j.gpus_unknown, j.qos, j.gpu_type, j.batch_step, j.zero_cpu_nodes,
           {t0} AS t0, {el} AS el
    FROM jobs j JOIN clusters c ON c.id = j.cluster_id
    WHERE j.start_time < %(until_ts)s AND (j.end_time >= %(since_ts)s OR j.end_time IS NULL)
          AND j.start_time IS NOT NULL{where}{fence}
), w AS (
    SELECT y.*, {share} AS f
    FROM y
){c_cte}
SELECT w.id, w.job_id, w.job_id_raw, w.cluster_id, w.cluster, w.name, w.user_name, w.account, w.partition,
       w.node_list, w.state, w.exit_code, w.start_time, w.end_time, w.is_open, w.cpus, w.gpus, w.nn,
       w.el / {per_h}, CASE WHEN w.time_limit_s > 0 THEN w.time_limit_s / {per_h} END,
       CASE WHEN w.req_mem_mb > 0 THEN w.req_mem_mb END, w.max_rss_mb, w.rss_tasks_per_node, w.total_cpu_s,
       w.f, {energy_j} / {J_PER_KWH!r}, coalesce(c.gpu, 0.0) / {J_PER_KWH!r},
       coalesce(c.cpu, 0.0) / {J_PER_KWH!r}, coalesce(c.dram, 0.0) / {J_PER_KWH!r},
       coalesce(c.other, 0.0) / {J_PER_KWH!r}, w.measured / {J_PER_KWH!r}, c.gpu_source, w.co2 / {per_kg},
       m.gpu_util_pct,
       CASE WHEN {held} > 0 THEN {busy} ELSE 0.0 END,
       coalesce(m.idle_gpu_s, 0.0) / {per_h}, {idle} / {J_PER_KWH!r}, m.gpu_mem_peak_mb,
       CASE WHEN m.gpu_samples_s > 0 THEN coalesce(m.gpu_samples_j, 0.0) / m.gpu_samples_s END,
       mm.model_name, mm.precision, mm.extra, mm.batch_size, mm.epochs, mm.tokens,
       m.shift_state, m.shift_slack_s / {per_h}, m.shift_best_start, m.shift_now_g, m.shift_best_g,
       coalesce(m.shift_saved_g, 0.0) / {per_kg}, coalesce(m.shift_pause_saved_g, 0.0) / {per_kg},
       m.gpu_util_source, w.gpus_unknown, w.qos, w.gpu_type, w.batch_step, w.zero_cpu_nodes,
       {energy_j} * w.f
FROM w {energy}
       LEFT JOIN job_metrics m ON m.job_pk = w.id
       LEFT JOIN model_metadata mm ON mm.job_pk = w.id
WHERE w.f > 0"""


# The row's columns before the model metadata: JobFacts' fields up to mean_gpu_power_w, as they are.
_N_PLAIN = 39


def load(
    db: Db,
    cfg: Config,
    since: datetime,
    until: datetime,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    pk: int | None = None,
    within: tuple[str, ...] | None = None,
    name: str | None = None,
    ids: Sequence[int] | None = None,
) -> list[JobFacts]:
    """The jobs that ran in [since, until) (of a user, a lab, everyone, or the job `pk`; `within`: only
    those in these labs; `ids`: only these primary keys), most energy first per user."""
    scope = "user" if user is not None else "account" if account is not None else None
    params: dict[str, Any] = {
        "since": since.timestamp(),
        "until": until.timestamp(),
        "since_ts": since,
        "until_ts": until,
    }
    if scope is not None:
        params["key"] = user if user is not None else account
    if cluster:
        params["cluster"] = cluster
    if pk is not None:
        params["pk"] = pk
    if name is not None:
        params["name"] = name
    inside = labs_bound(within)
    for i, a in enumerate(inside):
        params[f"in{i}"] = a
    if ids is not None and not ids:
        return []
    rows = db.rows(_sql(db, scope, bool(cluster), pk is not None, len(inside), name is not None, ids), params)
    # sorted here: the database's collation-aware sort of 10,000 wide rows cost more than the query
    rows.sort(key=lambda r: (r[6], -r[-1], r[0]))
    hw: dict[tuple[Any, Any], Any] = {}
    pg = db.dialect == "postgresql"
    return [_facts(db, cfg, r, hw, pg) for r in rows]


def one(db: Db, cfg: Config, pk: int) -> JobFacts | None:
    """One job, whole (its share is 1 over its own run), or None if it has not started."""
    rows = db.rows("SELECT start_time, end_time, elapsed_s FROM jobs WHERE id = %(pk)s", {"pk": pk})
    if not rows or rows[0][0] is None:
        return None
    from datetime import timedelta

    start = db.timestamp(rows[0][0])
    assert start is not None
    end = start + timedelta(seconds=max(float(rows[0][2] or 0.0), 0.0) + 1.0)
    got = load(db, cfg, start, end, pk=pk)
    return got[0] if got else None


def _facts(
    db: Db, cfg: Config, r: tuple[Any, ...], hw_cache: dict[tuple[Any, Any], Any], pg: bool = True
) -> JobFacts:
    """A row of `_sql` as JobFacts. Positional: the query already did the units and defaults, and this
    runs for each of a heavy user's jobs on the login node."""
    plain = list(r[:_N_PLAIN])
    if not pg:  # SQLite: times as stored text, booleans as 0/1
        plain[12] = db.timestamp(plain[12])
        plain[13] = db.timestamp(plain[13])
        plain[14] = bool(plain[14])
    elif plain[12] is not None and plain[12].tzinfo is not UTC:
        plain[12] = db.timestamp(plain[12])
        plain[13] = db.timestamp(plain[13])
    model, prec, extra, batch, epochs, tokens = r[_N_PLAIN : _N_PLAIN + 6]
    partition, node_list = r[8], r[9]
    key = (partition, node_list if cfg.node_groups else None)
    hw = hw_cache.get(key)
    if hw is None:
        hw = hw_cache[key] = _hardware(cfg, partition, node_list)
    if model is None and prec is None and extra is None:
        prec_class = prec_label = None
    else:
        prec_class, prec_label = precision_of(prec, extra)
    state, slack_h, best_start, now_g, best_g, saved, pause_saved = r[_N_PLAIN + 6 : _N_PLAIN + 13]
    if best_start is not None and (not pg or best_start.tzinfo is not UTC):
        best_start = db.timestamp(best_start)
    plain += (
        float(hw.gpu_tdp_w),
        float(hw.gpu_mem_gb),
        model,
        prec_class,
        prec_label,
        int(batch) if batch is not None else None,
        float(epochs) if epochs is not None else None,
        int(tokens) if tokens is not None else None,
        (),
        state,
        slack_h,
        best_start,
        now_g,
        best_g,
        float(saved),
        float(pause_saved),
        r[_N_PLAIN + 13],
        bool(r[_N_PLAIN + 14]),
        r[_N_PLAIN + 15],
        r[_N_PLAIN + 16],
        hw.gpu_model if hw.gpu_model != "unknown GPU" else None,
        None if r[_N_PLAIN + 17] is None else bool(r[_N_PLAIN + 17]),
        hw.cores_per_node,
        hw.gpus_per_node,
        float(hw.mem_gb),
        tuple(r[_N_PLAIN + 18].split(",")) if r[_N_PLAIN + 18] else (),
    )
    return JobFacts(*plain)


def _hardware(cfg: Config, partition: str | None, node_list: str | None) -> Any:
    nodes: list[str] = []
    if cfg.node_groups and node_list:
        from cocaq.hostlist import expand_hostlist

        try:
            nodes = expand_hostlist(node_list)
        except ValueError:
            nodes = []
    return cfg.hardware_for(partition, nodes)[0]
