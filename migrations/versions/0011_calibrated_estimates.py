"""Calibrated estimates: GPU power learnt from the site's measured jobs, and the range of an estimate

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 18:40:00

* gpu_power_calibration: W per GPU (median, 10th and 90th percentile, jobs and GPU-hours behind it) by
  GPU model, partition and utilisation bucket (cocaq.accounting.calibrate).
* jobs: the range of the estimated part of a job's energy; daily_rollups: its sums. Both nullable: rows
  from before read as having no range (the estimate itself).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RANGE = ("energy_est_low_j", "energy_est_high_j")


def upgrade() -> None:
    for table in ("jobs", "daily_rollups"):
        with op.batch_alter_table(table) as b:
            for name in RANGE:
                b.add_column(sa.Column(name, sa.Float(), nullable=True))
    op.create_table(
        "gpu_power_calibration",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("gpu_model", sa.String(length=64), nullable=False),
        sa.Column("partition", sa.String(length=128), nullable=False),
        sa.Column("bucket", sa.String(length=16), nullable=False),
        sa.Column("util_lo", sa.Float(), nullable=True),
        sa.Column("util_hi", sa.Float(), nullable=True),
        sa.Column("w_median", sa.Float(), nullable=False),
        sa.Column("w_p10", sa.Float(), nullable=False),
        sa.Column("w_p90", sa.Float(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("computed_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_power_calibration")),
        sa.UniqueConstraint(
            "gpu_model", "partition", "bucket", name=op.f("uq_gpu_power_calibration_gpu_model_partition_bucket")
        ),
    )


def downgrade() -> None:
    op.drop_table("gpu_power_calibration")
    for table in ("daily_rollups", "jobs"):
        with op.batch_alter_table(table) as b:
            for name in reversed(RANGE):
                b.drop_column(name)
