"""The demo's GPU samples: what the collector on the metered nodes (the A100s and half the V100s) would
have written for each GPU job, power, utilisation and memory, and shipped as node batches."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select

from cocaq.demo.jobs import DemoJob
from cocaq.demo.site import DEMO_CLUSTER, metered_v100

# GPU behaviour per kind of job, for the samples: (share of the time busy, utilisation when busy).
GPU_USE = {
    "llm": (0.97, (48.0, 66.0)),  # communication-bound: partly busy, near full power (a power cap helps)
    "train": (0.97, (82.0, 97.0)),
    "debug": (0.6, (25.0, 70.0)),
    "notebook": (0.1, (30.0, 85.0)),  # held for hours, used now and then
}


# GPU memory a kind of job holds on each of its GPUs, in GB (A100s of 80 GB): LLMs fill them, notebooks
# and debugging hold a little, training in between.
_GPU_MEM_GB = {"llm": (62.0, 76.0), "train": (9.0, 38.0), "debug": (3.0, 14.0), "notebook": (1.5, 6.0)}


def write_samples(
    engine: Any,
    jobs: list[DemoJob],
    seed: int,
    step_s: float,
    idle_factor: Callable[[DemoJob], float] | None = None,
    *,
    keep: bool = False,
) -> int:
    """NVML samples (power, utilisation) of the GPU jobs on the A100 nodes, as the collector ships them:
    one per GPU every `step_s`, each job's GPUs named by their index on the node.

    The demo's samples are replaced by these; with `keep`, they are added to those already there (the
    study demo writes a month's jobs at a time, cocaq.demo.study): each job then draws from random
    streams of its own (from `seed` and its id), so that what it gets does not depend on the jobs
    written with it or before it, and each node's samples are recorded as a shipped batch naming its
    jobs (node_shipments, as the collector's shipper records them; each job whole, its samples all
    written at once), so that the aggregator's incremental run derives those jobs' GPU use again.
    Without it the streams run through the jobs in turn, as they always have.

    `idle_factor(job)` is the e-mail study's planted effect (cocaq.demo.study): it scales a job's idle
    GPU time (0.8 = a fifth less), both the GPUs left unused and the share of samples that find a GPU
    idle. With it, each job's idle time is its expected share, spread evenly through its samples
    (systematic, from a random phase): no coin flip per sample (an hour-apart sample that flips a coin
    stands for a whole hour, a measurement noise a collector sampling every few seconds does not have)
    and no job drawn to leave its extra GPUs unused (a fifth of their time in each such job instead). A
    site of 150 users is too small to see a planted fifth through those per-job draws (docs/study.md:
    the study demo's site is less noisy than a real one). Without it (the one-month demo) the draws are
    as they always were.

    What they show: notebooks that hold GPUs idle, training that keeps them busy, some training with one
    GPU doing nothing (the `fewer-gpus` suggestion), a data-starved user (frank) and communication-bound
    LLM jobs drawing most of their power at moderate utilisation (`power-cap`).
    """
    from cocaq.db.schema import Cluster, Sample

    rng = random.Random(seed + 1)
    mem_rng = random.Random(seed + 3)  # (a stream of its own: the power and utilisation stay as they were)
    v100_rng = random.Random(seed + 4)  # (the metered V100 nodes': the A100s' stay as they were)
    step = max(int(step_s), 1)
    with engine.begin() as conn:
        cid = conn.execute(select(Cluster.id).where(Cluster.name == DEMO_CLUSTER)).scalar_one()
        if not keep:
            conn.execute(delete(Sample).where(Sample.cluster_id == cid))
        rows: list[dict[str, Any]] = []
        n = 0
        for j in jobs:
            if keep:
                rng, mem_rng, v100_rng = (random.Random(f"{seed}/{j.raw_id}/{k}") for k in (1, 3, 4))
            factor = None if idle_factor is None else idle_factor(j)
            if j.gpus and j.partition == "gpu_v100" and metered_v100(j.nodes) and j.elapsed >= step:
                rows += _v100_samples(j, cid, step, v100_rng, factor)
            if not j.gpus or j.partition not in ("gpu_a100", "interactive") or j.elapsed < step:
                continue
            rows += _a100_samples(j, cid, step, rng, mem_rng, factor)
            if len(rows) >= 20_000:
                n += _insert_samples(conn, cid, rows, keep)
                rows = []
        if rows:
            n += _insert_samples(conn, cid, rows, keep)
    return n


def _a100_samples(
    j: DemoJob, cid: int, step: int, rng: random.Random, mem_rng: random.Random, factor: float | None
) -> list[dict[str, Any]]:
    """NVML samples of a GPU job on the A100 nodes (400 W TDP, ~60 W idle): power, utilisation, memory;
    `factor` as write_samples' idle_factor(job)."""
    rows: list[dict[str, Any]] = []
    busy_share, (lo, hi) = GPU_USE.get(j.kind, (0.8, (40.0, 90.0)))
    if j.user == "frank" and j.kind == "train":
        busy_share, (lo, hi) = 0.95, (22.0, 36.0)
    if factor is not None:
        busy_share = 1.0 - (1.0 - busy_share) * factor
    per_node = max(j.gpus // len(j.nodes), 1)
    # a fifth of the multi-GPU training jobs left GPUs after the first unused (single-GPU code); with
    # the planted effect, a fifth of those GPUs' time in each such job, as the idle samples
    spread = factor is not None
    unused = 0.2 * (1.0 if factor is None else factor)
    eligible = j.kind == "train" and per_node > 1 and j.user != "frank"
    one_gpu = eligible and not spread and rng.random() < unused
    offset = j.raw_id % step  # jobs' samples interleave rather than collide on a shared node
    lo_gb, hi_gb = _GPU_MEM_GB.get(j.kind, (4.0, 30.0))
    mem_mb = mem_rng.uniform(lo_gb, hi_gb) * 1024  # what the job's GPUs hold once it is loaded
    for node in j.nodes:
        for k in range(per_node):
            dev = f"GPU-{k}"
            busy = busy_share * (1.0 - unused) if spread and eligible and k > 0 else busy_share
            idle_at = _idle_draw(busy, rng, spread)
            for i in range(int(j.elapsed // step)):
                ts = j.start + timedelta(seconds=offset + i * step)
                if (one_gpu and k > 0) or idle_at(i):
                    util = rng.uniform(0.0, 2.0)
                    power = rng.uniform(52.0, 66.0)
                else:
                    util = rng.uniform(lo, hi)
                    power = 60.0 + (400.0 * max(j.gpu_load, 0.3) - 60.0) * rng.uniform(0.9, 1.1)
                base = {"ts": ts, "cluster_id": cid, "node": node, "source": "nvml", "device": dev,
                        "job_id": str(j.raw_id)}  # fmt: skip
                rows.append({**base, "metric": "power_w", "value": round(power, 1)})
                rows.append({**base, "metric": "util_pct", "value": round(util, 1)})
                held = mem_mb * (0.5 if i == 0 else 1.0) * (0.2 if one_gpu and k > 0 else 1.0)
                rows.append({**base, "metric": "mem_used_mb", "value": round(held, 0)})
    return rows


def _insert_samples(conn: Any, cid: int, rows: list[dict[str, Any]], shipped: bool) -> int:
    """Insert the samples; `shipped`: and record them as one batch per node naming its jobs, as the
    collector's shipper does (cocaq.collector.ship), each without a time (the aggregator derives the
    whole job again: its samples are all here)."""
    import hashlib

    from sqlalchemy import insert

    from cocaq.db.schema import NodeShipment, Sample

    conn.execute(insert(Sample).prefix_with("OR IGNORE"), rows)
    if shipped:
        jobs: dict[str, set[str]] = {}
        count: dict[str, int] = {}
        for r in rows:
            jobs.setdefault(r["node"], set()).add(r["job_id"])
            count[r["node"]] = count.get(r["node"], 0) + 1
        batches = []
        for node, ids in sorted(jobs.items()):
            text = " ".join(sorted(ids))
            batch = "demo-" + hashlib.sha1(text.encode()).hexdigest()[:24]
            batches.append(
                {"cluster_id": cid, "node": node, "batch": batch, "rows": count[node], "job_ids": text}
            )
        conn.execute(insert(NodeShipment).prefix_with("OR IGNORE"), batches)
    return len(rows)


def _idle_draw(busy_share: float, rng: random.Random, spread: bool) -> Callable[[int], bool]:
    """Whether sample i of a GPU finds it idle: a coin flip per sample, or (`spread`) the idle share of
    its samples spread evenly from a random phase (write_samples says why)."""
    if not spread:
        return lambda _i: rng.random() > busy_share
    share, phase = 1.0 - busy_share, rng.random()
    return lambda i: math.floor(phase + (i + 1) * share) > math.floor(phase + i * share)


def _v100_samples(
    j: DemoJob, cid: int, step: int, rng: random.Random, idle_factor: float | None = None
) -> list[dict[str, Any]]:
    """NVML samples of a job on a metered V100 node (300 W TDP, ~40 W idle), as write_samples' A100s."""
    busy_share, (lo, hi) = GPU_USE.get(j.kind, (0.8, (40.0, 90.0)))
    if j.user == "frank" and j.kind == "train":
        busy_share, (lo, hi) = 0.95, (22.0, 36.0)
    if idle_factor is not None:
        busy_share = 1.0 - (1.0 - busy_share) * idle_factor
    rows: list[dict[str, Any]] = []
    offset = j.raw_id % step
    for node in j.nodes:
        for k in range(max(j.gpus // len(j.nodes), 1)):
            idle_at = _idle_draw(busy_share, rng, idle_factor is not None)
            for i in range(int(j.elapsed // step)):
                ts = j.start + timedelta(seconds=offset + i * step)
                if idle_at(i):
                    util, power = rng.uniform(0.0, 2.0), rng.uniform(36.0, 45.0)
                else:
                    util = rng.uniform(lo, hi)
                    power = 40.0 + (300.0 * max(j.gpu_load, 0.3) - 40.0) * rng.uniform(0.9, 1.1)
                base = {"ts": ts, "cluster_id": cid, "node": node, "source": "nvml", "device": f"GPU-{k}",
                        "job_id": str(j.raw_id)}  # fmt: skip
                rows.append({**base, "metric": "power_w", "value": round(power, 1)})
                rows.append({**base, "metric": "util_pct", "value": round(util, 1)})
    return rows
