"""Which way Slurm's accounting is read: sacct's CLI (JSON, or its text output) or slurmdbd through
pyslurm, as `[slurm] backend` or `--backend` says; "auto" takes pyslurm where it loads and was built for
the Slurm this host runs, else sacct, and says which it took and why."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cocaq.config import SLURM_BACKENDS, Config
from cocaq.errors import InputError
from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import ParseStats


@dataclass
class Accounting:
    kind: str  # "pyslurm", "json" (sacct --json) or "parsable" (sacct --parsable2)
    records: Iterable[JobRecord]
    stats: ParseStats
    note: str  # "auto"'s choice and why ("" for a backend asked by name)

    @property
    def label(self) -> str:
        """What read the jobs, for summary lines: "sacct json", "sacct parsable" or "pyslurm slurmdbd"."""
        return "pyslurm slurmdbd" if self.kind == "pyslurm" else f"sacct {self.kind}"

    @property
    def source(self) -> str:
        """The jobs' `source` column: sacct-json, sacct-parsable or slurmdb-pyslurm."""
        return "slurmdb-pyslurm" if self.kind == "pyslurm" else f"sacct-{self.kind}"


def _version_text(v: tuple[int, int] | None) -> str:
    return f"{v[0]}.{v[1]:02d}" if v else "unknown"


def choose(backend: str, sacct: str | None) -> tuple[str, Any, str]:
    """("pyslurm", the module, note) or ("cli", None, note); the note says why "auto" chose. InputError
    (one line) where `backend` is "pyslurm" and pyslurm is missing, does not load or was built for
    another Slurm release."""
    from cocaq.slurm.run import find_sacct, slurm_version
    from cocaq.slurm.slurmdb import PyslurmMissing, built_for, load_pyslurm, probe_pyslurm

    if backend not in SLURM_BACKENDS:
        raise InputError(f"unknown Slurm backend {backend!r} (expected one of: {', '.join(SLURM_BACKENDS)})")
    if backend == "cli":
        return "cli", None, ""
    try:
        version = probe_pyslurm()
    except PyslurmMissing:
        if backend == "pyslurm":
            raise
        return "cli", None, ""  # the usual case: nothing to say
    except InputError as exc:  # installed, and does not load: worth a line
        if backend == "pyslurm":
            raise
        return "cli", None, f"auto: sacct, as {exc}"
    exe = find_sacct(sacct)
    running = slurm_version(exe) if exe else None
    made_for = built_for(version)
    if exe and running is None and backend == "auto":  # cannot tell whether pyslurm fits: what is here
        return "cli", None, f"auto: sacct, as `{exe} --version` does not say which Slurm runs here"
    if running is not None and made_for != running:
        msg = (
            f"pyslurm {version} is built for Slurm {_version_text(made_for)}, but this host runs"
            f" Slurm {_version_text(running)} ({exe} --version)"
        )
        if backend == "pyslurm":
            raise InputError(f'{msg}: install the pyslurm release for it, or use [slurm] backend = "cli"')
        return "cli", None, f"auto: sacct, as {msg}"
    ps = load_pyslurm()
    if backend == "pyslurm":
        return "pyslurm", ps, ""
    if running is None:
        return "pyslurm", ps, f"auto: pyslurm {version} (no sacct on this host to compare its version)"
    made = _version_text(running)
    return "pyslurm", ps, f"auto: pyslurm {version}, built for the Slurm {made} running here"


def read_accounting(
    cfg: Config,
    start: datetime,
    end: datetime,
    *,
    all_users: bool,
    backend: str | None = None,
    sacct: str | None = None,
    use_json: bool = True,
    default_cluster: str | None = None,
) -> Accounting:
    """The jobs Slurm accounts for in [start, end], read the configured (or given) way."""
    from cocaq.slurm import sacct as sacct_mod

    stats = sacct_mod.ParseStats()
    cluster = default_cluster or cfg.cluster.name
    exe = sacct or cfg.slurm.sacct
    kind, ps, note = choose(backend or cfg.slurm.backend, exe)
    if kind == "pyslurm":
        from cocaq.slurm.slurmdb import iter_slurmdb

        # read now, not lazily: an unreachable slurmdbd is the caller's one-line error before any import
        records: Iterable[JobRecord] = list(
            iter_slurmdb(start, end, all_users=all_users, default_cluster=cluster, stats=stats, pyslurm=ps)
        )
        # pyslurm carries no gres usage of the steps: Slurm's GPU use of the GPU jobs comes from sacct
        from cocaq.slurm.gpu_usage import add_gpu_usage
        from cocaq.slurm.run import find_sacct

        why = add_gpu_usage(records, find_sacct(exe), cluster)
        return Accounting("pyslurm", records, stats, f"{note}; {why}" if why and note else why or note)
    from cocaq.slurm.run import run_sacct

    out = run_sacct(start, end, all_users=all_users, sacct=exe, use_json=use_json)
    if out.kind == "json":
        records = sacct_mod.iter_json(out.data, default_cluster=cluster, stats=stats)
    else:
        records = sacct_mod.iter_parsable(
            out.data.splitlines(keepends=True),
            tz=cfg.tz(),
            delimiter=out.delimiter,
            default_cluster=cluster,
            stats=stats,
        )
    return Accounting(out.kind, records, stats, note)
