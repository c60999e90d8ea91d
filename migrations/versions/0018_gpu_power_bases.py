"""What predicts a GPU's power: per-user cells and each basis's held-out error and range (issue 35)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 23:50:00

* gpu_power_keyed: what one user's measured jobs drew per GPU, by job name ("series") or over all
  ("user"), per GPU model and GPU count;
* gpu_power_bases: per basis of the GPU estimate, how it did on held-out runs of measured jobs, whether
  it is used, and the range (log ratios) it gives. `cocaq calibrate --refresh` fills both.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_power_keyed",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("basis", sa.String(length=16), nullable=False),
        sa.Column("gpu_model", sa.String(length=64), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("w_median", sa.Float(), nullable=False),
        sa.Column("w_p10", sa.Float(), nullable=False),
        sa.Column("w_p90", sa.Float(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("computed_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_power_keyed")),
        sa.UniqueConstraint("basis", "gpu_model", "key", name=op.f("uq_gpu_power_keyed_basis_gpu_model_key")),
    )
    op.create_table(
        "gpu_power_bases",
        sa.Column("basis", sa.String(length=32), nullable=False),
        sa.Column("used", sa.Boolean(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("median_err", sa.Float(), nullable=True),
        sa.Column("p90_err", sa.Float(), nullable=True),
        sa.Column("err_instead", sa.Float(), nullable=True),
        sa.Column("coverage", sa.Float(), nullable=True),
        sa.Column("log_lo", sa.Float(), nullable=False),
        sa.Column("log_hi", sa.Float(), nullable=False),
        sa.Column("widened", sa.Boolean(), nullable=False),
        sa.Column("computed_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("basis", name=op.f("pk_gpu_power_bases")),
    )


def downgrade() -> None:
    op.drop_table("gpu_power_bases")
    op.drop_table("gpu_power_keyed")
