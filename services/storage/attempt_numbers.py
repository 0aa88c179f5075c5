"""The run's attempt numbers, decided as records are written (services.analysis.attempt_numbers says the rule).

A record names its launch and its attempt within the launch; `number_records` gives it the run's attempt number
before anything of it is stored, so every table (events, steps, collectives, step marks and blocks) keeps keying
rows by (run, attempt, rank, ...) as before. `attempt_numbers` holds, per (run, launch, attempt), the run number
and what the numbering reads (earliest time, world size, ranks).

Most groups bring nothing new: their launch attempts are known and what the records say is already covered; their
numbers are read. A group that brings a new launch attempt, an earlier start or new ranks numbers the run again from
every launch attempt it has; when a number changes (a launch that started earlier arrived later: a spool replayed
by `goodput sync`, a node's records behind the others') the rows already stored are moved to their new number
(`_renumber`). That is rare and costs the moved launch attempts' rows.

Concurrency (PostgreSQL; SQLite runs one writer): a group takes, per run and in run order, a transaction-level
advisory lock, shared when it only reads numbers and exclusive when it numbers the run again, and reads the numbers
after taking it. A renumbering thus waits for the groups that read the old numbers to commit, and the groups after
it read the new ones; groups that only read never wait for each other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, cast

from sqlalchemy import Connection, Table, and_, func, insert, select, text, tuple_, update

from services.analysis.attempt_numbers import LEGACY, LaunchAttempt, LaunchAttemptKey, number_attempts
from services.storage.records import IngestRecord
from services.storage.tables import AttemptNumber, Event, collectives, step_blocks, step_marks, steps

NUMBERS_LOCK = 0x676F6964  # ("goid"), with the run's key: pg_advisory_xact_lock(NUMBERS_LOCK, run_pk)
_KEYS_PER_QUERY = 300
_numbers = cast(Table, AttemptNumber.__table__)

RunKey = tuple[int, str, int]  # (run pk, launch, attempt within the launch)
# Each run's lock, exclusive where the group numbers the run again, in run order (one order for every writer: no
# deadlock), in one statement.
_LOCK_SQL = text(
    "SELECT count(CASE WHEN (r->>1)::boolean THEN pg_advisory_xact_lock(:kind, (r->>0)::int4)::text "
    "ELSE pg_advisory_xact_lock_shared(:kind, (r->>0)::int4)::text END) "
    "FROM (SELECT r FROM json_array_elements(CAST(:runs AS json)) WITH ORDINALITY AS v(r, n) ORDER BY n) AS ordered")


def number_records(conn: Connection, records: Sequence[tuple[int, IngestRecord]]) -> dict[RunKey, int]:
    """The run's attempt number of every launch attempt the records name, numbering the runs again (and moving
    stored rows) where they bring something new. Keys: (run pk, launch or "", attempt as sent)."""
    seen = _launch_attempts(records)
    if not seen:
        return {}
    stored = _read(conn, list(seen))
    renumber = sorted({run_pk for (run_pk, launch, attempt), a in seen.items()
                       if (known := stored.get((run_pk, launch, attempt))) is None or not known.covers(a)})
    if conn.dialect.name == "postgresql":
        runs = sorted({run_pk for run_pk, _, _ in seen})
        conn.execute(_LOCK_SQL, {"kind": NUMBERS_LOCK, "runs": json.dumps([[pk, pk in renumber] for pk in runs])})
        stored = _read(conn, [key for key in seen if key[0] not in renumber])
    numbers = {key: row.attempt for key, row in stored.items() if key[0] not in renumber}
    for run_pk in renumber:
        mine = {(launch, attempt): a for (pk, launch, attempt), a in seen.items() if pk == run_pk}
        numbers.update(((run_pk, *key), number) for key, number in _number_run(conn, run_pk, mine).items())
    return numbers


def with_run_attempt(record: IngestRecord, numbers: dict[RunKey, int], run_pk: int) -> IngestRecord:
    """The record with its run's attempt number (records without an attempt as they are)."""
    if record.attempt is None:
        return record
    number = numbers[(run_pk, record.launch or LEGACY, record.attempt)]
    if number == record.attempt and record.launch is None:
        return record
    return replace(record, attempt=number, launch=None)


def renumbering(conn: Connection, run_pk: int) -> int:
    """How many times the run's stored rows were renumbered (0: never): a cache of them is stale when it changed."""
    return int(conn.execute(select(func.coalesce(func.max(_numbers.c.renumbered), 0))
                            .where(_numbers.c.run_pk == run_pk)).scalar_one())


class _Row:
    __slots__ = ("attempt", "launch_attempt")

    def __init__(self, attempt: int, launch_attempt: LaunchAttempt) -> None:
        self.attempt = attempt
        self.launch_attempt = launch_attempt

    def covers(self, other: LaunchAttempt) -> bool:
        return self.launch_attempt.covers(other)


def _launch_attempts(records: Iterable[tuple[int, IngestRecord]]) -> dict[RunKey, LaunchAttempt]:
    """What the records say of each launch attempt: earliest time, world size, ranks."""
    out: dict[RunKey, LaunchAttempt] = {}
    for run_pk, r in records:
        if r.attempt is None:
            continue
        launch = r.launch or LEGACY
        start = r.time
        for rows in (r.step_rows, r.collective_rows):
            if rows is not None and len(rows.start):
                start = min(start, float(rows.start.min()))
        world = r.data.get("world_size") if r.kind == "attempt_start" and r.data else None
        said = LaunchAttempt(launch=launch, attempt=r.attempt, start=start,
                             world_size=int(world) if world is not None else None, rank_lo=r.rank, rank_hi=r.rank)
        key = (run_pk, launch, r.attempt)
        known = out.get(key)
        out[key] = said if known is None else known.merged(said)
    return out


def _read(conn: Connection, keys: list[RunKey]) -> dict[RunKey, _Row]:
    out: dict[RunKey, _Row] = {}
    columns = (_numbers.c.run_pk, _numbers.c.launch, _numbers.c.client_attempt, _numbers.c.attempt,
               _numbers.c.start_time, _numbers.c.world_size, _numbers.c.rank_lo, _numbers.c.rank_hi)
    for at in range(0, len(keys), _KEYS_PER_QUERY):
        chunk = keys[at:at + _KEYS_PER_QUERY]
        query = select(*columns).where(tuple_(_numbers.c.run_pk, _numbers.c.launch,
                                              _numbers.c.client_attempt).in_(chunk))
        for row in conn.execute(query):
            out[(int(row[0]), str(row[1]), int(row[2]))] = _row(tuple(row)[1:])
    return out


def _row(row: Sequence[Any]) -> _Row:
    """(launch, attempt as sent, run attempt, start, world size, lowest rank, highest rank) as a stored row."""
    launch, sent, attempt, start, world, lo, hi = row
    return _Row(int(attempt), LaunchAttempt(launch=str(launch), attempt=int(sent), start=float(start),
                                            world_size=world, rank_lo=lo, rank_hi=hi))


def _number_run(conn: Connection, run_pk: int, seen: dict[LaunchAttemptKey, LaunchAttempt]
                ) -> dict[LaunchAttemptKey, int]:
    """Number the run again with what `seen` adds; store the new launch attempts and move renumbered rows."""
    stored = {(str(r[0]), int(r[1])): _row(tuple(r)) for r in conn.execute(
        select(_numbers.c.launch, _numbers.c.client_attempt, _numbers.c.attempt, _numbers.c.start_time,
               _numbers.c.world_size, _numbers.c.rank_lo, _numbers.c.rank_hi).where(_numbers.c.run_pk == run_pk))}
    merged = {key: row.launch_attempt for key, row in stored.items()}
    for key, said in seen.items():
        merged[key] = said if key not in merged else merged[key].merged(said)
    numbers = number_attempts(merged.values())
    moves = [(row.launch_attempt, row.attempt, numbers[key]) for key, row in stored.items()
             if numbers[key] != row.attempt]
    epoch = renumbering(conn, run_pk) + 1 if moves else 0
    if moves:
        _renumber(conn, run_pk, moves)
    for key, a in merged.items():
        old = stored.get(key)
        values = {"attempt": numbers[key], "start_time": a.start, "world_size": a.world_size, "rank_lo": a.rank_lo,
                  "rank_hi": a.rank_hi}
        if old is None:
            conn.execute(insert(_numbers).values(run_pk=run_pk, launch=key[0], client_attempt=key[1], renumbered=0,
                                                 **values))
        elif old.attempt != numbers[key] or old.launch_attempt != a:
            if old.attempt != numbers[key]:
                values["renumbered"] = epoch
            conn.execute(update(_numbers).where(_numbers.c.run_pk == run_pk, _numbers.c.launch == key[0],
                                                _numbers.c.client_attempt == key[1]).values(**values))
    return {key: numbers[key] for key in seen}


# Every table that keys rows by (run, attempt, rank, ...): a renumbering moves their rows (a table of step columns
# per (run, attempt, rank, block) would join them). step_blocks, per (run, attempt, block), is summarised again.
_TABLES: tuple[Table, ...] = (cast(Table, Event.__table__), steps, collectives, step_marks)


def _renumber(conn: Connection, run_pk: int, moves: list[tuple[LaunchAttempt, int, int]]) -> None:
    """Move the stored rows of each launch attempt (its attempt and ranks) from the old number to the new one.

    In two passes (through negative numbers), since one launch attempt may take the number another leaves. The
    ranks tell a launch attempt's rows from those of the others of its attempt (their ranks are disjoint). The
    blocks of every number touched are summarised again, and their marks' counts moved past every count the run
    had, so that no process reuses a block it kept (services.storage.summary_cache)."""
    for table in _TABLES:
        for a, old, new in moves:
            where = [table.c.run_pk == run_pk, table.c.attempt == old]
            if a.launch != LEGACY and a.rank_lo is not None and a.rank_hi is not None:
                where += [table.c.rank >= a.rank_lo, table.c.rank <= a.rank_hi]
            conn.execute(update(table).where(*where).values(attempt=-1 - new))
        conn.execute(update(table).where(table.c.run_pk == run_pk, table.c.attempt < 0)
                     .values(attempt=-1 - table.c.attempt))
    touched = sorted({old for _, old, _ in moves} | {new for _, _, new in moves})
    conn.execute(step_blocks.delete().where(step_blocks.c.run_pk == run_pk, step_blocks.c.attempt.in_(touched)))
    sums = (select(func.sum(step_marks.c.changes).label("changes")).where(step_marks.c.run_pk == run_pk)
            .group_by(step_marks.c.attempt, step_marks.c.block).subquery())
    past = int(conn.execute(select(func.coalesce(func.max(sums.c.changes), 0))).scalar_one()) + 1
    conn.execute(update(step_marks).where(and_(step_marks.c.run_pk == run_pk, step_marks.c.attempt.in_(touched)))
                 .values(changes=step_marks.c.changes + past))
