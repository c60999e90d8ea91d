"""The schema: SQLAlchemy 2 typed models; Alembic migrations in `migrations/` follow them exactly.

Built for PostgreSQL at scale (per-job totals kept on the job row so user/lab queries are one index range
scan; samples partitioned by time) while the same migrations run on SQLite for one-machine use.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from cocaq.db.coltypes import UTCDateTime
from cocaq.db.sqlfuncs import utcnow

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# Integer primary keys: BIGINT on PostgreSQL, INTEGER (the rowid alias) on SQLite.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Cluster(Base):
    __tablename__ = "clusters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(server_default=func.current_timestamp())
    # Whether the cluster's accounting ever recorded a GPU in a job's TRES (AccountingStorageTRES with
    # gres/gpu): until it has, a job on a GPU partition with no GPU in its TRES has an unknown GPU count
    gpu_tres: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    node_group: Mapped[str | None] = mapped_column(String(128))
    cpus: Mapped[int | None]
    gpus: Mapped[int | None]
    gpu_model: Mapped[str | None] = mapped_column(String(128))
    mem_gb: Mapped[float | None] = mapped_column(Float)


class Job(Base):
    """One Slurm job (array task and het-job component each count as one), with its totals and carbon."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("cluster_id", "job_id", "submit_time"),
        Index("ix_jobs_user_end", "user_name", "end_time"),
        Index("ix_jobs_account_end", "account", "end_time"),
        Index("ix_jobs_partition_end", "partition", "end_time"),
        Index("ix_jobs_cluster_end", "cluster_id", "end_time"),
        Index("ix_jobs_open", "is_open"),
        Index("ix_jobs_updated_at", "updated_at"),  # the aggregator's "changed since"
        Index("ix_jobs_end_time", "end_time"),  # the days a rollup rebuild reads
        Index("ix_jobs_raw_id", "cluster_id", "job_id_raw"),  # samples and shipments name jobs by raw id
        Index("ix_jobs_array", "array_job_id"),  # `cocaq job 123`: an array's tasks
        Index("ix_jobs_het", "het_job_id"),  # `cocaq job 12`: a het job's components
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(String(64))  # as sacct shows it: 123, 123_4, 123+0
    job_id_raw: Mapped[int | None] = mapped_column(BigInteger)
    array_job_id: Mapped[int | None] = mapped_column(BigInteger)
    array_task_id: Mapped[int | None]
    het_job_id: Mapped[int | None] = mapped_column(BigInteger)
    het_job_offset: Mapped[int | None]
    user_name: Mapped[str] = mapped_column(String(64))
    uid: Mapped[int | None]
    account: Mapped[str | None] = mapped_column(String(64))  # the lab
    partition: Mapped[str | None] = mapped_column(String(128))
    qos: Mapped[str | None] = mapped_column(String(64))
    node_list: Mapped[str | None] = mapped_column(Text)
    n_nodes: Mapped[int] = mapped_column(default=0)
    alloc_cpus: Mapped[int] = mapped_column(default=0)
    alloc_gpus: Mapped[int] = mapped_column(default=0)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    req_mem_mb: Mapped[float | None] = mapped_column(Float)
    # sacct's MaxRSS: the largest resident set of one task of any step, and that step's tasks per node
    # (their product bounds the memory the job used on a node)
    max_rss_mb: Mapped[float | None] = mapped_column(Float)
    rss_tasks_per_node: Mapped[int | None]
    # Slurm's own GPU signals (cocaq.slurm.record.JobRecord): gres/gpuutil over the run, summed over the
    # job's GPUs (% of one GPU), and the most GPU memory one task held (MB)
    slurm_gpu_util: Mapped[float | None] = mapped_column(Float)
    slurm_gpu_mem_mb: Mapped[float | None] = mapped_column(Float)
    # sacct showed a `.batch` step (sbatch); false: steps and none of them batch (srun --pty, salloc: an
    # interactive session); NULL: no step was read (sacct -X), not known (cocaq.slurm.record.JobRecord)
    batch_step: Mapped[bool | None] = mapped_column(Boolean)
    # the nodes of a multi-node job on which Slurm accounted no CPU time in any step (comma-separated, in
    # NodeList order; cocaq.slurm.idle_nodes); NULL: none, or its steps cannot tell
    zero_cpu_nodes: Mapped[str | None] = mapped_column(Text)
    # No GPU in the job's TRES on a GPU partition of a cluster whose accounting records none (or it used
    # GPUs by Slurm's gres/gpuutil): how many GPUs it held is not known, and they are not in its energy
    gpus_unknown: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    submit_time: Mapped[datetime]
    start_time: Mapped[datetime | None]
    end_time: Mapped[datetime | None]
    elapsed_s: Mapped[float] = mapped_column(Float, default=0.0)
    time_limit_s: Mapped[float | None] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(32))
    state_detail: Mapped[str | None] = mapped_column(String(128))  # "CANCELLED by 12345"
    is_open: Mapped[bool] = mapped_column(Boolean, default=False)  # RUNNING etc.: will be updated
    exit_code: Mapped[int | None]
    exit_signal: Mapped[int | None]
    name: Mapped[str | None] = mapped_column(Text)
    comment: Mapped[str | None] = mapped_column(Text)
    total_cpu_s: Mapped[float | None] = mapped_column(Float)
    consumed_energy_j: Mapped[float | None] = mapped_column(Float)  # Slurm's ConsumedEnergyRaw
    # Totals of job_energy (IT energy, before PUE) and the carbon used; kept here for fast rollups.
    energy_j: Mapped[float] = mapped_column(Float, default=0.0)
    energy_measured_j: Mapped[float] = mapped_column(Float, default=0.0)
    pue: Mapped[float] = mapped_column(Float, default=1.0)
    carbon_zone: Mapped[str | None] = mapped_column(String(64))
    carbon_g_per_kwh: Mapped[float | None] = mapped_column(Float)
    carbon_source: Mapped[str | None] = mapped_column(String(128))
    carbon_year: Mapped[int | None]
    carbon_flag: Mapped[str | None] = mapped_column(String(64))  # e.g. "unknown-zone"
    co2_g: Mapped[float] = mapped_column(Float, default=0.0)
    hw_profile: Mapped[str | None] = mapped_column(String(160))
    assumptions: Mapped[dict[str, Any] | None]  # what an estimate assumed, to recompute later
    # The range of the estimated part (energy_j - energy_measured_j) where an estimate has one (GPUs from
    # the site's measured jobs, cocaq.accounting.calibrate: their 10th and 90th percentile); None: no range
    # known.
    energy_est_low_j: Mapped[float | None] = mapped_column(Float)
    energy_est_high_j: Mapped[float | None] = mapped_column(Float)
    imported_from: Mapped[str | None] = mapped_column(String(32))
    record_hash: Mapped[str | None] = mapped_column(String(32))  # of the facts; unchanged re-imports skip
    # (utcnow, not CURRENT_TIMESTAMP, for what SQLAlchemy writes: SQLite's has no fraction of a second)
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.current_timestamp(), default=utcnow(), onupdate=utcnow()
    )

    energies: Mapped[list[JobEnergy]] = relationship(
        back_populates="job", cascade="all, delete-orphan", passive_deletes=True
    )


class JobEnergy(Base):
    """Energy of one job on one node by component, measured or estimated, and where it came from.

    A job's rows never overlap: measured node energy (Slurm's ConsumedEnergy) replaces the component
    estimates rather than adding to them, so summing a job's rows gives its energy.
    """

    __tablename__ = "job_energy"
    __table_args__ = (UniqueConstraint("job_pk", "node", "component", "source"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(128), default="")  # "" when not split by node
    component: Mapped[str] = mapped_column(String(16))  # gpu, cpu, dram, other, node
    method: Mapped[str] = mapped_column(String(16))  # measured, estimated
    source: Mapped[str] = mapped_column(String(64))  # nvml, rapl, slurm-consumed-energy, tdp-estimate
    energy_j: Mapped[float] = mapped_column(Float)

    job: Mapped[Job] = relationship(back_populates="energies")


class Sample(Base):
    """Time series from the node collector; partitioned by month of `ts` on PostgreSQL."""

    __tablename__ = "samples"
    __table_args__ = (
        Index("ix_samples_job_ts", "cluster_id", "job_id", "ts"),
        {"postgresql_partition_by": "RANGE (ts)"},
    )

    ts: Mapped[datetime] = mapped_column(primary_key=True)
    cluster_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    source: Mapped[str] = mapped_column(String(32), primary_key=True)  # nvml, rapl, cgroup
    device: Mapped[str] = mapped_column(String(64), primary_key=True)  # gpu0, package-0, job cgroup
    metric: Mapped[str] = mapped_column(String(32), primary_key=True)  # power_w, util_pct, mem_mb, ...
    job_id: Mapped[str | None] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)


class NodeEvent(Base):
    """One record written by a node hook (job start/end with its energy snapshot), as shipped.

    Kept verbatim (`payload`) so that linking to `jobs` can be redone; `uid` makes shipping idempotent.
    """

    __tablename__ = "node_events"
    __table_args__ = (
        Index("ix_node_events_job", "cluster_id", "job_id"),
        Index("ix_node_events_unlinked", "job_pk", "ts"),
    )

    uid: Mapped[str] = mapped_column(String(255), primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(128))
    job_id: Mapped[str] = mapped_column(String(64))  # SLURM_JOB_ID: the raw id, also for array tasks
    event: Mapped[str] = mapped_column(String(16))  # start, end, ctld-start, ctld-end, meta
    ts: Mapped[datetime]
    payload: Mapped[dict[str, Any]]
    job_pk: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    shipped_at: Mapped[datetime] = mapped_column(server_default=func.current_timestamp())


class NodeEnergy(Base):
    """Measured energy of one job on one node and device, cumulative since the job started there.

    The collector re-ships a growing value while the job runs and the epilog ships the final one; a row
    is only ever replaced by one with a later `t1`, so replays and late batches cannot regress it.
    """

    __tablename__ = "node_energy"
    __table_args__ = (
        UniqueConstraint("cluster_id", "node", "job_id", "job_start", "component", "device", "source"),
        Index("ix_node_energy_job", "cluster_id", "job_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(128))
    job_id: Mapped[str] = mapped_column(String(64))
    job_start: Mapped[datetime]  # when the job started on this node (prolog), to tell reused ids apart
    component: Mapped[str] = mapped_column(String(16))  # gpu, cpu, dram
    device: Mapped[str] = mapped_column(String(128))  # GPU UUID, RAPL domain, "" for a node total
    source: Mapped[str] = mapped_column(String(64))  # nvml, nvml-power-integral, rapl-cputime-share
    method: Mapped[str] = mapped_column(String(16))  # measured
    energy_j: Mapped[float] = mapped_column(Float)
    t0: Mapped[datetime]
    t1: Mapped[datetime]
    final: Mapped[bool] = mapped_column(Boolean, default=False)  # from the epilog: will not change


class NodeShipment(Base):
    """Batches of samples a node has shipped: a batch seen here was committed, so a replay is skipped."""

    __tablename__ = "node_shipments"
    __table_args__ = (
        UniqueConstraint("cluster_id", "node", "batch"),
        Index("ix_node_shipments_shipped_at", "shipped_at"),  # the aggregator's "new samples since"
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(128))
    batch: Mapped[str] = mapped_column(String(128))  # spool incarnation + first/last row id
    rows: Mapped[int]
    # The raw job ids the batch has samples of, space-separated: which jobs' GPU use must be derived again.
    job_ids: Mapped[str | None] = mapped_column(Text)
    shipped_at: Mapped[datetime] = mapped_column(server_default=func.current_timestamp())


class ModelMetadata(Base):
    """What an ML job trained or served, merged from its sources, to relate energy to models.

    One row per job. Each key's value comes from the most trusted source that gave one (an `api` call
    from inside the job over the `comment`, both over what the collector `detected`); `sources` maps each
    key to that source. Keys cocaq does not know are kept, validated as short strings or numbers, in `extra`.
    """

    __tablename__ = "model_metadata"
    __table_args__ = (UniqueConstraint("job_pk"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    model_name: Mapped[str | None] = mapped_column(String(256))
    task: Mapped[str | None] = mapped_column(String(64))
    framework: Mapped[str | None] = mapped_column(String(64))
    framework_version: Mapped[str | None] = mapped_column(String(64))
    parameters: Mapped[int | None] = mapped_column(BigInteger)
    precision: Mapped[str | None] = mapped_column(String(32))
    batch_size: Mapped[int | None] = mapped_column(BigInteger)
    dataset: Mapped[str | None] = mapped_column(String(256))
    epochs: Mapped[float | None] = mapped_column(Float)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    extra: Mapped[dict[str, Any] | None]
    sources: Mapped[dict[str, Any] | None]  # key -> comment | api | detected
    recorded_at: Mapped[datetime] = mapped_column(server_default=func.current_timestamp())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.current_timestamp())


class CarbonIntensity(Base):
    """Carbon intensity of a zone over an interval, with where the figure came from."""

    __tablename__ = "carbon_intensity"
    # One value per zone, basis and time: a later import of the same hours replaces the earlier one.
    __table_args__ = (UniqueConstraint("zone", "kind", "ts_start"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    zone: Mapped[str] = mapped_column(String(64))
    ts_start: Mapped[datetime]
    ts_end: Mapped[datetime]
    g_per_kwh: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16), default="lifecycle")  # lifecycle or direct
    source: Mapped[str] = mapped_column(String(128))
    provenance: Mapped[str | None] = mapped_column(Text)


class JobMetrics(Base):
    """What the aggregator derives per job: carbon over its run time, embodied CO2, GPU use and idling.

    Kept apart from `jobs` (which imports rewrite) so that a re-import never loses it; `computed_at`
    against `jobs.updated_at` says when it must be derived again.
    """

    __tablename__ = "job_metrics"

    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    co2_embodied_g: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_util_pct: Mapped[float | None] = mapped_column(Float)  # energy-weighted mean over its GPU samples
    gpu_samples_s: Mapped[float] = mapped_column(Float, default=0.0)  # GPU-seconds that samples cover
    idle_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)  # allocated GPU-seconds under threshold
    idle_gpu_energy_j: Mapped[float] = mapped_column(Float, default=0.0)
    # GPU energy that the samples saw: the weight of gpu_util_pct when days and months average it (the
    # job's GPU energy component is 0 where it was measured for the whole node)
    gpu_samples_j: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_mem_peak_mb: Mapped[float | None] = mapped_column(Float)  # the most memory one of its GPUs held
    # where gpu_util_pct and the idle figures come from: "samples" (the collector's), "slurm" (Slurm's
    # gres/gpuutil and gres/gpumem, for a job that no collector sampled); None: no GPU figures
    gpu_util_source: Mapped[str | None] = mapped_column(String(16))
    carbon_detail: Mapped[dict[str, Any] | None]  # how the intensity was chosen: series coverage, fallbacks
    # When to run (cocaq.accounting.shifting): the job started at its best hour within its slack, and
    # run in the cheapest hours of its window (pausing), against when it ran, over the zone's hourly
    # series. shift_state says whether it has these figures ("ok") or why not; the grams are its CO2
    # times the share saved (0 without figures).
    shift_state: Mapped[str | None] = mapped_column(String(16))
    shift_slack_s: Mapped[float | None] = mapped_column(Float)
    shift_now_g: Mapped[float | None] = mapped_column(Float)  # g/kWh over its run (flat power)
    shift_best_g: Mapped[float | None] = mapped_column(Float)  # ... at the best contiguous start
    shift_best_start: Mapped[datetime | None]
    shift_pause_g: Mapped[float | None] = mapped_column(Float)  # ... in the cheapest hours, pausing
    shift_saved_g: Mapped[float] = mapped_column(Float, default=0.0)
    shift_pause_saved_g: Mapped[float] = mapped_column(Float, default=0.0)
    # The days the job was last counted in (UTC midnights): if its times change, those days are redone too.
    rolled_from: Mapped[datetime | None]
    rolled_to: Mapped[datetime | None]
    computed_at: Mapped[datetime] = mapped_column(server_default=func.current_timestamp())


class JobGpuHour(Base):
    """Per raw job id and hour: what its GPU samples say (energy, utilisation, idle time and energy).

    Derived from `samples`, which for a finished job rarely change: the aggregator keeps these rows and
    derives them again only for jobs with newly shipped samples (`node_shipments.job_ids`), running jobs,
    or when the parameters they depend on (`aggregator_state` 'gpu_hours') change, so that a full
    recompute does not re-read every sample.
    """

    __tablename__ = "job_gpu_hours"

    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)  # as samples.job_id
    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # hours since the epoch, UTC
    energy_j: Mapped[float] = mapped_column(Float, default=0.0)  # GPU power x time
    util_energy: Mapped[float] = mapped_column(Float, default=0.0)  # utilisation % x power x time
    seconds: Mapped[float] = mapped_column(Float, default=0.0)  # GPU-seconds the samples cover
    idle_s: Mapped[float] = mapped_column(Float, default=0.0)
    idle_j: Mapped[float] = mapped_column(Float, default=0.0)
    mem_peak_mb: Mapped[float | None] = mapped_column(Float)  # the most memory one of its GPUs held


class DailyRollup(Base):
    """Per day x user x account x partition: what reports and the CLI read instead of scanning jobs.

    A job counts in each day it ran, pro rata to the hours in that day (as the CLI's windows do), so
    days add up to months exactly. Rebuilt per day, so re-running any window gives the same rows.
    Its columns by name, as the aggregator, the CLI and the reports use them: cocaq.db.rollup_columns.
    """

    __tablename__ = "daily_rollups"
    __table_args__ = (
        UniqueConstraint("cluster_id", "day", "user_name", "account", "partition"),
        Index("ix_daily_rollups_user_day", "user_name", "day"),
        Index("ix_daily_rollups_account_day", "account", "day"),
        Index("ix_daily_rollups_day", "day"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    day: Mapped[datetime]  # 00:00 UTC of the day
    user_name: Mapped[str] = mapped_column(String(64))
    account: Mapped[str] = mapped_column(String(64), default="")
    partition: Mapped[str] = mapped_column(String(128), default="")
    jobs: Mapped[int] = mapped_column(default=0)  # jobs that ran in the day (a job in several days: each)
    jobs_failed: Mapped[int] = mapped_column(default=0)  # FAILED, NODE_FAIL, BOOT_FAIL
    jobs_oom: Mapped[int] = mapped_column(default=0)
    jobs_cancelled: Mapped[int] = mapped_column(default=0)
    jobs_timeout: Mapped[int] = mapped_column(default=0)  # TIMEOUT, DEADLINE
    cpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    energy_gpu_j: Mapped[float] = mapped_column(Float, default=0.0)
    energy_cpu_j: Mapped[float] = mapped_column(Float, default=0.0)
    energy_dram_j: Mapped[float] = mapped_column(Float, default=0.0)
    energy_other_j: Mapped[float] = mapped_column(Float, default=0.0)  # node-level measurements
    energy_measured_j: Mapped[float] = mapped_column(Float, default=0.0)
    energy_estimated_j: Mapped[float] = mapped_column(Float, default=0.0)
    # The range of energy_estimated_j (jobs' energy_est_low_j/high_j, the estimate itself where a job has
    # none); None in days rolled up before the range existed: read as energy_estimated_j.
    energy_est_low_j: Mapped[float | None] = mapped_column(Float)
    energy_est_high_j: Mapped[float | None] = mapped_column(Float)
    # What did no work, in disjoint parts (cocaq.accounting.ledger): idle GPUs (below), then the rest of the
    # energy
    # of jobs that failed, ran out of memory, timed out or were cancelled.
    energy_failed_j: Mapped[float] = mapped_column(Float, default=0.0)
    energy_oom_j: Mapped[float] = mapped_column(Float, default=0.0)
    energy_timeout_j: Mapped[float] = mapped_column(Float, default=0.0)
    energy_cancelled_j: Mapped[float] = mapped_column(Float, default=0.0)
    co2_g: Mapped[float] = mapped_column(Float, default=0.0)  # operational, with PUE
    co2_embodied_g: Mapped[float] = mapped_column(Float, default=0.0)  # scope 3, reported apart
    gpu_util_energy_j: Mapped[float] = mapped_column(Float, default=0.0)  # GPU energy with utilisation data
    gpu_util_weighted: Mapped[float] = mapped_column(Float, default=0.0)  # sum(util% x energy): mean = /above
    idle_gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    idle_gpu_energy_j: Mapped[float] = mapped_column(Float, default=0.0)  # at most the GPU energy
    # When to run: the CO2 of the jobs with shifting figures (job_metrics.shift_state "ok"), and what
    # their best start within the slack, or pausing, would have saved
    shift_co2_g: Mapped[float] = mapped_column(Float, default=0.0)
    shift_saved_g: Mapped[float] = mapped_column(Float, default=0.0)
    shift_pause_saved_g: Mapped[float] = mapped_column(Float, default=0.0)
    computed_at: Mapped[datetime] = mapped_column(server_default=func.current_timestamp())


class AggregatorState(Base):
    """Watermarks of the aggregator's incremental runs (which jobs changed since the last one)."""

    __tablename__ = "aggregator_state"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    watermark: Mapped[datetime | None]
    params: Mapped[str | None] = mapped_column(String(256))  # what derived rows depend on, to redo on change
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.current_timestamp(), onupdate=func.current_timestamp()
    )


class User(Base):
    """Where and how often to tell a user about their footprint."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    email: Mapped[str | None] = mapped_column(String(320))
    full_name: Mapped[str | None] = mapped_column(String(256))
    monthly_email: Mapped[bool] = mapped_column(Boolean, default=True)
    job_email: Mapped[bool] = mapped_column(Boolean, default=False)
    opted_out: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.current_timestamp(), onupdate=func.current_timestamp()
    )


class SentReport(Base):
    """Each report or e-mail sent, so none is sent twice and failures are visible."""

    __tablename__ = "sent_reports"
    __table_args__ = (
        UniqueConstraint("kind", "recipient", "period_start"),
        Index("ix_sent_reports_user_kind", "user_name", "kind"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # user-monthly, job, lab-monthly, admin
    recipient: Mapped[str] = mapped_column(String(320))  # the address
    # The Slurm user a user-addressed report was for (None for labs and admins): addresses change.
    user_name: Mapped[str | None] = mapped_column(String(64))
    period_start: Mapped[datetime]
    period_end: Mapped[datetime]
    sent_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(String(16))  # sent, failed, skipped
    message_id: Mapped[str | None] = mapped_column(String(256))
    error: Mapped[str | None] = mapped_column(Text)


class JobNotice(Base):
    """A job that a job e-mail tells of: bound once, to one digest, before that digest is sent.

    `digest_at` is the digest's key, its `sent_reports.period_start` (kind "job"); the digest was sent
    when that ledger row (with this `user_name`) is `sent`. The primary key makes a job belong to one
    digest only, whichever runs race (reports/jobmail.py).
    """

    __tablename__ = "job_notices"
    __table_args__ = (Index("ix_job_notices_digest", "digest_at", "user_name"),)

    job_pk: Mapped[int] = mapped_column(
        BigId, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    user_name: Mapped[str] = mapped_column(String(64))
    digest_at: Mapped[datetime]


class JobAlert(Base):
    """An alert sent about a job while it ran (GPUs held idle): at most one of a kind per job.

    `alerted_at` is the alert's key in the ledger (`sent_reports.period_start`, kind = `kind`), so that
    it is sent exactly once; the per-user throttle reads the user's latest alerts here.
    """

    __tablename__ = "job_alerts"
    __table_args__ = (Index("ix_job_alerts_user_at", "user_name", "alerted_at"),)

    job_pk: Mapped[int] = mapped_column(
        BigId, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)  # idle-gpu
    user_name: Mapped[str] = mapped_column(String(64))
    alerted_at: Mapped[datetime]
    detail: Mapped[dict[str, Any] | None]  # what the alert said (idle minutes, GPUs, energy)


class SchedulerRun(Base):
    """Each run of a `cocaq scheduler` job (or `--once`): what ran, where, when, and how it ended.

    `status`: running (written at the start, so a run that died stays visible), ok, skipped (nothing to do
    on this host: no sacct, no aggregator or reports in this version) or error; `summary` is one line.
    """

    __tablename__ = "scheduler_runs"
    __table_args__ = (Index("ix_scheduler_runs_job_started", "job_id", "started_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(String(16))
    summary: Mapped[str] = mapped_column(Text, default="")
    via: Mapped[str] = mapped_column(String(16), default="scheduler")  # scheduler, once
    host: Mapped[str] = mapped_column(String(255), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)


class GpuPowerCalibration(Base):
    """What the site's measured jobs drew per GPU, by GPU model, partition and utilisation bucket.

    Learnt by cocaq.accounting.calibrate from jobs whose GPUs were all measured, weighted by GPU-hours; the
    estimate
    of a job that nothing measured takes its cell's median (and its 10th-90th percentile as the range).
    `partition` "" is the model's row over all partitions; `bucket` "any" the row over all utilisations.
    """

    __tablename__ = "gpu_power_calibration"
    __table_args__ = (UniqueConstraint("gpu_model", "partition", "bucket"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    gpu_model: Mapped[str] = mapped_column(
        String(64)
    )  # normalised: h100, a100, v100 (cocaq.accounting.calibrate)
    partition: Mapped[str] = mapped_column(String(128), default="")  # "": all partitions
    bucket: Mapped[str] = mapped_column(String(16), default="any")  # "any", or "0-25" (% utilisation)
    util_lo: Mapped[float | None] = mapped_column(Float)
    util_hi: Mapped[float | None] = mapped_column(Float)
    w_median: Mapped[float] = mapped_column(Float)  # W per GPU
    w_p10: Mapped[float] = mapped_column(Float)
    w_p90: Mapped[float] = mapped_column(Float)
    jobs: Mapped[int] = mapped_column(default=0)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    computed_at: Mapped[datetime]


class GpuPowerKeyed(Base):
    """What one user's measured jobs drew per GPU: by job name (`series`) or over all (`user`), per GPU model
    and GPU count (cocaq.accounting.power_bases). The estimate of that user's next such job starts here."""

    __tablename__ = "gpu_power_keyed"
    __table_args__ = (UniqueConstraint("basis", "gpu_model", "key"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    basis: Mapped[str] = mapped_column(String(16))  # series, user
    gpu_model: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(Text)  # user, job name and GPU count, separated by U+001F
    w_median: Mapped[float] = mapped_column(Float)
    w_p10: Mapped[float] = mapped_column(Float)
    w_p90: Mapped[float] = mapped_column(Float)
    jobs: Mapped[int] = mapped_column(default=0)
    runs: Mapped[int] = mapped_column(default=0)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    computed_at: Mapped[datetime]


class GpuPowerBasis(Base):
    """How each basis of the GPU estimate did on held-out runs of the site's measured jobs: whether it is
    used, its median error, the range it gives (log ratios) and how often that range held the truth."""

    __tablename__ = "gpu_power_bases"

    basis: Mapped[str] = mapped_column(String(32), primary_key=True)
    used: Mapped[bool] = mapped_column(Boolean, default=False)
    jobs: Mapped[int] = mapped_column(default=0)
    runs: Mapped[int] = mapped_column(default=0)
    median_err: Mapped[float | None] = mapped_column(Float)
    p90_err: Mapped[float | None] = mapped_column(Float)
    err_instead: Mapped[float | None] = mapped_column(Float)
    coverage: Mapped[float | None] = mapped_column(Float)
    log_lo: Mapped[float] = mapped_column(Float, default=0.0)
    log_hi: Mapped[float] = mapped_column(Float, default=0.0)
    widened: Mapped[bool] = mapped_column(Boolean, default=False)
    computed_at: Mapped[datetime]


class StudyArm(Base):
    """A user's arm in the e-mail study (`[study]`, cocaq.study): drawn once, never changed while it runs.

    `draw` is the user's uniform number from the study's seed and their name (cocaq.study.assign), the
    documented randomness; `stratum` their GPU-hours band over the baseline months (0: none, 1-4: the
    quartiles of those with some; -1: joined after the start), `block` their run of users within it by
    baseline CO2. A user who opted out of the e-mails stays
    in their arm (the analysis is by arm as drawn) and is recorded apart (`opted_out_at`).
    """

    __tablename__ = "study_arms"
    __table_args__ = (Index("ix_study_arms_arm", "study", "arm"),)

    # cocaq.study.assign.study_id: "2026-09/seed 7" (a seed from the config), "2026-09" (a random one)
    study: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    arm: Mapped[str] = mapped_column(String(16))  # emailed, hold-out
    stratum: Mapped[int]
    # the block within the stratum (users ranked by baseline CO2, block_size of them); None: a joiner, or a
    # study drawn before blocks (stratum only)
    block: Mapped[int | None]
    gpu_hours_before: Mapped[float] = mapped_column(Float, default=0.0)
    draw: Mapped[float] = mapped_column(Float)
    assigned_at: Mapped[datetime]
    opted_out_at: Mapped[datetime | None]


class StudySeed(Base):
    """The seed of a study drawn without `[study] seed`: drawn at random (cocaq.study.assign) by its first
    draw, so that nobody can redo the draw from the config, and kept so that joiners and the report use
    the same. Decimal text (128 bits). Admins only: whoever has it can tell every user's arm."""

    __tablename__ = "study_seeds"

    study: Mapped[str] = mapped_column(String(64), primary_key=True)  # its start month, "2026-09"
    seed: Mapped[str] = mapped_column(String(40))
    drawn_at: Mapped[datetime]


class StudyProtocol(Base):
    """What a study is judged by, kept at its first draw: before any e-mail is held back and before any of
    its months has data, so that the primary outcome cannot be chosen after seeing the results. A later
    `[study] primary` does not change it (the report says so)."""

    __tablename__ = "study_protocols"

    study: Mapped[str] = mapped_column(String(64), primary_key=True)  # the study's key (study_arms.study)
    primary_outcome: Mapped[str] = mapped_column(String(64))  # cocaq.config.STUDY_OUTCOMES
    declared_at: Mapped[datetime]


class MonthAnswer(Base):
    """A settled month's answer for one user (GET /v1/users/{user}/month: the month e-mail and its
    figures), kept by `cocaq report keep` so that the web app need not compute a whole month's e-mail on
    every view. Served only while `stamp` (cocaq.reports.month_store: what the month's data and the
    site's settings were when it was kept) is still what they are; otherwise computed again."""

    __tablename__ = "month_answers"
    __table_args__ = (UniqueConstraint("user_name", "cluster", "month_start"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_name: Mapped[str] = mapped_column(String(64))
    cluster: Mapped[str] = mapped_column(String(64))  # the cluster asked for; "" for all of them
    month_start: Mapped[datetime]
    stamp: Mapped[str] = mapped_column(String(64))
    kept_at: Mapped[datetime]
    answer: Mapped[bytes] = mapped_column(LargeBinary)  # the answer as JSON, zlib-compressed
