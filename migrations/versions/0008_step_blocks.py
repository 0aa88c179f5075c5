"""step_marks and step_blocks: a run's step rows reduced per block of steps, kept up to date as rows arrive

`step_marks` is written with the step and collective rows (which ranks sent rows for which block, and how often);
`step_blocks` holds each block's summary, made again only for blocks whose marks changed since
(services/storage/step_blocks.py). Upgrading marks every block of the rows stored before (one pass over `steps`
and `collectives`); their summaries are made at each run's next analysis.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-20 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

BLOCK_STEPS = 128


def upgrade() -> None:
    op.create_table(
        "step_marks",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("changes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("run_pk", "attempt", "block", "rank", name=op.f("pk_step_marks")),
    )
    op.create_table(
        "step_blocks",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("changes", sa.BigInteger(), nullable=False),
        sa.Column("summary", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("run_pk", "attempt", "block", name=op.f("pk_step_blocks")),
    )
    # services.analysis.step_blocks.BLOCK_STEPS as of this revision; floor division for any sign of step
    block = f"(step - ((step % {BLOCK_STEPS}) + {BLOCK_STEPS}) % {BLOCK_STEPS}) / {BLOCK_STEPS}"
    op.execute(f"INSERT INTO step_marks (run_pk, attempt, block, rank, changes) "
               f"SELECT run_pk, attempt, block, rank, 1 FROM ("
               f"SELECT run_pk, attempt, {block} AS block, rank FROM steps UNION "
               f"SELECT run_pk, attempt, {block} AS block, rank FROM collectives) AS marked")


def downgrade() -> None:
    op.drop_table("step_blocks")
    op.drop_table("step_marks")
