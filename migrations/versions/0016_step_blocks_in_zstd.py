"""block rows compressed with Zstandard: the same bytes as zlib, a ninth of the time to inflate

From this revision the collector writes its block rows (`step_columns.data`) in the column codec's format 2, the
same words compressed with zstd instead of zlib (services/storage/column_codec.py): on a run's blocks the same bytes
within 1 %, a seventh of the CPU to encode and a ninth to inflate, which was most of loading a run's steps.

Upgrade: nothing to rewrite. Blocks already stored stay in format 1, which this code reads as well (a run of mixed
formats decodes in one pass), and leave with their raw retention; re-encoding them all would hold the collector's
start for the whole table (~2.4 us a row measured: days for a month of a large fleet's rows).
Downgrade: every block row of format 2 (written since the upgrade) back into format 1, which the code before this
revision reads, a (run, attempt, rank) at a time; its rows come back bit for bit (the codec's round trip;
tests/storage/test_zstd_blocks_migration.py).

Revision ID: 0016
Revises: 0015
Create Date: 2027-01-13 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from services.storage.column_codec import ZLIB_FORMAT, ZSTD_FORMAT, decode_step_rows, encode_step_rows

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The collector writes format 2 from this revision on; stored format-1 blocks are read as they are."""


def downgrade() -> None:
    """Every zstd block row written again in zlib, one (run, attempt, rank)'s rows at a time, so memory holds one
    rank's blocks at most. The format is the data's first byte."""
    conn = op.get_bind()
    zstd = {"f": bytes([ZSTD_FORMAT])}
    of_format = "substr(data, 1, 1) = :f"  # (bytea on PostgreSQL, a BLOB on SQLite: bytes either way)
    ranks = conn.execute(sa.text(f"SELECT DISTINCT run_pk, attempt, rank FROM step_columns WHERE {of_format} "
                                 "ORDER BY run_pk, attempt, rank"), zstd).all()
    for run_pk, attempt, rank in ranks:
        where = f"run_pk = :p AND attempt = :a AND rank = :r AND {of_format}"
        key = {"p": run_pk, "a": attempt, "r": rank}
        rows = conn.execute(sa.text(f"SELECT block, end_time, rows, data FROM step_columns WHERE {where}"),
                            {**key, **zstd}).all()
        conn.execute(sa.text(f"DELETE FROM step_columns WHERE {where}"), {**key, **zstd})
        conn.execute(sa.text("INSERT INTO step_columns (run_pk, attempt, rank, block, end_time, rows, data) "
                             "VALUES (:p, :a, :r, :b, :e, :n, :d)"),
                     [{**key, "b": block, "e": end_time, "n": n,
                       "d": encode_step_rows(decode_step_rows(bytes(data)), format_version=ZLIB_FORMAT)}
                      for block, end_time, n, data in rows])
