"""When to run: each job's shifting potential, and its sums in the daily rollups

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 04:30:00

* job_metrics: the job's CO2 had it started at its best hour within its slack, or run in the cheapest
  hours of its window (pausing), against when it ran (cocaq.accounting.shifting), and whether it has
  these figures (`shift_state`).
* daily_rollups: the CO2 of the jobs with figures and what each way would have saved.

Every job is touched (updated_at), so that the next `cocaq aggregate` derives the figures for every job and
rebuilds every day with the new sums.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

METRIC_FLOATS = ("shift_slack_s", "shift_now_g", "shift_best_g", "shift_pause_g")
METRIC_SUMS = ("shift_saved_g", "shift_pause_saved_g")
ROLLUP_SUMS = ("shift_co2_g", "shift_saved_g", "shift_pause_saved_g")


def upgrade() -> None:
    with op.batch_alter_table("job_metrics") as b:
        b.add_column(sa.Column("shift_state", sa.String(length=16), nullable=True))
        for name in METRIC_FLOATS:
            b.add_column(sa.Column(name, sa.Float(), nullable=True))
        b.add_column(
            sa.Column("shift_best_start", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=True)
        )
        for name in METRIC_SUMS:
            b.add_column(sa.Column(name, sa.Float(), nullable=False, server_default=sa.text("0")))
    with op.batch_alter_table("daily_rollups") as b:
        for name in ROLLUP_SUMS:
            b.add_column(sa.Column(name, sa.Float(), nullable=False, server_default=sa.text("0")))
    op.execute("UPDATE jobs SET updated_at = CURRENT_TIMESTAMP")


def downgrade() -> None:
    with op.batch_alter_table("daily_rollups") as b:
        for name in reversed(ROLLUP_SUMS):
            b.drop_column(name)
    with op.batch_alter_table("job_metrics") as b:
        for name in (*reversed(METRIC_SUMS), "shift_best_start", *reversed(METRIC_FLOATS), "shift_state"):
            b.drop_column(name)
