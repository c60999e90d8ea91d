"""Whether a job ran a batch step: interactive sessions told from sacct's steps

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30 10:00:00

* jobs.batch_step: true where sacct showed a `JOBID.batch` step (sbatch), false where it showed the job's
  steps and none is batch (srun --pty, salloc: an interactive session, cocaq.accounting.sessions), NULL
  where no step was read (sacct -X). Jobs imported before read NULL (not known) until they are imported
  again from a dump with step lines; the daily rollups count a session's time-limit energy as possibly
  lost no more once rebuilt (`cocaq recompute`).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("batch_step", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.drop_column("batch_step")
