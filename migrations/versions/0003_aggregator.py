"""aggregator

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 10:47:39.541943
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.coltypes

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('aggregator_state',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('watermark', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=True),
    sa.Column('updated_at', cocaq.db.coltypes.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_aggregator_state'))
    )
    op.create_table('daily_rollups',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('day', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
    sa.Column('user_name', sa.String(length=64), nullable=False),
    sa.Column('account', sa.String(length=64), nullable=False),
    sa.Column('partition', sa.String(length=128), nullable=False),
    sa.Column('jobs', sa.Integer(), nullable=False),
    sa.Column('jobs_failed', sa.Integer(), nullable=False),
    sa.Column('jobs_cancelled', sa.Integer(), nullable=False),
    sa.Column('jobs_timeout', sa.Integer(), nullable=False),
    sa.Column('cpu_hours', sa.Float(), nullable=False),
    sa.Column('gpu_hours', sa.Float(), nullable=False),
    sa.Column('energy_gpu_j', sa.Float(), nullable=False),
    sa.Column('energy_cpu_j', sa.Float(), nullable=False),
    sa.Column('energy_dram_j', sa.Float(), nullable=False),
    sa.Column('energy_other_j', sa.Float(), nullable=False),
    sa.Column('energy_measured_j', sa.Float(), nullable=False),
    sa.Column('energy_estimated_j', sa.Float(), nullable=False),
    sa.Column('energy_failed_j', sa.Float(), nullable=False),
    sa.Column('co2_g', sa.Float(), nullable=False),
    sa.Column('co2_embodied_g', sa.Float(), nullable=False),
    sa.Column('gpu_util_energy_j', sa.Float(), nullable=False),
    sa.Column('gpu_util_weighted', sa.Float(), nullable=False),
    sa.Column('idle_gpu_hours', sa.Float(), nullable=False),
    sa.Column('idle_gpu_energy_j', sa.Float(), nullable=False),
    sa.Column('computed_at', cocaq.db.coltypes.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_daily_rollups_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_daily_rollups')),
    sa.UniqueConstraint('cluster_id', 'day', 'user_name', 'account', 'partition', name=op.f('uq_daily_rollups_cluster_id_day_user_name_account_partition'))
    )
    op.create_index('ix_daily_rollups_account_day', 'daily_rollups', ['account', 'day'], unique=False)
    op.create_index('ix_daily_rollups_day', 'daily_rollups', ['day'], unique=False)
    op.create_index('ix_daily_rollups_user_day', 'daily_rollups', ['user_name', 'day'], unique=False)
    op.create_table('job_metrics',
    sa.Column('job_pk', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('co2_embodied_g', sa.Float(), nullable=False),
    sa.Column('gpu_util_pct', sa.Float(), nullable=True),
    sa.Column('gpu_samples_s', sa.Float(), nullable=False),
    sa.Column('idle_gpu_s', sa.Float(), nullable=False),
    sa.Column('idle_gpu_energy_j', sa.Float(), nullable=False),
    sa.Column('carbon_detail', sa.JSON(), nullable=True),
    sa.Column('rolled_from', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=True),
    sa.Column('rolled_to', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=True),
    sa.Column('computed_at', cocaq.db.coltypes.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['job_pk'], ['jobs.id'], name=op.f('fk_job_metrics_job_pk_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_pk', name=op.f('pk_job_metrics'))
    )
    op.drop_table('rollups')
    with op.batch_alter_table('carbon_intensity') as batch:  # (SQLite rebuilds the table)
        batch.drop_constraint(op.f('uq_carbon_intensity_zone_source_ts_start'), type_='unique')
        batch.create_unique_constraint(op.f('uq_carbon_intensity_zone_kind_ts_start'), ['zone', 'kind', 'ts_start'])


def downgrade() -> None:
    with op.batch_alter_table('carbon_intensity') as batch:
        batch.drop_constraint(op.f('uq_carbon_intensity_zone_kind_ts_start'), type_='unique')
        batch.create_unique_constraint(op.f('uq_carbon_intensity_zone_source_ts_start'), ['zone', 'source', 'ts_start'])
    op.create_table('rollups',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('period', sa.String(length=8), nullable=False),
    sa.Column('period_start', cocaq.db.coltypes.UTCDateTime(timezone=True), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('jobs', sa.Integer(), nullable=False),
    sa.Column('cpu_hours', sa.Float(), nullable=False),
    sa.Column('gpu_hours', sa.Float(), nullable=False),
    sa.Column('energy_j', sa.Float(), nullable=False),
    sa.Column('energy_measured_j', sa.Float(), nullable=False),
    sa.Column('co2_g', sa.Float(), nullable=False),
    sa.Column('idle_gpu_hours', sa.Float(), nullable=False),
    sa.Column('computed_at', cocaq.db.coltypes.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_rollups_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rollups')),
    sa.UniqueConstraint('cluster_id', 'period', 'period_start', 'scope', 'key', name=op.f('uq_rollups_cluster_id_period_period_start_scope_key'))
    )
    op.drop_table('job_metrics')
    op.drop_index('ix_daily_rollups_user_day', table_name='daily_rollups')
    op.drop_index('ix_daily_rollups_day', table_name='daily_rollups')
    op.drop_index('ix_daily_rollups_account_day', table_name='daily_rollups')
    op.drop_table('daily_rollups')
    op.drop_table('aggregator_state')
