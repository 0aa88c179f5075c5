"""Events of a pruned run that repeat what retention deleted: recognised from what it kept, never stored again.

Retention deletes a quiet run's raw rows and their events, ids included (keeping the ids would keep most of what
it frees: a step's `events` row is 245 of its 379 bytes). What it keeps holds the same facts: the run's step blocks
hold every (attempt, rank, step) that had a row, and each (attempt, rank)'s first and last heartbeat bound the
ones deleted. So when a client sends its spool again after the prune (`goodput sync`, a retry of batches it never
saw acknowledged), a raw record of a pruned run repeats a deleted one when:

- steps, step, collectives, collective: the run's blocks hold every (attempt, rank, step) it has rows for (the
  collective time of a summarised step is in its summary already); of a record with some held and some not, only
  the others' rows are stored;
- heartbeat: its time lies within the first and last heartbeat kept of its (attempt, rank), which are all the
  analysis reads of them (live detection reads the last).

A repeat counts as a duplicate in the batch's answer, like a repeated event id. Runs pruned before revision 0009
kept no blocks: their records are stored as they come.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from sqlalchemy import Connection, and_, func, or_, select

from services.analysis.step_blocks import StepBlock, block_of, holds
from services.storage.block_codec import block_from_bytes
from services.storage.db import psycopg_connection, sqlite_connection
from services.storage.records import SERIES_KINDS, CollectiveRows, IngestRecord
from services.storage.tables import Event, step_blocks

RAW_KINDS = SERIES_KINDS | {"heartbeat"}


@dataclass(frozen=True, slots=True)
class KeptOfPrunedRuns:
    """What retention kept of the pruned runs a group of records names: their step blocks and heartbeat spans, read
    before the group's own records are written."""

    runs: frozenset[int]
    blocks: dict[tuple[int, int, int], StepBlock]  # (run pk, attempt, block) -> summary
    beats: dict[tuple[int, int, int], tuple[float, float]]  # (run pk, attempt, rank) -> first, last heartbeat time

    def without_repeats(self, records: Sequence[tuple[int, IngestRecord]]) -> list[IngestRecord | None]:
        """Per (run pk, record): the record to store (a step-bearing one with only the rows not held), or None when
        it repeats what retention deleted (module docstring)."""
        out: list[IngestRecord | None] = []
        for run_pk, r in records:
            if run_pk not in self.runs or not _is_raw(r):
                out.append(r)
            elif r.kind == "heartbeat":
                span = self.beats.get((run_pk, int(r.attempt or 0), int(r.rank or 0)))
                out.append(None if span is not None and span[0] <= r.time <= span[1] else r)
            else:
                out.append(_unheld(run_pk, r, self.blocks))
        return out


def raw_record_runs(records: Iterable[tuple[int, IngestRecord]]) -> list[int]:
    """The runs (pks, in order) of the raw records among `records`: those whose pruned state a group reads."""
    return sorted({run_pk for run_pk, r in records if _is_raw(r)})


def kept_of_pruned_runs(conn: Connection, records: Sequence[tuple[int, IngestRecord]],
                        pruned: frozenset[int] | None = None) -> KeptOfPrunedRuns | None:
    """What retention kept of the pruned runs with raw records among `records`; None when there are none (one
    query for a group with raw records, none for a group without). `pruned`: the pruned runs among (at least)
    `raw_record_runs(records)`, when the caller read them already (services.storage.attempt_numbers)."""
    raw = [(run_pk, r) for run_pk, r in records if _is_raw(r)]
    if not raw:
        return None
    raw_runs = {run_pk for run_pk, _ in raw}
    runs = _pruned(conn, sorted(raw_runs)) if pruned is None else pruned & raw_runs
    if not runs:
        return None
    mine = [(run_pk, r) for run_pk, r in raw if run_pk in runs]
    return KeptOfPrunedRuns(runs=runs, blocks=_blocks(conn, [(p, r) for p, r in mine if r.kind != "heartbeat"]),
                            beats=_heartbeat_spans(conn, {p for p, r in mine if r.kind == "heartbeat"}))


# On the writer's path for nearly every group: a fixed text through the driver's cursor (SQLAlchemy's compile and
# result handling cost several times the lookup itself, ~0.5 ms a group).
PRUNED_SQL = "SELECT id FROM runs WHERE id = ANY(%(pruned)s::int4[]) AND detail_pruned_version IS NOT NULL"


def _pruned(conn: Connection, run_pks: list[int]) -> frozenset[int]:
    """Of `run_pks`, the runs pruned with their step blocks kept."""
    if conn.dialect.name == "postgresql":
        with psycopg_connection(conn).cursor() as cursor:
            return frozenset(int(pk) for (pk,) in cursor.execute(PRUNED_SQL, {"pruned": run_pks}))
    sql = (f"SELECT id FROM runs WHERE id IN ({', '.join('?' for _ in run_pks)}) "
           "AND detail_pruned_version IS NOT NULL")
    sqlite_cursor = sqlite_connection(conn).cursor()
    try:
        return frozenset(int(pk) for (pk,) in sqlite_cursor.execute(sql, run_pks))
    finally:
        sqlite_cursor.close()


def _is_raw(r: IngestRecord) -> bool:
    return r.kind in RAW_KINDS and r.attempt is not None and r.rank is not None


def _steps_of(r: IngestRecord) -> np.ndarray:
    rows = r.step_rows if r.step_rows is not None else r.collective_rows
    return rows.step if rows is not None else np.zeros(0, dtype=np.int64)


def _blocks(conn: Connection, records: list[tuple[int, IngestRecord]]) -> dict[tuple[int, int, int], StepBlock]:
    """The stored summaries of the blocks the records have rows in, by (run pk, attempt, block)."""
    keys = sorted({(run_pk, int(r.attempt or 0), int(b)) for run_pk, r in records
                   for b in np.unique(block_of(_steps_of(r)))})
    out: dict[tuple[int, int, int], StepBlock] = {}
    for at in range(0, len(keys), 100):
        wanted = or_(*(and_(step_blocks.c.run_pk == p, step_blocks.c.attempt == a, step_blocks.c.block == b)
                       for p, a, b in keys[at:at + 100]))
        for run_pk, attempt, block, summary in conn.execute(select(
                step_blocks.c.run_pk, step_blocks.c.attempt, step_blocks.c.block, step_blocks.c.summary).where(wanted)):
            if summary:
                out[(int(run_pk), int(attempt), int(block))] = block_from_bytes(bytes(summary))
    return out


def _heartbeat_spans(conn: Connection, run_pks: set[int]) -> dict[tuple[int, int, int], tuple[float, float]]:
    """(first, last) heartbeat time stored per (run pk, attempt, rank)."""
    if not run_pks:
        return {}
    table = Event.__table__
    rows = conn.execute(select(table.c.run_pk, table.c.attempt, table.c.rank, func.min(table.c.time),
                               func.max(table.c.time))
                        .where(table.c.run_pk.in_(sorted(run_pks)), table.c.kind == "heartbeat")
                        .group_by(table.c.run_pk, table.c.attempt, table.c.rank))
    return {(int(p), int(a), int(r)): (float(lo), float(hi)) for p, a, r, lo, hi in rows
            if a is not None and r is not None}


def _unheld(run_pk: int, r: IngestRecord, blocks: dict[tuple[int, int, int], StepBlock]) -> IngestRecord | None:
    """The record with only the rows its run's blocks do not hold; None when they hold them all."""
    steps = _steps_of(r)
    held = np.zeros(len(steps), dtype=bool)
    which = block_of(steps)
    for b in np.unique(which):
        block = blocks.get((run_pk, int(r.attempt or 0), int(b)))
        if block is not None:
            at = which == b
            held[at] = holds(block, np.full(int(at.sum()), r.rank, dtype=np.int64), steps[at])
    if not held.any():
        return r
    if held.all():
        return None
    keep = ~held
    if r.step_rows is not None:
        s = r.step_rows
        return replace(r, step_rows=s.take(keep))
    c = r.collective_rows
    assert c is not None
    return replace(r, collective_rows=CollectiveRows(step=c.step[keep], op=[op for op, k in zip(c.op, keep, strict=True)
                                                                             if k],
                                                     start=c.start[keep], end=c.end[keep]))
