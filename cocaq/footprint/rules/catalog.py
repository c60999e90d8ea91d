"""Every advice rule, in the order they run: the one list the window's suggestions
(cocaq.footprint.advice) and the notes on one job (cocaq.footprint.job_advice) iterate.

Importing a rule's module registers it (cocaq.footprint.rules.registry); a new rule is a new module of
this package, imported here. tests/test_advice_registry.py holds the package to one rule per module,
named after it, and every module to this list.
"""

from __future__ import annotations

from cocaq.footprint.rules import (  # noqa: F401  (imported to register them)
    cores_per_gpu,
    cpus,
    dataloader,
    failures,
    failures_late,
    fewer_gpus,
    fewer_nodes,
    gpu_memory,
    mem_per_gpu,
    memory,
    mig,
    notebooks,
    out_of_memory,
    precision,
    time_limits,
    timeouts,
    unused_gpus,
    zero_cpu_nodes,
)
from cocaq.footprint.rules.registry import REGISTRY, Rule, in_order

RULES: tuple[Rule, ...] = in_order(REGISTRY)
OVER_WINDOW: tuple[Rule, ...] = tuple(r for r in RULES if r.speaks_over_window)
ON_JOB: tuple[Rule, ...] = tuple(r for r in RULES if r.speaks_on_job)
