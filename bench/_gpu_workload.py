#!/usr/bin/env python3
"""The job that bench/real_gpu_check.py runs between its prolog and its epilog: two phases at two powers.

    python bench/_gpu_workload.py --uuid GPU-... --out phases.json [--fake --start-at T]

`high`: large bf16 matmuls back to back (the GPU near its power limit). `low`: the same matmuls for
`duty` of every 100 ms and idle the rest (a duty-cycled load well below the limit), or, with
`--power-limit W`, the high load again under `nvidia-smi -pl W` (root; the limit is put back at the end).
At each phase's edges it synchronises the GPU and reads NVML's energy counter through cocaq's own NVML
layer (the call the hooks make), so the driver can split the job's counter energy by phase exactly.

With `--fake` there is no torch and no GPU: it sleeps through the phases (from `--start-at`, when the
fake GPU's trace steps up) and reads the fake NVML. It writes `--out` as JSON and exits 0, or prints
one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cocaq.collector.nvml import Nvml, NvmlUnavailable


def counter_mj(nvml: Nvml, uuid: str) -> tuple[float, int | None]:
    """(time, NVML energy counter in mJ) as the hooks read it."""
    r = nvml.read(uuid, energy_only=True)
    return r.ts, r.energy_mj


def set_power_limit(uuid: str, watts: float) -> str | None:
    """`nvidia-smi -pl`; None when it worked, else its one-line refusal."""
    p = subprocess.run(
        ["nvidia-smi", "-i", uuid, "-pl", f"{watts:.0f}"], capture_output=True, text=True, timeout=30
    )
    if p.returncode == 0:
        return None
    return " ".join((p.stdout + p.stderr).split())[:200] or f"exit {p.returncode}"


def run_gpu(a: argparse.Namespace, nvml: Nvml, mark: Any) -> dict[str, Any]:
    """The two phases on the GPU (CUDA_VISIBLE_DEVICES names it); returns what the driver reports."""
    try:
        import torch
    except ImportError as exc:
        raise SystemExit(f"real_gpu_check: no torch in {sys.executable}: {exc}") from None
    if not torch.cuda.is_available():
        raise SystemExit("real_gpu_check: torch sees no CUDA device (CUDA_VISIBLE_DEVICES, driver?)")
    dev = torch.device("cuda:0")
    n = a.matrix
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    out = torch.empty(n, n, device=dev, dtype=torch.bfloat16)

    def burst(seconds: float) -> int:
        """Matmuls for about `seconds` (synchronised every 8, so it stops on time); how many ran."""
        done, stop = 0, time.monotonic() + seconds
        while time.monotonic() < stop:
            for _ in range(8):
                torch.matmul(x, y, out=out)
            torch.cuda.synchronize()
            done += 8
        return done

    burst(1.0)  # warm-up: cuBLAS picks its kernels here, not in the first phase
    info: dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__}
    mark("high")
    t0 = time.monotonic()
    k = burst(a.high_s)
    info["high_tflops"] = round(2 * n**3 * k / (time.monotonic() - t0) / 1e12, 1)
    refused = None
    if a.power_limit:
        refused = set_power_limit(a.uuid, a.power_limit)
        info["power_limit"] = {"watts": a.power_limit, "refused": refused}
    mark("low")
    t0 = time.monotonic()
    k = 0
    if a.power_limit and refused is None:
        k = burst(a.low_s)
    else:
        stop = time.monotonic() + a.low_s
        while time.monotonic() < stop:
            k += burst(0.1 * a.duty)
            time.sleep(max(0.0, min(0.1 * (1 - a.duty), stop - time.monotonic())))
    info["low_tflops"] = round(2 * n**3 * k / (time.monotonic() - t0) / 1e12, 1)
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--uuid", required=True, help="the GPU (as NVML names it)")
    p.add_argument("--nvml", default="pynvml", help="cocaq's NVML spec: pynvml or fake:SPEC")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--high-s", type=float, default=40.0)
    p.add_argument("--low-s", type=float, default=40.0)
    p.add_argument("--duty", type=float, default=0.3, help="low phase: share of each 100 ms spent busy")
    p.add_argument("--matrix", type=int, default=8192, help="side of the bf16 matrices")
    p.add_argument("--power-limit", type=float, default=None, help="low phase: nvidia-smi -pl W instead")
    p.add_argument("--fake", action="store_true", help="no torch: sleep through the phases")
    p.add_argument("--start-at", type=float, default=None, help="--fake: when the high phase starts")
    a = p.parse_args(argv)
    try:
        nvml = Nvml.open(a.nvml)
    except NvmlUnavailable as exc:
        print(f"real_gpu_check: workload: {exc}", file=sys.stderr)
        return 2
    edges: list[dict[str, Any]] = []

    def mark(name: str) -> None:
        ts, mj = counter_mj(nvml, a.uuid)
        edges.append({"at": name, "ts": ts, "energy_mj": mj})

    try:
        if a.fake:
            time.sleep(max(0.0, (a.start_at or time.time()) - time.time()))
            mark("high")
            time.sleep(a.high_s)
            mark("low")
            time.sleep(a.low_s)
            info: dict[str, Any] = {"device": "fake", "torch": None}
        else:
            info = run_gpu(a, nvml, mark)
            import torch

            torch.cuda.synchronize()
        mark("end")
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    finally:
        nvml.close()
    a.out.write_text(json.dumps({"edges": edges, "info": info}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
