"""Step records sent again after their rows moved into block rows: recognised by their rows, stored once.

A step record's `events` row (its id and digest: the idempotency key) is kept while its rows are in `steps`. When a
rank's rows move into block rows (services.storage.step_columns), the event rows of its step records below the new
block go (`forget_moved_records`): the raw record is not stored a second time where its rows are. A record sent
again after that (a retry whose answer the client never saw, a spool sent again by `goodput sync`) has an id the
collector no longer holds; it repeats what is stored when the rank's block rows hold a row with the same step, start
and end, to the bit (the resume check's own rule for "the same report stored twice"). Such rows are not stored again;
a record whose rows are all held counts as a duplicate in its batch's answer, as a repeated id does. Its other rows
(a step the rank never sent, or sent with other times) are stored as late rows.

Only a record with rows in a block below its rank's highest marked block can repeat moved rows: one index probe
per (run, attempt, rank) of the group finds that block, and only the block rows those records fall in are read.

A rank's heartbeats strictly between its earliest and latest of the attempt are deleted when it moves a block: the
analysis reads the extremes, live detection the latest. A heartbeat sent again after that is stored again, and thinned
again at the rank's next block.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from sqlalchemy import Connection, text

from services.analysis.step_blocks import BLOCK_STEPS
from services.storage.db import json_rows, psycopg_connection
from services.storage.one_trip import OneTrip
from services.storage.records import IngestRecord, StepRows, column_min
from services.storage.step_columns import RankKey, column_rows
from services.storage.tables import HEARTBEATS, STEP_RECORDS


def without_moved_repeats(conn: Connection, records: Sequence[tuple[int, IngestRecord]],
                          heads: Mapping[RankKey, int] | None = None) -> list[IngestRecord | None] | None:
    """Per (run pk, record) of new records: the record to store (with only the rows not held when some repeat moved
    rows), or None when every row repeats one; None for the whole group when no record can repeat moved rows.
    `heads`: each rank's highest marked block, read in this transaction for at least the records' ranks (PostgreSQL:
    with the group's `events` insert, `HIGHEST_BLOCKS_SQL`); None: read here."""
    lowest = lowest_steps(records)
    if heads is None:
        heads = _highest_blocks(conn, list(lowest))
    below = {key: heads[key] * BLOCK_STEPS for key, step in lowest.items()
             if key in heads and step < heads[key] * BLOCK_STEPS}
    if not below:
        return None
    held = _held_rows(conn, records, below)
    return [r if (rank := _rank_key(run_pk, r)) is None or rank not in below else _unheld(r, held.get(rank))
            for run_pk, r in records]


def lowest_steps(records: Sequence[tuple[int, IngestRecord]]) -> dict[RankKey, int]:
    """Each (run pk, attempt, rank)'s lowest step among the records' step rows: the ranks whose highest marked block
    `without_moved_repeats` needs."""
    lowest: dict[RankKey, int] = {}
    for run_pk, r in records:
        key = _rank_key(run_pk, r)
        if key is not None and r.step_rows is not None and len(r.step_rows.step):
            step = int(column_min(r.step_rows.step))
            lowest[key] = min(step, lowest.get(key, step))
    return lowest


def _rank_key(run_pk: int, r: IngestRecord) -> RankKey | None:
    return None if r.attempt is None or r.rank is None else (run_pk, r.attempt, r.rank)


def forget_moved_records(conn: Connection, below: dict[RankKey, int], trip: OneTrip) -> None:
    """After `move_left_blocks(below)`: the event rows of each rank's step records wholly below its new block
    (their rows are in block rows now), and its heartbeats of the attempt strictly between the earliest and the
    latest (ties at either end all stay, so the analysis picks the same one). Rank by rank, each statement reads
    only the rows it deletes (partial indexes `ix_events_step_records`, `ix_events_heartbeats`). PostgreSQL: the
    statements are queued in `trip`, sent with the group's last ones."""
    if not below:
        return
    ranks = sorted(below.items())
    if conn.dialect.name == "postgresql":
        for (run_pk, attempt, rank), step in ranks:
            trip.add(_FORGET_RECORDS_POSTGRES, (run_pk, attempt, rank, step))
            trip.add(_THIN_HEARTBEATS_POSTGRES, (run_pk, attempt, rank) * 3)
        return
    params = [{"p": run_pk, "a": attempt, "r": rank, "s": step} for (run_pk, attempt, rank), step in ranks]
    conn.execute(text(_FORGET_RECORDS), params)
    conn.execute(text(_THIN_HEARTBEATS), params)


_RANK = "run_pk = :p AND attempt = :a AND rank = :r"
_FORGET_RECORDS = f"DELETE FROM events WHERE {_RANK} AND {STEP_RECORDS} AND step < :s"
_THIN_HEARTBEATS = (
    f"DELETE FROM events WHERE {_RANK} AND {HEARTBEATS} "
    f"AND time > (SELECT min(time) FROM events WHERE {_RANK} AND {HEARTBEATS}) "
    f"AND time < (SELECT max(time) FROM events WHERE {_RANK} AND {HEARTBEATS})")
# the same with positional placeholders, the values in order, as OneTrip binds them (services.storage.one_trip)
_FORGET_RECORDS_POSTGRES = re.sub(r":[pars]\b", "%s", _FORGET_RECORDS)
_THIN_HEARTBEATS_POSTGRES = re.sub(r":[pars]\b", "%s", _THIN_HEARTBEATS)


def _highest_blocks(conn: Connection, keys: list[RankKey]) -> dict[RankKey, int]:
    """Each (run pk, attempt, rank)'s highest marked block, for those with marks: one index probe each."""
    if not keys:
        return {}
    if conn.dialect.name == "postgresql":  # a fixed text, prepared once per connection
        with psycopg_connection(conn).cursor() as cursor:
            rows = cursor.execute(HIGHEST_BLOCKS_SQL, (json_rows(keys),)).fetchall()
    else:
        rows = []
        for at in range(0, len(keys), 500):  # integers only, as literals
            listed = ", ".join(f"({int(p)}, {int(a)}, {int(r)})" for p, a, r in keys[at:at + 500])
            rows += conn.execute(text(
                "SELECT k.column1, k.column2, k.column3, (SELECT max(m.block) FROM step_marks m WHERE "
                f"m.run_pk = k.column1 AND m.attempt = k.column2 AND m.rank = k.column3) FROM (VALUES {listed}) AS k"
            )).all()
    return heads_of(rows)


def heads_of(rows: Sequence[Sequence[Any]]) -> dict[RankKey, int]:
    """`HIGHEST_BLOCKS_SQL`'s rows as {(run pk, attempt, rank): highest marked block}, for the ranks with marks."""
    return {(int(p), int(a), int(r)): int(b) for p, a, r, b in rows if b is not None}


# (run pk, attempt, rank, highest marked block or NULL) of each key of a JSON parameter of [run pk, attempt, rank]
HIGHEST_BLOCKS_SQL = (
    "SELECT k.p, k.a, k.r, (SELECT max(m.block) FROM step_marks m WHERE m.run_pk = k.p AND m.attempt = k.a "
    "AND m.rank = k.r) FROM (SELECT (j->>0)::int4 AS p, (j->>1)::int4 AS a, (j->>2)::int4 AS r "
    "FROM jsonb_array_elements(%s::jsonb) AS v(j)) AS k"
)


def _held_rows(conn: Connection, records: Sequence[tuple[int, IngestRecord]], below: dict[RankKey, int]
               ) -> dict[RankKey, np.ndarray]:
    """The (step, start, end) keys (`_row_keys`) of every row the ranks' block rows hold in the blocks the records
    fall in."""
    wanted: dict[RankKey, set[int]] = defaultdict(set)
    for run_pk, r in records:
        key = _rank_key(run_pk, r)
        if key is not None and key in below and r.step_rows is not None:
            steps = r.step_rows.step[r.step_rows.step < below[key]]
            wanted[key].update(int(b) for b in np.unique(steps // BLOCK_STEPS))
    return {(run_pk, attempt, rank): np.concatenate([
                _row_keys(column_rows(conn, run_pk, attempt=attempt, ranks=[rank], block=b).rows)
                for b in sorted(blocks)])
            for (run_pk, attempt, rank), blocks in wanted.items()}


def _row_keys(rows: StepRows) -> np.ndarray:
    """One comparable value per row: its step and the bits of its start and end, 24 bytes (numpy compares them
    bytewise, so equal to the bit)."""
    matrix = np.column_stack([rows.step.astype(np.int64), rows.start.view(np.int64), rows.end.view(np.int64)])
    return np.ascontiguousarray(matrix).view("V24").ravel()


def _unheld(r: IngestRecord, held: np.ndarray | None) -> IngestRecord | None:
    """The record with only the rows not held; None when all are."""
    rows = r.step_rows
    if held is None or not len(held) or rows is None:
        return r
    keep = ~np.isin(_row_keys(rows), held)
    if keep.all():
        return r
    if not keep.any():
        return None
    return replace(r, step_rows=rows.take(keep))
