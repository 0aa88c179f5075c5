"""clock_readings: what the requests said of each rank's clock; step blocks summarised again with clock groups

`clock_readings` holds, per (run, attempt, rank) and minute of receipt, how far its events' times and its
requests' `Goodput-Sent-At` lay from the collector's clock (services/storage/clock_readings.py): live hang
detection measures a run against the collector's clock with them. Step block summaries now keep each block's
ranks in clock groups (services/analysis/block_clocks.py); the ones stored before are deleted, so that each block
is summarised again from its rows at its run's next analysis (a pruned run has none: they went with its rows).

Revision ID: 0009
Revises: 0008
Create Date: 2027-01-10 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clock_readings",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("window_index", sa.BigInteger(), nullable=False),
        sa.Column("lead_s", sa.Double(), nullable=False),
        sa.Column("lead_prev_s", sa.Double(), nullable=True),
        sa.Column("offset_s", sa.Double(), nullable=True),
        sa.Column("offset_prev_s", sa.Double(), nullable=True),
        sa.Column("received_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_clock_readings_run_pk_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "attempt", "rank", name=op.f("pk_clock_readings")),
    )
    op.execute("DELETE FROM step_blocks")


def downgrade() -> None:
    op.drop_table("clock_readings")  # the summaries' clock groups are extra arrays the older code does not read
