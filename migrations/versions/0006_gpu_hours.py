"""per-job GPU use by hour, kept between aggregator runs; which jobs a sample batch names

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21 12:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_gpu_hours",
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("hour", sa.BigInteger(), nullable=False),
        sa.Column("energy_j", sa.Float(), nullable=False),
        sa.Column("util_energy", sa.Float(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("idle_s", sa.Float(), nullable=False),
        sa.Column("idle_j", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_job_gpu_hours_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("cluster_id", "job_id", "hour", name=op.f("pk_job_gpu_hours")),
    )
    with op.batch_alter_table("node_shipments") as b:
        b.add_column(sa.Column("job_ids", sa.Text(), nullable=True))
    op.create_index("ix_node_shipments_shipped_at", "node_shipments", ["shipped_at"], unique=False)
    with op.batch_alter_table("aggregator_state") as b:
        b.add_column(sa.Column("params", sa.String(length=256), nullable=True))
    op.create_index("ix_jobs_raw_id", "jobs", ["cluster_id", "job_id_raw"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_raw_id", table_name="jobs")
    with op.batch_alter_table("aggregator_state") as b:
        b.drop_column("params")
    op.drop_index("ix_node_shipments_shipped_at", table_name="node_shipments")
    with op.batch_alter_table("node_shipments") as b:
        b.drop_column("job_ids")
    op.drop_table("job_gpu_hours")
