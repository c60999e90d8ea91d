"""The same migrations run on PostgreSQL and SQLite, both ways, and agree with the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from cocaq.db import migrate
from cocaq.db.engine import make_engine
from cocaq.db.schema import Base

TABLES = {
    "clusters",
    "nodes",
    "jobs",
    "job_energy",
    "samples",
    "node_events",
    "node_energy",
    "node_shipments",
    "model_metadata",
    "carbon_intensity",
    "daily_rollups",
    "job_metrics",
    "job_gpu_hours",
    "aggregator_state",
    "users",
    "sent_reports",
    "scheduler_runs",
    "job_notices",
    "job_alerts",
    "gpu_power_calibration",
    "study_arms",
    "study_seeds",
    "gpu_power_keyed",
    "gpu_power_bases",
}


def _include(obj, name, type_, reflected, compare_to):  # same filter as migrations/env.py
    return not (type_ == "table" and name and (name.startswith("samples_p") or name == "samples_default"))


def test_upgrade_downgrade_and_models_agree(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == "0020"
    assert set(inspect(engine).get_table_names()) >= TABLES
    with engine.connect() as conn:
        mc = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": _include})
        diff = compare_metadata(mc, Base.metadata)
    assert diff == [], f"models and migrations differ: {diff}"
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    assert not (TABLES & set(inspect(engine).get_table_names()))
    migrate.upgrade(engine)  # and back up again
    assert migrate.current_revision(engine) == "0020"
    engine.dispose()


def test_postgres_samples_are_partitioned_by_month(request, tmp_path) -> None:
    from tests.conftest import new_database

    engine = make_engine(new_database("postgresql", tmp_path, request))
    migrate.upgrade(engine)
    with engine.connect() as conn:
        kind = conn.execute(text("SELECT relkind FROM pg_class WHERE relname = 'samples'")).scalar()
        parts = (
            conn.execute(
                text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'samples'"
                )
            )
            .scalars()
            .all()
        )
    assert kind == "p"  # a partitioned table
    assert "samples_default" in parts
    assert sum(p.startswith("samples_p") for p in parts) == 3  # this month and the next two
    # Upgrading again is harmless and adds nothing.
    migrate.upgrade(engine)
    engine.dispose()
