"""checkpoint_requests: a scheduler asks a running run to checkpoint; the checkpoint that follows is linked

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_requests",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("requested_at", sa.Double(), nullable=False),
        sa.Column("reason", sa.String(length=256), nullable=True),
        sa.Column("requested_by", sa.String(length=128), nullable=True),
        sa.Column("fulfilled_at", sa.Double(), nullable=True),
        sa.Column("fulfilled_step", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_checkpoint_requests_run_pk_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoint_requests")),
    )
    op.create_index("ix_checkpoint_requests_run_fulfilled", "checkpoint_requests", ["run_pk", "fulfilled_at"],
                    unique=False)


def downgrade() -> None:
    op.drop_index("ix_checkpoint_requests_run_fulfilled", table_name="checkpoint_requests")
    op.drop_table("checkpoint_requests")
