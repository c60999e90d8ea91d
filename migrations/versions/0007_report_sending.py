"""report sending: which Slurm user a sent report went to; which job e-mail (digest) told of each job

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 09:00:00

`sent_reports.user_name`: the recipient column is an address, which changes when a user's address does;
the user name says whom a user report was for (first report per user, the job digests' state).
`job_notices`: each job that a job e-mail told (or will tell) of, bound once to one digest
(`digest_at` = that digest's `sent_reports.period_start`, kind "job"), so no job is in two digests.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sent_reports") as b:
        b.add_column(sa.Column("user_name", sa.String(length=64), nullable=True))
    op.create_index("ix_sent_reports_user_kind", "sent_reports", ["user_name", "kind"], unique=False)
    op.create_table(
        "job_notices",
        sa.Column("job_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("digest_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_pk"], ["jobs.id"], name=op.f("fk_job_notices_job_pk_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_pk", name=op.f("pk_job_notices")),
    )
    op.create_index("ix_job_notices_digest", "job_notices", ["digest_at", "user_name"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_notices_digest", table_name="job_notices")
    op.drop_table("job_notices")
    op.drop_index("ix_sent_reports_user_kind", table_name="sent_reports")
    with op.batch_alter_table("sent_reports") as b:
        b.drop_column("user_name")
