"""One definition per formula and per list (issue 37, point 1): CO2 = kWh x PUE x intensity is
cocaq.units.co2_grams (and co2_grams_of_kwh), joules per kWh is cocaq.units.J_PER_KWH, the conversions by
an hour and by a thousand are cocaq.units' named ones (S_PER_HOUR, G_PER_KG, ...), the daily_rollups
columns are cocaq.db.rollup_columns, and what PostgreSQL and SQLite spell differently is cocaq.db.dialect.
This fails on a new inline copy, in the style of tests/test_layers.py (which it follows: every module of
the package, the component folders too), and each rule checks itself on a planted copy."""

from __future__ import annotations

import ast
import functools
import itertools
import re
from pathlib import Path
from typing import cast

import pytest
from sqlalchemy import Table, UniqueConstraint

from cocaq import units
from cocaq.accounting.ledger import OUTCOMES
from cocaq.db.rollup_columns import ROLLUP_COUNTS, ROLLUP_FIELDS, ROLLUP_KEYS, ROLLUP_SUMS
from cocaq.db.schema import DailyRollup
from cocaq.units import G_PER_KG, J_PER_KWH, S_PER_HOUR, WH_PER_KWH, co2_grams, co2_grams_of_kwh

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ("cocaq", "collector", "prolog_epilog", "reports", "migrations")
HOME = ROOT / "cocaq" / "units.py"
UNIT_NAMES = sorted(n for n in vars(units) if n.isupper())  # J_PER_KWH, S_PER_HOUR, G_PER_KG, ...

COPIES = {
    # PUE times an intensity, or the other way round, on one line: the CO2 formula written out again
    "CO2 = kWh x PUE x intensity": re.compile(
        r"\bpue\b.*\*.*(g_per_kwh|intensity)|(g_per_kwh|intensity)\b.*\*.*\bpue\b"
    ),
    "joules per kWh": re.compile(r"(?<![\w.])3\.6e6\b|(?<![\w.])3_600_000(\.0)?\b|(?<![\w.])3600000(\.0)?\b"),
    "a unit of cocaq.units defined again": re.compile(rf"^\s*({'|'.join(UNIT_NAMES)})\s*[:=]"),
}


def sources() -> list[Path]:
    out = []
    for top in PACKAGE:
        out += sorted((ROOT / top).rglob("*.py"))
    return [p for p in out if p.resolve() != HOME.resolve() and "__pycache__" not in p.parts]


def copies(path: Path) -> list[str]:
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        for what, pattern in COPIES.items():
            if pattern.search(code):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{where}:{n}: {what}: {line.strip()}")
    return found


def test_no_module_writes_these_formulas_out_again() -> None:
    found = [c for p in sources() for c in copies(p)]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_copy(tmp_path: Path) -> None:
    """The test itself: each pattern catches the copies it is for, and not the calls that replace them."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "co2_kg = energy_j / J_PER_KWH * pue * g_per_kwh / 1000\n"
        "g = kwh * c.carbon_g_per_kwh * c.pue\n"
        "kwh = energy_j / 3.6e6\n"
        "J_PER_KWH = 3_600_000.0\n"
        "S_PER_HOUR: int = 3600\n"
        "co2 = co2_grams(energy_j, pue, g_per_kwh)  # pue * g_per_kwh in a comment is fine\n"
        "HOUR = float(S_PER_HOUR)  # a name of its own, from the one definition: fine\n"
    )
    found = copies(bad)
    assert [f.split(": ")[1] for f in found] == [
        "CO2 = kWh x PUE x intensity", "CO2 = kWh x PUE x intensity", "joules per kWh", "joules per kWh",
        "a unit of cocaq.units defined again", "a unit of cocaq.units defined again",
    ], found  # fmt: skip


@pytest.mark.parametrize(("j", "pue", "g"), [(3.6e6, 1.0, 100.0), (1.8e7, 1.35, 56.0), (0.0, 2.0, 400.0)])
def test_the_formula(j: float, pue: float, g: float) -> None:
    assert co2_grams(j, pue, g) == co2_grams_of_kwh(j / J_PER_KWH, pue, g) == j / J_PER_KWH * pue * g


# --- the rollup column list: cocaq.db.rollup_columns ------------------------------------------------------

ROLLUP_HOME = ROOT / "cocaq" / "db" / "rollup_columns.py"
# A revision is written against the schema and the SQL of its day: it must not read today's lists.
FROZEN = ROOT / "migrations" / "versions"


def later_sources(*homes: Path) -> list[Path]:
    """The modules these rules hold, less the rule's own home and the migrations' frozen revisions."""
    out = []
    for top in PACKAGE:
        out += sorted((ROOT / top).rglob("*.py"))
    skip = {h.resolve() for h in homes}
    return [
        p
        for p in out
        if p.resolve() not in skip and "__pycache__" not in p.parts and not p.resolve().is_relative_to(FROZEN)
    ]


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{line}"


@functools.cache
def _rollup_neighbours() -> frozenset[frozenset[str]]:
    """The pairs of rollup columns that stand next to each other in the list or in the table."""
    table = [c.name for c in cast(Table, DailyRollup.__table__).c if c.name in ROLLUP_FIELDS]
    return frozenset(frozenset(p) for order in (ROLLUP_FIELDS, table) for p in itertools.pairwise(order))


def rollup_copies(path: Path) -> list[str]:
    """Literal sequences of names (a tuple, list or set, or a call's arguments) that copy the rollup
    column list: three names in a row that follow one another in the list or the table (a piece of it,
    in either order), or half of the list's names in one literal (a copy in another order). A selection
    of a few sums (what a series shows, what peers are compared on) is neither."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = node.elts
        elif isinstance(node, ast.Call):
            elts = node.args
        else:
            continue
        names = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in elts]
        run, longest = 1, 1
        for a, b in itertools.pairwise(names):
            run = run + 1 if a and b and frozenset((a, b)) in _rollup_neighbours() else 1
            longest = max(longest, run)
        if longest >= 3 or len({n for n in names if n in ROLLUP_FIELDS}) >= len(ROLLUP_FIELDS) // 2:
            found.append(
                f"{_where(path, node.lineno)}: a copy of the rollup columns (cocaq.db.rollup_columns)"
            )
    return found


def test_no_module_copies_the_rollup_columns() -> None:
    found = [c for p in later_sources(ROLLUP_HOME) for c in rollup_copies(p)]
    assert found == [], "\n".join(found)


def test_the_rollup_columns_are_the_tables() -> None:
    """The one list names every column of daily_rollups once (its key, what it counts, what it sums),
    and the counts are those of the ledger's outcomes (cocaq.accounting.rollups counts `jobs_{outcome}`)."""
    table = cast(Table, DailyRollup.__table__)
    assert sorted([*ROLLUP_KEYS, *ROLLUP_FIELDS, "id", "computed_at"]) == sorted(c.name for c in table.c)
    assert len(set(ROLLUP_FIELDS)) == len(ROLLUP_FIELDS)
    (key,) = [c for c in table.constraints if isinstance(c, UniqueConstraint)]
    assert tuple(c.name for c in key.columns) == ROLLUP_KEYS
    assert ("jobs", *(f"jobs_{o}" for o in OUTCOMES)) == ROLLUP_COUNTS
    assert (*ROLLUP_COUNTS, *ROLLUP_SUMS) == ROLLUP_FIELDS


def test_the_check_finds_a_copy_of_the_rollup_columns(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "SUMS = ('cpu_hours', 'gpu_hours', 'energy_gpu_j', 'energy_cpu_j')\n"  # a piece, in the list's order
        "EST = ['energy_estimated_j', 'energy_est_low_j', 'energy_est_high_j']\n"  # in the table's order
        f"ALL = {tuple(sorted(ROLLUP_SUMS))!r}\n"  # all of it, sorted
        "cols = select('co2_g', 'co2_embodied_g', 'gpu_util_energy_j')\n"  # as a call's arguments
        "DAY_SUMS = ('energy_measured_j', 'energy_estimated_j', 'co2_g', 'gpu_hours', 'gpu_util_energy_j')\n"
        "PAIR = ('gpu_util_energy_j', 'gpu_util_weighted')\n"
        "FROM_HOME = (*ROLLUP_KEYS, *ROLLUP_SUMS)\n"
    )
    assert [f.split(": ")[0] for f in rollup_copies(bad)] == ["bad.py:1", "bad.py:2", "bad.py:3", "bad.py:4"]


# --- SQL spellings by dialect: cocaq.db.dialect -----------------------------------------------------------

DIALECT_HOME = ROOT / "cocaq" / "db" / "dialect.py"
DIALECTS = {"postgresql", "sqlite"}
# Where a dialect check legitimately remains: what differs is the way (a driver's own path, PostgreSQL's
# partitions, locks and settings, a plan SQLite cannot run), never how a function is spelled.
PATHS: dict[str, str] = {
    "cocaq/accounting/aggregate.py": "PostgreSQL: ids straight from the driver, COPY writes, ANY(array), workers",
    "cocaq/accounting/importer.py": "PostgreSQL imports by COPY",
    "cocaq/accounting/retention.py": "PostgreSQL drops monthly partitions, SQLite deletes rows",
    "cocaq/accounting/rollups.py": "PostgreSQL: the rollups in one statement, SET LOCAL work_mem, parallel days",
    "cocaq/api/pool.py": "sqlite3 connections stay in their thread: not pooled",
    "cocaq/carbon/series_import.py": "PostgreSQL upserts by its own statement",
    "cocaq/cli/db.py": "retention's summary: partitions on PostgreSQL",
    "cocaq/cli/db_status_view.py": "`cocaq db status`: PostgreSQL's row counts are estimates",
    "cocaq/demo/site.py": "the demo makes its own SQLite database",
    "cocaq/scheduler/lock.py": "the scheduler's lock: an advisory lock or a lock file",
    "cocaq/db/alongside.py": "a statement in a thread of its own: sqlite3 connections stay in theirs",
    "cocaq/db/coltypes.py": "SQLite stores naive UTC times",
    "cocaq/db/dbapi.py": "the login-node connections: the driver and its parameter style",
    "cocaq/db/engine.py": "engine setup per backend",
    "cocaq/db/migrate.py": "PostgreSQL's sample partitions after an upgrade",
    "cocaq/db/status.py": "PostgreSQL's catalogue and partitions",
    "cocaq/footprint/jobfacts.py": "PostgreSQL joins job_energy LATERAL; SQLite's text times and 0/1 booleans",
    "cocaq/study/assign.py": "the dialect's INSERT ... ON CONFLICT construct",
    "migrations/env.py": "Alembic's batch mode for SQLite's ALTER TABLE",
    "reports/alerts.py": "PostgreSQL's advisory lock per user",
    "reports/queries.py": "PostgreSQL: SET LOCAL jit and work_mem",
}  # fmt: skip
# Modules that pick text by dialect that is no SQL: words for people.
NOT_SQL: dict[str, str] = {
    "cocaq/cli/db_status_view.py": "`cocaq db status` says how each backend keeps samples",
}


def _is_dialect(node: ast.AST) -> bool:
    """A dialect's name: "postgresql" or "sqlite", a tuple of them, or a constant named for one."""
    if isinstance(node, ast.Constant):
        return node.value in DIALECTS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_dialect(e) for e in node.elts)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in ("SQLITE", "POSTGRESQL")


def _is_check(node: ast.AST) -> bool:
    return isinstance(node, ast.Compare) and any(_is_dialect(n) for n in (node.left, *node.comparators))


def _is_text(node: ast.AST) -> bool:
    """SQL text, or an SQLAlchemy generic function (func.least): what a spelling picks between."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.JoinedStr, ast.Tuple)):
        return isinstance(node, ast.JoinedStr) or all(_is_text(e) for e in node.elts)
    f = node.func if isinstance(node, ast.Call) else None
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "func"


def _picks_text(n: ast.AST, flags: set[str]) -> bool:
    """`<text> if <a dialect check> else <text>`: a spelling picked by dialect."""
    if not (isinstance(n, ast.IfExp) and _is_text(n.body) and _is_text(n.orelse)):
        return False
    return any(_is_check(t) or (isinstance(t, ast.Name) and t.id in flags) for t in ast.walk(n.test))


def dialect_checks(path: Path) -> tuple[list[str], list[str]]:
    """(comparisons with a dialect's name, conditional expressions that pick SQL text by one) in a file,
    by line. A name bound to a comparison (`pg = db.dialect == "postgresql"`) counts as the comparison."""
    tree = ast.parse(path.read_text(), str(path))
    flags = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and _is_check(n.value)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    nodes = sorted(
        (n for n in ast.walk(tree) if isinstance(n, (ast.Compare, ast.IfExp))),
        key=lambda n: (n.lineno, n.col_offset),
    )
    checks = [f"{_where(path, n.lineno)}: a dialect check" for n in nodes if _is_check(n)]
    spellings = [
        f"{_where(path, n.lineno)}: SQL spelled by dialect (cocaq.db.dialect)"
        for n in nodes
        if _picks_text(n, flags)
    ]
    return checks, spellings


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_dialect_checks_only_where_the_way_differs() -> None:
    """A dialect check outside cocaq.db.dialect is a different way (PATHS, with why), never a spelling."""
    found = [c for p in later_sources(DIALECT_HOME) if _rel(p) not in PATHS for c in dialect_checks(p)[0]]
    assert found == [], "\n".join(found)


def test_no_sql_spelled_by_dialect_outside_the_dialect_module() -> None:
    found = [s for p in later_sources(DIALECT_HOME) if _rel(p) not in NOT_SQL for s in dialect_checks(p)[1]]
    assert found == [], "\n".join(found)


def test_the_dialect_lists_are_current() -> None:
    """Each module on PATHS still asks the dialect, each on NOT_SQL still picks text by it: an entry whose
    reason is gone comes off (the lists only shrink)."""
    for rel in PATHS:
        assert dialect_checks(ROOT / rel)[0], f"{rel} asks no dialect now: take it off PATHS"
    for rel in NOT_SQL:
        assert dialect_checks(ROOT / rel)[1], f"{rel} picks no text by dialect now: take it off its list"
    assert not set(NOT_SQL) - set(PATHS), "a module that picks words by dialect asks it: on PATHS too"


def test_the_check_finds_a_dialect_check(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        'big = "greatest" if dialect == "postgresql" else "max"\n'
        'pg = db.dialect == "postgresql"\n'
        'fence = "\\n OFFSET 0" if pg else ""\n'
        'if conn.dialect.name != "sqlite":\n'
        "    pass\n"
        'f = func.min(a) if engine.dialect.name in ("sqlite",) else func.least(a)\n'
        'e = f"split_part({c})" if d != SQLITE else f"instr({c})"\n'
        'x = dialect.greatest(db.dialect, "a", "b")  # the dialect module spells it: fine\n'
        'name = "postgresql"  # a name, compared with nothing: fine\n'
        "rows = fetch_pg(conn) if pg else fetch(conn)  # a way, not a spelling: a check, no spelling\n"
    )
    checks, spellings = dialect_checks(bad)
    assert [c.split(": ")[0] for c in checks] == ["bad.py:1", "bad.py:2", "bad.py:4", "bad.py:6", "bad.py:7"]
    assert [s.split(": ")[0] for s in spellings] == ["bad.py:1", "bad.py:3", "bad.py:6", "bad.py:7"]


# --- conversions by an hour and by a thousand: cocaq.units ------------------------------------------------

FACTORS = (3600, 1000)  # seconds in an hour (S_PER_HOUR); a thousand (G_PER_KG, MS_PER_S, WH_PER_KWH, ...)
_SCALES = (ast.Mult, ast.Div, ast.FloorDiv)
# the same in SQL text: `el / 3600.0`, `1000 * x` (a query interpolates the named one: `/ {per_h}`)
_SQL_FACTOR = re.compile(r"[*/] ?(3600|1000)(\.0+)?(?![\d.])|(?<![\w.])(3600|1000)(\.0+)? ?[*/]")
# Where such a literal stays (path -> why): no unit conversion, or a module that may not import cocaq.
# What the rule does not see needs no entry: a bare value (`timeout=3600`, `le=1000`, `seconds < 3600`,
# `range(1000)`), a sum (`h + 3600.0`), a table of seconds per unit (cocaq.timeparse's), a docstring.
FACTORS_KEPT: dict[str, str] = {
    "collector/fakenvml.py": "the fake NVML loads nothing of cocaq, as a hook's budget wants "
    "(tests/test_nvml.py): its millijoules and milliwatts are NVML's own units",
}


def _is_factor(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and node.value in FACTORS


def inline_factors(path: Path) -> list[str]:
    """Products and quotients by 3600 or 1000 written as a number (`x / 3600`, `2 * 3600.0`,
    `ms = s * 1e3`, `x *= 1000`, `t // 3600`) and the same in SQL text, by line; docstrings aside."""
    tree = ast.parse(path.read_text(), str(path))
    prose = {
        id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, _SCALES):
            what = ast.unparse(node) if _is_factor(node.left) or _is_factor(node.right) else None
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, _SCALES):
            what = ast.unparse(node) if _is_factor(node.value) else None
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            m = _SQL_FACTOR.search(node.value)
            what = f"{m.group(0)!r} in a string" if m else None
        if what:
            found.append((node.lineno, f"{_where(path, node.lineno)}: an inline conversion by 3600 or 1000: "
                          f"{what[:80]} (cocaq.units names it)"))  # fmt: skip
    return [f for _, f in sorted(set(found))]


def test_no_inline_conversion_by_an_hour_or_a_thousand() -> None:
    """`x / 3600` is `x / S_PER_HOUR`, `g / 1000` is `g / G_PER_KG`: named once, in cocaq.units."""
    found = [f for p in later_sources(HOME) if _rel(p) not in FACTORS_KEPT for f in inline_factors(p)]
    assert found == [], "\n".join(found)


def test_the_kept_factors_are_current() -> None:
    """Each module on FACTORS_KEPT still writes such a literal: an entry whose reason is gone comes off."""
    for rel in FACTORS_KEPT:
        assert inline_factors(ROOT / rel), f"{rel} converts by no literal now: take it off FACTORS_KEPT"


def test_the_check_finds_an_inline_conversion(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "h = seconds / 3600\n"
        "kg = g / 1000.0\n"
        "ms = dt * 1e3\n"
        "timeout = 2 * 3600\n"
        "x *= 1_000\n"
        "h, rest = s // 3600, s % 3600\n"
        'sql = f"SELECT w.el / 3600.0, w.co2 / {per_kg} FROM w"\n'
        "SUMS = 'sum(1000 * x) AS y'\n"
        "h = seconds / S_PER_HOUR  # / 3600 in a comment is fine\n"
        "rows = range(1000)\n"
        "timeout = 3600\n"
        "y = x / 36000 + x * 10000 + x / 3600.5 + x + 3600\n"
        'def f() -> None:\n    """seconds / 3600 in a docstring is fine"""\n'
    )
    assert [f.split(": ")[0] for f in inline_factors(bad)] == [f"bad.py:{n}" for n in range(1, 9)]


def test_the_units() -> None:
    """The named conversions are whole numbers (a quotient is what the literal gave, `//` floors to an
    int): an hour's seconds and, for the rest, a thousand; an hour times a thousand is J_PER_KWH."""
    assert all(type(getattr(units, n)) is int for n in UNIT_NAMES if n != "J_PER_KWH")
    assert J_PER_KWH == S_PER_HOUR * WH_PER_KWH
    assert {getattr(units, n) for n in UNIT_NAMES if n not in ("J_PER_KWH", "S_PER_HOUR")} == {G_PER_KG}
