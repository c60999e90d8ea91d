"""The e-mail study's primary outcome, kept with the study at its first draw (issue 36)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 01:00:00

* study_protocols: per study (its key, as in study_arms), the outcome it is judged by (`[study] primary`
  when it was first drawn) and when that was recorded. A study drawn before this revision gets its row
  from the next draw or e-mail run, dated then, and its report says it was recorded after the start.
* study_arms.block: the user's block within their stratum (ranked by baseline CO2), on which the draw
  holds out a fixed number and the report's re-randomisation re-draws; NULL for joiners and for studies
  drawn before blocks (their re-draws keep to the strata).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "study_protocols",
        sa.Column("study", sa.String(length=64), nullable=False),
        sa.Column("primary_outcome", sa.String(length=64), nullable=False),
        sa.Column("declared_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("study", name=op.f("pk_study_protocols")),
    )
    op.add_column("study_arms", sa.Column("block", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("study_arms") as batch:
        batch.drop_column("block")
    op.drop_table("study_protocols")
