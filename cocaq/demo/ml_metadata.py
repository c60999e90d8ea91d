"""The demo's ML metadata: the model some jobs declare (in their comment or with `cocaq tag`) and the
framework the collector detects, shipped as a node's `meta` records."""

from __future__ import annotations

import random
from typing import Any

from cocaq.demo.jobs import DemoJob
from cocaq.demo.site import DEMO_CLUSTER
from cocaq.units import S_PER_HOUR

# Job name -> (model, task, parameters, GPU-hours per epoch in bf16/fp16) of the ML jobs; tokens per
# GPU-second for the LLMs instead of epochs. fp32 runs take ~1.7x as long per epoch on the same GPUs.
_MODELS: dict[str, tuple[str, str, float, float]] = {
    "llama-ft": ("llama-3-8b", "finetune", 8.0e9, 0.0),
    "pretrain-7b": ("mistral-7b", "pretrain", 7.2e9, 0.0),
    "mistral-sft": ("mistral-7b", "sft", 7.2e9, 0.0),
    "rlhf-ppo": ("llama-3-8b", "rlhf", 8.0e9, 0.0),
    "resnet50": ("resnet50", "train", 25.6e6, 0.9),
    "vit-b16": ("vit-b16", "train", 86e6, 1.6),
    "unet-seg": ("unet", "segmentation", 31e6, 0.5),
    "detr": ("detr-r50", "detection", 41e6, 2.2),
    "bert-base": ("bert-base", "finetune", 110e6, 0.3),
    "gnn-train": ("gin", "train", 2e6, 0.2),
}
_SLOWER = {"fp32": 1.7, "bf16": 1.0, "fp16": 1.0}


def model_metadata(jobs: list[DemoJob], seed: int) -> None:
    """Give the ML jobs model metadata the three ways a site gets it: about half declare it in their
    comment, a quarter from inside with `cocaq tag` (epochs and tokens as they go), and the collector
    detects the framework of all of them. A separate random stream: the jobs themselves do not change."""
    r = random.Random(seed + 7)
    for j in jobs:
        spec = _MODELS.get(j.name)
        if spec is None or not j.gpus:
            continue
        model, task, params, epoch_gpu_h = spec
        precision = r.choice(["bf16", "bf16", "fp32"] if j.kind == "llm" else ["fp16", "bf16", "fp32"])
        batch = r.choice([8, 16] if j.kind == "llm" else [32, 64, 128])
        gpu_s = j.gpus * j.elapsed
        counters: dict[str, Any] = {}
        if epoch_gpu_h:
            counters["epochs"] = round(gpu_s / S_PER_HOUR / (epoch_gpu_h * _SLOWER[precision]), 2)
        else:
            counters["tokens"] = int(gpu_s * 2600 / _SLOWER[precision])
        how = r.random()
        if how < 0.55:
            j.comment = (
                f"cocaq: model={model} task={task} params={params:.3g} framework=pytorch "
                f"precision={precision} batch_size={batch}"
            )
            j.declared = counters if r.random() < 0.7 else None
        elif how < 0.8:
            j.declared = {"model": model, "precision": precision, "batch_size": batch, **counters}
        j.detected = {"framework": "pytorch", "framework_version": r.choice(["2.3.1", "2.3.1", "2.1.2"]),
                      "launcher": "torchrun" if j.gpus > 1 else "python"}  # fmt: skip


def ship_metadata(url: str, jobs: list[DemoJob]) -> int:
    """The collector's `meta` records of the jobs, shipped as a node would ship them."""
    from cocaq.collector.ship import connect

    records = []
    for j in jobs:
        for source in ("detected", "api"):
            values = j.detected if source == "detected" else j.declared
            if not values:
                continue
            ts = j.start.timestamp() + (60 if source == "detected" else j.elapsed * 0.95)
            records.append(
                {
                    "uid": f"{DEMO_CLUSTER}/{j.nodes[0]}/{j.raw_id}/meta/{int(ts * 1e9)}-{source}",
                    "event": "meta",
                    "cluster": DEMO_CLUSTER,
                    "node": j.nodes[0],
                    "job_id": str(j.raw_id),
                    "ts": ts,
                    "meta": {source: values},
                }
            )
    target = connect(url)
    try:
        return target.ship_events(target.cluster_id(DEMO_CLUSTER), records)
    finally:
        target.close()
