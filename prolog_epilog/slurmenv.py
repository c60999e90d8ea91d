"""The job as a Slurm hook sees it: environment variables, read defensively.

Everything here is user-controlled or nearly so (job name, comment, account strings), arrives as bytes
that need not be UTF-8, and may be huge. Values are decoded with replacement, stripped of control
characters, and cut to a bound; identifiers that we use in file names must match a strict shape.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

MAX_VALUE = 1024  # most variables
MAX_TEXT = 4096  # job name, comment
_CONTROL = {i: "?" for i in [*range(0, 9), *range(11, 32), 127]}
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
NAME = _ALNUM | frozenset("._@+-")  # user and account names
PARTITION = _ALNUM | frozenset("._,-")
HOSTLIST = _ALNUM | frozenset(".,[]_-")
GPUS = _ALNUM | frozenset(",:_.-")

CONTEXTS = {
    "prolog_slurmd": "prolog",
    "epilog_slurmd": "epilog",
    "prolog_slurmctld": "prologslurmctld",
    "epilog_slurmctld": "epilogslurmctld",
}
KINDS = ("prolog", "epilog", "prologslurmctld", "epilogslurmctld")


def _decode(raw: bytes | str | None, limit: int) -> tuple[str | None, bool]:
    """(value, truncated); None when absent."""
    if raw is None:
        return None, False
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    cut = len(raw) > limit
    text = raw[:limit].decode("utf-8", "replace")
    return text.translate(_CONTROL), cut


class JobEnv:
    __slots__ = ("fields", "job_id", "kind", "problems")

    def __init__(self, job_id: str, kind: str) -> None:
        self.job_id = job_id
        self.kind = kind  # prolog, epilog, prologslurmctld, epilogslurmctld
        self.fields: dict[str, Any] = {}
        self.problems: list[str] = []

    def get(self, key: str) -> Any:
        return self.fields.get(key)


# (variable, key in the record, limit, validator)
_VARS: tuple[tuple[str, str, int, frozenset[str] | None], ...] = (
    ("SLURM_JOB_USER", "user", 128, NAME),
    ("SLURM_JOB_ACCOUNT", "account", 128, NAME),
    ("SLURM_JOB_PARTITION", "partition", 256, PARTITION),
    ("SLURM_NODELIST", "node_list", MAX_VALUE, HOSTLIST),  # the slurmd Prolog/Epilog's name (22.05)
    ("SLURM_JOB_NODELIST", "node_list", MAX_VALUE, HOSTLIST),  # PrologSlurmctld/EpilogSlurmctld's
    ("SLURM_JOB_GPUS", "gpus", MAX_VALUE, GPUS),
    ("CUDA_VISIBLE_DEVICES", "cuda_visible_devices", MAX_VALUE, GPUS),
    ("SLURM_JOB_CONSTRAINTS", "constraints", MAX_VALUE, None),
    ("SLURM_JOB_NAME", "name", MAX_TEXT, None),
    ("SLURM_JOB_COMMENT", "comment", MAX_TEXT, None),
    ("SLURM_JOB_EXTRA", "extra", MAX_TEXT, None),
    ("SLURM_WCKEY", "wckey", 256, None),
    ("SLURM_CLUSTER_NAME", "cluster", 128, NAME),
    ("SLURMD_NODENAME", "node", 128, NAME),
    ("SLURM_JOB_QOS", "qos", 128, NAME),
    ("SLURM_JOB_EXIT_CODE", "exit_code", 32, None),
    ("SLURM_JOB_DERIVED_EC", "derived_exit_code", 32, None),
    ("SLURM_JOB_STATE", "state", 64, None),
)
_INTS = (
    ("SLURM_JOB_UID", "uid"),
    ("SLURM_JOB_GID", "gid"),
    ("SLURM_ARRAY_JOB_ID", "array_job_id"),
    ("SLURM_ARRAY_TASK_ID", "array_task_id"),
    ("SLURM_HET_JOB_ID", "het_job_id"),
    ("SLURM_JOB_CPUS_PER_NODE", "cpus_per_node"),
)


def read_env(kind_arg: str | None, environ: Mapping[bytes, bytes] | None = None) -> JobEnv:
    """The hook's job; raises ValueError with a one-line reason when there is no usable job id."""
    env = os.environb if environ is None else environ

    def raw(name: str) -> bytes | None:
        return env.get(name.encode())

    if kind_arg:
        kind = kind_arg.lower().replace("-", "").replace("_", "")
        if kind not in KINDS:
            raise ValueError(f"unknown hook kind {kind_arg!r} (expected one of: {', '.join(KINDS)})")
    else:
        ctx, _ = _decode(raw("SLURM_SCRIPT_CONTEXT"), 64)
        if not ctx or ctx not in CONTEXTS:
            raise ValueError(f"no hook kind given and SLURM_SCRIPT_CONTEXT is {ctx!r}")
        kind = CONTEXTS[ctx]
    job_id, _ = _decode(raw("SLURM_JOB_ID") or raw("SLURM_JOBID"), 32)
    if not job_id or not job_id.isdigit() or len(job_id) > 20:
        raise ValueError(f"SLURM_JOB_ID is missing or not a number: {job_id!r}")
    job = JobEnv(job_id=job_id, kind=kind)
    for var, key, limit, pattern in _VARS:
        value, cut = _decode(raw(var), limit)
        if value is None or value == "":
            continue
        if cut:
            job.problems.append(f"{var} longer than {limit} bytes, truncated")
        if pattern is not None and not pattern.issuperset(value):
            job.problems.append(f"{var} has an unexpected shape, ignored: {value[:64]!r}")
            continue
        job.fields[key] = value
    for var, key in _INTS:
        value, _ = _decode(raw(var), 32)
        if value is None or value == "":
            continue
        head = value.split("(")[0].split(",")[0]  # SLURM_JOB_CPUS_PER_NODE: "4(x2),2"
        if head.isdigit():
            job.fields[key] = int(head)
        else:
            job.problems.append(f"{var} is not a number, ignored: {value[:32]!r}")
    return job
