"""The energy ledger: disjoint waste parts in the rollups, memory per job, alerts while jobs run

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 02:00:00

* daily_rollups: `energy_failed_j` now holds failed jobs only (FAILED, NODE_FAIL, BOOT_FAIL, beyond
  their idle GPU energy); out-of-memory, timed-out and cancelled jobs get their own columns, and
  `jobs_oom` their count (they were in `jobs_failed`). See cocaq.accounting.ledger.
* jobs: sacct's MaxRSS and the tasks per node of its step; job_gpu_hours and job_metrics: the GPU memory
  peak from the collector's samples.
* job_alerts: the alerts sent about running jobs (GPUs held idle).

Every job is touched (updated_at) and the GPU hours' parameters forgotten, so that the next
`cocaq aggregate` derives every job again (the GPU share of node-level measurements, idle energy at most
the GPU energy) and rebuilds every day with the new columns.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLLUP_FLOATS = ("energy_oom_j", "energy_timeout_j", "energy_cancelled_j")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("max_rss_mb", sa.Float(), nullable=True))
        b.add_column(sa.Column("rss_tasks_per_node", sa.Integer(), nullable=True))
    with op.batch_alter_table("job_metrics") as b:
        b.add_column(sa.Column("gpu_mem_peak_mb", sa.Float(), nullable=True))
    with op.batch_alter_table("job_gpu_hours") as b:
        b.add_column(sa.Column("mem_peak_mb", sa.Float(), nullable=True))
    with op.batch_alter_table("daily_rollups") as b:
        b.add_column(sa.Column("jobs_oom", sa.Integer(), nullable=False, server_default=sa.text("0")))
        for name in ROLLUP_FLOATS:
            b.add_column(sa.Column(name, sa.Float(), nullable=False, server_default=sa.text("0")))
    op.create_table(
        "job_alerts",
        sa.Column("job_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("alerted_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_pk"], ["jobs.id"], name=op.f("fk_job_alerts_job_pk_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_pk", "kind", name=op.f("pk_job_alerts")),
    )
    op.create_index("ix_job_alerts_user_at", "job_alerts", ["user_name", "alerted_at"], unique=False)
    # Derive everything again with the ledger's rules (see the module doc).
    op.execute("UPDATE jobs SET updated_at = CURRENT_TIMESTAMP")
    op.execute("DELETE FROM aggregator_state WHERE name = 'gpu_hours'")


def downgrade() -> None:
    op.drop_index("ix_job_alerts_user_at", table_name="job_alerts")
    op.drop_table("job_alerts")
    with op.batch_alter_table("daily_rollups") as b:
        for name in reversed(ROLLUP_FLOATS):
            b.drop_column(name)
        b.drop_column("jobs_oom")
    with op.batch_alter_table("job_gpu_hours") as b:
        b.drop_column("mem_peak_mb")
    with op.batch_alter_table("job_metrics") as b:
        b.drop_column("gpu_mem_peak_mb")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("rss_tasks_per_node")
        b.drop_column("max_rss_mb")
