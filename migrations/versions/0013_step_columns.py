"""step_columns: a rank's step rows of the blocks of steps it has left, one encoded row per block

`step_columns` holds, per (run, attempt, rank, block of 128 steps), the rows of that block encoded column-wise
(services/storage/column_codec.py, format 1: zlib; the collector writes format 2 from 0016); `steps` keeps each
rank's current block (services/storage/step_columns.py, docs/storage.md). PostgreSQL: partitioned by day of the
block's latest end, as `steps`, with a partition for each day `steps` has one for.

Upgrade: for every (run, attempt, rank), its rows of the blocks below its highest one leave `steps` for one block
row each. Downgrade: every block row's rows back into `steps`, and the table dropped (its partitions with it).

Revision ID: 0013
Revises: 0012
Create Date: 2027-01-10 12:00:00
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

from services.storage.column_codec import ZLIB_FORMAT, decode_step_rows, encode_step_rows
from services.storage.records import StepRows

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

BLOCK_STEPS = 128
_VALUES = ("step", "start", "end", "loss", "lr", "comm")


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    types: dict[str, sa.types.TypeEngine[Any]] = {
        "run_pk": sa.Integer(), "attempt": sa.Integer(), "rank": sa.Integer(), "block": sa.BigInteger(),
        "end_time": sa.Double(), "rows": sa.Integer(), "data": sa.LargeBinary()}
    columns: list[sa.Column[Any]] = [sa.Column(name, kind, nullable=False) for name, kind in types.items()]
    if postgres:
        op.create_table("step_columns", *columns, postgresql_partition_by="RANGE (end_time)")
        op.execute('CREATE TABLE "step_columns_default" PARTITION OF "step_columns" DEFAULT')
        for (name,) in op.get_bind().execute(sa.text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p "
                "ON p.oid = i.inhparent WHERE p.relname = 'steps' AND c.relname <> 'steps_default'")):
            bounds = op.get_bind().execute(sa.text(
                "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c WHERE c.relname = :n"),
                {"n": name}).scalar()
            day = name.removeprefix("steps_")
            op.execute(f'CREATE TABLE "step_columns_{day}" PARTITION OF "step_columns" {bounds}')
    else:
        op.create_table("step_columns", *columns)
    op.create_index("ix_step_columns_run_attempt_rank_block", "step_columns", ["run_pk", "attempt", "rank", "block"])
    conn = op.get_bind()
    keys = conn.execute(sa.text("SELECT run_pk, attempt, rank, max(step) FROM steps GROUP BY run_pk, attempt, rank "
                                "ORDER BY run_pk, attempt, rank")).all()
    for run_pk, attempt, rank, top in keys:
        below = (int(top) // BLOCK_STEPS) * BLOCK_STEPS
        where = {"pk": run_pk, "a": attempt, "r": rank, "below": below}
        fetched = conn.execute(sa.text(
            "SELECT step, start_time, end_time, loss, lr, comm FROM steps WHERE run_pk = :pk AND attempt = :a "
            "AND rank = :r AND step < :below"), where).all()
        if not fetched:
            continue
        matrix = np.array([tuple(r)[1:] for r in fetched], dtype=np.float64)  # NULL -> NaN
        steps = np.array([r[0] for r in fetched], dtype=np.int64)
        order = np.lexsort((matrix[:, 1], matrix[:, 0], steps))
        rows = StepRows(steps[order], *(np.ascontiguousarray(matrix[order, k]) for k in range(5)))
        blocks = rows.step // BLOCK_STEPS
        cuts = np.flatnonzero(np.diff(blocks)) + 1
        out = []
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(blocks)], strict=True):
            part = StepRows(*(getattr(rows, c)[lo:hi] for c in _VALUES))
            out.append({"pk": run_pk, "a": attempt, "r": rank, "b": int(blocks[lo]), "e": float(part.end.max()),
                        "n": int(hi - lo), "d": encode_step_rows(part, format_version=ZLIB_FORMAT)})
        conn.execute(sa.text("INSERT INTO step_columns (run_pk, attempt, rank, block, end_time, rows, data) "
                             "VALUES (:pk, :a, :r, :b, :e, :n, :d)"), out)
        conn.execute(sa.text("DELETE FROM steps WHERE run_pk = :pk AND attempt = :a AND rank = :r AND step < :below"),
                     where)


def downgrade() -> None:
    conn = op.get_bind()
    for run_pk, attempt, rank, data in conn.execute(sa.text(
            "SELECT run_pk, attempt, rank, data FROM step_columns ORDER BY run_pk, attempt, rank, block")).all():
        rows = decode_step_rows(bytes(data))
        values = [{"pk": run_pk, "a": attempt, "r": rank, "s": s, "t0": t0, "t1": t1, "loss": _value(loss),
                   "lr": _value(lr), "comm": _value(comm)}
                  for s, t0, t1, loss, lr, comm in zip(*(getattr(rows, c).tolist() for c in _VALUES), strict=True)]
        conn.execute(sa.text("INSERT INTO steps (run_pk, attempt, rank, step, start_time, end_time, loss, lr, comm) "
                             "VALUES (:pk, :a, :r, :s, :t0, :t1, :loss, :lr, :comm)"), values)
    op.drop_index("ix_step_columns_run_attempt_rank_block", table_name="step_columns")
    op.drop_table("step_columns")


def _value(v: float) -> float | None:
    """A value not reported: NaN on PostgreSQL (as the writer stores it), NULL on SQLite (which has no NaN)."""
    if v == v or op.get_bind().dialect.name == "postgresql":
        return v
    return None
