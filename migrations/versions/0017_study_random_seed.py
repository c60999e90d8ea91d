"""The e-mail study's seed, drawn at random where the config gives none, kept with the study (issue 33)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 10:00:00

* study_seeds: per study drawn with a random seed (its key is its start month), that seed (decimal text:
  128 random bits, more than a BIGINT holds) and when it was drawn. Studies with a seed from the config
  (`[study] seed`, keyed "START/seed N") have no row; those drawn before, with the old default seed 1,
  keep it (cocaq.study.assign.study_id finds them by their key).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "study_seeds",
        sa.Column("study", sa.String(length=64), nullable=False),
        sa.Column("seed", sa.String(length=40), nullable=False),
        sa.Column("drawn_at", cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("study", name=op.f("pk_study_seeds")),
    )


def downgrade() -> None:
    op.drop_table("study_seeds")
