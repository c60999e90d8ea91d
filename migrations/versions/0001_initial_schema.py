"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-21 07:34:47.191419
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import cocaq.db.schema


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('carbon_intensity',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('ts_start', cocaq.db.schema.UTCDateTime(timezone=True), nullable=False),
    sa.Column('ts_end', cocaq.db.schema.UTCDateTime(timezone=True), nullable=False),
    sa.Column('g_per_kwh', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('source', sa.String(length=128), nullable=False),
    sa.Column('provenance', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_carbon_intensity')),
    sa.UniqueConstraint('zone', 'source', 'ts_start', name=op.f('uq_carbon_intensity_zone_source_ts_start'))
    )
    op.create_table('clusters',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('created_at', cocaq.db.schema.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_clusters')),
    sa.UniqueConstraint('name', name=op.f('uq_clusters_name'))
    )
    op.create_table('samples',
    sa.Column('ts', cocaq.db.schema.UTCDateTime(timezone=True), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('device', sa.String(length=64), nullable=False),
    sa.Column('metric', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=True),
    sa.Column('value', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('ts', 'cluster_id', 'node', 'source', 'device', 'metric', name=op.f('pk_samples')),
    postgresql_partition_by='RANGE (ts)'
    )
    op.create_index('ix_samples_job_ts', 'samples', ['cluster_id', 'job_id', 'ts'], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        # Rows outside any monthly partition land here; `cocaq db upgrade` adds the monthly ones.
        op.execute("CREATE TABLE samples_default PARTITION OF samples DEFAULT")
    op.create_table('sent_reports',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('recipient', sa.String(length=320), nullable=False),
    sa.Column('period_start', cocaq.db.schema.UTCDateTime(timezone=True), nullable=False),
    sa.Column('period_end', cocaq.db.schema.UTCDateTime(timezone=True), nullable=False),
    sa.Column('sent_at', cocaq.db.schema.UTCDateTime(timezone=True), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('message_id', sa.String(length=256), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sent_reports')),
    sa.UniqueConstraint('kind', 'recipient', 'period_start', name=op.f('uq_sent_reports_kind_recipient_period_start'))
    )
    op.create_table('users',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('email', sa.String(length=320), nullable=True),
    sa.Column('full_name', sa.String(length=256), nullable=True),
    sa.Column('monthly_email', sa.Boolean(), nullable=False),
    sa.Column('job_email', sa.Boolean(), nullable=False),
    sa.Column('opted_out', sa.Boolean(), nullable=False),
    sa.Column('updated_at', cocaq.db.schema.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_users'))
    )
    op.create_table('jobs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('job_id_raw', sa.BigInteger(), nullable=True),
    sa.Column('array_job_id', sa.BigInteger(), nullable=True),
    sa.Column('array_task_id', sa.Integer(), nullable=True),
    sa.Column('het_job_id', sa.BigInteger(), nullable=True),
    sa.Column('het_job_offset', sa.Integer(), nullable=True),
    sa.Column('user_name', sa.String(length=64), nullable=False),
    sa.Column('uid', sa.Integer(), nullable=True),
    sa.Column('account', sa.String(length=64), nullable=True),
    sa.Column('partition', sa.String(length=128), nullable=True),
    sa.Column('qos', sa.String(length=64), nullable=True),
    sa.Column('node_list', sa.Text(), nullable=True),
    sa.Column('n_nodes', sa.Integer(), nullable=False),
    sa.Column('alloc_cpus', sa.Integer(), nullable=False),
    sa.Column('alloc_gpus', sa.Integer(), nullable=False),
    sa.Column('gpu_type', sa.String(length=64), nullable=True),
    sa.Column('req_mem_mb', sa.Float(), nullable=True),
    sa.Column('submit_time', cocaq.db.schema.UTCDateTime(timezone=True), nullable=False),
    sa.Column('start_time', cocaq.db.schema.UTCDateTime(timezone=True), nullable=True),
    sa.Column('end_time', cocaq.db.schema.UTCDateTime(timezone=True), nullable=True),
    sa.Column('elapsed_s', sa.Float(), nullable=False),
    sa.Column('time_limit_s', sa.Float(), nullable=True),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('state_detail', sa.String(length=128), nullable=True),
    sa.Column('is_open', sa.Boolean(), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('exit_signal', sa.Integer(), nullable=True),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('comment', sa.Text(), nullable=True),
    sa.Column('total_cpu_s', sa.Float(), nullable=True),
    sa.Column('consumed_energy_j', sa.Float(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=False),
    sa.Column('energy_measured_j', sa.Float(), nullable=False),
    sa.Column('pue', sa.Float(), nullable=False),
    sa.Column('carbon_zone', sa.String(length=64), nullable=True),
    sa.Column('carbon_g_per_kwh', sa.Float(), nullable=True),
    sa.Column('carbon_source', sa.String(length=128), nullable=True),
    sa.Column('carbon_year', sa.Integer(), nullable=True),
    sa.Column('carbon_flag', sa.String(length=64), nullable=True),
    sa.Column('co2_g', sa.Float(), nullable=False),
    sa.Column('hw_profile', sa.String(length=160), nullable=True),
    sa.Column('assumptions', sa.JSON(), nullable=True),
    sa.Column('imported_from', sa.String(length=32), nullable=True),
    sa.Column('record_hash', sa.String(length=32), nullable=True),
    sa.Column('updated_at', cocaq.db.schema.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_jobs_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('cluster_id', 'job_id', 'submit_time', name=op.f('uq_jobs_cluster_id_job_id_submit_time'))
    )
    op.create_index('ix_jobs_account_end', 'jobs', ['account', 'end_time'], unique=False)
    op.create_index('ix_jobs_cluster_end', 'jobs', ['cluster_id', 'end_time'], unique=False)
    op.create_index('ix_jobs_open', 'jobs', ['is_open'], unique=False)
    op.create_index('ix_jobs_partition_end', 'jobs', ['partition', 'end_time'], unique=False)
    op.create_index('ix_jobs_user_end', 'jobs', ['user_name', 'end_time'], unique=False)
    op.create_table('nodes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('node_group', sa.String(length=128), nullable=True),
    sa.Column('cpus', sa.Integer(), nullable=True),
    sa.Column('gpus', sa.Integer(), nullable=True),
    sa.Column('gpu_model', sa.String(length=128), nullable=True),
    sa.Column('mem_gb', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_nodes_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_nodes')),
    sa.UniqueConstraint('cluster_id', 'name', name=op.f('uq_nodes_cluster_id_name'))
    )
    op.create_table('rollups',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.Integer(), nullable=False),
    sa.Column('period', sa.String(length=8), nullable=False),
    sa.Column('period_start', cocaq.db.schema.UTCDateTime(timezone=True), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('jobs', sa.Integer(), nullable=False),
    sa.Column('cpu_hours', sa.Float(), nullable=False),
    sa.Column('gpu_hours', sa.Float(), nullable=False),
    sa.Column('energy_j', sa.Float(), nullable=False),
    sa.Column('energy_measured_j', sa.Float(), nullable=False),
    sa.Column('co2_g', sa.Float(), nullable=False),
    sa.Column('idle_gpu_hours', sa.Float(), nullable=False),
    sa.Column('computed_at', cocaq.db.schema.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_rollups_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rollups')),
    sa.UniqueConstraint('cluster_id', 'period', 'period_start', 'scope', 'key', name=op.f('uq_rollups_cluster_id_period_period_start_scope_key'))
    )
    op.create_table('job_energy',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_pk', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('component', sa.String(length=16), nullable=False),
    sa.Column('method', sa.String(length=16), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('energy_j', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['job_pk'], ['jobs.id'], name=op.f('fk_job_energy_job_pk_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_energy')),
    sa.UniqueConstraint('job_pk', 'node', 'component', 'source', name=op.f('uq_job_energy_job_pk_node_component_source'))
    )
    op.create_table('model_metadata',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_pk', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('model_name', sa.String(length=256), nullable=False),
    sa.Column('framework', sa.String(length=64), nullable=True),
    sa.Column('task', sa.String(length=64), nullable=True),
    sa.Column('parameters', sa.BigInteger(), nullable=True),
    sa.Column('dataset', sa.String(length=256), nullable=True),
    sa.Column('tokens', sa.BigInteger(), nullable=True),
    sa.Column('extra', sa.JSON(), nullable=True),
    sa.Column('recorded_at', cocaq.db.schema.UTCDateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['job_pk'], ['jobs.id'], name=op.f('fk_model_metadata_job_pk_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_metadata')),
    sa.UniqueConstraint('job_pk', 'source', 'model_name', name=op.f('uq_model_metadata_job_pk_source_model_name'))
    )


def downgrade() -> None:
    op.drop_table('model_metadata')
    op.drop_table('job_energy')
    op.drop_table('rollups')
    op.drop_table('nodes')
    op.drop_index('ix_jobs_user_end', table_name='jobs')
    op.drop_index('ix_jobs_partition_end', table_name='jobs')
    op.drop_index('ix_jobs_open', table_name='jobs')
    op.drop_index('ix_jobs_cluster_end', table_name='jobs')
    op.drop_index('ix_jobs_account_end', table_name='jobs')
    op.drop_table('jobs')
    op.drop_table('users')
    op.drop_table('sent_reports')
    op.drop_index('ix_samples_job_ts', table_name='samples')
    op.drop_table('samples')
    op.drop_table('clusters')
    op.drop_table('carbon_intensity')
