"""A rank's step rows of the blocks of steps it has left, one encoded row per block (`step_columns`): the storage
of record of a run's steps but for each rank's current block, which stays in `steps` (docs/storage.md).

- `move_left_blocks`: the writer calls it in the transaction that stored a rank's first rows of a new block
  (services.storage.step_blocks.mark_step_blocks says which): the rank's rows of lower steps leave `steps` (DELETE
  ... RETURNING: two writers never move the same row) for one `step_columns` row per block, encoded by
  services.storage.column_codec. Rows that arrive later for a block already moved (a replay) stay in `steps` until
  the rank enters its next block, then move into a second row of that block. So a rank's latest step is always in
  `steps` (live hang detection reads it there), and every row is stored once: in `steps` or in one block row.
- `column_rows`: decoded rows of a run's blocks (by attempt, ranks, block), for the loader, the block summaries,
  the rank drill-down and the live tail, which read them together with what `steps` holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection, text

from services.analysis.step_blocks import BLOCK_STEPS
from services.storage.column_codec import decode_blocks, encode_step_rows
from services.storage.db import json_rows, psycopg_connection, sqlite_connection
from services.storage.records import StepRows
from services.storage.tables import step_columns

_MOVE_SQL = ("DELETE FROM steps WHERE run_pk = {p} AND attempt = {p} AND rank = {p} AND step >= {p} AND step < {p} "
             "RETURNING step, start_time, end_time, loss, lr, comm")
_LOWEST_SQL = ("SELECT min(step) FROM steps WHERE run_pk = {p} AND attempt = {p} AND rank = {p} AND step >= {p} "
               "AND step < {p}")
# Rows moved per statement at most (whole blocks): a batch that brings a rank's millions of steps at once moves them
# a slice at a time, so the collector never holds them all as Python rows (tests/faults/test_request_memory.py).
MOVE_CHUNK_STEPS = 64 * BLOCK_STEPS
_INT64_MIN = -(1 << 63)
RankKey = tuple[int, int, int]  # (run pk, attempt, rank)


@dataclass(frozen=True, slots=True)
class ColumnRows:
    """Step rows with the attempt and rank of each."""

    attempt: np.ndarray  # int64
    rank: np.ndarray  # int64
    rows: StepRows

    def __len__(self) -> int:
        return len(self.attempt)


def move_left_blocks(conn: Connection, below: dict[RankKey, int]) -> int:
    """Move each (run_pk, attempt, rank)'s rows of steps below the given step out of `steps` into block rows;
    returns the rows moved. In key order: concurrent writers take the same row locks in the same order.

    A group's ranks that entered a block are moved together: their lowest steps read in one statement, their
    slices deleted in one round trip (up to MOVE_CHUNK_STEPS steps in all) and their block rows inserted in one
    statement. A rank far behind its new block (a replay, a bulk upload) moves the rest a slice at a time."""
    keys = sorted(below.items())
    lowest = _lowest_steps(conn, keys)
    moved = 0
    batch: list[tuple[RankKey, int, int]] = []  # (key, first step, end step) of each slice to delete
    spanned = 0  # steps the batch's slices span
    for key, step in keys:
        first = lowest.get(key)
        while first is not None:
            start = int(first) // BLOCK_STEPS * BLOCK_STEPS
            end = min(step, start + MOVE_CHUNK_STEPS)
            if batch and spanned + end - start > MOVE_CHUNK_STEPS:
                moved += _move_slices(conn, batch)
                batch, spanned = [], 0
            batch.append((key, start, end))
            spanned += end - start
            if end >= step:
                break
            moved += _move_slices(conn, batch)
            batch, spanned = [], 0
            first = _execute(conn, _LOWEST_SQL, (*key, end, step))[0][0]
    if batch:
        moved += _move_slices(conn, batch)
    return moved


def _lowest_steps(conn: Connection, keys: list[tuple[RankKey, int]]) -> dict[RankKey, int]:
    """Each rank's lowest step in `steps` below the given step, for the ranks that have one."""
    if not keys:
        return {}
    if conn.dialect.name == "postgresql":  # one statement: an index probe per rank
        with psycopg_connection(conn).cursor() as cursor:
            rows = cursor.execute(_LOWEST_MANY_SQL, (json_rows([(*key, step) for key, step in keys]),)).fetchall()
        return {(int(p), int(a), int(r)): int(lowest) for p, a, r, lowest in rows if lowest is not None}
    out = {}
    for key, step in keys:
        lowest = _execute(conn, _LOWEST_SQL, (*key, _INT64_MIN, step))[0][0]
        if lowest is not None:
            out[key] = int(lowest)
    return out


_LOWEST_MANY_SQL = (
    "SELECT k.p, k.a, k.r, (SELECT min(s.step) FROM steps s WHERE s.run_pk = k.p AND s.attempt = k.a AND s.rank = k.r "
    "AND s.step < k.b) FROM (SELECT (j->>0)::int4 AS p, (j->>1)::int4 AS a, (j->>2)::int4 AS r, (j->>3)::int8 AS b "
    "FROM jsonb_array_elements(%s::jsonb) AS v(j)) AS k"
)


def _move_slices(conn: Connection, slices: list[tuple[RankKey, int, int]]) -> int:
    """Delete the slices' step rows (whole blocks of one rank each) and insert them as one block row per block."""
    params = [(*key, start, end) for key, start, end in slices]
    if conn.dialect.name == "postgresql":  # the deletes in one round trip (psycopg pipelines executemany)
        fetched: list[list[tuple[Any, ...]]] = []
        with psycopg_connection(conn).cursor() as cursor:
            cursor.executemany(_MOVE_SQL.format(p="%s"), params, returning=True)
            while True:
                fetched.append(cursor.fetchall())
                if not cursor.nextset():
                    break
    else:
        fetched = [_execute(conn, _MOVE_SQL, slice_) for slice_ in params]
    out = [row for (key, _, _), rows in zip(slices, fetched, strict=True) for row in _block_rows(key, rows)]
    if out:
        conn.execute(step_columns.insert(), out)
    return sum(len(rows) for rows in fetched)


def _block_rows(key: RankKey, fetched: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """One rank's deleted step rows (whole blocks) as one block row each."""
    if not fetched:
        return []
    run_pk, attempt, rank = key
    matrix = np.array(fetched, dtype=np.float64)  # SQLite's NULL (a value not reported) becomes NaN here
    steps = np.array([r[0] for r in fetched], dtype=np.int64)  # exact: a float64 holds 53 bits of a step
    order = np.lexsort((matrix[:, 2], matrix[:, 1], steps))  # one order, whatever the delete returned
    rows = StepRows(steps[order], *(np.ascontiguousarray(matrix[order, k]) for k in range(1, 6)))
    blocks = rows.step // BLOCK_STEPS
    cuts = np.flatnonzero(np.diff(blocks)) + 1
    out = []
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(blocks)], strict=True):
        part = rows.take(slice(lo, hi))
        out.append({"run_pk": run_pk, "attempt": attempt, "rank": rank, "block": int(blocks[lo]),
                    "end_time": float(part.end.max()), "rows": int(hi - lo), "data": encode_step_rows(part)})
    return out


def column_rows(conn: Connection, run_pk: int, *, attempt: int | None = None, ranks: Sequence[int] | None = None,
                block: int | None = None, last_blocks: int | None = None) -> ColumnRows:
    """The decoded rows of the run's block rows (only `attempt`'s, `ranks`', `block`'s; `last_blocks`: only the rows of
    the highest few, for one rank), ordered by (attempt, rank, block), each block's rows in their stored order."""
    postgres = conn.dialect.name == "postgresql"
    p = "%s" if postgres else "?"
    sql = f"SELECT attempt, rank, block, data FROM step_columns WHERE run_pk = {p}"
    params: list[Any] = [int(run_pk)]
    if attempt is not None:
        sql += f" AND attempt = {p}"
        params.append(int(attempt))
    if ranks is not None:
        if not ranks:
            return _no_rows()
        sql += f" AND rank IN ({', '.join(str(int(r)) for r in ranks)})"
    if block is not None:
        sql += f" AND block = {p}"
        params.append(int(block))
    if last_blocks is None:
        sql += " ORDER BY attempt, rank, block"
    else:
        sql += f" ORDER BY block DESC LIMIT {p}"
        params.append(int(last_blocks))
    fetched = _execute(conn, sql, tuple(params), binary=True)
    if last_blocks is not None:
        fetched.sort(key=lambda r: (r[0], r[1], r[2]))
    if not fetched:
        return _no_rows()
    counts, rows = decode_blocks([data for _, _, _, data in fetched])
    return ColumnRows(attempt=np.repeat(np.array([r[0] for r in fetched], dtype=np.int64), counts),
                      rank=np.repeat(np.array([r[1] for r in fetched], dtype=np.int64), counts), rows=rows)


def stored_step_count(conn: Connection, run_pk: int | None = None) -> int:
    """Every stored step row: those in `steps` and those in block rows (a resend's duplicates included)."""
    where = "" if run_pk is None else f" WHERE run_pk = {int(run_pk)}"
    head = conn.execute(text(f"SELECT count(*) FROM steps{where}")).scalar_one()
    moved = conn.execute(text(f"SELECT coalesce(sum(rows), 0) FROM step_columns{where}")).scalar_one()
    return int(head) + int(moved)


def stored_step_keys(conn: Connection, run_id: str | None = None) -> pd.DataFrame:
    """(run_pk, attempt, rank, step) of every stored step row (`run_id`: of the runs of that id), in `steps` or in a
    block row, one line per row (a resend's duplicates included), ordered by (run_pk, attempt, rank, step): what
    checks that every step was stored once read."""
    runs = "" if run_id is None else " WHERE run_pk IN (SELECT id FROM runs WHERE run_id = :run)"
    params = {"run": run_id}
    head = conn.execute(text(f"SELECT run_pk, attempt, rank, step FROM steps{runs}"), params).all()
    parts = [pd.DataFrame(head, columns=["run_pk", "attempt", "rank", "step"], dtype=np.int64)]
    for (run_pk,) in conn.execute(text(f"SELECT DISTINCT run_pk FROM step_columns{runs} ORDER BY run_pk"),
                                  params).all():
        moved = column_rows(conn, int(run_pk))
        parts.append(pd.DataFrame({"run_pk": np.full(len(moved), int(run_pk), dtype=np.int64),
                                   "attempt": moved.attempt, "rank": moved.rank, "step": moved.rows.step}))
    keys = pd.concat(parts, ignore_index=True)
    return keys.sort_values(list(keys.columns), kind="stable").reset_index(drop=True)


def blocks_entered(records: Iterable[tuple[int, int, int, np.ndarray]],
                   new_marks: set[tuple[int, int, int, int]]) -> dict[tuple[int, int, int], int]:
    """From the step rows just stored ((run_pk, attempt, rank, steps) each) and the (run_pk, attempt, block, rank)
    marks their storing created: per (run_pk, attempt, rank) that entered a block, the first step of the highest
    block it entered (what `move_left_blocks` moves the rows below of)."""
    out: dict[tuple[int, int, int], int] = {}
    for run_pk, attempt, rank, steps in records:
        for block in {int(b) for b in (steps // BLOCK_STEPS).tolist()}:
            if (run_pk, attempt, block, rank) in new_marks:
                key = (run_pk, attempt, rank)
                out[key] = max(out.get(key, block * BLOCK_STEPS), block * BLOCK_STEPS)
    return out


def _no_rows() -> ColumnRows:
    empty = np.zeros(0, dtype=np.int64)
    return ColumnRows(attempt=empty, rank=empty, rows=StepRows(empty, *(np.zeros(0) for _ in range(5))))


def _execute(conn: Connection, sql: str, params: tuple[Any, ...], *, binary: bool = False) -> list[tuple[Any, ...]]:
    if conn.dialect.name == "postgresql":
        with psycopg_connection(conn).cursor(binary=binary) as pg_cursor:
            return pg_cursor.execute(sql.format(p="%s"), params).fetchall()
    cursor = sqlite_connection(conn).cursor()
    try:
        return cursor.execute(sql.format(p="?"), params).fetchall()
    finally:
        cursor.close()
