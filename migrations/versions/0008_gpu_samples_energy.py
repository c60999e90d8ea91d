"""job_metrics.gpu_samples_j: the GPU energy the samples saw, the weight of utilisation in the rollups

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-21 13:40:00

Days and months averaged utilisation weighted by the job's GPU energy component, which is 0 for a job
measured at node level (Slurm's ConsumedEnergy): such jobs dropped out of the averages. The jobs with
GPU samples are touched (updated_at) so that the next `cocaq aggregate` derives them and their days again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_metrics") as b:
        b.add_column(sa.Column("gpu_samples_j", sa.Float(), nullable=False, server_default=sa.text("0")))
    op.execute(
        "UPDATE jobs SET updated_at = CURRENT_TIMESTAMP WHERE id IN "
        "(SELECT job_pk FROM job_metrics WHERE gpu_samples_s > 0)"
    )


def downgrade() -> None:
    with op.batch_alter_table("job_metrics") as b:
        b.drop_column("gpu_samples_j")
