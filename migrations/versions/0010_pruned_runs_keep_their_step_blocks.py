"""runs.detail_pruned_version and step_blocks.pruned: a pruned run keeps its step blocks and goes on being analysed

Retention used to delete a run's step blocks with its raw rows, so a pruned run could never be analysed again.
From this revision it keeps them: `step_blocks.pruned` says that a block's rows were deleted (empty: the stored
summary is theirs; else the summary of the deleted rows, the summary then holding rows received since as well), and
`runs.detail_pruned_version` is the run's version whose rows were all summarised when they went
(services/storage/retention.py). Runs pruned before this revision keep NULL: their blocks are gone, so their stored
analyses stay final, as before.

Downgrade drops both columns: a run pruned since is then final again (its blocks stay, unread).

Revision ID: 0010
Revises: 0009
Create Date: 2027-01-05 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("detail_pruned_version", sa.BigInteger(), nullable=True))
    op.add_column("step_blocks", sa.Column("pruned", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_blocks") as batch:
        batch.drop_column("pruned")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("detail_pruned_version")
