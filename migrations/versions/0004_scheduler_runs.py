"""scheduler runs: one row per run of a `cocaq scheduler` job

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 09:00:00

Written by hand for PostgreSQL and SQLite. APScheduler's own table (apscheduler_jobs) is not here:
APScheduler creates it, and migrations/env.py keeps autogenerate away from it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('scheduler_runs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('started_at', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
    sa.Column('finished_at', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('via', sa.String(length=16), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_scheduler_runs'))
    )
    op.create_index('ix_scheduler_runs_job_started', 'scheduler_runs', ['job_id', 'started_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_scheduler_runs_job_started', table_name='scheduler_runs')
    op.drop_table('scheduler_runs')
