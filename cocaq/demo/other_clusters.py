"""What real accounting holds and the demo month does not, on two more clusters of the demo's site.

The demo month (cocaq.demo.jobs) is generated to our own assumptions: every job has its TotalCPU,
its GPUs in its TRES, and either a node measurement or cocaq's collector. Real sites have holes, and a
newcomer should see how each is shown. One user (`mallory`, lab_physics) runs a few jobs on:

* `atlas`, an older cluster without cocaq's node hooks or an energy plugin, whose accounting records
  the GPUs' use (`AccountingStorageTRES=gres/gpu,gres/gpumem,gres/gpuutil`): a training run that keeps its
  GPUs busy, one that left its 4 GPUs idle (gres/gpuutil = 0), a long CPU job whose TotalCPU Slurm did not
  gather (no step accounted), and a job whose Submit time is after its Start (corrected at import);
* `legacy`, whose accounting records no GPUs at all: a job on its V100 partition has an unknown GPU count.

The lines are sacct's `--parsable2` with cocaq's --format (the real captures' shapes, tests/data/sacct).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from cocaq.slurm.sacct import SACCT_FIELDS
from cocaq.timeparse import format_slurm_duration
from cocaq.units import S_PER_HOUR

ATLAS = "atlas"
LEGACY = "legacy"
USER, UID, LAB = "mallory", 2101, "lab_physics"
# Job ids far from the demo month's (410000 on): `cocaq job ID` finds one job
IDLE_JOB, BUSY_JOB, NO_CPU_JOB, SUBMIT_JOB, UNKNOWN_JOB = "880002", "880001", "880003", "880004", "990001"


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S")


def _line(fields: list[str], **kw: str) -> str:
    return "|".join(kw.get(f, "") for f in fields)


def shape_lines(end: datetime) -> list[str]:
    """The two clusters' sacct lines (a header, jobs and their steps), the jobs ending before `end`."""
    fields = SACCT_FIELDS.split(",")
    out = ["|".join(fields)]

    def job(jid: str, cluster: str, name: str, part: str, node: str, cpus: int, gpus: int, hours: float,
            ago_h: float, *, totalcpu: float | None, submit_after: bool = False, gpu_tres: bool = True,
            steps: tuple[tuple[str, int, float, str, str], ...] = ()) -> None:  # fmt: skip
        start = end - timedelta(hours=ago_h)
        secs = int(hours * S_PER_HOUR)
        tres = f"billing={cpus},cpu={cpus},mem={cpus * 4}G,node=1" + (
            f",gres/gpu={gpus}" if gpus and gpu_tres else ""
        )
        submit = start + timedelta(minutes=7) if submit_after else start - timedelta(minutes=20)
        common = {
            "NodeList": node,
            "NNodes": "1",
            "AllocCPUS": str(cpus),
            "Start": _ts(start),
            "End": _ts(start + timedelta(seconds=secs)),
            "State": "COMPLETED",
            "ExitCode": "0:0",
        }
        cpu_text = format_slurm_duration(totalcpu) if totalcpu else "00:00:00"
        out.append(
            _line(
                fields, JobID=jid, JobIDRaw=jid, JobName=name, User=USER, UID=str(UID), Account=LAB,
                Partition=part, QOS="normal", AllocTRES=tres, ReqTRES=tres, ReqMem=f"{cpus * 4}G",
                Submit=_ts(submit), Elapsed=format_slurm_duration(secs), ElapsedRaw=str(secs),
                TotalCPU=cpu_text, Cluster=cluster, Timelimit="1-00:00:00", **common,
            )
        )  # fmt: skip
        for step, ntasks, share, ave, top in steps:
            s_secs = int(secs * share)
            step_row = {
                **common,
                "JobID": f"{jid}.{step}",
                "JobIDRaw": f"{jid}.{step}",
                "JobName": step,
                "End": _ts(start + timedelta(seconds=s_secs)),
                "Elapsed": format_slurm_duration(s_secs),
                "ElapsedRaw": str(s_secs),
                # the work's CPU time in its batch script or srun step; the extern step's none
                "TotalCPU": "00:00:00" if step == "extern" else cpu_text,
                "MaxRSS": f"{cpus * 1024 * 1024}K",
                "NTasks": str(ntasks),
                "TRESUsageInAve": ave,
                "TRESUsageInMax": top,
            }
            out.append(_line(fields, **step_row))

    usage = (
        "cpu=00:00:00,energy=0,fs/disk=1048576,gres/gpumem={mem},gres/gpuutil={util},mem=2G,pages=0,vmem=0"
    )
    idle = usage.format(mem="0", util="0")
    busy_ave = usage.format(mem="21474836480", util="86")
    busy_max = usage.format(mem="27917287424", util="100")
    batch = (("batch", 1, 1.0, "", ""),)
    gpu_steps = (("batch", 1, 1.0, idle, idle), ("extern", 1, 1.0, idle, idle))
    # id, cluster, name, partition, node, CPUs, GPUs, hours, started hours before `end`, CPU-seconds, and
    # what is odd about it
    for jid, cluster, name, part, node, cpus, gpus, hours, ago, cpu_s, odd in (
        (BUSY_JOB, ATLAS, "md-sim", "gpu_v100", "atl-g03", 16, 2, 11.0, 40.0, 11 * S_PER_HOUR * 12.0,
         {"steps": (*gpu_steps, ("0", 2, 0.98, busy_ave, busy_max))}),
        (IDLE_JOB, ATLAS, "forgot-cuda", "gpu_v100", "atl-g04", 16, 4, 8.0, 30.0, 8 * S_PER_HOUR * 14.5,
         {"steps": gpu_steps}),
        (NO_CPU_JOB, ATLAS, "long-cpu", "cpu", "atl-c01", 64, 0, 20.0, 60.0, None, {}),
        (SUBMIT_JOB, ATLAS, "requeued", "cpu", "atl-c02", 8, 0, 2.0, 10.0, 2 * S_PER_HOUR * 7.5,
         {"submit_after": True, "steps": batch}),
        (UNKNOWN_JOB, LEGACY, "train-legacy", "gpu_v100", "leg-g01", 8, 2, 10.0, 50.0, 10 * S_PER_HOUR * 6.0,
         {"gpu_tres": False, "steps": batch}),
        ("990002", LEGACY, "prep", "cpu", "leg-c01", 32, 0, 3.0, 52.0, 3 * S_PER_HOUR * 30.0,
         {"steps": batch}),
    ):  # fmt: skip
        job(jid, cluster, name, part, node, cpus, gpus, hours, ago, totalcpu=cpu_s, **odd)
    return out
