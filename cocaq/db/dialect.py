"""The SQL that PostgreSQL and SQLite spell differently, as text: the one place that asks which it is.

Three kinds of query embed these spellings: the SQLAlchemy functions of the ORM paths (the aggregator,
the reports: cocaq.db.sqlfuncs, whose compiled constructs call these), the login-node queries' plain SQL
(cocaq.footprint.dbsql: `cocaq user` must not import SQLAlchemy) and the formulas written once as SQL
text for both (cocaq.accounting.window, cocaq.accounting.ledger). Each function takes the dialect's name
as SQLAlchemy and cocaq.db.dbapi give it ("postgresql", "sqlite") and SQL expressions, and returns SQL
text; any dialect but SQLite gets the standard (PostgreSQL) spelling. tests/test_formulas.py fails on a
dialect check that picks a spelling anywhere else. Stdlib-only.
"""

from __future__ import annotations

SQLITE = "sqlite"


def greatest(dialect: str, *xs: str) -> str:
    """The largest of these values (SQLite's max() of several arguments is the same)."""
    return f"{'max' if dialect == SQLITE else 'greatest'}({', '.join(xs)})"


def least(dialect: str, *xs: str) -> str:
    """The smallest of these values (SQLite's min() of several arguments is the same)."""
    return f"{'min' if dialect == SQLITE else 'least'}({', '.join(xs)})"


def epoch(dialect: str, col: str) -> str:
    """Seconds since 1970 of a timestamp column, a few microseconds off on SQLite (julianday's
    arithmetic), numeric on PostgreSQL (which `round(x, 3)` takes): for times rounded to the millisecond."""
    if dialect == SQLITE:
        return f"((julianday({col}) - 2440587.5) * 86400.0)"
    return f"EXTRACT(EPOCH FROM {col})"


def epoch_exact(dialect: str, col: str, *, percent: str = "%") -> str:
    """Seconds since 1970 of a timestamp column as a double, to the microsecond on both dialects (as the
    aggregator, the rollups and `cocaq user` must agree on a job that starts at midnight). `percent`: how
    the query's driver wants a literal percent sign ("%%" in cocaq.db.dbapi's psycopg-style SQL)."""
    if dialect == SQLITE:
        # SQLite keeps naive UTC text: whole seconds by strftime, the fraction from the text (julianday
        # would land a job starting at midnight a hair into the day before).
        return (
            f"(CAST(strftime('{percent}s', {col}) AS INTEGER)"
            f" + CASE WHEN length({col}) > 19 THEN CAST(substr({col}, 20) AS REAL) ELSE 0.0 END)"
        )
    # float8 arithmetic on the microseconds: the nearest double to the exact value, as extract(...)::float8
    # (the rollups' statement) rounds it, and cheaper than going through numeric.
    return f"date_part('epoch', {col})"


def first_word(dialect: str, col: str) -> str:
    """`CANCELLED by 5` -> `CANCELLED` ('' for NULL), as the rollups read a state."""
    if dialect == SQLITE:
        return (
            f"CASE WHEN instr(coalesce({col}, ''), ' ') > 0 THEN substr({col}, 1, instr({col}, ' ') - 1)"
            f" ELSE coalesce({col}, '') END"
        )
    return f"split_part(coalesce({col}, ''), ' ', 1)"


def floor(dialect: str, x: str) -> str:
    """floor() of a non-negative number (SQLite may lack floor(): a cast truncates, the same there)."""
    if dialect == SQLITE:
        return f"CAST({x} AS INTEGER)"
    return f"floor({x})"


def utcnow(dialect: str) -> str:
    """The database's current time, to the microsecond's format on SQLite too.

    SQLite's CURRENT_TIMESTAMP is "YYYY-MM-DD HH:MM:SS", which compares as a string *below* the same
    second as SQLAlchemy stores it ("...:SS.000000"); change detection by timestamp needs one format.
    """
    if dialect == SQLITE:
        return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"
    return "CURRENT_TIMESTAMP"


def planner_fence(dialect: str, before: str = " ") -> str:
    """What ends a subquery that the planner must not inline into the query around it: PostgreSQL's
    `OFFSET 0` (its columns are then computed once, not in every expression that reads them). SQLite
    needs none, and takes no OFFSET without a LIMIT. `before`: the text that leads it (a line break)."""
    return "" if dialect == SQLITE else f"{before}OFFSET 0"


def false(dialect: str) -> str:
    """The boolean false (SQLite keeps booleans as 0 and 1)."""
    return "0" if dialect == SQLITE else "false"


def char(dialect: str, code: int) -> str:
    """The one-character string of this code point (chr() on PostgreSQL, char() on SQLite)."""
    return f"{'char' if dialect == SQLITE else 'chr'}({code})"


def strpos(dialect: str, haystack: str, needle: str) -> str:
    """Where `needle` first starts in `haystack`, from 1 (0: nowhere): strpos(), SQLite's instr()."""
    return f"{'instr' if dialect == SQLITE else 'strpos'}({haystack}, {needle})"


def json_text(dialect: str, col: str, *keys: str) -> str:
    """The text at the path of object `keys` in JSON column `col` (NULL where there is none): PostgreSQL's
    `->` and `->>`, SQLite's json_extract(). The keys are plain names, written as they are."""
    if dialect == SQLITE:
        return f"json_extract({col}, '$.{'.'.join(keys)}')"
    *inner, last = keys
    return col + "".join(f"->'{k}'" for k in inner) + f"->>'{last}'"


def text_type(dialect: str) -> str:
    """The type of unbounded text a CAST names (SQLite's TEXT affinity, PostgreSQL's VARCHAR)."""
    return "TEXT" if dialect == SQLITE else "VARCHAR"
