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

import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, and_, func, insert, select, tuple_, update

from services.analysis.attempt_numbers import LEGACY, LaunchAttempt, LaunchAttemptKey, number_attempts
from services.storage.block_codec import block_from_bytes, block_to_bytes
from services.storage.db import json_rows, psycopg_connection
from services.storage.pruned import PRUNED_SQL
from services.storage.records import IngestRecord, column_min
from services.storage.tables import (
    AttemptNumber,
    ClockReading,
    Event,
    collectives,
    step_blocks,
    step_columns,
    step_marks,
    steps,
)

NUMBERS_LOCK = 0x676F6964  # ("goid"), with the run's key: pg_advisory_xact_lock(NUMBERS_LOCK, run_pk)
_KEYS_PER_QUERY = 300
_numbers = cast(Table, AttemptNumber.__table__)

RunKey = tuple[int, str, int]  # (run pk, launch, attempt within the launch)
_ROW_COLUMNS = "run_pk, launch, client_attempt, attempt, start_time, world_size, rank_lo, rank_hi"
# PostgreSQL, fixed texts. Each run's lock, exclusive where the group numbers the run again, taken in run order (one
# order for every writer: no deadlock) in one statement; then, in a statement of its own (which sees what the
# writers the lock waited for committed), the stored rows of the keys that were only read.
_LOCK_SQL = (
    "SELECT count(CASE WHEN (r->>1)::boolean THEN pg_advisory_xact_lock(%(kind)s, (r->>0)::int4)::text "
    "ELSE pg_advisory_xact_lock_shared(%(kind)s, (r->>0)::int4)::text END) "
    "FROM (SELECT r FROM jsonb_array_elements(%(runs)s::jsonb) WITH ORDINALITY AS v(r, n) ORDER BY n) AS ordered")
_READ_SQL = (
    f"SELECT {', '.join('n.' + c for c in _ROW_COLUMNS.split(', '))} FROM attempt_numbers n "
    "JOIN jsonb_array_elements(%(keys)s::jsonb) AS k(r) "
    "ON n.run_pk = (k.r->>0)::int4 AND n.launch = k.r->>1 AND n.client_attempt = (k.r->>2)::int4")
_KNOWN_MAX = 200_000


class StaleAttemptNumbers(Exception):
    """What this process remembered of the stored launch attempts is not in the database (emptied or restored under
    it): the caller rolls the transaction back and writes the group again (services.storage.write)."""


def number_records(conn: Connection, records: Sequence[tuple[int, IngestRecord]], *,
                   pruned_among: Sequence[int] = ()) -> tuple[dict[RunKey, int], frozenset[int] | None]:
    """The run's attempt number of every launch attempt the records name, numbering the runs again (and moving
    stored rows) where they bring something new. Keys: (run pk, launch or "", attempt as sent). Also which of
    `pruned_among` (run pks, in order, each once) are pruned runs (services.storage.pruned), read in the same round
    trip as the numbers on PostgreSQL; None when not read (SQLite, or a group without attempts): the caller reads
    them then."""
    seen = _launch_attempts(records)
    if not seen:
        return {}, None
    postgres = conn.dialect.name == "postgresql"
    known = _known(conn)
    # Launch attempts stored as they are now need no reading before the lock: this process saw them stored so
    # (what is stored only ever grows to cover more), else they are read first.
    unknown = [key for key, a in seen.items() if (k := known.get(key)) is None or not k.covers(a)]
    stored = _read(conn, unknown) if unknown else {}
    _remember(known, stored)
    renumber = {key[0] for key, a in seen.items() if (k := known.get(key)) is None or not k.covers(a)}
    read = [key for key in seen if key[0] not in renumber]  # the keys of runs this group does not number again
    pruned: frozenset[int] | None = None
    if postgres:
        runs = sorted({run_pk for run_pk, _, _ in seen})
        stored, pruned = _lock_and_read(conn, [[pk, pk in renumber] for pk in runs], read, list(pruned_among))
    else:  # one writer: nothing changes between two reads
        stored = _read(conn, read) if read else {}
    if any((row := stored.get(key)) is None or not row.covers(seen[key]) for key in read):
        known.clear()
        raise StaleAttemptNumbers
    _remember(known, stored)
    numbers = {key: stored[key].attempt for key in read}
    for run_pk in sorted(renumber):
        mine = {(launch, attempt): a for (pk, launch, attempt), a in seen.items() if pk == run_pk}
        numbers.update(((run_pk, *key), number) for key, number in _number_run(conn, run_pk, mine).items())
    return numbers, pruned


def with_run_attempt(record: IngestRecord, numbers: Mapping[RunKey, int], run_pk: int) -> IngestRecord:
    """The record with its run's attempt number (records without an attempt as they are)."""
    if record.attempt is None:
        return record
    number = numbers[(run_pk, record.launch or LEGACY, record.attempt)]
    if number == record.attempt and record.launch is None:
        return record
    return record.renumbered(number)


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
    """What the records say of each launch attempt: earliest time, world size, ranks (LaunchAttempt.merged over the
    records of each, gathered in plain lists first: a LaunchAttempt per record cost more than the rest of this)."""
    said: dict[RunKey, list[Any]] = {}  # [start, world size, lowest rank, highest rank]
    for run_pk, r in records:
        if r.attempt is None:
            continue
        start = r.time
        for rows in (r.step_rows, r.collective_rows):
            if rows is not None and len(rows.start):
                start = min(start, column_min(rows.start))
        world = r.data.get("world_size") if r.kind == "attempt_start" and r.data else None
        world = int(world) if world is not None else None
        rank = r.rank
        key = (run_pk, r.launch or LEGACY, r.attempt)
        known = said.get(key)
        if known is None:
            said[key] = [start, world, rank, rank]
            continue
        known[0] = min(known[0], start)
        if known[1] is None:
            known[1] = world
        if rank is not None:
            known[2] = rank if known[2] is None else min(known[2], rank)
            known[3] = rank if known[3] is None else max(known[3], rank)
    return {key: LaunchAttempt(launch=key[1], attempt=key[2], start=start, world_size=world, rank_lo=lo, rank_hi=hi)
            for key, (start, world, lo, hi) in said.items()}


def _read(conn: Connection, keys: list[RunKey]) -> dict[RunKey, _Row]:
    if conn.dialect.name == "postgresql":
        with psycopg_connection(conn).cursor() as cursor:
            return _rows(cursor.execute(_READ_SQL, {"keys": json_rows(keys)}).fetchall())
    out: dict[RunKey, _Row] = {}
    columns = (_numbers.c.run_pk, _numbers.c.launch, _numbers.c.client_attempt, _numbers.c.attempt,
               _numbers.c.start_time, _numbers.c.world_size, _numbers.c.rank_lo, _numbers.c.rank_hi)
    for at in range(0, len(keys), _KEYS_PER_QUERY):
        chunk = keys[at:at + _KEYS_PER_QUERY]
        query = select(*columns).where(tuple_(_numbers.c.run_pk, _numbers.c.launch,
                                              _numbers.c.client_attempt).in_(chunk))
        out.update(_rows(conn.execute(query)))
    return out


def _lock_and_read(conn: Connection, locks: list[list[object]], keys: list[RunKey], pruned_among: list[int]
                   ) -> tuple[dict[RunKey, _Row], frozenset[int] | None]:
    """PostgreSQL: take the group's run locks, then read `keys` and which of `pruned_among` are pruned runs, in one
    round trip (a statement each)."""
    from psycopg import ClientCursor  # (PostgreSQL only: its driver is not needed on SQLite)

    raw = psycopg_connection(conn)
    if not keys and not pruned_among:
        raw.execute(_LOCK_SQL, {"kind": NUMBERS_LOCK, "runs": json_rows(locks)})
        return {}, None
    statements = [_LOCK_SQL] + ([_READ_SQL] if keys else []) + ([PRUNED_SQL] if pruned_among else [])
    with ClientCursor(raw) as cursor:  # client-side binding: the statements in one round trip
        cursor.execute("; ".join(statements), {"kind": NUMBERS_LOCK, "runs": json_rows(locks),
                                               "keys": json_rows(keys), "pruned": pruned_among})
        stored: dict[RunKey, _Row] = {}
        if keys:
            cursor.nextset()
            stored = _rows(cursor.fetchall())
        if not pruned_among:
            return stored, None
        cursor.nextset()
        return stored, frozenset(int(pk) for (pk,) in cursor.fetchall())


def _rows(rows: Iterable[Sequence[Any]]) -> dict[RunKey, _Row]:
    return {(int(row[0]), str(row[1]), int(row[2])): _row(tuple(row)[1:]) for row in rows}


_KNOWN: weakref.WeakKeyDictionary[Engine, dict[RunKey, LaunchAttempt]] = weakref.WeakKeyDictionary()


def _known(conn: Connection) -> dict[RunKey, LaunchAttempt]:
    """What this process saw stored of each launch attempt, per database (only a hint: the lock's read decides)."""
    known = _KNOWN.get(conn.engine)
    if known is None:
        known = _KNOWN[conn.engine] = {}
    return known


def _remember(known: dict[RunKey, LaunchAttempt], rows: dict[RunKey, _Row]) -> None:
    if len(known) + len(rows) > _KNOWN_MAX:
        known.clear()
    known.update((key, row.launch_attempt) for key, row in rows.items())


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
        _renumber(conn, run_pk, moves, [(row.attempt, numbers[key]) for key, row in stored.items()])
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


# Every table that keys rows by (run, attempt, rank, ...): a renumbering moves their rows (a block row of
# step_columns names no attempt in its bytes). step_blocks, per (run, attempt, block), is summarised again.
_TABLES: tuple[Table, ...] = (cast(Table, Event.__table__), steps, step_columns, collectives, step_marks,
                              cast(Table, ClockReading.__table__))
_AWAY = -2  # a moved row's number, new n, is _AWAY - n during the move


def _renumber(conn: Connection, run_pk: int, moves: list[tuple[LaunchAttempt, int, int]],
              now: list[tuple[int, int]]) -> None:
    """Move the stored rows of each launch attempt (its attempt and ranks) from the old number to the new one.

    In two passes (through numbers below -1: -1 is a run-level row's), since one launch attempt may take the number
    another leaves. The ranks tell a launch attempt's rows from those of the others of its attempt (their ranks are
    disjoint). `now`: (old number, new number) of every stored launch attempt. The attempts that move whole (all
    their launch attempts to one number that nothing else keeps) take their block summaries with them, which keeps
    what retention kept of a pruned run's blocks; the other blocks of every number touched are summarised again from
    their rows (a pruned block of an attempt split or joined cannot be kept). Marks' counts of every number touched
    move past every count the run had, so that no process reuses a block it kept (services.storage.summary_cache)."""
    for table in _TABLES:
        for a, old, new in moves:
            where = [table.c.run_pk == run_pk, table.c.attempt == old]
            if a.launch != LEGACY and a.rank_lo is not None and a.rank_hi is not None:
                where += [table.c.rank >= a.rank_lo, table.c.rank <= a.rank_hi]
            conn.execute(update(table).where(*where).values(attempt=_AWAY - new))
        conn.execute(update(table).where(table.c.run_pk == run_pk, table.c.attempt <= _AWAY)
                     .values(attempt=_AWAY - table.c.attempt))
    touched = sorted({old for _, old, _ in moves} | {new for _, _, new in moves})
    whole = {old: new for old, new in now if old != new and _moves_whole(now, old, new)}
    kept = [(whole[int(r.attempt)], r) for r in conn.execute(
        select(step_blocks).where(step_blocks.c.run_pk == run_pk, step_blocks.c.attempt.in_(sorted(whole))))]
    # The others are summarised again from their rows (a pruned block of an attempt split or joined cannot be kept).
    conn.execute(step_blocks.delete().where(step_blocks.c.run_pk == run_pk,
                                            step_blocks.c.attempt.in_(sorted(set(touched) | set(whole.values())))))
    for new, r in kept:  # a summary names its attempt: written again under the new number
        conn.execute(insert(step_blocks).values(
            run_pk=run_pk, attempt=new, block=r.block, changes=r.changes, summary=_renamed(r.summary, new),
            pruned=_renamed(r.pruned, new) if r.pruned else r.pruned))
    sums = (select(func.sum(step_marks.c.changes).label("changes")).where(step_marks.c.run_pk == run_pk)
            .group_by(step_marks.c.attempt, step_marks.c.block).subquery())
    past = int(conn.execute(select(func.coalesce(func.max(sums.c.changes), 0))).scalar_one()) + 1
    conn.execute(update(step_marks).where(and_(step_marks.c.run_pk == run_pk, step_marks.c.attempt.in_(touched)))
                 .values(changes=step_marks.c.changes + past))


def _moves_whole(now: list[tuple[int, int]], old: int, new: int) -> bool:
    """Whether every launch attempt numbered `old` goes to `new`, and none stays at `new` or comes from elsewhere."""
    return all(n == new for o, n in now if o == old) and all(o == old for o, n in now if n == new)


def _renamed(summary: bytes, attempt: int) -> bytes:
    """A block summary's bytes with another attempt number (b"": a block without rows)."""
    if not summary:
        return summary
    block = block_from_bytes(summary)
    return block_to_bytes(replace(block, attempt=attempt, clocks=replace(block.clocks, attempt=attempt)))
