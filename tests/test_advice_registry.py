"""The advice rules' registry is the one place a rule is defined (cocaq.footprint.rules): one rule per
module, named after it, every module in the catalog both surfaces iterate, a second rule of the same name
or order refused, and no rule's name (its logic) written out in the window's suggestions or the job notes.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from cocaq.footprint import advice, job_advice, rules
from cocaq.footprint.rules import catalog
from cocaq.footprint.rules.registry import REGISTRY, Rule, in_order, register
from tests.test_advice import CTX, JUNE, fact

# the package's modules that hold what the rules share, and register none
SHARED = {"base", "registry", "catalog", "jobstats"}
PACKAGE = Path(rules.__file__).parent


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE)]))


def test_each_rule_module_defines_exactly_one_rule_named_after_it() -> None:
    rule_modules = [m for m in _modules() if m not in SHARED]
    assert len(rule_modules) >= 18
    for m in _modules():
        mod = importlib.import_module(f"cocaq.footprint.rules.{m}")
        defined = [
            v
            for v in vars(mod).values()
            if isinstance(v, type) and issubclass(v, Rule) and v.__module__ == mod.__name__
        ]
        registered = [r for r in REGISTRY.values() if type(r).__module__ == mod.__name__]
        if m in SHARED:
            assert registered == [], m
            continue
        assert len(defined) == 1 and len(registered) == 1, (m, defined)
        assert type(registered[0]) is defined[0] and registered[0].name.replace("-", "_") == m


def test_the_catalog_holds_every_rule_and_both_surfaces_iterate_it() -> None:
    assert {type(r).__module__.rsplit(".", 1)[1] for r in catalog.RULES} == set(_modules()) - SHARED
    assert set(catalog.RULES) == set(REGISTRY.values())
    assert [r.order for r in catalog.RULES] == sorted(r.order for r in catalog.RULES)
    assert advice.RULES == catalog.OVER_WINDOW and set(advice.SHOWN) <= set(advice.RULES)
    assert {"timeouts", "failures", "failures-late", "out-of-memory"} == advice.REPEATED
    for r in catalog.RULES:
        assert r.speaks_over_window or r.speaks_on_job, r.name
        assert r.source.strip(), r.name
        assert set(r.after) <= set(REGISTRY), r.name


class _Planted(Rule):
    order = 99_999
    source = "a test"


def test_a_planted_duplicate_is_refused() -> None:
    before = dict(REGISTRY)

    class Memory(_Planted):
        name = "memory"

    with pytest.raises(ValueError, match="registered twice"):
        register(Memory)

    class SameOrder(_Planted):
        name = "planted-order"
        order = REGISTRY["precision"].order

    with pytest.raises(ValueError, match="has the order of 'precision'"):
        register(SameOrder)
    assert before == REGISTRY

    # and a rule that would run after one that runs later: its `after` could never hold
    scratch: dict[str, Rule] = {}

    class Early(_Planted):
        name = "early"
        order = 1
        after: ClassVar[tuple[str, ...]] = ("late",)

    class Late(_Planted):
        name = "late"
        order = 2

    register(Early, scratch)
    register(Late, scratch)
    with pytest.raises(ValueError, match="runs after 'late'"):
        in_order(scratch)


def _jobs() -> list[Any]:
    """June's jobs of one user that make most rules speak, over the window and one by one."""
    limit = dict(time_limit_h=24.0, elapsed_h=2.0)
    return [
        fact(pk=1, job_id="1", state="TIMEOUT", time_limit_h=10.0),
        fact(pk=2, job_id="2", state="OUT_OF_MEMORY", req_mem_mb=16_000.0),
        fact(pk=3, job_id="3", state="FAILED", exit_code=1, elapsed_h=0.2),
        fact(pk=4, job_id="4", state="FAILED", exit_code=1, elapsed_h=6.0),
        fact(pk=5, job_id="5", name="jupyter", gpu_util_pct=2.0, sampled_share=1.0, idle_gpu_hours=8.0,
             idle_kwh=2.0),
        fact(pk=6, job_id="6", gpus=4, gpu_util_pct=3.0, sampled_share=1.0, idle_gpu_hours=36.0, idle_kwh=10.0),
        fact(pk=7, job_id="7", gpu_util_pct=20.0, sampled_share=1.0, cpus=4, total_cpu_s=4 * 10 * 3600.0),
        fact(pk=8, job_id="8", req_mem_mb=64_000.0, max_rss_mb=4_000.0, rss_tasks_per_node=1,
             gpu_mem_peak_mb=2_000.0),
        fact(pk=9, job_id="9", precision="full", precision_label="fp32", model="m", energy_kwh=40.0,
             gpu_kwh=30.0),
        fact(pk=10, job_id="10", gpus=0, cpus=16, total_cpu_s=3600.0, name="cpu", **limit),
        *(fact(pk=20 + i, job_id=str(20 + i), name="short", start=JUNE + timedelta(days=3 + i), **limit)
          for i in range(4)),
    ]  # fmt: skip


def test_every_suggestion_and_note_comes_from_the_registered_rule_of_its_name() -> None:
    jobs = _jobs()
    runs = [j for j in jobs if not j.is_open]
    said: set[str] = set()
    for rule in catalog.RULES:
        found = [rule.over_window(jobs, CTX), *(rule.on_job(j, CTX, runs) for j in jobs)]
        for a in found:
            if a is not None:
                assert a.id == rule.name
                said.add(a.id)
    window = {a.id for a in advice.candidates(jobs, CTX)}
    notes = {a.id for j in jobs for a in job_advice.job_notes(j, CTX, runs)}
    assert window | notes <= set(REGISTRY)
    assert window | notes == said and len(said) >= 12, said


def _constants(path: Path) -> list[tuple[str, int]]:
    return [
        (n.value, n.lineno)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _after_lines(path: Path) -> set[int]:
    """The lines of `after = (...)`, where a rule names the rules it follows."""
    out: set[int] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "after" for t in n.targets):
            out |= set(range(n.lineno, (n.end_lineno or n.lineno) + 1))
    return out


def test_no_rule_is_named_outside_its_own_module() -> None:
    """A rule's name as a string is its id; written in the surfaces that run the rules, or in another
    rule's module (but in an `after`), it would be a rule defined, or tested for, a second time."""
    names = set(REGISTRY)
    footprint = PACKAGE.parent
    for path in [footprint / "advice.py", footprint / "job_advice.py", *sorted(PACKAGE.glob("*.py"))]:
        own = path.stem.replace("_", "-")
        allowed = _after_lines(path)
        stray = [(s, line) for s, line in _constants(path) if s in names and s != own and line not in allowed]
        assert stray == [], path
