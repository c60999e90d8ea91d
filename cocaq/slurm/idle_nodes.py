"""The nodes of a multi-node job on which Slurm accounted no CPU time at all (issue 32, jobstats' "did not
use N of the M allocated nodes"), from each step's least-used task.

What sacct(1) gives per step: TRESUsageInMin is the least usage of any one task ("Tres minimum usage in by
all tasks"), TRESUsageInMinNode the node where each minimum occurred, TRESUsageInMinTask its task (-1: the
metric is node-centric, the node's whole use); TotalCPU the step's CPU time over all its tasks. The text
form prints CPU time in whole seconds (`cpu=00:00:00` is under one second); --json and pyslurm give it in
milliseconds and seconds.

When a step's minimum says something about a node: a zero minimum is one task's. Where the step ran one
task per node (NTasks == NNodes: srun puts at least one task on each node of a step) or the minimum is
node-centric, that task is the node's whole share of the step, so the node did nothing in it. Where it ran
several tasks per node (`srun --ntasks-per-node=8`), the node's other tasks may have worked: the minimum
says nothing about the node, and no node is named. A step whose TotalCPU is under a second did nothing on
any of its nodes.

A node did no CPU work in the job when every step that ran on it (its NodeList; a step over all the job's
nodes; the batch step on the job's first node, where sbatch runs the script) did nothing there by one of
these; a step that may have run on it and of which nothing is known (several tasks per node, a partial
step without NodeList) makes it a worker. A job in which no step's CPU use was gathered (no
jobacct_gather: TRESUsageIn* empty, TotalCPU 0 everywhere) says nothing, nor one whose every node is idle
(that is a job that did nothing, not one launched on too few nodes). Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cocaq.hostlist import expand_hostlist
from cocaq.timeparse import parse_slurm_duration
from cocaq.units import MS_PER_S

CPU_ZERO_S = 1.0  # under a second of CPU time over the run: nothing (the text form's cpu=00:00:00)
MAX_NODES = 4096  # a job's nodes examined one by one at most (a bad NodeList names a million)
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class StepCpu:
    """One step's CPU use as sacct gives it; None where it does not say."""

    step: str  # its id after the dot: batch, extern, interactive, 0
    hosts: tuple[str, ...] | None  # its NodeList, expanded
    n_nodes: int | None
    n_tasks: int | None
    total_cpu_s: float | None  # TotalCPU
    min_cpu_s: float | None  # the least CPU time of one of its tasks (None: not gathered)
    min_node: str | None  # where
    min_task: int | None  # which task; -1: node-centric


def _host(text: Any) -> str | None:
    t = str(text).strip() if text is not None else ""
    return t if _HOST.match(t) else None


def _hosts(text: str) -> tuple[str, ...] | None:
    try:
        hosts = expand_hostlist(text)
    except ValueError:
        return None
    return tuple(hosts) if 0 < len(hosts) <= MAX_NODES else None


def _tres_value(text: str, key: str) -> str | None:
    for part in (text or "").split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip() == key:
            return v.strip()
    return None


def _seconds(text: str | None) -> float | None:
    if not text:
        return None
    try:
        s = parse_slurm_duration(text)
    except (ValueError, OverflowError):
        return None
    return s if s is not None and 0 <= s < 1e12 else None


def _int(v: Any) -> int | None:
    try:
        x = int(str(v).strip())
    except (ValueError, TypeError):
        return None
    return x if -1 <= x < 2**31 else None


def from_text(
    step: str,
    nodelist: str,
    nnodes: str,
    ntasks: str,
    total_cpu_s: float | None,
    tres_min: str,
    tres_min_node: str,
    tres_min_task: str,
) -> StepCpu:
    """A parsable step line's figures (TRESUsageInMin `cpu=00:00:00,...`, TRESUsageInMinNode `cpu=n3,...`,
    TRESUsageInMinTask `cpu=0,...`); a bad value costs only itself."""
    cpu = _seconds(_tres_value(tres_min, "cpu"))
    return StepCpu(
        step,
        _hosts(nodelist),
        _int(nnodes),
        _int(ntasks),
        total_cpu_s,
        cpu,
        _host(_tres_value(tres_min_node, "cpu")) if cpu is not None else None,
        _int(_tres_value(tres_min_task, "cpu")) if cpu is not None else None,
    )


def _count(obj: Any) -> int | None:
    v = obj.get("count") if isinstance(obj, dict) else None
    if isinstance(v, dict):  # v0.0.40+: {"set", "number"}
        v = v.get("number") if v.get("set", True) else None
    return _int(v) if isinstance(v, int | str) and not isinstance(v, bool) else None


def from_json(step: Any, total_cpu_s: float | None) -> StepCpu | None:
    """A sacct --json step (or cocaq.slurm.slurmdb's from pyslurm): `tres.requested.min`'s cpu entry
    (`count` in milliseconds, `node`, `task`), `nodes.list`, `tasks.count`; None where it is not a step."""
    if not isinstance(step, dict):
        return None
    sid = (step.get("step") or {}).get("id") if isinstance(step.get("step"), dict) else None
    name = str(sid).rsplit(".", 1)[-1].strip() if sid is not None else ""
    nodes = step.get("nodes")
    hosts = None
    if isinstance(nodes, dict):
        lst = nodes.get("list")
        if isinstance(lst, list) and lst:
            named = tuple(h for h in (_host(x) for x in lst[: MAX_NODES + 1]) if h)
            hosts = named if 0 < len(named) == len(lst) <= MAX_NODES else None
        elif isinstance(nodes.get("range"), str):
            hosts = _hosts(nodes["range"])
    tres = step.get("tres")
    req = tres.get("requested") if isinstance(tres, dict) else None
    mins = req.get("min") if isinstance(req, dict) else None
    cpu = node = task = None
    for t in mins if isinstance(mins, list) else []:
        if isinstance(t, dict) and t.get("type") == "cpu":
            c = t.get("count")
            if isinstance(c, int | float) and not isinstance(c, bool) and 0 <= c < 1e15:
                cpu, node, task = c / MS_PER_S, _host(t.get("node")), _int(t.get("task"))
            break
    return StepCpu(name, hosts, _count(nodes), _count(step.get("tasks")), total_cpu_s, cpu, node, task)


def _ran_on(s: StepCpu, host: str, hosts: Sequence[str]) -> bool:
    if s.hosts:
        return host in s.hosts
    if s.n_nodes is not None and s.n_nodes >= len(hosts):
        return True
    if s.step == "batch":  # sbatch runs the script on the first node of the allocation
        return host == hosts[0]
    return True  # not known where: it may have


def _idle_in(s: StepCpu, host: str) -> bool:
    """Whether `host` did no CPU work in step `s`, by what sacct says of it."""
    if s.total_cpu_s is not None and 0 <= s.total_cpu_s < CPU_ZERO_S:
        return True
    if s.min_cpu_s is None or s.min_cpu_s >= CPU_ZERO_S or s.min_node != host:
        return False
    one_per_node = s.n_tasks is not None and s.n_tasks > 0 and s.n_tasks == s.n_nodes
    return one_per_node or s.min_task == -1


def idle_nodes(job_nodelist: str | None, steps: Iterable[StepCpu]) -> str | None:
    """The job's nodes, in its NodeList's order and comma-separated, on which no step did any CPU work;
    None where there are none, or the data cannot tell (one node, nothing gathered, every node idle)."""
    hosts = _hosts(job_nodelist or "")
    if hosts is None or len(hosts) < 2 or len(set(hosts)) != len(hosts):
        return None
    ss = list(steps)
    if not any(s.min_cpu_s is not None for s in ss):
        return None
    idle = [h for h in hosts if all(_idle_in(s, h) for s in ss if _ran_on(s, h, hosts))]
    if not idle or len(idle) == len(hosts):
        return None
    return ",".join(idle)
