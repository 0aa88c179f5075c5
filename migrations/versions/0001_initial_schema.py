"""initial schema: runs, events, steps, collectives

Revision ID: 0001
Revises:
Create Date: 2026-11-29 19:02:31.787350
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('collectives',
    sa.Column('run_pk', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('op', sa.String(length=64), nullable=False),
    sa.Column('start_time', sa.Double(), nullable=False),
    sa.Column('end_time', sa.Double(), nullable=False)
    )
    op.create_index('ix_collectives_run_attempt_step', 'collectives', ['run_pk', 'attempt', 'step'], unique=False)

    op.create_table('runs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=256), nullable=False),
    sa.Column('project', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('first_time', sa.Double(), nullable=True),
    sa.Column('last_time', sa.Double(), nullable=True),
    sa.Column('received_at', sa.Double(), nullable=True),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.Column('ledger_version', sa.BigInteger(), nullable=False),
    sa.Column('ledger_json', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('run_id', name=op.f('uq_runs_run_id'))
    )
    op.create_table('steps',
    sa.Column('run_pk', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('start_time', sa.Double(), nullable=False),
    sa.Column('end_time', sa.Double(), nullable=False),
    sa.Column('loss', sa.Double(), nullable=True),
    sa.Column('lr', sa.Double(), nullable=True),
    sa.Column('comm', sa.Double(), nullable=True)
    )
    op.create_index('ix_steps_run_attempt_rank_step', 'steps', ['run_pk', 'attempt', 'rank', 'step'], unique=False)

    op.create_table('events',
    sa.Column('run_pk', sa.Integer(), nullable=False),
    sa.Column('event_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('time', sa.Double(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('step', sa.BigInteger(), nullable=True),
    sa.Column('data', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_pk'], ['runs.id'], name=op.f('fk_events_run_pk_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_pk', 'event_id', name=op.f('pk_events'))
    )
    op.create_index('ix_events_run_kind_time', 'events', ['run_pk', 'kind', 'time'], unique=False)



def downgrade() -> None:
    op.drop_index('ix_events_run_kind_time', table_name='events')

    op.drop_table('events')
    op.drop_index('ix_steps_run_attempt_rank_step', table_name='steps')

    op.drop_table('steps')
    op.drop_table('runs')
    op.drop_index('ix_collectives_run_attempt_step', table_name='collectives')

    op.drop_table('collectives')
