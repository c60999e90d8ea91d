"""The architecture, held by a test: no import cycle between modules, and dependencies only run downwards.

Every import of every module counts, at the top or inside a function (a lazy import is still a
dependency; it only moves the cost): a cycle means two modules that cannot be read or changed apart.
The rooms and what each may import are below; the node side (prolog_epilog, collector) reaches nothing
above the core leaves and the shared formats, so an epilog never loads the database layer or reports.
A new room, or a new dependency between rooms, is a decision: make it here, where a reviewer sees it.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# module prefix -> room (the longest prefix wins)
ROOMS: dict[str, str] = {
    "cocaq": "core",  # the package itself: __version__ and cocaq.annotate()
    "cocaq.config": "core",  # the configuration model
    "cocaq.config_load": "core",  # reading and validating it (file, COCAQ_* variables)
    "cocaq.errors": "core",
    "cocaq.timeparse": "core",
    "cocaq.hostlist": "core",
    "cocaq.addresses": "core",
    "cocaq.units": "core",  # units every layer converts between (J_PER_KWH)
    # formats shared by the node side, users' jobs and the head node: standard library only
    "cocaq.ml.annotation": "formats",
    "cocaq.ml.meta": "formats",
    "cocaq.db.pgurl": "formats",
    "cocaq.slurm.record": "formats",
    "cocaq.collector.records": "formats",  # the spool's events and energy rows
    "cocaq.db": "db",
    "cocaq.db.migrate": "migrate",
    "cocaq.migrations": "migrations",
    "cocaq.slurm": "slurm",
    "cocaq.carbon": "carbon",
    "cocaq.ml": "ml",
    "cocaq.accounting": "accounting",
    "cocaq.footprint": "footprint",
    "cocaq.collector": "collector",
    "cocaq.prolog_epilog": "hooks",
    "cocaq.reports": "reports",
    "cocaq.api": "api",
    "cocaq.study": "study",  # the e-mail study: the draw (assign) and the analysis
    "cocaq.web": "web",  # the web app (Open OnDemand): pages over the read API, asked as the user
    "cocaq.frames": "frames",  # the tables as pandas DataFrames, from the database or the read API
    "cocaq.scheduler": "scheduler",  # `cocaq scheduler`'s service: the job table, the lock, the daemon
    "cocaq.demo": "demo",  # the demo's made-up site: its jobs, samples and reports, built for `cocaq demo`
    "cocaq.cli": "cli",
    "cocaq.ood": "cli",  # Open OnDemand's startup file (ood/passenger_wsgi.py): an entry point, as the CLI
    "cocaq.__main__": "cli",
}

_BELOW_ACCOUNTING = {"core", "formats", "db", "slurm", "carbon", "ml"}
# every stage a site's data goes through, from the import to the study: the demo runs made-up data through them
_THE_DEMO_RUNS = {"core", "db", "migrate", "slurm", "carbon", "accounting", "footprint", "collector",
                  "reports", "study"}  # fmt: skip
# room -> the rooms it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "formats": set(),
    "core": {"formats"},
    "db": {"core", "formats"},
    "migrations": {"core", "formats", "db"},
    "migrate": {"core", "formats", "db", "migrations"},
    "slurm": {"core", "formats"},
    "carbon": {"core", "formats", "db"},
    "ml": {"core", "formats", "db"},
    "accounting": _BELOW_ACCOUNTING,
    "footprint": _BELOW_ACCOUNTING | {"accounting"},
    "collector": {"core", "formats"},
    "hooks": {"core", "formats", "collector"},
    "study": _BELOW_ACCOUNTING | {"accounting", "footprint"},
    "reports": _BELOW_ACCOUNTING | {"accounting", "footprint", "study"},
    "api": _BELOW_ACCOUNTING | {"accounting", "footprint", "reports"},  # (a month: the e-mail itself)
    "frames": _BELOW_ACCOUNTING | {"accounting", "footprint", "api"},
    # The web app reads through the read API only (its client, or its app in-process), and words its
    # figures as the terminal and the e-mails do (footprint's words, the reports' wording).
    "web": {"core", "formats", "api", "footprint", "reports"},
    # The scheduler runs the accounting's and the reports' passes on a clock; it reads no footprint of its
    # own and serves nothing, and only its command (cli) imports it: a job never loads the front-end.
    "scheduler": {"core", "db", "slurm", "accounting", "reports"},
    # The demo runs a made-up site through every real stage a site's data goes through (import, the
    # collector's shipping, measurement, aggregation, footprints, reports, the study), so it sits above
    # them all; it says nothing itself (cli prints what it built), and only cli imports it: nothing a site
    # runs depends on made-up data.
    "demo": _THE_DEMO_RUNS,
    "cli": set(),  # the front-end: anything (filled below)
}
ALLOWED["cli"] = set(ALLOWED) - {"cli"}


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of the package as it is installed: cocaq/ with the root folders it links to."""
    out: dict[str, Path] = {}
    base = ROOT / "cocaq"
    for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = Path(dirpath).relative_to(base)
        if rel.parts and rel.parts[0] == "migrations" and "versions" in rel.parts:
            continue  # the migrations' revisions: a frozen history, loaded by Alembic by path
        for f in filenames:
            if not f.endswith(".py"):
                continue
            parts = ["cocaq", *rel.parts] + ([] if f == "__init__.py" else [f[:-3]])
            out[".".join(parts)] = Path(dirpath) / f
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import in the file, at any depth, resolved to a module of ours."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            targets = [node.args[0].value]  # importlib.import_module("cocaq.x"): a dependency all the same
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                mod = ".".join([*pkg, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            # `from a import b` is module a.b where that is a module, else a name in module a
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        for t in targets:
            while t and t not in known and "." in t:
                t = t.rsplit(".", 1)[0]  # `import cocaq.x.y` of a name: the module that holds it
            if t in known and t != name:
                yield t, node.lineno


@functools.cache
def _graph() -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    known = _modules()
    graph: dict[str, dict[str, int]] = {m: {} for m in known}
    for m, p in known.items():
        for t, line in _imports(m, p, known):
            graph[m].setdefault(t, line)
    return known, graph


def room(module: str) -> str | None:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in ROOMS:
            return ROOMS[".".join(parts[:i])]
    return None


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_every_module_is_in_a_room() -> None:
    known, _ = _graph()
    assert len(known) > 80  # the walk follows the links to the root folders
    assert {"cocaq.collector.daemon", "cocaq.reports.batch", "cocaq.prolog_epilog.hook"} <= set(known)
    assert [m for m in known if room(m) is None] == []
    assert set(ROOMS.values()) == set(ALLOWED)


def test_the_rooms_depend_on_each_other_one_way() -> None:
    """ALLOWED itself has no cycle: the rooms can be drawn as layers."""
    done: set[str] = set()
    pending = dict(ALLOWED)
    while pending:
        ready = [r for r, deps in pending.items() if deps <= done]
        assert ready, f"the rooms' allowed imports form a cycle among {sorted(pending)}"
        for r in ready:
            done.add(r)
            del pending[r]


def test_only_the_front_end_imports_the_scheduler_and_the_demo() -> None:
    """Rooms no other room may import: a job, a report or the API never loads the daemon or made-up data."""
    for r in ("scheduler", "demo"):
        assert {src for src, deps in ALLOWED.items() if r in deps} == {"cli"}, r


def test_no_import_cycle_between_modules() -> None:
    _, graph = _graph()
    cycles = _cycles(graph)
    lines = []
    for comp in cycles:
        members = set(comp)
        edges = [f"{a} -> {b} (line {graph[a][b]})" for a in comp for b in sorted(graph[a]) if b in members]
        lines.append("; ".join(edges))
    assert cycles == [], "import cycles:\n" + "\n".join(lines)


def test_no_upward_import() -> None:
    known, graph = _graph()
    bad = []
    for m, deps in sorted(graph.items()):
        src = room(m)
        assert src is not None
        for t, line in sorted(deps.items()):
            dst = room(t)
            if dst != src and dst not in ALLOWED[src]:
                rel = known[m].relative_to(ROOT)
                bad.append(
                    f"{rel}:{line}: {m} ({src}) imports {t} ({dst}); {src} may import {sorted(ALLOWED[src])}"
                )
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import cocaq.db.engine\n", {"cocaq.db.engine"}),
        ("from cocaq.db import engine, schema\n", {"cocaq.db.engine", "cocaq.db.schema"}),
        ("def f():\n    from cocaq.footprint.totals import Window\n", {"cocaq.footprint.totals"}),
        ("from . import engine\n", {"cocaq.db.engine"}),
        ("from .schema import Job\n", {"cocaq.db.schema"}),
        ("import importlib\nimportlib.import_module('cocaq.db.schema')\n", {"cocaq.db.schema"}),
        ("import json\nfrom sqlalchemy import text\n", set()),
    ],
)
def test_the_checker_sees_every_kind_of_import(tmp_path: Path, source: str, expected: set[str]) -> None:
    """The checker itself: absolute, from-imports of modules and of names, lazy and relative imports."""
    known, _ = _graph()
    f = tmp_path / "probe.py"
    f.write_text(source)
    assert {t for t, _ in _imports("cocaq.db.probe", f, known)} == expected


def test_the_checker_finds_a_cycle_and_an_upward_import() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert room("cocaq.collector.ship") == "collector" and "db" not in ALLOWED["collector"]
    assert room("cocaq.db.pgurl") == "formats" and room("cocaq.db.schema") == "db"
