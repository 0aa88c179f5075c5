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
from services.storage.db import psycopg_connection, sqlite_connection
from services.storage.one_trip import OneTrip
from services.storage.records import StepRows
from services.storage.tables import step_columns

_MOVE_SQL = ("DELETE FROM steps WHERE run_pk = {p} AND attempt = {p} AND rank = {p} AND step >= {p} AND step < {p} "
             "RETURNING step, start_time, end_time, loss, lr, comm")
_LOWEST_SQL = ("SELECT min(step) FROM steps WHERE run_pk = {p} AND attempt = {p} AND rank = {p} AND step >= {p} "
               "AND step < {p}")
# Rows moved per statement at most (whole blocks): a batch that brings a rank's millions of steps at once moves them
# a slice at a time, so the collector never holds them all as Python rows (tests/faults/test_request_memory.py).
MOVE_CHUNK_STEPS = 64 * BLOCK_STEPS
_RANKS_A_MOVE = MOVE_CHUNK_STEPS // BLOCK_STEPS  # ranks whose block just left move in one round trip, at most
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


def move_left_blocks(conn: Connection, below: dict[RankKey, int], trip: OneTrip | None = None) -> int:
    """Move each (run_pk, attempt, rank)'s rows of steps below the given step (the first of a block) out of `steps`
    into block rows (each step > 0: a rank entering block 0 has nothing below it, and the writer passes none); returns
    the rows moved. In key order: concurrent writers take the same row locks in the same order. `trip` (PostgreSQL):
    the block rows of the usual move are inserted with the statements it holds.

    The usual move is the block each rank just left: the group's ranks' blocks deleted in one round trip, each with
    the lowest step left below it, and their block rows inserted with the group's last statements. A rank with rows
    further below (late rows of a block already moved, a replay, a bulk upload) moves the rest a slice at a time,
    up to MOVE_CHUNK_STEPS steps a round trip."""
    left = [(key, step - BLOCK_STEPS, step) for key, step in sorted(below.items())]
    chunks = [left[at:at + _RANKS_A_MOVE] for at in range(0, len(left), _RANKS_A_MOVE)]
    moved = 0
    lower: dict[RankKey, int] = {}
    for chunk in chunks:
        fetched, chunk_lower = _move_left_block(conn, chunk)
        # a group's usual few go with its last message; a group of more ranks inserts each chunk's at once
        _insert_block_rows(conn, [row for (key, _, _), rows in zip(chunk, fetched, strict=True)
                                  for row in _block_rows(key, rows)], trip if len(chunks) == 1 else None)
        moved += sum(len(rows) for rows in fetched)
        lower.update(chunk_lower)
    return moved + _move_below(conn, [(key, start) for key, start, _ in left if key in lower], lower)


def _move_below(conn: Connection, keys: list[tuple[RankKey, int]], lowest: dict[RankKey, int]) -> int:
    """Move each rank's rows below the given step, its lowest such step known, a slice at a time."""
    moved = 0
    batch: list[tuple[RankKey, int, int]] = []  # (key, first step, end step) of each slice to delete
    spanned = 0  # steps the batch's slices span
    for key, step in keys:
        first: int | None = lowest[key]
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


def _move_left_block(conn: Connection, left: list[tuple[RankKey, int, int]]
                     ) -> tuple[list[list[tuple[Any, ...]]], dict[RankKey, int]]:
    """Delete each rank's rows of [first step, end step) (one block); returns the rows deleted of each, and the lowest
    step below the first of each rank that has rows there."""
    if conn.dialect.name != "postgresql":
        fetched = [_execute(conn, _MOVE_SQL, (*key, start, end)) for key, start, end in left]
        below = {key: _execute(conn, _LOWEST_SQL, (*key, _INT64_MIN, start))[0][0] for key, start, _ in left}
        return fetched, {key: int(step) for key, step in below.items() if step is not None}
    out: list[list[tuple[Any, ...]]] = []
    lower: dict[RankKey, int] = {}
    with psycopg_connection(conn).cursor() as cursor:  # every rank's statement in one round trip (pipelined)
        cursor.executemany(_MOVE_LEFT_BLOCK_SQL, [(*key, start, end, *key, start) for key, start, end in left],
                           returning=True)
        for key, _, _ in left:
            rows = cursor.fetchall()
            out.append([row[1:] for row in rows if not row[0]])
            first_below = next(row[1] for row in rows if row[0])
            if first_below is not None:
                lower[key] = int(first_below)
            cursor.nextset()
    return out, lower


# A rank's rows of one block deleted (flag false), and the lowest step it has left below the block (flag true; NULL
# for none): both read the statement's snapshot, and the probe's rows are not the delete's.
_MOVE_LEFT_BLOCK_SQL = (
    "WITH moved AS (DELETE FROM steps WHERE run_pk = %s AND attempt = %s AND rank = %s AND step >= %s AND step < %s "
    "RETURNING step, start_time, end_time, loss, lr, comm) "
    "SELECT false, step, start_time, end_time, loss, lr, comm FROM moved UNION ALL "
    "SELECT true, (SELECT min(step) FROM steps WHERE run_pk = %s AND attempt = %s AND rank = %s AND step < %s), "
    "NULL, NULL, NULL, NULL, NULL"
)
_BLOCK_ROW_COLUMNS = ("run_pk", "attempt", "rank", "block", "end_time", "rows", "data")
_INSERT_BLOCK_ROW_SQL = (f"INSERT INTO step_columns ({', '.join(_BLOCK_ROW_COLUMNS)}) "
                         f"VALUES ({', '.join(['%s'] * len(_BLOCK_ROW_COLUMNS))})")


def _insert_block_rows(conn: Connection, rows: list[dict[str, Any]], trip: OneTrip | None) -> None:
    if not rows:
        return
    if trip is None:
        conn.execute(step_columns.insert(), rows)
        return
    for row in rows:
        trip.add(_INSERT_BLOCK_ROW_SQL, [row[name] for name in _BLOCK_ROW_COLUMNS])


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
    _insert_block_rows(conn, [row for (key, _, _), rows in zip(slices, fetched, strict=True)
                              for row in _block_rows(key, rows)], None)
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
