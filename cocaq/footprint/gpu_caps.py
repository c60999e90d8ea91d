"""What a GPU model can compute in reduced precision: its CUDA compute capability, from NVIDIA's table.

The precision advice must not tell a V100 user to train in bf16: bfloat16 tensor-core math needs compute
capability 8.0 (Ampere) or newer; on 7.x (Volta, Turing) the mixed precision that pays is float16 with a
loss scaler (torch.cuda.amp.GradScaler); before 7.0 there are no tensor cores and mixed precision gains
little, so the advice says nothing there. Sources: NVIDIA's "CUDA GPUs - Compute Capability" table
(developer.nvidia.com/cuda-gpus) and the CUDA C++ Programming Guide's table of features per compute
capability (bf16 tensor-core MMA from 8.0). Names are matched as sites write them in their config or
Slurm's gres type (`a100`, `NVIDIA A100-SXM4-80GB`, `tesla_v100`, `h100_80gb_hbm3`). Standard library
only (login nodes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# (pattern on the lowered name with separators removed, compute capability, the name to say)
_TABLE: tuple[tuple[str, float, str], ...] = (
    (r"gb200|b200|b100", 10.0, "B200"),
    (r"gh200", 9.0, "GH200"),
    (r"h200", 9.0, "H200"),
    (r"h100|h800", 9.0, "H100"),
    (r"l40s?", 8.9, "L40"),
    (r"(?<![a-z])l4(?!\d)", 8.9, "L4"),
    (r"rtx(a|pro)?[456]000ada|rtx[456]000ada|ada", 8.9, "RTX Ada"),
    (r"rtx40\d0|rtx4090|4090|4080", 8.9, "GeForce RTX 40"),
    (r"a100|a800", 8.0, "A100"),
    (r"a30(?!\d)", 8.0, "A30"),
    (r"a40(?!\d)", 8.6, "A40"),
    (r"a10g?(?!\d)", 8.6, "A10"),
    (r"a16(?!\d)|a2(?!\d)", 8.6, "A16/A2"),
    (r"rtxa[456]000|rtxa6000|(?<![a-z])a[456]000", 8.6, "RTX A6000"),
    (r"rtx30\d0|3090|3080", 8.6, "GeForce RTX 30"),
    (r"v100|titanv|quadrogv100", 7.0, "V100"),
    (r"t4(?!\d)", 7.5, "T4"),
    (r"rtx20\d0|2080|titanrtx|quadrortx[468]000|rtx[468]000", 7.5, "Turing RTX"),
    (r"p100", 6.0, "P100"),
    (r"p40(?!\d)|p4(?!\d)|p6000|gtx10\d0|1080", 6.1, "Pascal"),
    (r"k80", 3.7, "K80"),
    (r"k40", 3.5, "K40"),
)
_COMPILED = tuple((re.compile(p), cc, name) for p, cc, name in _TABLE)
_SEPARATORS = re.compile(r"[\s_\-./]+")


@dataclass(frozen=True)
class Capability:
    model: str  # the name to say: "V100"
    compute_capability: float

    @property
    def bf16(self) -> bool:
        """bfloat16 tensor-core math: compute capability 8.0 and newer."""
        return self.compute_capability >= 8.0

    @property
    def fp16_tensor_cores(self) -> bool:
        """float16 tensor cores: Volta (7.0) and newer."""
        return self.compute_capability >= 7.0


def capability(*names: str | None) -> Capability | None:
    """The first of `names` (a job's gres type, its profile's gpu_model) that the table knows; None where
    none is known (the advice then names both precisions with the capability each needs)."""
    for raw in names:
        if raw and (cap := _known(raw)) is not None:
            return cap
    return None


@lru_cache(maxsize=256)
def _known(raw: str) -> Capability | None:
    """One name against the table; cached, as a heavy user's 10,000 jobs name the same few GPUs."""
    key = _SEPARATORS.sub("", raw.lower()).replace("nvidia", "").replace("tesla", "")
    for pat, cc, name in _COMPILED:
        if pat.search(key):
            return Capability(name, cc)
    return None
