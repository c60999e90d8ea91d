"""Builders for the tests' inputs: a cocaq.toml from keyword overrides per section, and a job as sacct shows it.

The tests once carried a copy of these each (a config helper writing its own TOML, a `_job()` filling in
every JobRecord field); the copies drifted only in their defaults. Here the shape is written once: a test
says what differs (`config(tmp_path, url, cluster={"pue": 1.5})`, `job(7, start, 2.0, gpus=4)`), or binds
its file's defaults once with functools.partial. Both return plain values (a Config loaded from a real
file, as cocaq reads it, and a JobRecord), so a test builds exactly the input it did before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from cocaq.config import Config
from cocaq.config_load import load_config
from cocaq.slurm.record import JobRecord

# What (nearly) every test's cocaq.toml says: the cluster "c", and the TDPs that make estimates round.
BASE_SECTIONS: dict[str, dict[str, Any]] = {
    "cluster": {"name": "c"},
    "defaults": {"gpu_tdp_w": 400, "cpu_tdp_w_per_core": 10},
}

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else json.dumps(k, ensure_ascii=False)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items() if x is not None) + " }"
    raise TypeError(f"no TOML for {v!r}")


def _table(name: str, keys: Mapping[str, Any]) -> list[str]:
    """`[name]` with its keys; a dict value becomes the sub-table `[name.key]`; a None value is left out."""
    lines = [f"[{name}]"]
    subs = []
    for k, v in keys.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            subs.append((f"{name}.{_key(k)}", v))
        else:
            lines.append(f"{_key(k)} = {_value(v)}")
    for sub, table in subs:
        lines += _table(sub, table)
    return lines


def toml_table(name: str, keys: Mapping[str, Any]) -> str:
    """The TOML text of the table `[name]` (a dict value: a sub-table; a None value: left out)."""
    return "\n".join(_table(name, keys)) + "\n"


def config_toml(
    database_url: str | None = None,
    extra: str = "",
    *,
    base: bool = True,
    **sections: Mapping[str, Any] | None,
) -> str:
    """A cocaq.toml: the base sections (unless `base=False`) updated key by key with `sections`, then `extra`.

    `cluster={"pue": 1.2}` adds to [cluster]; a key set to None is left out (`defaults={"cpu_tdp_w_per_core":
    None}`), a section set to None too. `extra` is TOML text appended as is (a [mail] table from
    tests.mailkit.mail_toml, or a table a test spells out itself).
    """
    tables: dict[str, dict[str, Any] | None] = {k: dict(v) for k, v in BASE_SECTIONS.items()} if base else {}
    for name, keys in sections.items():
        if keys is None:
            tables[name] = None
        else:
            tables[name] = {**(tables.get(name) or {}), **keys}
    lines = [] if database_url is None else [f"database_url = {_value(database_url)}"]
    for name, keys in tables.items():
        if keys is not None:
            lines += _table(name, keys)
    return "\n".join(lines) + ("\n" if lines else "") + extra


def write_config(
    path: Path,
    database_url: str | None = None,
    extra: str = "",
    *,
    base: bool = True,
    **sections: Mapping[str, Any] | None,
) -> Path:
    """Write `config_toml(...)` to `path` and return it (for a test that hands cocaq the file)."""
    path.write_text(config_toml(database_url, extra, base=base, **sections))
    return path


def config(
    tmp_path: Path,
    database_url: str | None = None,
    extra: str = "",
    *,
    name: str = "c.toml",
    environ: dict[str, str] | None = None,
    base: bool = True,
    **sections: Mapping[str, Any] | None,
) -> Config:
    """The Config cocaq loads from `tmp_path / name` written by `config_toml` (no COCAQ_* variables)."""
    p = write_config(tmp_path / name, database_url, extra, base=base, **sections)
    return load_config(p, environ={} if environ is None else environ)


def default_config(**cluster: Any) -> Config:
    """The built-in defaults, with no file and no environment, and these [cluster] keys: for the import
    tests, which hold the parser and importer to a config nobody wrote."""
    from dataclasses import replace

    c = load_config(None, environ={})
    return replace(c, cluster=replace(c.cluster, **cluster))


def job(
    raw: int,
    start: datetime,
    hours: float = 1.0,
    *,
    user: str = "alice",
    account: str = "lab",
    partition: str = "gpu",
    gpus: int = 1,
    cpus: int = 4,
    state: str = "COMPLETED",
    running: bool = False,
    end: datetime | None = None,
    cpu_s: float | Literal["half"] | None = "half",
    queued: timedelta = timedelta(minutes=5),
    node_list: str = "n1",
    n_nodes: int = 1,
    mem_mb: float = 0,
    cluster: str = "c",
    **more: Any,
) -> JobRecord:
    """Job `raw` as sacct shows it: submitted `queued` before `start`, ran `hours` (elapsed) on `node_list`.

    A running job has no end, state RUNNING and is open; `end` sets the end instead of start + hours.
    `cpu_s` is the job's CPU time: "half" (half its cores busy all along), a number, or None (unknown).
    Any other JobRecord field goes in `more` (name, comment, time_limit_s, consumed_energy_j, gpu_type...).
    """
    return JobRecord(
        job_id=str(raw),
        job_id_raw=raw,
        user_name=user,
        account=account,
        partition=partition,
        submit_time=start - queued,
        start_time=start,
        end_time=None if running else end if end is not None else start + timedelta(hours=hours),
        elapsed_s=hours * 3600,
        state="RUNNING" if running else state,
        is_open=running,
        node_list=node_list,
        n_nodes=n_nodes,
        alloc_cpus=cpus,
        alloc_gpus=gpus,
        total_cpu_s=hours * 3600 * cpus * 0.5 if isinstance(cpu_s, str) else cpu_s,
        req_mem_mb=mem_mb,
        cluster=cluster,
        **more,
    )
