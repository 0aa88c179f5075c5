"""block summaries TOAST-compressed with lz4 on PostgreSQL instead of pglz

A step block's summary (`step_blocks.summary`, and `pruned` where retention kept one) is an uncompressed .npz of the
block's per-step and per-rank arrays (services/storage/block_codec.py: read back as views of the stored bytes), a few
hundred kilobytes for a block of 256 ranks, written again at every fold of a live block. PostgreSQL's default TOAST
compression, pglz, spent ~5.5 ms on each such value only to store it as it was (it saves less than pglz's 25 %
minimum); lz4 compresses it in ~1 ms and keeps it smaller (a block of 256 ranks x 128 steps: an upsert 2.9 ms
against 8.4, 270 KB stored against 310).

Upgrade: the two columns' compression set to lz4 where the server has it (PostgreSQL 14 or later built with lz4, as
the official images and Debian's packages are); a stored value keeps its form until it is written again, and reads
the same either way. Elsewhere (SQLite, a server without lz4): nothing.
Downgrade: the columns back to the server's default compression.

Revision ID: 0017
Revises: 0016
Create Date: 2027-01-20 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_COLUMNS = ("summary", "pruned")


def _has_lz4(conn: sa.Connection) -> bool:
    if conn.dialect.name != "postgresql":
        return False
    row = conn.execute(sa.text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")).first()
    return row is not None and "lz4" in (row[0] or ())


def _set_compression(method: str) -> None:
    op.execute("ALTER TABLE step_blocks " + ", ".join(f"ALTER COLUMN {c} SET COMPRESSION {method}" for c in _COLUMNS))


def upgrade() -> None:
    if _has_lz4(op.get_bind()):
        _set_compression("lz4")


def downgrade() -> None:
    if _has_lz4(op.get_bind()):
        _set_compression("DEFAULT")
