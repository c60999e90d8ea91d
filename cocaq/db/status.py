"""What the database holds, per table: rows and size on disk (`cocaq db status`).

PostgreSQL: rows are the planner's estimate (pg_class.reltuples, kept by autovacuum's ANALYZE: no
count(*) over billions of samples), counted exactly only for a small table never analysed; sizes are
pg_total_relation_size (table, indexes and TOAST), a partitioned table's the sum of its partitions'.
SQLite: exact counts, and the size of the database file with its write-ahead log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, inspect, text

from cocaq.db.partitions import Partition, sample_partitions

EXACT_BELOW = 64 * 2**20  # bytes: a never-analysed table smaller than this is counted


@dataclass(frozen=True)
class TableStat:
    name: str
    rows: int | None  # None: not known (never analysed and too large to count)
    estimated: bool  # rows from pg_class.reltuples
    bytes: int | None  # None: not known per table (SQLite)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DbStatus:
    dialect: str
    tables: list[TableStat]
    partitions: list[Partition]  # of samples (PostgreSQL)
    file_bytes: int | None  # SQLite: the file and its -wal
    total_bytes: int


_PG_TABLES = """
SELECT c.relname AS name, c.relkind AS kind, c.reltuples AS reltuples,
       CASE WHEN c.relkind = 'p'
            THEN (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)
                    FROM pg_partition_tree(c.oid) t WHERE t.isleaf)
            ELSE pg_total_relation_size(c.oid) END AS bytes,
       CASE WHEN c.relkind = 'p'
            THEN (SELECT coalesce(sum(greatest(p.reltuples, 0)), 0)
                    FROM pg_partition_tree(c.oid) t JOIN pg_class p ON p.oid = t.relid WHERE t.isleaf)
            END AS part_rows,
       CASE WHEN c.relkind = 'p'
            THEN (SELECT bool_or(p.reltuples < 0)
                    FROM pg_partition_tree(c.oid) t JOIN pg_class p ON p.oid = t.relid WHERE t.isleaf)
            END AS part_unknown
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
 ORDER BY c.relname
"""


def db_status(engine: Engine) -> DbStatus:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            tables = _pg_tables(conn)
            parts = [_counted(conn, p) for p in sample_partitions(conn)]
            total = int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
            return DbStatus("postgresql", tables, parts, None, total)
        names = sorted(inspect(conn).get_table_names())
        tables = [TableStat(n, _count(conn, n), False, None) for n in names]
    size = _sqlite_file_bytes(engine)
    return DbStatus(engine.dialect.name, tables, [], size, size or 0)


def _pg_tables(conn: Connection) -> list[TableStat]:
    out = []
    for r in conn.execute(text(_PG_TABLES)):
        size = int(r.bytes or 0)
        if r.kind == "p":
            rows = None if r.part_unknown else int(r.part_rows or 0)
        else:
            rows = None if r.reltuples is None or r.reltuples < 0 else int(r.reltuples)
        if rows is None and size < EXACT_BELOW:  # never analysed, and cheap to count
            out.append(TableStat(r.name, _count(conn, r.name), False, size))
        else:
            out.append(TableStat(r.name, rows, True, size))
    return out


def _counted(conn: Connection, p: Partition) -> Partition:
    """A partition never analysed and small enough: its rows counted."""
    return replace(p, rows=_count(conn, p.name)) if p.rows is None and p.bytes < EXACT_BELOW else p


def _count(conn: Connection, table: str) -> int:
    quoted = conn.dialect.identifier_preparer.quote(table)
    return int(conn.execute(text(f"SELECT count(*) FROM {quoted}")).scalar_one())


def _sqlite_file_bytes(engine: Engine) -> int | None:
    db = engine.url.database
    if not db or db == ":memory:":
        return None
    path = Path(db).expanduser()
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def size_text(n: float) -> str:
    """Bytes for people, in powers of 1024: `512 B`, `12.0 MiB`, `1.4 TiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
