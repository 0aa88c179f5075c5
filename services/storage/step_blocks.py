"""A run's step rows reduced per block of steps, kept up to date as rows arrive (services.analysis.step_blocks).

- `mark_step_blocks`: the writer calls it with the records a group inserted, in the same transaction: for each
  (attempt, block, rank) that received step or collective rows, `step_marks.changes` goes up by one.
- `fold_step_blocks`: summarises again every block whose marks changed since its summary was made (the sum of its
  marks' changes differs from the one stored with the summary), reading only that block's rows: the marks are
  read before the rows, so a summary never claims rows it did not read (rows committed in between make it
  summarised again next time). Cost: the rows of the changed blocks, not the run's.
- `load_step_summary`: the run's blocks merged, what the ledger and the views read instead of every row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.dialects import postgresql, sqlite

from services.analysis.run_data import RunData, collectives_frame, steps_frame
from services.analysis.step_blocks import BLOCK_STEPS, StepBlock, StepSummary, block_of, merge_blocks, summarize_block
from services.storage.db import psycopg_connection, sqlite_connection
from services.storage.load import _load_events, sum_collective_seconds
from services.storage.records import IngestRecord
from services.storage.runs import RunRow
from services.storage.tables import step_blocks, step_marks


def mark_step_blocks(conn: Connection, records: Sequence[tuple[int, IngestRecord]]) -> None:
    """Count, per (run, attempt, block, rank), the newly inserted records with rows in that block."""
    counts: dict[tuple[int, int, int, int], int] = {}
    for run_pk, r in records:
        for rows in (r.step_rows, r.collective_rows):
            if rows is None or not len(rows.step) or r.attempt is None or r.rank is None:
                continue
            for block in np.unique(block_of(rows.step)).tolist():
                key = (run_pk, int(r.attempt), int(block), int(r.rank))
                counts[key] = counts.get(key, 0) + 1
    if not counts:
        return
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(step_marks)
    statement = statement.on_conflict_do_update(
        index_elements=["run_pk", "attempt", "block", "rank"],
        set_={"changes": step_marks.c.changes + statement.excluded.changes})
    conn.execute(statement, [{"run_pk": k[0], "attempt": k[1], "block": k[2], "rank": k[3], "changes": n}
                             for k, n in sorted(counts.items())])  # one key order for every writer: no deadlock


def fold_step_blocks(engine: Engine, run_pk: int) -> int:
    """Summarise again the run's blocks that changed since their summary; returns how many."""
    with engine.connect() as conn:
        marked = _marked(conn, run_pk)
        folded = {(int(a), int(b)): int(c) for a, b, c in conn.execute(
            select(step_blocks.c.attempt, step_blocks.c.block, step_blocks.c.changes)
            .where(step_blocks.c.run_pk == run_pk))}
    dirty = sorted(key for key, changes in marked.items() if folded.get(key) != changes)
    for attempt, block in dirty:
        with engine.begin() as conn:
            _fold_block(conn, run_pk, attempt, block)
    return len(dirty)


def _marked(conn: Connection, run_pk: int, attempt: int | None = None,
            block: int | None = None) -> dict[tuple[int, int], int]:
    query = (select(step_marks.c.attempt, step_marks.c.block, func.sum(step_marks.c.changes))
             .where(step_marks.c.run_pk == run_pk).group_by(step_marks.c.attempt, step_marks.c.block))
    if attempt is not None:
        query = query.where(step_marks.c.attempt == attempt, step_marks.c.block == block)
    return {(int(a), int(b)): int(c) for a, b, c in conn.execute(query)}


def _fold_block(conn: Connection, run_pk: int, attempt: int, block: int) -> None:
    changes = _marked(conn, run_pk, attempt, block)[(attempt, block)]  # before the rows: never claims unread rows
    ranks = sorted(int(r) for (r,) in conn.execute(select(step_marks.c.rank).where(
        step_marks.c.run_pk == run_pk, step_marks.c.attempt == attempt, step_marks.c.block == block)))
    lo, hi = block * BLOCK_STEPS, (block + 1) * BLOCK_STEPS
    rank, step, start, end, comm = _block_steps(conn, run_pk, attempt, ranks, lo, hi)
    if len(step) and np.isnan(comm).any():  # collective rows fill the steps without their own comm
        summed = _block_comm(conn, run_pk, attempt, lo, hi)
        if not summed.empty:
            key = (summed["rank"].to_numpy(np.int64) << 32) | summed["step"].to_numpy(np.int64)
            order = np.argsort(key)
            key, seconds = key[order], summed["seconds"].to_numpy(np.float64)[order]
            mine = (rank << 32) | step
            at = np.clip(np.searchsorted(key, mine), 0, len(key) - 1)
            found = key[at] == mine
            comm = np.where(np.isnan(comm) & found, seconds[at], comm)
    summary = summarize_block(attempt, block, rank, step, start, end, comm).to_bytes() if len(step) else b""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(step_blocks).values(run_pk=run_pk, attempt=attempt, block=block, changes=changes,
                                           summary=summary)
    conn.execute(statement.on_conflict_do_update(
        index_elements=["run_pk", "attempt", "block"],
        set_={"changes": statement.excluded.changes, "summary": statement.excluded.summary}))


_STEP_SQL = ("SELECT rank, step, start_time, end_time, {comm} FROM steps WHERE run_pk = {p} AND attempt = {p} "
             "AND rank IN ({ranks}) AND step >= {p} AND step < {p}")
_COMM_SQL = ("SELECT attempt, rank, step, start_time, end_time FROM collectives WHERE run_pk = {p} AND attempt = {p} "
             "AND step >= {p} AND step < {p}")


def _block_steps(conn: Connection, run_pk: int, attempt: int, ranks: list[int], lo: int,
                 hi: int) -> tuple[np.ndarray, ...]:
    """(rank, step, start, end, comm) of one block's rows, read along the (run, attempt, rank, step) index: one
    range per rank. Unknown comm is NaN on PostgreSQL, NULL on SQLite (read as -1: never a valid value)."""
    listed = ", ".join(str(int(r)) for r in ranks) or "NULL"
    postgres = conn.dialect.name == "postgresql"
    comm_sql = "coalesce(comm, 'NaN'::float8)" if postgres else "ifnull(comm, -1.0)"
    matrix = _fetch(conn, _STEP_SQL.format(comm=comm_sql, p="{p}", ranks=listed), (run_pk, attempt, lo, hi))
    comm = matrix[:, 4]
    return (matrix[:, 0].astype(np.int64), matrix[:, 1].astype(np.int64), matrix[:, 2], matrix[:, 3],
            np.where(comm < 0, np.nan, comm))


def _block_comm(conn: Connection, run_pk: int, attempt: int, lo: int, hi: int) -> pd.DataFrame:
    matrix = _fetch(conn, _COMM_SQL, (run_pk, attempt, lo, hi))
    return sum_collective_seconds(*(matrix[:, k] for k in range(5)))


def _fetch(conn: Connection, template: str, params: tuple[int, ...]) -> np.ndarray:
    """The rows of a query of five numeric columns as a float64 matrix (plain DBAPI tuples: no Row objects)."""
    if conn.dialect.name == "postgresql":
        with psycopg_connection(conn).cursor() as pg_cursor:
            rows = pg_cursor.execute(template.format(p="%s"), params).fetchall()
    else:
        cursor = sqlite_connection(conn).cursor()
        try:
            rows = cursor.execute(template.format(p="?"), params).fetchall()
        finally:
            cursor.close()
    return np.array(rows, dtype=np.float64).reshape(-1, 5)


def load_summarised_run_data(engine: Engine, run: RunRow) -> RunData:
    """What the ledger and the views read of a run: its control events and its step rows reduced per block, the
    changed blocks summarised again first."""
    fold_step_blocks(engine, run.pk)
    with engine.connect() as conn:
        return RunData(run_id=run.run_id, events=_load_events(conn, run.pk), steps=steps_frame(),
                       collectives=collectives_frame(), step_summary=load_step_summary(conn, run.pk))


def load_step_summary(conn: Connection, run_pk: int) -> StepSummary:
    """The run's block summaries, merged (fold them first: `fold_step_blocks`)."""
    rows = conn.execute(select(step_blocks.c.summary).where(step_blocks.c.run_pk == run_pk)).all()
    blocks: list[StepBlock] = [StepBlock.from_bytes(bytes(summary)) for (summary,) in rows if summary]
    return merge_blocks(blocks)
