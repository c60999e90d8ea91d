"""Alembic environment: the URL comes from the Alembic config, else from cocaq's own configuration."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, pool

from cocaq.db.schema import Base

config = context.config
target_metadata = Base.metadata

# Partitions of `samples` are made at run time, not by models, and APScheduler makes its own job table:
# autogenerate must not propose to drop them.
PARTITION_PREFIX = "samples_p"


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    return not (
        type_ == "table"
        and name
        and (name.startswith(PARTITION_PREFIX) or name in ("samples_default", "apscheduler_jobs"))
    )


def _in_a_fixed_order() -> None:
    """Alembic's batch mode (SQLite) recreates a table from its constraints and indexes in the order of
    SQLAlchemy's sets of them, which follows the objects' addresses: the same migrations then gave another
    CREATE TABLE each run, so another automatic index number, another index chosen by SQLite's planner and
    another order, and last bits, of a sum. Sorting them by name (unnamed ones by kind and columns) makes
    the recreated schema the same on every run."""
    from alembic.operations.batch import ApplyBatchImpl

    grab = ApplyBatchImpl._grab_table_elements
    if getattr(grab, "_cocaq_sorted", False):
        return

    def unnamed_key(const: Any) -> tuple[str, str]:
        cols = ",".join(sorted(c.name for c in getattr(const, "columns", ())))
        return type(const).__name__, cols + "|" + str(getattr(const, "sqltext", ""))

    def sorted_grab(self: Any) -> None:
        grab(self)
        self.named_constraints = dict(sorted(self.named_constraints.items()))
        self.unnamed_constraints = sorted(self.unnamed_constraints, key=unnamed_key)
        self.indexes = dict(sorted(self.indexes.items(), key=lambda kv: str(kv[0])))

    sorted_grab._cocaq_sorted = True  # type: ignore[attr-defined]
    ApplyBatchImpl._grab_table_elements = sorted_grab  # type: ignore[method-assign]


_in_a_fixed_order()


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from cocaq.config_load import load_config

    return load_config().database_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from cocaq.db.engine import make_engine

    engine = make_engine(_url())
    engine.pool = pool.NullPool(engine.pool._creator)  # type: ignore[attr-defined,unused-ignore]
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
