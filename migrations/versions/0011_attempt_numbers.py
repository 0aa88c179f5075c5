"""attempt_numbers: a run's attempt number of each (launch, attempt within it), decided by the collector

Clients name their launch on every record (`launch`) and number its rounds; the collector numbers the run's
attempts from every launch's (services/storage/attempt_numbers.py). Upgrading records every stored attempt as one
of launch "" (records without a launch keep their numbers), starting at its earliest event.

Revision ID: 0011
Revises: 0010
Create Date: 2027-01-05 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempt_numbers",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("launch", sa.String(length=128), nullable=False),
        sa.Column("client_attempt", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("rank_lo", sa.Integer(), nullable=True),
        sa.Column("rank_hi", sa.Integer(), nullable=True),
        sa.Column("renumbered", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_attempt_numbers_run_pk_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "launch", "client_attempt", name=op.f("pk_attempt_numbers")),
    )
    op.execute("INSERT INTO attempt_numbers (run_pk, launch, client_attempt, attempt, start_time, renumbered) "
               "SELECT run_pk, '', attempt, attempt, min(time), 0 FROM events WHERE attempt IS NOT NULL "
               "GROUP BY run_pk, attempt")


def downgrade() -> None:
    op.drop_table("attempt_numbers")
