"""model_metadata: one merged row per job, with precision, batch size, epochs and each key's source

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-21 15:20:00

The first shape (a row per job, source and model name) had no writer yet: metadata now arrives from the
job's Slurm comment, `cocaq.annotate`/`cocaq tag` from inside the job, and what the collector detects,
and is merged per key. Rows of the old shape are carried over, the latest per job, with their `source`
recorded for each key they set.
"""

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

import cocaq.db.schema

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
OLD_KEYS = ("model_name", "framework", "task", "parameters", "dataset", "tokens")


def _keys() -> list[Any]:
    """The id, the job it describes, and their constraints: the same in both shapes."""
    return [
        sa.Column("id", BigId, nullable=False),
        sa.Column("job_pk", BigId, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_pk"], ["jobs.id"], name=op.f("fk_model_metadata_job_pk_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_metadata")),
    ]


def _timestamp(name: str) -> sa.Column[object]:
    return sa.Column(
        name,
        cocaq.db.schema.UTCDateTime(timezone=True),
        server_default=sa.text("CURRENT_TIMESTAMP"),
        nullable=False,
    )


def upgrade() -> None:
    conn = op.get_bind()
    old = conn.execute(
        sa.text(
            "SELECT job_pk, source, model_name, framework, task, parameters, dataset, tokens, extra"
            " FROM model_metadata ORDER BY job_pk, id"
        )
    ).fetchall()
    op.drop_table("model_metadata")
    table = op.create_table(
        "model_metadata",
        *_keys(),
        sa.Column("model_name", sa.String(length=256), nullable=True),
        sa.Column("task", sa.String(length=64), nullable=True),
        sa.Column("framework", sa.String(length=64), nullable=True),
        sa.Column("framework_version", sa.String(length=64), nullable=True),
        sa.Column("parameters", sa.BigInteger(), nullable=True),
        sa.Column("precision", sa.String(length=32), nullable=True),
        sa.Column("batch_size", sa.BigInteger(), nullable=True),
        sa.Column("dataset", sa.String(length=256), nullable=True),
        sa.Column("epochs", sa.Float(), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.Column("sources", sa.JSON(), nullable=True),
        _timestamp("recorded_at"),
        _timestamp("updated_at"),
        sa.UniqueConstraint("job_pk", name=op.f("uq_model_metadata_job_pk")),
    )
    latest: dict[int, dict[str, object]] = {}
    for r in old:
        extra = r.extra if isinstance(r.extra, dict) or r.extra is None else json.loads(r.extra)
        row: dict[str, object] = {k: getattr(r, k) for k in OLD_KEYS}
        row.update(job_pk=r.job_pk, extra=extra or None)
        row["sources"] = {k: str(r.source)[:16] for k in OLD_KEYS if row[k] is not None}
        latest[r.job_pk] = row
    if latest:
        op.bulk_insert(table, list(latest.values()))


def downgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT job_pk, model_name, framework, task, parameters, dataset, tokens, extra"
            " FROM model_metadata WHERE model_name IS NOT NULL"
        )
    ).fetchall()
    op.drop_table("model_metadata")
    table = op.create_table(
        "model_metadata",
        *_keys(),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("model_name", sa.String(length=256), nullable=False),
        sa.Column("framework", sa.String(length=64), nullable=True),
        sa.Column("task", sa.String(length=64), nullable=True),
        sa.Column("parameters", sa.BigInteger(), nullable=True),
        sa.Column("dataset", sa.String(length=256), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=True),
        _timestamp("recorded_at"),
        sa.UniqueConstraint(
            "job_pk", "source", "model_name", name=op.f("uq_model_metadata_job_pk_source_model_name")
        ),
    )
    out = []
    for r in rows:
        extra = r.extra if isinstance(r.extra, dict) or r.extra is None else json.loads(r.extra)
        out.append(
            {
                "job_pk": r.job_pk,
                "source": "merged",
                "model_name": r.model_name,
                "framework": r.framework,
                "task": r.task,
                "parameters": r.parameters,
                "dataset": r.dataset,
                "tokens": r.tokens,
                "extra": extra,
            }
        )
    if out:
        op.bulk_insert(table, out)
