"""The e-mail study: each user's arm (e-mailed or hold-out), drawn once

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 05:10:00

* study_arms: per study (its start month and seed) and user, the arm, the stratum and GPU-hours that
  stratified the draw, the draw itself, when it was made, and when the user was found opted out.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "study_arms",
        sa.Column("study", sa.String(length=64), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("arm", sa.String(length=16), nullable=False),
        sa.Column("stratum", sa.Integer(), nullable=False),
        sa.Column("gpu_hours_before", sa.Float(), nullable=False),
        sa.Column("draw", sa.Float(), nullable=False),
        sa.Column("assigned_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.Column("opted_out_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("study", "user_name", name=op.f("pk_study_arms")),
    )
    op.create_index("ix_study_arms_arm", "study_arms", ["study", "arm"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_study_arms_arm", table_name="study_arms")
    op.drop_table("study_arms")
