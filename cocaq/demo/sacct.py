"""The demo's jobs as `sacct --parsable2` prints them, with their .batch, .extern and srun steps: what
the demo imports through the same parser and importer a site uses."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from cocaq.demo.jobs import DemoJob
from cocaq.demo.site import DEMO_CLUSTER
from cocaq.slurm.sacct import SACCT_FIELDS
from cocaq.timeparse import format_slurm_duration


def _ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def sacct_lines(jobs: list[DemoJob]) -> list[str]:
    """The jobs as `sacct --parsable2 --format=SACCT_FIELDS` would print them, steps included.

    Memory use (MaxRSS, per task, on the steps) comes from a random stream of each job's own, so that
    it changes nothing else the demo draws: most jobs use 20-60 % of the memory they asked for, CPU jobs
    40-95 %, carol's debug jobs and every job that ran out of memory all of it.
    """
    fields = SACCT_FIELDS.split(",")
    out = ["|".join(fields)]
    for j in jobs:
        row = _job_row(j)
        out.append("|".join(row[f] for f in fields))
        if j.running:
            continue
        out.extend("|".join(srow[f] for f in fields) for srow in _step_rows(j, row))
    return out


def _job_row(j: DemoJob) -> dict[str, str]:
    """The job's own line, by sacct field."""
    nodelist = _compress(j.nodes)
    end = "Unknown" if j.running else _ts(j.start + timedelta(seconds=j.elapsed))
    tres = f"billing={j.cpus},cpu={j.cpus},mem={int(j.mem_gb)}G,node={len(j.nodes)}"
    if j.gpus:
        tres += f",gres/gpu={j.gpus}"
    energy = "" if j.energy_j is None else str(int(j.energy_j))
    state = "CANCELLED by " + str(j.uid) if j.state == "CANCELLED" else j.state
    return {
        "JobID": j.job_id,
        "JobIDRaw": str(j.raw_id),
        "JobName": j.name,
        "User": j.user,
        "UID": str(j.uid),
        "Account": j.account,
        "Partition": j.partition,
        "QOS": "normal",
        "NodeList": nodelist,
        "NNodes": str(len(j.nodes)),
        "AllocCPUS": str(j.cpus),
        "AllocTRES": tres,
        "ReqTRES": tres,
        "ReqMem": f"{int(j.mem_gb)}G",
        "Submit": _ts(j.submit),
        "Start": _ts(j.start),
        "End": end,
        "Elapsed": format_slurm_duration(j.elapsed),
        "ElapsedRaw": str(j.elapsed),
        "State": state,
        "ExitCode": j.exit_code,
        "TotalCPU": "" if j.running else format_slurm_duration(j.total_cpu),
        "Comment": j.comment,
        "ConsumedEnergyRaw": "" if j.running else energy,
        "Cluster": DEMO_CLUSTER,
        "Timelimit": format_slurm_duration(j.limit_min * 60),
        "MaxRSS": "",  # sacct leaves both empty on the job line
        "NTasks": "",
        "TRESUsageInAve": "",  # the demo's site records no GPU use in Slurm (its collector does)
        "TRESUsageInMax": "",
        "TRESUsageInMin": "",  # nor the least-used task of each step (cocaq.slurm.idle_nodes)
        "TRESUsageInMinNode": "",
        "TRESUsageInMinTask": "",
    }


def _step_rows(j: DemoJob, row: dict[str, str]) -> list[dict[str, str]]:
    """The lines of an ended job's steps (.batch, .extern, and .0 for a multi-node GPU job's srun)."""
    rows: list[dict[str, str]] = []
    mem_rng = random.Random(f"{j.job_id}/{_ts(j.submit)}")
    if j.state == "OUT_OF_MEMORY":
        used = mem_rng.uniform(0.97, 1.04)
    elif j.user == "carol" and j.kind == "debug":
        used = mem_rng.uniform(0.9, 1.0)
    elif j.kind in ("preprocess", "cpu_sim"):
        used = mem_rng.uniform(0.4, 0.95)
    else:
        used = mem_rng.uniform(0.2, 0.6)
    node_kb = used * j.mem_gb * 1024**2 / len(j.nodes)
    # A multi-node GPU job runs its work in an srun step (`.0`), one task per GPU; the batch script
    # itself only launches it.
    srun = j.gpus > 0 and len(j.nodes) > 1
    steps = ("batch", "extern", "0") if srun else ("batch", "extern")
    for step in steps:
        if step == "batch":
            rss_kb, ntasks = (mem_rng.uniform(2e5, 9e5) if srun else node_kb), 1
        elif step == "extern":
            rss_kb, ntasks = mem_rng.uniform(800, 1200), len(j.nodes)
        else:
            rss_kb, ntasks = node_kb / (j.gpus // len(j.nodes)), j.gpus
        srow = dict(
            row,
            JobID=f"{j.job_id}.{step}",
            JobIDRaw=f"{j.raw_id}.{step}",
            JobName=step,
            User="",
            Account=j.account,
            Partition="",
            QOS="",
            Submit=_ts(j.start),
            Comment="",
            AllocTRES=f"cpu={j.cpus},mem={int(j.mem_gb)}G,node={len(j.nodes)}",
            ReqTRES="",
            ReqMem="",
            Timelimit="",
            Cluster="",
            State=j.state if j.state != "TIMEOUT" else "CANCELLED",
            TotalCPU=format_slurm_duration(j.total_cpu if step == "batch" else 0.1),
            MaxRSS=f"{int(rss_kb)}K",
            NTasks=str(ntasks),
        )
        if step == "0":
            srow.update(JobName="python", TotalCPU=format_slurm_duration(j.total_cpu * 0.97))
        rows.append(srow)
    return rows


def _compress(nodes: list[str]) -> str:
    if len(nodes) == 1:
        return nodes[0]
    prefix = nodes[0].rstrip("0123456789")
    nums = [n[len(prefix) :] for n in nodes]
    return f"{prefix}[{nums[0]}-{nums[-1]}]"
