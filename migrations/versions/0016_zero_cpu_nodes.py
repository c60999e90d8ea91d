"""The nodes of a multi-node job that did no CPU work, from sacct's per-step minimum (issue 32)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 15:00:00

* jobs.zero_cpu_nodes: the nodes (comma-separated, in NodeList order) of a multi-node job on which Slurm
  accounted no CPU time in any step, from TRESUsageInMin/MinNode/MinTask (cocaq.slurm.idle_nodes); NULL
  where there are none or the steps cannot tell. Jobs imported before read NULL until they are imported
  again from a dump with those fields.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("zero_cpu_nodes", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.drop_column("zero_cpu_nodes")
