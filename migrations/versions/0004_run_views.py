"""run_views: the last build of each run's dashboard views, with the ledger of the same version

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_views",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("analysed_at", sa.Double(), nullable=False),
        sa.Column("analysis_seconds", sa.Double(), nullable=False),
        sa.Column("ledger_json", sa.Text(), nullable=False),
        sa.Column("views_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_run_views_run_pk_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", name=op.f("pk_run_views")),
    )


def downgrade() -> None:
    op.drop_table("run_views")
