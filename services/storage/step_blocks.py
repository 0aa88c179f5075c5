"""A run's step rows reduced per block of steps, kept up to date as rows arrive (services.analysis.step_blocks).

- `mark_step_blocks`: the writer calls it with the records a group inserted, in the same transaction: for each
  (attempt, block, rank) that received step or collective rows, `step_marks.changes` goes up by one.
- `fold_step_blocks`: summarises again every block whose marks changed since its summary was made (the sum of its
  marks' changes differs from the one stored with the summary), reading only that block's rows: the marks are
  read before the rows, so a summary never claims rows it did not read (rows committed in between make it
  summarised again next time). Cost: the rows of the changed blocks, not the run's.
- `load_step_summary`: the run's blocks merged, what the ledger and the views read instead of every row.
- A block whose rows retention deleted keeps their summary (`step_blocks.pruned`, services.storage.retention): rows
  received since are summarised onto it (`extend_block`), so a pruned run goes on being analysed.
- With a `SummaryCache` (services.storage.summary_cache), a build of a live run reads the blocks that changed and
  the events that arrived since the last build, not the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
from sqlalchemy import Connection, Engine, and_, func, or_, select, text
from sqlalchemy.dialects import postgresql, sqlite

from services.analysis.collective_time import sum_collective_seconds
from services.analysis.rank_sketch import EXACT_RANK_VALUES, RankSketch
from services.analysis.run_data import RunData, collectives_frame, steps_frame
from services.analysis.step_blocks import BLOCK_STEPS, StepBlock, block_of, extend_block, summarize_block
from services.analysis.step_summary import StepSummary, merge_blocks
from services.storage import pgarrays, pgcopy
from services.storage.attempt_numbers import renumbering
from services.storage.block_codec import block_from_bytes, block_to_bytes
from services.storage.db import json_rows, psycopg_connection, sqlite_connection
from services.storage.load import COLLECTIVE_TIME_COLUMNS, _load_events, _load_events_with_ids, load_heartbeat_extremes
from services.storage.records import SERIES_KINDS, SMALL, IngestRecord
from services.storage.runs import RunRow
from services.storage.step_columns import column_rows
from services.storage.summary_cache import KeptEvents, SealedBlocks, SummaryCache
from services.storage.tables import Event, step_blocks, step_marks


def mark_step_blocks(conn: Connection, records: Sequence[tuple[int, IngestRecord]]) -> set[tuple[int, int, int, int]]:
    """Count, per (run, attempt, block, rank), the newly inserted records with rows in that block; returns the
    (run_pk, attempt, block, rank) marks this created (a rank's first rows of a block)."""
    counts: dict[tuple[int, int, int, int], int] = {}
    for run_pk, r in records:
        if r.attempt is None or r.rank is None:
            continue
        for rows in (r.step_rows, r.collective_rows):
            if rows is None or not len(rows.step):
                continue
            for block in _blocks_of(rows.step):
                key = (run_pk, r.attempt, block, r.rank)
                counts[key] = counts.get(key, 0) + 1
    if not counts:
        return set()
    keys = sorted(counts)  # one key order for every writer: concurrent upserts wait, never deadlock
    if conn.dialect.name == "postgresql":  # one statement of fixed text, whatever the number of marks
        with psycopg_connection(conn).cursor() as cursor:
            marked = cursor.execute(_MARK_SQL, (json_rows([(*k, counts[k]) for k in keys]),)).fetchall()
        # a mark that existed had changes >= 1 already: only a created one holds exactly what was added
        return {key for *k, changes in marked if counts[key := (int(k[0]), int(k[1]), int(k[2]), int(k[3]))]
                == changes}
    existing = _existing_marks(conn, keys)  # SQLite: this transaction holds the write lock since its inserts
    statement = sqlite.insert(step_marks)
    statement = statement.on_conflict_do_update(
        index_elements=["run_pk", "attempt", "block", "rank"],
        set_={"changes": step_marks.c.changes + statement.excluded.changes})
    conn.execute(statement, [{"run_pk": k[0], "attempt": k[1], "block": k[2], "rank": k[3], "changes": counts[k]}
                             for k in keys])
    return set(keys) - existing


def _existing_marks(conn: Connection, keys: list[tuple[int, int, int, int]]) -> set[tuple[int, int, int, int]]:
    out: set[tuple[int, int, int, int]] = set()
    for at in range(0, len(keys), 500):  # the keys as literals (integers only): one index probe each
        listed = ", ".join(f"({int(k[0])}, {int(k[1])}, {int(k[2])}, {int(k[3])})" for k in keys[at:at + 500])
        rows = conn.execute(text(f"SELECT run_pk, attempt, block, rank FROM step_marks WHERE (run_pk, attempt, block, "
                                 f"rank) IN (VALUES {listed})"))
        out.update((int(p), int(a), int(b), int(r)) for p, a, b, r in rows)
    return out


_MARK_SQL = (  # the rows as one JSON parameter, in key order (services.storage.db.json_rows says why)
    "INSERT INTO step_marks (run_pk, attempt, block, rank, changes) "
    "SELECT (r->>0)::int4, (r->>1)::int4, (r->>2)::int8, (r->>3)::int4, (r->>4)::int8 "
    "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS m(r, n) ORDER BY n "
    "ON CONFLICT (run_pk, attempt, block, rank) DO UPDATE SET changes = step_marks.changes + excluded.changes "
    "RETURNING run_pk, attempt, block, rank, changes"
)


def _blocks_of(step: np.ndarray) -> list[int]:
    """The distinct blocks of a record's steps. A record usually holds a few steps of one block: plain Python is
    faster than numpy up to SMALL values."""
    if len(step) <= SMALL:
        return sorted({int(s) // BLOCK_STEPS for s in step.tolist()})
    return [int(b) for b in np.unique(block_of(step))]


def fold_step_blocks(engine: Engine, run_pk: int, cache: SummaryCache | None = None) -> int:
    """Summarise again the run's blocks that changed since their summary (kept in `cache` too); returns how many."""
    with engine.connect() as conn:
        marked = _marked(conn, run_pk)
        folded = {(int(a), int(b)): int(c) for a, b, c in conn.execute(
            select(step_blocks.c.attempt, step_blocks.c.block, step_blocks.c.changes)
            .where(step_blocks.c.run_pk == run_pk))}
    dirty = sorted(key for key, changes in marked.items() if folded.get(key) != changes)
    for attempt, block in dirty:
        with engine.begin() as conn:
            changes, summary = _fold_block(conn, run_pk, attempt, block)
        if cache is not None:  # committed: what a build reads from the database from now on
            cache.keep_block((run_pk, attempt, block), changes, summary)
    return len(dirty)


def _marked(conn: Connection, run_pk: int, attempt: int | None = None,
            block: int | None = None) -> dict[tuple[int, int], int]:
    query = (select(step_marks.c.attempt, step_marks.c.block, func.sum(step_marks.c.changes))
             .where(step_marks.c.run_pk == run_pk).group_by(step_marks.c.attempt, step_marks.c.block))
    if attempt is not None:
        query = query.where(step_marks.c.attempt == attempt, step_marks.c.block == block)
    return {(int(a), int(b)): int(c) for a, b, c in conn.execute(query)}


def _fold_block(conn: Connection, run_pk: int, attempt: int, block: int) -> tuple[int, StepBlock | None]:
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
    pruned = _pruned_base(conn, run_pk, attempt, block)
    if pruned is None:
        summary = summarize_block(attempt, block, rank, step, start, end, comm) if len(step) else None
    else:  # retention deleted the block's rows: the rows left were received since
        summary = extend_block(block_from_bytes(pruned) if pruned else None, attempt, block, rank, step, start, end,
                               comm)
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(step_blocks).values(run_pk=run_pk, attempt=attempt, block=block, changes=changes,
                                           summary=block_to_bytes(summary) if summary is not None else b"",
                                           pruned=pruned or None)  # no deleted row had steps: none to keep
    conn.execute(statement.on_conflict_do_update(
        index_elements=["run_pk", "attempt", "block"],
        set_={"changes": statement.excluded.changes, "summary": statement.excluded.summary,
              "pruned": statement.excluded.pruned}))
    return changes, summary


def _pruned_base(conn: Connection, run_pk: int, attempt: int, block: int) -> bytes | None:
    """The summary of the block's rows that retention deleted (`step_blocks.pruned`; b"": none had steps), or None
    when it deleted none."""
    row = conn.execute(select(step_blocks.c.summary, step_blocks.c.pruned).where(
        step_blocks.c.run_pk == run_pk, step_blocks.c.attempt == attempt, step_blocks.c.block == block)).first()
    if row is None or row[1] is None:
        return None
    # empty: the stored summary is the deleted rows' own (no row arrived since the prune)
    return bytes(row[1]) if len(row[1]) else bytes(row[0])


_STEP_SQL = ("SELECT rank, step, start_time, end_time, {comm} FROM steps WHERE run_pk = {p} AND attempt = {p} "
             "AND rank IN ({ranks}) AND step >= {p} AND step < {p}")
_COMM_SQL = ("SELECT attempt, rank, step, start_time, end_time FROM collectives WHERE run_pk = {p} AND attempt = {p} "
             "AND step >= {p} AND step < {p}")


def _block_steps(conn: Connection, run_pk: int, attempt: int, ranks: list[int], lo: int,
                 hi: int) -> tuple[np.ndarray, ...]:
    """(rank, step, start, end, comm) of one block's rows: those in its block rows (services.storage.step_columns) and
    those in `steps`, read along the (run, attempt, rank, step) index: one range per rank. Unknown comm is NaN on
    PostgreSQL, NULL on SQLite (read as -1: never a valid value)."""
    listed = ", ".join(str(int(r)) for r in ranks) or "NULL"
    postgres = conn.dialect.name == "postgresql"
    comm_sql = "coalesce(comm, 'NaN'::float8)" if postgres else "ifnull(comm, -1.0)"
    rank, step, start, end, comm = _fetch(conn, _STEP_SQL.format(comm=comm_sql, p="{p}", ranks=listed),
                                          (run_pk, attempt, lo, hi), _STEP_COLUMNS, bounded=True)
    head = (rank.astype(np.int64), step.astype(np.int64), start, end, np.where(comm < 0, np.nan, comm))
    moved = column_rows(conn, run_pk, attempt=attempt, ranks=ranks, block=lo // BLOCK_STEPS)
    if not len(moved):
        return head
    rows = moved.rows
    return tuple(np.concatenate([a, b]) for a, b in zip((moved.rank, rows.step, rows.start, rows.end, rows.comm),
                                                        head, strict=True))


def _block_comm(conn: Connection, run_pk: int, attempt: int, lo: int, hi: int) -> pd.DataFrame:
    return sum_collective_seconds(*_fetch(conn, _COMM_SQL, (run_pk, attempt, lo, hi), COLLECTIVE_TIME_COLUMNS))


_STEP_COLUMNS = {"rank": ">i4", "step": ">i8", "start": ">f8", "end": ">f8", "comm": ">f8"}


def _fetch(conn: Connection, template: str, params: tuple[int, ...], columns: dict[str, str], *,
           bounded: bool = False) -> list[np.ndarray]:
    """The columns of a query of numeric columns (`columns`: their types on PostgreSQL) in native byte order:
    PostgreSQL as one binary array per column when the query's rows are `bounded` (one row per rank and step of a
    block: services.storage.pgarrays), else streamed by binary COPY (a block's collectives, several a step); the
    parameters are integers, written into the statement. SQLite as plain DBAPI tuples (no Row objects) in a float64
    matrix."""
    if conn.dialect.name == "postgresql":
        sql = template.replace("{p}", "{}").format(*(int(v) for v in params))
        if bounded:
            return pgarrays.read_columns(conn, sql, columns)
        rows = pgcopy.copy_out(conn, sql, columns)
        return [rows[name].astype(rows.dtype[name].newbyteorder("=")) for name in columns]
    cursor = sqlite_connection(conn).cursor()
    try:
        fetched = cursor.execute(template.format(p="?"), params).fetchall()
    finally:
        cursor.close()
    matrix = np.array(fetched, dtype=np.float64).reshape(-1, len(columns))
    return [matrix[:, k] for k in range(len(columns))]


def load_summarised_run_data(engine: Engine, run: RunRow, cache: SummaryCache | None = None,
                             exact_values: int = EXACT_RANK_VALUES) -> RunData:
    """What the ledger and the views read of a run: its control events and its step rows reduced per block, the
    changed blocks summarised again first (`exact_values`: see `load_step_summary`). With `cache`, only what
    changed since the cache last saw the run is read (SummaryCache)."""
    fold_step_blocks(engine, run.pk, cache)
    with engine.connect() as conn:
        events = _load_events(conn, run.pk) if cache is None else _cached_events(conn, run.pk, cache)
        return RunData(run_id=run.run_id, events=events, steps=steps_frame(), collectives=collectives_frame(),
                       step_summary=load_step_summary(conn, run.pk, cache, exact_values))


def load_step_summary(conn: Connection, run_pk: int, cache: SummaryCache | None = None,
                      exact_values: int = EXACT_RANK_VALUES) -> StepSummary:
    """The run's block summaries, merged (fold them first: `fold_step_blocks`).

    A run of more than `exact_values` (rank, step) values has its closed blocks (all but the last two of its
    latest attempt) folded into a sketch (services.analysis.rank_sketch), so that what a build holds does not grow
    with the run. With `cache`, only the blocks whose summary is not there at its current `changes` are read and
    decoded, and a long run's sketch is kept and extended with the blocks closed since; rows arriving for a sealed
    block fold the run again."""
    current = {(int(a), int(b)): int(c) for a, b, c in conn.execute(
        select(step_blocks.c.attempt, step_blocks.c.block, step_blocks.c.changes)
        .where(step_blocks.c.run_pk == run_pk))}
    still_open = _open_blocks(current)
    kept = cache.sealed(run_pk) if cache is not None else None
    if kept is not None and any(current.get(k) != c or k in still_open for k, c in kept.changes.items()):
        kept = None
    sealing = _Sealing(kept)
    whole: list[tuple[tuple[int, int], StepBlock]] = []
    values = 0
    read = [k for k in sorted(current) if kept is None or k not in kept.changes]
    changes_of: dict[tuple[int, int], int] = {}
    for key, changes, block in _read_blocks(conn, run_pk, read, current, cache):
        changes_of[key] = changes
        if block is None:
            if key not in still_open:
                sealing.seal(key, changes, None)
            continue
        values += block.compute.size
        whole.append((key, block))
        if kept is None and values <= exact_values:
            continue
        for closed_key, closed in [(k, b) for k, b in whole if k not in still_open]:
            sealing.seal(closed_key, changes_of[closed_key], closed)
            if cache is not None:
                cache.drop_block((run_pk, *closed_key))
        whole = [(k, b) for k, b in whole if k in still_open]
    if not sealing.folded_values:  # a short run: every value, exact
        return merge_blocks([b for _, b in whole])
    sealed = sealing.result()
    if cache is not None and sealed is not kept:
        cache.keep_sealed(run_pk, sealed)
    return merge_blocks([b for _, b in whole], sealed.sketch, sealed.steps)


class _Sealing:
    """The sealed blocks of a run being extended: the kept ones, copied before the first block is added."""

    def __init__(self, kept: SealedBlocks | None) -> None:
        self._kept = kept
        self._sketch = kept.sketch if kept is not None else None
        self._changes = dict(kept.changes) if kept is not None else {}
        self._steps = list(kept.steps) if kept is not None else []
        self._copied = kept is None
        self.folded_values = kept is not None

    def seal(self, key: tuple[int, int], changes: int, block: StepBlock | None) -> None:
        self._changes[key] = changes
        if block is None:
            return
        if self._sketch is None:
            self._sketch = RankSketch()
        elif not self._copied:  # the kept sketch may be in use by another build
            self._sketch = self._sketch.copy()
        self._copied = True
        self._sketch.add_block(block)
        self._steps.append(block.per_step())
        self.folded_values = True

    def result(self) -> SealedBlocks:
        if self._kept is not None and self._changes == self._kept.changes:
            return self._kept
        assert self._sketch is not None
        return SealedBlocks(changes=self._changes, sketch=self._sketch, steps=tuple(self._steps))


def _open_blocks(current: dict[tuple[int, int], int]) -> frozenset[tuple[int, int]]:
    """The blocks still filling: the last two of the latest attempt (ranks a few steps apart straddle a block's
    end)."""
    if not current:
        return frozenset()
    latest = max(a for a, _ in current)
    return frozenset(sorted(k for k in current if k[0] == latest)[-2:])


_READ_GROUP = 64  # blocks per query: what a cold build holds at once, whatever the run's length


def _read_blocks(conn: Connection, run_pk: int, keys: list[tuple[int, int]], current: dict[tuple[int, int], int],
                 cache: SummaryCache | None) -> Iterator[tuple[tuple[int, int], int, StepBlock | None]]:
    """(key, changes, decoded block) of `keys`, in their order: from `cache` when it holds them at their current
    `changes`, else from the database, a group at a time (and kept in `cache`)."""
    for first in range(0, len(keys), _READ_GROUP):
        group = keys[first:first + _READ_GROUP]
        found: dict[tuple[int, int], tuple[int, StepBlock | None]] = {}
        if cache is not None:
            for key in group:
                hit, block = cache.block((run_pk, *key), current[key])
                if hit:
                    found[key] = current[key], block
        missing = {k for k in group if k not in found}
        if missing:
            by_key = cache is not None or len(keys) > _READ_GROUP
            for attempt, block_index, changes, data in _summaries(conn, run_pk, sorted(missing) if by_key else None):
                key = (attempt, block_index)
                if key in missing:
                    block = block_from_bytes(data) if data else None
                    found[key] = changes, block
                    if cache is not None:
                        cache.keep_block((run_pk, *key), changes, block)
        for key in group:
            if key in found:
                yield key, *found[key]


def _summaries(conn: Connection, run_pk: int,
               keys: Sequence[tuple[int, int]] | None = None) -> list[tuple[int, int, int, bytes]]:
    """(attempt, block, changes, summary) of the run's blocks (`keys`: only those). On PostgreSQL in binary: a
    bytea read as text is hex, twice the bytes to send and decode."""
    if conn.dialect.name == "postgresql":
        sql = "SELECT attempt, block, changes, summary FROM step_blocks WHERE run_pk = %s"
        params: list[int] = [run_pk]
        if keys is not None:
            sql += " AND (attempt, block) IN (" + ", ".join("(%s, %s)" for _ in keys) + ")"
            params += [v for key in keys for v in key]
        with psycopg_connection(conn).cursor(binary=True) as pg_cursor:
            rows = pg_cursor.execute(sql, params).fetchall()
    else:
        query = select(step_blocks.c.attempt, step_blocks.c.block, step_blocks.c.changes, step_blocks.c.summary
                       ).where(step_blocks.c.run_pk == run_pk)
        if keys is not None:
            query = query.where(or_(*(and_(step_blocks.c.attempt == a, step_blocks.c.block == b) for a, b in keys)))
        rows = [tuple(row) for row in conn.execute(query)]
    return [(int(a), int(b), int(c), bytes(data) if data else b"") for a, b, c, data in rows]


def _cached_events(conn: Connection, run_pk: int, cache: SummaryCache) -> pd.DataFrame:
    """The run's control events (as `load._load_events`): those the cache does not hold yet are read by id, the
    heartbeats' extremes (which move with every heartbeat) each time."""
    control = _cached_control_events(conn, run_pk, cache)
    beats = load_heartbeat_extremes(conn, run_pk)
    if beats.empty or control.empty:
        return beats if control.empty else control
    return pd.concat([control, beats], ignore_index=True)


def _cached_control_events(conn: Connection, run_pk: int, cache: SummaryCache) -> pd.DataFrame:
    """The run's control events but heartbeats, reading only those the cache does not hold yet."""
    table = Event.__table__
    control = and_(table.c.run_pk == run_pk, table.c.kind.not_in(sorted(SERIES_KINDS | {"heartbeat"})))
    kept = cache.events(run_pk)
    renumbered = renumbering(conn, run_pk)
    if kept is not None and kept.renumbered != renumbered:  # same events, other attempt numbers: read them again
        kept = None
    if kept is not None:
        count = int(conn.execute(select(func.count()).select_from(table).where(control)).scalar_one())
        if count == len(kept.ids):  # only ever added: the same events
            return kept.frame
        ids = frozenset(str(i) for (i,) in conn.execute(select(table.c.event_id).where(control)))
        if kept.ids <= ids:  # else never while the run can be built: read them all again, below
            new = sorted(ids - kept.ids)
            parts = [kept.frame]
            for at in range(0, len(new), 500):  # within any SQLite's limit of bound parameters
                parts.append(_load_events(conn, run_pk, event_ids=new[at:at + 500]))
            frame = pd.concat(parts, ignore_index=True)
            cache.keep_events(run_pk, KeptEvents(ids=ids, frame=frame, renumbered=renumbered))
            return frame
    frame, listed = _load_events_with_ids(conn, run_pk, heartbeats=False)
    cache.keep_events(run_pk, KeptEvents(ids=frozenset(listed), frame=frame, renumbered=renumbered))
    return frame
