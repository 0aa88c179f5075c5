"""a step record's event row goes when its rows move into block rows; heartbeats thinned to their extremes

From this revision a step record's `events` row (its id and digest) is kept only while its rows are in `steps`: when
a rank's rows move into `step_columns`, the event rows of its step records below the new block are deleted, and a
record sent again after that is recognised by its rows (services/storage/moved_repeats.py). A rank's heartbeats
are kept as its earliest and latest of each attempt, all the analysis and live detection read of them. The index
on `step_marks` finds a rank's highest block (what says whether a record may repeat moved rows) in one probe; two
partial indexes on `events` (a rank's step records by step, its heartbeats by time) let the writer delete exactly
the rows it makes redundant, rank by rank.

Upgrade: creates the indexes; deletes the event rows of step records wholly below the blocks each rank has in
`step_columns` (their rows are there), and every heartbeat strictly between each (run, attempt, rank)'s earliest
and latest.
Downgrade: drops the indexes. The deleted rows do not come back: their ids are gone (their rows are in the blocks;
the older code stores a record sent again as late rows, which the analysis counts once).

Revision ID: 0015
Revises: 0014
Create Date: 2027-01-12 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

BLOCK_STEPS = 128

_MOVED_RECORDS = (
    "DELETE FROM events WHERE kind IN ('step', 'steps') AND attempt IS NOT NULL AND rank IS NOT NULL "
    "AND step < (SELECT (max(c.block) + 1) * {block_steps} FROM step_columns c WHERE c.run_pk = events.run_pk "
    "AND c.attempt = events.attempt AND c.rank = events.rank)"
)
# strictly between the (run, attempt, rank)'s earliest and latest: ties at either end all stay (the writer's rule,
# services/storage/moved_repeats.py); each subquery is a probe of the partial index made first
_RANK_BEATS = ("FROM events b WHERE b.run_pk = events.run_pk AND b.kind = 'heartbeat' AND b.attempt = events.attempt "
               "AND b.rank = events.rank")
_HEARTBEATS_BETWEEN = (
    f"DELETE FROM events WHERE kind = 'heartbeat' AND time > (SELECT min(b.time) {_RANK_BEATS}) "
    f"AND time < (SELECT max(b.time) {_RANK_BEATS})"
)
_STEP_RECORDS = "kind IN ('step', 'steps')"
_HEARTBEATS = "kind = 'heartbeat'"


def upgrade() -> None:
    op.create_index("ix_step_marks_run_attempt_rank_block", "step_marks", ["run_pk", "attempt", "rank", "block"])
    op.create_index("ix_events_step_records", "events", ["run_pk", "attempt", "rank", "step"],
                    postgresql_where=sa.text(_STEP_RECORDS), sqlite_where=sa.text(_STEP_RECORDS))
    op.create_index("ix_events_heartbeats", "events", ["run_pk", "attempt", "rank", "time"],
                    postgresql_where=sa.text(_HEARTBEATS), sqlite_where=sa.text(_HEARTBEATS))
    op.execute(_MOVED_RECORDS.format(block_steps=BLOCK_STEPS))
    op.execute(_HEARTBEATS_BETWEEN)


def downgrade() -> None:
    op.drop_index("ix_events_heartbeats", table_name="events")
    op.drop_index("ix_events_step_records", table_name="events")
    op.drop_index("ix_step_marks_run_attempt_rank_block", table_name="step_marks")
