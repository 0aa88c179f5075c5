"""runs belong to projects: unique (run_id, project) instead of unique run_id; events.content_hash

A run is identified by (project, run id): two projects may use the same run id. Existing runs keep their
project (the column exists since 0001; nothing is rewritten). `runs.id` stays the key every other table
references. The unique index leads with run_id, so a lookup of a run id across projects uses it too.

events.content_hash holds a digest of each event's validated content; a repeated event id with other content
is refused (409). Events stored before this revision have none (NULL): a repeat of one is taken as a retry.

SQLite cannot drop a UNIQUE constraint in place: the runs table is rebuilt (copy, drop, rename). Dropping a
parent table while foreign keys are enforced would cascade-delete every event, so this revision refuses to run
on SQLite with foreign keys on; services.storage.migrate and migrations/env.py switch them off for the
migration and check `PRAGMA foreign_key_check` before committing.

Downgrade: refused while two projects share a run id (the old schema cannot hold both).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-08 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _require_foreign_keys_off() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError(
            "revision 0005 rebuilds the runs table, and on SQLite with foreign keys enforced that would delete every "
            "event of every run; run it with `goodput migrate` (which switches them off for the migration)")


def upgrade() -> None:
    _require_foreign_keys_off()
    with op.batch_alter_table("runs", recreate="auto") as batch:
        batch.drop_constraint("uq_runs_run_id", type_="unique")
        batch.create_unique_constraint("uq_runs_run_id_project", ["run_id", "project"])
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("content_hash", sa.String(length=32), nullable=True))


def downgrade() -> None:
    _require_foreign_keys_off()
    shared = op.get_bind().execute(sa.text(
        "SELECT run_id, COUNT(*) FROM runs GROUP BY run_id HAVING COUNT(*) > 1 ORDER BY run_id LIMIT 5")).all()
    if shared:
        names = ", ".join(repr(r[0]) for r in shared)
        raise RuntimeError(
            f"cannot downgrade below 0005: run ids used by several projects ({names}); the old schema allows one "
            "run per run id. Delete or rename one of each pair first")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("content_hash")
    with op.batch_alter_table("runs", recreate="auto") as batch:
        batch.drop_constraint("uq_runs_run_id_project", type_="unique")
        batch.create_unique_constraint("uq_runs_run_id", ["run_id"])
