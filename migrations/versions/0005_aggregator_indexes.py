"""indexes for the aggregator's incremental runs

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21 11:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_updated_at", "jobs", ["updated_at"], unique=False)
    op.create_index("ix_jobs_end_time", "jobs", ["end_time"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_end_time", table_name="jobs")
    op.drop_index("ix_jobs_updated_at", table_name="jobs")
