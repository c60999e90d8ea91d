"""The monthly partitions of `samples` on PostgreSQL: which there are, making the coming ones, dropping one.

`samples` is range-partitioned by `ts` (migrations/versions/0001): one partition per UTC month, named
samples_pYYYYMM, and `samples_default` for rows no month holds (a month not made yet, or one dropped).
This module is the DDL only; which month may go is cocaq.accounting.retention's decision. SQLite has one
plain table and none of this.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, text

DEFAULT = "samples_default"
# DETACH takes an ACCESS EXCLUSIVE lock on `samples`: waiting behind a long query would stall every
# shipper queued behind it, so it gives up after this and the next day's run tries again.
LOCK_TIMEOUT = "10s"

# A partition's bounds as its catalogue text says them, read back as timestamptz in the session's time
# zone (the one the text was written in), so no parsing of offsets in Python.
_PARTITIONS = r"""
SELECT c.relname AS name,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                     $re$FROM \('([^']+)'\) TO \('([^']+)'\)$re$))[1]::timestamptz AS lo,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                     $re$FROM \('([^']+)'\) TO \('([^']+)'\)$re$))[2]::timestamptz AS hi,
       c.reltuples AS reltuples,
       pg_total_relation_size(c.oid) AS bytes
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = to_regclass('samples')
 ORDER BY lo NULLS LAST, c.relname
"""


@dataclass(frozen=True)
class Partition:
    """One partition of `samples`: its bounds (None for the default one), rows and size on disk."""

    name: str
    lo: datetime | None
    hi: datetime | None
    rows: int | None  # pg_class.reltuples: the planner's estimate; None where never analysed
    bytes: int  # pg_total_relation_size: the table with its indexes and TOAST

    @property
    def month(self) -> str:
        return f"{self.lo:%Y-%m}" if self.lo is not None else "default"


def month_add(d: datetime, n: int) -> datetime:
    """The first instant of the month `n` months after `d`'s (in `d`'s zone)."""
    y, m = divmod(d.month - 1 + n, 12)
    return d.replace(year=d.year + y, month=m + 1, day=1, hour=0, minute=0, second=0, microsecond=0)


def sample_partitions(conn: Connection) -> list[Partition]:
    """Every partition of `samples`, oldest month first, the default one last."""
    out = []
    for r in conn.execute(text(_PARTITIONS)):
        rows = None if r.reltuples is None or r.reltuples < 0 else int(r.reltuples)
        out.append(Partition(r.name, r.lo, r.hi, rows, int(r.bytes or 0)))
    return out


def _months(around: datetime, months_ahead: int) -> list[tuple[str, datetime, datetime]]:
    return [
        (f"samples_p{month_add(around, i):%Y%m}", month_add(around, i), month_add(around, i + 1))
        for i in range(months_ahead + 1)
    ]


def missing_sample_partitions(conn: Connection, around: datetime, months_ahead: int = 2) -> list[str]:
    """The monthly partitions from `around`'s month to `months_ahead` later that do not exist yet."""
    around = around.astimezone(UTC)
    have = sample_partitions(conn)
    return [
        name
        for name, lo, hi in _months(around, months_ahead)
        if not any(p.name == name or _overlaps(p, lo, hi) for p in have)
    ]


def _overlaps(p: Partition, lo: datetime, hi: datetime) -> bool:
    return p.lo is not None and p.hi is not None and p.lo < hi and lo < p.hi


def ensure_sample_partitions(engine: Engine, around: datetime, months_ahead: int = 2) -> list[str]:
    """Monthly partitions of `samples` from `around`'s month to `months_ahead` later (PostgreSQL only).

    A month whose rows already went to samples_default (no partition was made in time) cannot be made
    by CREATE ... PARTITION OF (PostgreSQL refuses while the default holds rows it would own): its rows
    are moved into a new table, which is then attached, in one transaction.
    """
    made = []
    around = around.astimezone(UTC)
    with engine.begin() as conn:
        missing = set(missing_sample_partitions(conn, around, months_ahead))
        has_default = conn.execute(text("SELECT to_regclass(:n)"), {"n": DEFAULT}).scalar() is not None
        for name, lo, hi in _months(around, months_ahead):
            if name not in missing:
                continue
            bounds = f"FROM ('{lo:%Y-%m-%d} 00:00:00+00') TO ('{hi:%Y-%m-%d} 00:00:00+00')"
            stray = (
                has_default
                and conn.execute(
                    text(f"SELECT EXISTS (SELECT 1 FROM {DEFAULT} WHERE ts >= :lo AND ts < :hi)"),
                    {"lo": lo, "hi": hi},
                ).scalar()
            )
            if not stray:
                conn.execute(text(f"CREATE TABLE {name} PARTITION OF samples FOR VALUES {bounds}"))
            else:
                span = {"lo": lo, "hi": hi}
                where = "WHERE ts >= :lo AND ts < :hi"
                like = "LIKE samples INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
                conn.execute(text(f"CREATE TABLE {name} ({like})"))
                conn.execute(text(f"INSERT INTO {name} SELECT * FROM {DEFAULT} {where}"), span)
                conn.execute(text(f"DELETE FROM {DEFAULT} {where}"), span)
                conn.execute(text(f"ALTER TABLE samples ATTACH PARTITION {name} FOR VALUES {bounds}"))
            made.append(name)
    return made


def drop_partition(conn: Connection, name: str) -> None:
    """Detach one partition of `samples` and drop it, in the caller's transaction (so both or neither)."""
    quoted = conn.dialect.identifier_preparer.quote(name)
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    conn.execute(text(f"ALTER TABLE samples DETACH PARTITION {quoted}"))
    conn.execute(text(f"DROP TABLE {quoted}"))
