"""Slurm's own GPU signals, and GPU counts that Slurm's accounting cannot tell

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 15:40:00

* jobs.slurm_gpu_util, jobs.slurm_gpu_mem_mb: gres/gpuutil and gres/gpumem from the steps' TRESUsageIn*
  (cocaq.slurm.sacct); nullable: jobs imported before read as "not recorded".
* jobs.gpus_unknown: no GPU in the job's TRES on a GPU partition of a cluster whose accounting records
  none; clusters.gpu_tres: whether the cluster's accounting has recorded a GPU in any job's TRES (set here
  for clusters that have GPU jobs already).
* ix_jobs_array, ix_jobs_het: an array's tasks and a het job's components by their base id (`cocaq job`).
* job_metrics.gpu_util_source: where a job's GPU utilisation and idle figures come from ("samples" or
  "slurm").

Jobs imported before keep their figures until `cocaq recompute` re-reads them (a TotalCPU of 0 on a
long job then becomes "not gathered", and the GPU flags are set).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("slurm_gpu_util", sa.Float(), nullable=True))
        b.add_column(sa.Column("slurm_gpu_mem_mb", sa.Float(), nullable=True))
        b.add_column(sa.Column("gpus_unknown", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("clusters") as b:
        b.add_column(sa.Column("gpu_tres", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("job_metrics") as b:
        b.add_column(sa.Column("gpu_util_source", sa.String(length=16), nullable=True))
    op.execute(
        "UPDATE clusters SET gpu_tres = true WHERE id IN (SELECT DISTINCT cluster_id FROM jobs WHERE alloc_gpus > 0)"
    )
    op.create_index("ix_jobs_array", "jobs", ["array_job_id"], unique=False)
    op.create_index("ix_jobs_het", "jobs", ["het_job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_het", table_name="jobs")
    op.drop_index("ix_jobs_array", table_name="jobs")
    with op.batch_alter_table("job_metrics") as b:
        b.drop_column("gpu_util_source")
    with op.batch_alter_table("clusters") as b:
        b.drop_column("gpu_tres")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("gpus_unknown")
        b.drop_column("slurm_gpu_mem_mb")
        b.drop_column("slurm_gpu_util")
