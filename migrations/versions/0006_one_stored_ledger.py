"""one stored ledger: run_views.ledger_json dropped, a run's ledger is kept in runs only

Until now a views build stored its ledger twice: in `runs` (what every read of the ledger uses) and beside the
views in `run_views`. Upgrading first moves into `runs` a views build's ledger that is newer than the run's own
(it describes a later version), then drops the copy.

Downgrade: the copy comes back from `runs` for the views of the same version as the run's ledger; other views
are deleted (they are rebuilt the next time a page or the background analyst asks for them).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-14 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "UPDATE runs SET "
        "ledger_json = (SELECT v.ledger_json FROM run_views v WHERE v.run_pk = runs.id), "
        "ledger_version = (SELECT v.version FROM run_views v WHERE v.run_pk = runs.id) "
        "WHERE EXISTS (SELECT 1 FROM run_views v WHERE v.run_pk = runs.id AND v.version > runs.ledger_version)")
    with op.batch_alter_table("run_views") as batch:
        batch.drop_column("ledger_json")


def downgrade() -> None:
    op.execute(
        "DELETE FROM run_views WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = run_views.run_pk "
        "AND r.ledger_version = run_views.version AND r.ledger_json IS NOT NULL)")
    with op.batch_alter_table("run_views") as batch:
        batch.add_column(sa.Column("ledger_json", sa.Text(), nullable=True))
    op.execute("UPDATE run_views SET ledger_json = (SELECT r.ledger_json FROM runs r WHERE r.id = run_views.run_pk)")
    with op.batch_alter_table("run_views") as batch:
        batch.alter_column("ledger_json", existing_type=sa.Text(), nullable=False)
