"""node side: hook events, measured energy, shipments

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 09:48:29.823710
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('node_energy',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('job_start', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
    sa.Column('component', sa.String(length=16), nullable=False),
    sa.Column('device', sa.String(length=128), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('method', sa.String(length=16), nullable=False),
    sa.Column('energy_j', sa.Float(), nullable=False),
    sa.Column('t0', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
    sa.Column('t1', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
    sa.Column('final', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_node_energy_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_node_energy')),
    sa.UniqueConstraint('cluster_id', 'node', 'job_id', 'job_start', 'component', 'device', 'source', name=op.f('uq_node_energy_cluster_id_node_job_id_job_start_component_device_source'))
    )
    op.create_index('ix_node_energy_job', 'node_energy', ['cluster_id', 'job_id'], unique=False)
    op.create_table('node_shipments',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('batch', sa.String(length=128), nullable=False),
    sa.Column('rows', sa.Integer(), nullable=False),
    sa.Column('shipped_at', cocaq.db.coltypes.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_node_shipments_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_node_shipments')),
    sa.UniqueConstraint('cluster_id', 'node', 'batch', name=op.f('uq_node_shipments_cluster_id_node_batch'))
    )
    op.create_table('node_events',
    sa.Column('uid', sa.String(length=255), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('event', sa.String(length=16), nullable=False),
    sa.Column('ts', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('job_pk', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('shipped_at', cocaq.db.coltypes.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_node_events_cluster_id_clusters'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_pk'], ['jobs.id'], name=op.f('fk_node_events_job_pk_jobs'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('uid', name=op.f('pk_node_events'))
    )
    op.create_index('ix_node_events_job', 'node_events', ['cluster_id', 'job_id'], unique=False)
    op.create_index('ix_node_events_unlinked', 'node_events', ['job_pk', 'ts'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_node_events_unlinked', table_name='node_events')
    op.drop_index('ix_node_events_job', table_name='node_events')
    op.drop_table('node_events')
    op.drop_table('node_shipments')
    op.drop_index('ix_node_energy_job', table_name='node_energy')
    op.drop_table('node_energy')
