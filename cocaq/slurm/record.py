"""One job as cocaq understands it, whatever Slurm output it came from."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# States of a job that may still change: imported, and updated by a later import.
OPEN_STATES = frozenset(
    {
        "RUNNING",
        "SUSPENDED",
        "COMPLETING",
        "CONFIGURING",
        "RESIZING",
        "REQUEUED",
        "STAGE_OUT",
        "SIGNALING",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "SPECIAL_EXIT",
        "STOPPED",
        "POWER_UP_NODE",
        "UPDATE_DB",
    }
)
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)
NOT_STARTED_STATES = frozenset({"PENDING"})
# A job id as users give it: 1234, an array task 1234_7, a het job component 1234+1.
JOB_ID_PATTERN = r"[0-9]{1,20}(?:_[0-9]{1,10}|\+[0-9]{1,4})?"


@dataclass(slots=True)
class JobRecord:
    job_id: str  # as sacct shows it: 123, 123_4, 123+0
    user_name: str
    submit_time: datetime
    state: str
    cluster: str | None = None
    job_id_raw: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    node_list: str | None = None
    n_nodes: int = 0
    alloc_cpus: int = 0
    alloc_gpus: int = 0
    gpu_type: str | None = None
    req_mem_mb: float | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    elapsed_s: float = 0.0
    time_limit_s: float | None = None
    state_detail: str | None = None
    is_open: bool = False
    exit_code: int | None = None
    exit_signal: int | None = None
    name: str | None = None
    comment: str | None = None
    total_cpu_s: float | None = None
    consumed_energy_j: float | None = None
    # sacct's MaxRSS: the largest resident set of one task in any step (MB), and that step's tasks per
    # node; their product bounds what the job held on one node (names = the `jobs` columns: recompute)
    max_rss_mb: float | None = None
    rss_tasks_per_node: int | None = None
    # Slurm's own GPU signals (gres/gpuutil, gres/gpumem in the steps' TRESUsageIn*, with a gpu plugin and
    # AccountingStorageTRES naming them): GPU use over the run, summed over the job's GPUs (% of one GPU:
    # 150 = one and a half GPUs busy), and the most GPU memory one task held (MB, summed over its GPUs)
    slurm_gpu_util: float | None = None
    slurm_gpu_mem_mb: float | None = None
    # Whether the job ran a batch step (`JOBID.batch`: sbatch); False: its steps were read and none is
    # (srun --pty, salloc: an interactive session, cocaq.accounting.sessions); None: no step was read
    # (sacct -X, or a job that ran none), so nothing is known
    batch_step: bool | None = None
    # The job's nodes (comma-separated, in NodeList order) on which Slurm accounted no CPU time in any step,
    # from each step's least-used task (sacct TRESUsageInMin/MinNode/MinTask, cocaq.slurm.idle_nodes);
    # None: none, or the steps cannot tell (one node, several tasks per node, nothing gathered)
    zero_cpu_nodes: str | None = None
