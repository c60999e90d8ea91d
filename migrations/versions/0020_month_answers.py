"""A settled month's answer per user, kept for the web app (issue 38)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 17:00:00

* month_answers: per (user, cluster asked for, month), the month e-mail and its figures as the read API
  answers them (zlib-compressed JSON), with the stamp of the data and settings they were built from
  (cocaq.reports.month_store). Written by `cocaq report keep`; nothing else depends on them, so
  downgrading loses nothing that cannot be built again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "month_answers",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("month_start", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.Column("stamp", sa.String(length=64), nullable=False),
        sa.Column("kept_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.Column("answer", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_month_answers")),
        sa.UniqueConstraint(
            "user_name", "cluster", "month_start", name=op.f("uq_month_answers_user_name_cluster_month_start")
        ),
    )


def downgrade() -> None:
    op.drop_table("month_answers")
