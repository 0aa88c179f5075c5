"""Write a group of validated batches in one transaction and tell each batch what was new.

Runs: a run is identified by (project, run id). A batch writes into the runs of its write token's project
(project "default" for local clients while no token exists), creating them when new; two projects may use the
same run id without seeing or affecting each other.

Idempotency: `events` has the primary key (run_pk, event_id) and a digest of each event's content
(`content_hash`). An event whose id is already stored for its run (or appears earlier in the group) with the
same content is a duplicate (a retry): not written again, counted in `duplicates`. The same id with other
content is a conflict: the batch is refused whole (its result has `conflict`; nothing of it is stored), since
one of the two must be wrong and the collector cannot tell which. Events stored before revision 0005 have no
digest; a repeat of one is taken as a retry. A pruned run's raw events are gone, ids included: a repeat of one is
recognised from what retention kept (services.storage.pruned) and counted a duplicate too. Likewise a step record's
id is kept only while its rows are in `steps`: sent again once they moved into block rows, it is recognised by its
rows (services.storage.moved_repeats).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, delete, select, text
from sqlalchemy.dialects import postgresql, sqlite

from services.analysis.attempt_numbers import LEGACY
from services.storage import pgcopy
from services.storage.attempt_numbers import RunKey, StaleAttemptNumbers, number_records, with_run_attempt
from services.storage.clock_readings import (
    ClockReadings,
    ReadingKey,
    ReadingRow,
    RequestClock,
    WrittenReadings,
    readings_of,
    record_readings,
)
from services.storage.db import json_rows, psycopg_connection
from services.storage.moved_repeats import (
    HIGHEST_BLOCKS_SQL,
    forget_moved_records,
    heads_of,
    lowest_steps,
    without_moved_repeats,
)
from services.storage.one_trip import OneTrip
from services.storage.pruned import kept_of_pruned_runs, raw_record_runs
from services.storage.records import EventConflict, IngestRecord, IngestResult
from services.storage.runs import DEFAULT_PROJECT
from services.storage.step_blocks import mark_step_blocks
from services.storage.step_columns import RankKey, blocks_entered, move_left_blocks
from services.storage.tables import Event, Run, collectives, steps

_INSERT_CHUNK = 2000


class StaleRunKeys(Exception):
    """A run key the caller kept (`known_runs`) no longer names that run in the database: the transaction is rolled
    back and written again with every run looked up."""


class ConflictingBatches(Exception):
    """Raised by `write_group` (before its caller commits) when batches of the group repeat stored event ids with
    other content: the caller rolls the transaction back and writes the group again without them."""

    def __init__(self, conflicts: dict[int, EventConflict]) -> None:
        super().__init__(f"{len(conflicts)} batches repeat event ids with other content")
        self.conflicts = conflicts


def write_batches(target: Engine | Connection, batches: Sequence[Sequence[IngestRecord]],
                  projects: Sequence[str | None] | None = None, *,
                  known_runs: dict[tuple[str, str], int] | None = None,
                  clocks: Sequence[ClockReadings | None] | None = None,
                  written_readings: WrittenReadings | None = None) -> list[IngestResult]:
    """`write_group` in its own transaction, committed; batches refused for a conflict are left out of a second
    transaction (each pass leaves out at least one, so this ends). One result per batch. `target`: an engine (a
    pooled connection per call) or a connection the caller holds (the writer's: no checkout and ping per group).
    `known_runs`: {(project, run_id): runs.id} the caller keeps between calls; runs in it are not looked up, and
    the runs each committed transaction found or created are added to it. `clocks`: what each batch's request
    said of its senders' clocks (services.storage.clock_readings), kept for the batches written; with
    `written_readings` (the caller's, kept between calls), only those that may raise what it committed."""
    projects = list(projects) if projects is not None else [None] * len(batches)
    clocks = list(clocks) if clocks is not None else [None] * len(batches)
    refused: dict[int, EventConflict] = {}
    while True:
        keep = [b for b in range(len(batches)) if b not in refused]
        learned: dict[tuple[str, str], int] = {}
        sent: list[tuple[list[ReadingRow], dict[ReadingKey, Hashable | None]]] = []
        try:
            with _transaction(target) as conn:
                written = write_group(conn, [batches[b] for b in keep], [projects[b] for b in keep],
                                      known_runs=known_runs, learned=learned, clocks=[clocks[b] for b in keep],
                                      written_readings=written_readings, sent_readings=sent, commit=True)
        except ConflictingBatches as exc:  # rolled back: nothing of the group was stored
            refused.update((keep[k], conflict) for k, conflict in exc.conflicts.items())
            continue
        except StaleRunKeys:  # rolled back; the database was emptied or restored under the caller
            if not known_runs:
                raise
            known_runs.clear()
            if written_readings is not None:  # its run keys may name other runs now
                written_readings.clear()
            continue
        except StaleAttemptNumbers:  # rolled back, likewise; what was remembered of the numbers is forgotten
            continue
        if known_runs is not None:  # committed: the runs it created exist now
            known_runs.update(learned)
        if written_readings is not None:
            for rows, owners in sent:
                written_readings.committed(rows, owners)
        results = [IngestResult(0, 0, conflict=c) for c in (refused.get(b) for b in range(len(batches)))]
        for b, result in zip(keep, written, strict=True):
            results[b] = result
        return results


@contextmanager
def _transaction(target: Engine | Connection) -> Iterator[Connection]:
    if isinstance(target, Engine):
        with target.begin() as conn:
            yield conn
    else:
        with target.begin():
            yield target


def write_group(conn: Connection, batches: Sequence[Sequence[IngestRecord]],
                projects: Sequence[str | None] | None = None, *,
                known_runs: Mapping[tuple[str, str], int] | None = None,
                learned: dict[tuple[str, str], int] | None = None,
                clocks: Sequence[ClockReadings | None] | None = None,
                written_readings: WrittenReadings | None = None,
                sent_readings: list[tuple[list[ReadingRow], dict[ReadingKey, Hashable | None]]] | None = None,
                commit: bool = False) -> list[IngestResult]:
    """Insert every new event of every batch; commit is the caller's (PostgreSQL with `commit`: the group's last
    round trip commits it, one round trip fewer; the caller's transaction has then ended when this returns).
    Returns one result per batch.

    `projects[b]` is the project of batch b's write token: its runs are that project's (created there if new).
    None = no token (a local client): project "default". A batch that repeats an event id with other content
    (against the group itself: refused here; against stored events: `ConflictingBatches` is raised, since
    other batches' rows are written already) gets a result with `conflict` and nothing of it is written.
    """
    projects = list(projects) if projects is not None else [None] * len(batches)
    postgres = conn.dialect.name == "postgresql"
    keyed = [[((project or DEFAULT_PROJECT, r.run_id), r) for r in batch]
             for batch, project in zip(batches, projects, strict=True)]

    # Repeats inside the group, checked in memory before anything is written: the first batch to name an id wins.
    hashed = [[(key, r, *_stored_form(r)) for key, r in batch] for batch in keyed]
    conflicts: dict[int, EventConflict] = {}
    first_seen: dict[tuple[tuple[str, str], str], str] = {}
    for b, batch in enumerate(hashed):
        mine: dict[tuple[tuple[str, str], str], str] = {}
        for index, (key, r, _, digest) in enumerate(batch):
            earlier = first_seen.get((key, r.event_id), mine.get((key, r.event_id)))
            if earlier is not None and earlier != digest:
                conflicts[b] = EventConflict(index=index, event_id=r.event_id, run_id=r.run_id)
                break
            mine.setdefault((key, r.event_id), digest)
        else:
            for k, v in mine.items():
                first_seen.setdefault(k, v)

    # Runs' keys the caller kept are checked in this same transaction, at no extra round trip for the usual group
    # (all new events): `_touch_runs` updates a run only where its key still names it. Keys behind duplicates are
    # checked before the stored events are compared with them.
    named = {key for b, batch in enumerate(keyed) if b not in conflicts for key, _ in batch}
    # .get: the writer's other thread may clear the kept keys meanwhile
    runs = {key: pk for key in named if (pk := known_runs.get(key)) is not None} if known_runs else {}
    kept = set(runs.values())
    if len(runs) < len(named):
        looked_up = _ensure_runs(conn, named - runs.keys())
        runs.update(looked_up)
        if learned is not None:
            learned.update(looked_up)
    key_of = {pk: key for key, pk in runs.items()}
    # The run's attempt numbers (services.storage.attempt_numbers), after the digests: those are of what was sent.
    named_records = [(runs[key], record) for b, batch in enumerate(hashed) if b not in conflicts
                     for key, record, _, _ in batch]
    numbers, pruned = number_records(conn, named_records, pruned_among=raw_record_runs(named_records))
    seen: set[tuple[int, str]] = set()
    candidates: list[tuple[int, IngestRecord, str | None, str]] = []
    owner: list[tuple[int, int]] = []  # (batch, index in batch) of each candidate
    duplicates = [0] * len(batches)
    for b, batch in enumerate(hashed):
        if b in conflicts:
            continue
        for index, (key, record, data_json, digest) in enumerate(batch):
            pk_key = (runs[key], record.event_id)
            if pk_key in seen:
                duplicates[b] += 1
                continue
            seen.add(pk_key)
            candidates.append((pk_key[0], with_run_attempt(record, numbers, pk_key[0]), data_json, digest))
            owner.append((b, index))

    # read before the group's own records are in: a heartbeat of the group must not bound itself
    named_candidates = [(run_pk, r) for run_pk, r, _, _ in candidates]
    kept_of_pruned = kept_of_pruned_runs(conn, named_candidates, pruned)
    # PostgreSQL: the ranks' highest marked blocks (services.storage.moved_repeats) read in the insert's message
    inserted, heads = _insert_events(conn, candidates, postgres, list(lowest_steps(named_candidates)))
    not_inserted = [(run_pk, r.event_id) for run_pk, r, _, _ in candidates if (run_pk, r.event_id) not in inserted]
    _check_kept_keys(conn, {pk: key_of[pk] for pk, _ in not_inserted if pk in kept})
    stored = _stored_hashes(conn, not_inserted)
    late: dict[int, EventConflict] = {}
    for (run_pk, record, _, digest), (b, index) in zip(candidates, owner, strict=True):
        other = stored.get((run_pk, record.event_id))
        if other is not None and other != digest and b not in late:
            late[b] = EventConflict(index=index, event_id=record.event_id, run_id=record.run_id)
    if late:
        raise ConflictingBatches(late)

    accepted = [0] * len(batches)
    new_records: list[tuple[int, IngestRecord]] = []
    new_owners: list[int] = []
    for (run_pk, record, _, _), (b, _) in zip(candidates, owner, strict=True):
        if (run_pk, record.event_id) in inserted:
            accepted[b] += 1
            new_records.append((run_pk, record))
            new_owners.append(b)
        else:
            duplicates[b] += 1
    if kept_of_pruned is not None:
        new_records, new_owners = _without_repeats(conn, kept_of_pruned.without_repeats(new_records), new_records,
                                                   new_owners, accepted, duplicates)
    moved = without_moved_repeats(conn, new_records, heads)
    if moved is not None:
        new_records, new_owners = _without_repeats(conn, moved, new_records, new_owners, accepted, duplicates)

    _insert_steps(conn, new_records, postgres)
    _insert_collectives(conn, new_records)
    entered = mark_step_blocks(conn, new_records)
    # a rank entering block 0 has nothing below it (steps are >= 0: the event schema): its first records move nothing
    # and forget nothing (its heartbeats are thinned with its first move)
    below = {key: step for key, step in blocks_entered(
        ((run_pk, r.attempt, r.rank, r.step_rows.step) for run_pk, r in new_records
         if r.step_rows is not None and r.attempt is not None and r.rank is not None), entered).items() if step > 0}
    # PostgreSQL: the moved blocks' rows, the moved records' deletes, the readings, the runs' touches in one round trip
    trip = OneTrip()
    move_left_blocks(conn, below, trip if postgres else None)
    forget_moved_records(conn, below, trip)
    if clocks is not None:
        owners = _reading_owners(keyed, conflicts, runs, numbers) if written_readings is not None else None
        sent = record_readings(
            conn, [({run_id: pk for (p, run_id), pk in runs.items() if p == (project or DEFAULT_PROJECT)},
                    _with_run_attempts(readings, keyed[b], runs, numbers))
                   for b, (project, readings) in enumerate(zip(projects, clocks, strict=True))
                   if readings is not None and b not in conflicts], trip, written_readings, owners)
        if sent_readings is not None and owners is not None:
            sent_readings.append((sent, owners))
    # last: every other group writing to these runs waits for their rows' locks until this one commits
    _touch_runs(conn, new_records, key_of, trip, commit)
    return [IngestResult(accepted=a, duplicates=d, conflict=conflicts.get(b))
            for b, (a, d) in enumerate(zip(accepted, duplicates, strict=True))]


def _reading_owners(keyed: Sequence[Sequence[tuple[tuple[str, str], IngestRecord]]], conflicts: Mapping[int, object],
                    runs: Mapping[tuple[str, str], int], numbers: Mapping[RunKey, int]
                    ) -> dict[ReadingKey, Hashable | None]:
    """The launch attempt (launch, attempt as sent) whose records each clock reading of the group is of, keyed as
    the readings are (run, run attempt, rank; -1 for none); None where they are of several
    (services.storage.clock_readings.WrittenReadings)."""
    owners: dict[ReadingKey, Hashable | None] = {}
    for b, batch in enumerate(keyed):
        if b in conflicts:
            continue
        for key, r in batch:
            run_pk = runs[key]
            if r.attempt is None:
                reading, owner = (run_pk, -1, -1 if r.rank is None else r.rank), ("", -1)
            else:
                launch = r.launch or LEGACY
                reading = (run_pk, numbers[(run_pk, launch, r.attempt)], -1 if r.rank is None else r.rank)
                owner = (launch, r.attempt)
            if owners.setdefault(reading, owner) != owner:
                owners[reading] = None
    return owners


def _with_run_attempts(readings: ClockReadings, batch: Sequence[tuple[tuple[str, str], IngestRecord]],
                       runs: Mapping[tuple[str, str], int], numbers: Mapping[RunKey, int]) -> ClockReadings:
    """A request's clock readings keyed by the run's attempt numbers, not the ones its launches sent: read again
    from its records as numbered (the request's sending time is its offset plus its arrival)."""
    if all(r.launch is None for _, r in batch):
        return readings
    sent = next(iter(readings.offset.values())) + readings.received_at if readings.offset else None
    return readings_of([with_run_attempt(r, numbers, runs[key]) for key, r in batch],
                       RequestClock(received_at=readings.received_at, sent_at=sent))


def _without_repeats(conn: Connection, checked: list[IngestRecord | None], records: list[tuple[int, IngestRecord]],
                     owners: list[int], accepted: list[int], duplicates: list[int]
                     ) -> tuple[list[tuple[int, IngestRecord]], list[int]]:
    """The new records and their batches without the records that repeat what is stored by their rows
    (`checked[i]` None: services.storage.pruned, services.storage.moved_repeats; their event rows deleted again,
    counted in their batch's `duplicates` instead of `accepted`), and with only the rows not held of those that
    repeat part of it (their event rows keep the digest as sent)."""
    if all(new is old for new, (_, old) in zip(checked, records, strict=True)):
        return records, owners
    kept: list[tuple[int, IngestRecord]] = []
    kept_owners: list[int] = []
    repeats: list[tuple[int, str]] = []
    for (run_pk, record), b, new in zip(records, owners, checked, strict=True):
        if new is None:
            accepted[b] -= 1
            duplicates[b] += 1
            repeats.append((run_pk, record.event_id))
        else:
            kept.append((run_pk, new))
            kept_owners.append(b)
    for run_pk in sorted({pk for pk, _ in repeats}):
        ids = [event_id for pk, event_id in repeats if pk == run_pk]
        for at in range(0, len(ids), _INSERT_CHUNK):
            conn.execute(delete(Event).where(Event.run_pk == run_pk, Event.event_id.in_(ids[at:at + _INSERT_CHUNK])))
    return kept, kept_owners


def _stored_form(r: IngestRecord) -> tuple[str | None, str]:
    """(the `data` column's JSON, the content digest) of a record."""
    data = r.data
    if not data:
        data_json = None
    elif len(data) == 1 and type(count := data.get("n")) is int:  # a compact record's: json.dumps' text, faster
        data_json = f'{{"n":{count}}}'
    else:
        data_json = _DATA_JSON.encode(data)
    return data_json, content_hash(r, data_json)


_DATA_JSON = json.JSONEncoder(separators=(",", ":"))  # json.dumps' text; made once, not on every call
_DTYPE_CODES: dict[np.dtype[Any], bytes] = {}


def content_hash(r: IngestRecord, data_json: str | None) -> str:
    """blake2b-128 (hex) of what the record says: kind, time, launch, attempt, rank, step, its other fields and every
    array of a compact record (bytes, dtype and length; an unsent column differs from a sent one). The same
    wire event validated twice gives the same digest. About 1 us per event plus ~1 GB/s of array bytes."""
    head = f"{r.kind}\x1f{r.time!r}\x1f{r.attempt}\x1f{r.rank}\x1f{r.step}\x1f{data_json or ''}"
    if r.launch is not None:  # (records without one hash as they did before launches existed)
        head += f"\x1f{r.launch}"
    content = head.encode()  # hashed as one string: the digest of the parts' concatenation, in one update
    rows = r.step_rows
    if rows is not None:
        content = b"".join((content, _column_bytes(rows.step), _column_bytes(rows.start), _column_bytes(rows.end),
                            _column_bytes(rows.loss), _column_bytes(rows.lr), _column_bytes(rows.comm)))
    collective = r.collective_rows
    if collective is not None:
        content = b"".join((content, _column_bytes(collective.step), _column_bytes(collective.start),
                            _column_bytes(collective.end), "\x1f".join(collective.op).encode()))
    return hashlib.blake2b(content, digest_size=16).hexdigest()


def _column_bytes(values: np.ndarray) -> bytes:
    """An array's part of the digest: its dtype's code (b"|<f8"), its length and its bytes, or for a column the client
    did not send (one value viewed n times) b"broadcast" and that one value."""
    dtype = values.dtype
    code = _DTYPE_CODES.get(dtype)
    if code is None:  # looked up: numpy builds dtype.str anew at every read (~0.4 us)
        code = _DTYPE_CODES[dtype] = f"|{dtype.str}".encode()
    n = len(values)
    if n > 1 and values.strides[0] == 0 and values.ndim == 1:
        return b"%s%dbroadcast%s" % (code, n, values[:1].tobytes())
    return b"%s%d%s" % (code, n, values.tobytes())


def _ensure_runs(conn: Connection, keys: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """{(project, run_id): pk} of every named run, creating the missing ones."""
    if not keys:
        return {}
    run_ids = sorted({run_id for _, run_id in keys})

    def found() -> dict[tuple[str, str], int]:
        rows = conn.execute(select(Run.project, Run.run_id, Run.id).where(Run.run_id.in_(run_ids)))
        return {(r[0], r[1]): r[2] for r in rows if (r[0], r[1]) in keys}

    pks = found()
    missing = sorted(keys - pks.keys())
    if missing:
        insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        conn.execute(  # another process may create one of them meanwhile: then its row is the run
            insert(Run).on_conflict_do_nothing(index_elements=["run_id", "project"]),
            [{"run_id": run_id, "project": project, "status": "running", "version": 0, "ledger_version": -1}
             for project, run_id in missing],
        )
        pks = found()
    return pks


def _insert_events(conn: Connection, candidates: list[tuple[int, IngestRecord, str | None, str]], postgres: bool,
                   ranks: list[RankKey]) -> tuple[set[tuple[int, str]], dict[RankKey, int] | None]:
    """The (run pk, event id) of the candidates inserted (those not stored yet), and on PostgreSQL the `ranks`'
    highest marked blocks, read in the same round trip (None: not read)."""
    if not candidates:
        return set(), None
    # One key order for every writer: concurrent transactions inserting the same ids wait, never deadlock.
    candidates = sorted(candidates, key=lambda c: (c[0], c[1].event_id))
    if postgres:
        return _insert_events_postgres(conn, candidates, ranks)
    statement = (
        sqlite.insert(Event).on_conflict_do_nothing(index_elements=["run_pk", "event_id"])
        .returning(Event.run_pk, Event.event_id)
    )
    inserted: set[tuple[int, str]] = set()
    for i in range(0, len(candidates), _INSERT_CHUNK):
        rows = [
            {"run_pk": run_pk, "event_id": r.event_id, "kind": r.kind, "time": r.time, "attempt": r.attempt,
             "rank": r.rank, "step": r.step, "data": data_json, "content_hash": digest}
            for run_pk, r, data_json, digest in candidates[i:i + _INSERT_CHUNK]
        ]
        inserted.update((r[0], r[1]) for r in conn.execute(statement, rows))
    return inserted, None


# One statement of fixed text per chunk, the rows as one JSON parameter (services.storage.db.json_rows), inserted in
# the list's order (ORDER BY the ordinality), so the key order above holds.
_INSERT_EVENTS_SQL = (
    "INSERT INTO events (run_pk, event_id, kind, time, attempt, rank, step, data, content_hash) "
    "SELECT (r->>0)::int4, r->>1, r->>2, (r->>3)::float8, (r->>4)::int4, (r->>5)::int4, (r->>6)::int8, r->>7, r->>8 "
    "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS v(r, n) ORDER BY n "
    "ON CONFLICT (run_pk, event_id) DO NOTHING RETURNING run_pk, event_id"
)


def _insert_events_postgres(conn: Connection, candidates: list[tuple[int, IngestRecord, str | None, str]],
                            ranks: list[RankKey]) -> tuple[set[tuple[int, str]], dict[RankKey, int] | None]:
    """The inserts a chunk at a time; the last chunk's with the ranks' highest marked blocks read by the statement
    after it, in the same message (a round trip fewer a group; each costs the writer its waits for the GIL). Two
    statements, not one: the read takes its snapshot once the insert is done, so it sees the marks of a transaction
    the insert waited for (another collector storing the same event ids), as it did as a round trip of its own."""
    from psycopg import ClientCursor  # (PostgreSQL only: its driver is not needed on SQLite)

    inserted: set[tuple[int, str]] = set()
    heads: dict[RankKey, int] | None = None
    raw = psycopg_connection(conn)
    for i in range(0, len(candidates), _INSERT_CHUNK):
        rows = json_rows([(run_pk, r.event_id, r.kind, r.time, r.attempt, r.rank, r.step, data_json, digest)
                          for run_pk, r, data_json, digest in candidates[i:i + _INSERT_CHUNK]])
        if i + _INSERT_CHUNK < len(candidates) or not ranks:
            with raw.cursor() as cursor:
                inserted.update(cursor.execute(_INSERT_EVENTS_SQL, (rows,)).fetchall())
            continue
        with ClientCursor(raw) as cursor:  # client-side binding: both statements in one message
            cursor.execute("; ".join((cursor.mogrify(_INSERT_EVENTS_SQL, (rows,)),
                                      cursor.mogrify(HIGHEST_BLOCKS_SQL, (json_rows(ranks),)))))
            inserted.update((run_pk, event_id) for run_pk, event_id in cursor.fetchall())
            cursor.nextset()
            heads = heads_of(cursor.fetchall())
    return inserted, heads


def _stored_hashes(conn: Connection, keys: list[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """The stored digest of each (run_pk, event_id) that has one (rows from before revision 0005 have none)."""
    by_run: dict[int, list[str]] = {}
    for run_pk, event_id in keys:
        by_run.setdefault(run_pk, []).append(event_id)
    out: dict[tuple[int, str], str] = {}
    for run_pk, event_ids in by_run.items():
        for i in range(0, len(event_ids), _INSERT_CHUNK):
            rows = conn.execute(select(Event.event_id, Event.content_hash).where(
                Event.run_pk == run_pk, Event.event_id.in_(event_ids[i:i + _INSERT_CHUNK])))
            out.update(((run_pk, event_id), digest) for event_id, digest in rows if digest is not None)
    return out


def _insert_steps(conn: Connection, records: list[tuple[int, IngestRecord]], postgres: bool) -> None:
    parts = [(run_pk, r) for run_pk, r in records if r.step_rows is not None]
    if not parts:
        return
    if postgres:  # one COPY, encoded a few records at a time: no concatenated copy of the whole group's columns
        _copy_encoded_steps(conn, _encoded_step_chunks(parts))
        return
    for run_pk, r in parts:  # rows as Python objects one chunk at a time
        cols = _step_columns(run_pk, r)
        names = list(cols)
        for i in range(0, len(cols["step"]), _INSERT_CHUNK):
            rows = [
                {k: (None if isinstance(v, float) and v != v else v) for k, v in zip(names, values, strict=True)}
                for values in zip(*(cols[k][i:i + _INSERT_CHUNK].tolist() for k in names), strict=True)
            ]
            conn.execute(steps.insert(), rows)


def _step_columns(run_pk: int, r: IngestRecord) -> dict[str, np.ndarray]:
    rows = r.step_rows
    assert rows is not None
    n = len(rows.step)
    return {"run_pk": np.full(n, run_pk, dtype=np.int32), "attempt": np.full(n, r.attempt, dtype=np.int32),
            "rank": np.full(n, r.rank, dtype=np.int32), "step": rows.step, "start_time": rows.start,
            "end_time": rows.end, "loss": rows.loss, "lr": rows.lr, "comm": rows.comm}


_COPY_CHUNK_ROWS = 16_384  # ~1.6 MB of encoded rows at a time (one record of up to MAX_SERIES rows more at most)
_COPY_SEND_BYTES = 256 * 1024  # encoded chunks smaller than this are sent together


def _encoded_step_chunks(parts: list[tuple[int, IngestRecord]]) -> Iterator[bytes]:
    """The records' step rows as binary COPY rows, records taken together up to _COPY_CHUNK_ROWS rows: a few numpy
    calls per chunk and column, not per record (a group of bulk records has thousands of them)."""
    start = rows = 0
    for end, (_, r) in enumerate(parts, 1):
        assert r.step_rows is not None
        rows += len(r.step_rows.step)
        if rows >= _COPY_CHUNK_ROWS or end == len(parts):
            yield _encode_steps(parts[start:end])
            start, rows = end, 0


def _encode_steps(parts: list[tuple[int, IngestRecord]]) -> bytes:
    series = [r.step_rows for _, r in parts if r.step_rows is not None]
    counts = [len(s.step) for s in series]
    return pgcopy.encode_step_rows(
        np.repeat(np.array([run_pk for run_pk, _ in parts], dtype=np.int32), counts),
        np.repeat(np.array([r.attempt for _, r in parts], dtype=np.int32), counts),
        np.repeat(np.array([r.rank for _, r in parts], dtype=np.int32), counts),
        *(np.concatenate([getattr(s, column) for s in series])
          for column in ("step", "start", "end", "loss", "lr", "comm")),
    )


def copy_steps(conn: Connection, cols: dict[str, np.ndarray]) -> None:
    """Binary COPY of step rows into PostgreSQL (also the benchmark's raw-COPY baseline)."""
    n = len(cols["step"])
    _copy_encoded_steps(conn, (pgcopy.encode_step_rows(*(cols[c][i:i + _COPY_CHUNK_ROWS]
                                                         for c in pgcopy.STEP_COPY_COLUMNS))
                               for i in range(0, n, _COPY_CHUNK_ROWS)))


def _copy_encoded_steps(conn: Connection, chunks: Iterable[bytes]) -> None:
    """One binary COPY into `steps` (the partitioned table: PostgreSQL routes each row to its day's partition)."""
    sql = f"COPY steps ({', '.join(pgcopy.STEP_COPY_COLUMNS)}) FROM STDIN (FORMAT binary)"
    # each write is a send and a wait of the driver (~0.1 ms of CPU): the header, the trailer and small chunks go
    # together, so a small group's rows are one send
    with psycopg_connection(conn).cursor() as cursor, cursor.copy(sql) as copy:
        pending = [pgcopy.HEADER]
        size = len(pgcopy.HEADER)
        for chunk in chunks:
            if size + len(chunk) > _COPY_SEND_BYTES:
                copy.write(b"".join(pending))
                pending, size = [], 0
            pending.append(chunk)
            size += len(chunk)
        pending.append(pgcopy.TRAILER)
        copy.write(b"".join(pending))


def _insert_collectives(conn: Connection, records: list[tuple[int, IngestRecord]]) -> None:
    rows: list[dict[str, Any]] = []
    for run_pk, r in records:
        c = r.collective_rows
        if c is None:
            continue
        for step, op, start, end in zip(c.step.tolist(), c.op, c.start.tolist(), c.end.tolist(), strict=True):
            rows.append({"run_pk": run_pk, "attempt": r.attempt, "rank": r.rank, "step": step, "op": op,
                         "start_time": start, "end_time": end})
            if len(rows) >= _INSERT_CHUNK:  # rows as Python objects one chunk at a time
                conn.execute(collectives.insert(), rows)
                rows = []
    if rows:
        conn.execute(collectives.insert(), rows)


def _check_kept_keys(conn: Connection, keys: dict[int, tuple[str, str]]) -> None:
    if not keys:
        return
    rows = conn.execute(select(Run.id, Run.project, Run.run_id).where(Run.id.in_(sorted(keys))))
    if {r[0]: (r[1], r[2]) for r in rows} != keys:
        raise StaleRunKeys


def _touch_runs(conn: Connection, records: list[tuple[int, IngestRecord]],
                keys: dict[int, tuple[str, str]], trip: OneTrip, commit: bool = False) -> None:
    """Bump each written run's version (invalidates its stored ledger) and keep its summary columns. A run whose
    key no longer names it (project, run id) raises StaleRunKeys: the caller kept a key the database dropped.
    PostgreSQL: the updates go with what `trip` holds already, in one round trip, runs in key order; with `commit`,
    the transaction's COMMIT too (a touch that finds no row fails in the database, so nothing is committed then)."""
    per_run: dict[int, _RunTouch] = {}
    for run_pk, r in records:
        touch = per_run.get(run_pk)
        if touch is None:
            touch = per_run[run_pk] = _RunTouch()
        touch.times.append(np.array([r.time]))
        for rows in (r.step_rows, r.collective_rows):
            if rows is not None and len(rows.step):
                touch.times += (rows.start, rows.end)
        if r.kind == "run_end" and r.data and (touch.end is None or r.time >= touch.end[0]):
            touch.end = (r.time, r.data["status"])
    now = time.time()
    updates = []
    for run_pk, touch in sorted(per_run.items()):  # one lock order for every writer process: no deadlock
        times = np.concatenate(touch.times)  # one reduction per run, not one per record and column
        project, run_id = keys[run_pk]
        updates.append({"run_pk": run_pk, "project": project, "run_id": run_id, "now": now,
                        "first": float(times.min()), "last": float(times.max()),
                        "status": touch.end[1] if touch.end is not None else None})
    if conn.dialect.name == "postgresql":
        from psycopg.errors import DivisionByZero  # (PostgreSQL only: its driver is not needed on SQLite)

        for update in updates:
            trip.add(_TOUCH_RUN_POSTGRES, [update[name] for name in _TOUCH_RUN_PARAMS])
        if commit:
            trip.add("COMMIT", [])
        try:
            trip.send(conn)
        except DivisionByZero as exc:  # _TOUCH_RUN_POSTGRES's check: no row has the run's key
            raise StaleRunKeys from exc
        return
    for update in updates:
        if conn.execute(_TOUCH_RUN_SQLITE, update).rowcount != 1:
            raise StaleRunKeys


@dataclass(slots=True)
class _RunTouch:
    times: list[np.ndarray] = field(default_factory=list)  # every time the run's new records mention
    end: tuple[float, str] | None = None  # (time, status) of its latest run_end


# A fixed text, run through the driver's cursor on PostgreSQL (SQLAlchemy's execute cost more than the update itself:
# one per run per group), its values bound by the client (services.storage.one_trip). SQLite's two-argument min/max
# are PostgreSQL's least/greatest.
_TOUCH_RUN_TEMPLATE = (
    "UPDATE runs SET version = version + 1, received_at = %(now)s, "
    "first_time = coalesce({least}(first_time, %(first)s), %(first)s), "
    "last_time = coalesce({greatest}(last_time, %(last)s), %(last)s), "
    "status = coalesce(%(status)s, status) WHERE id = %(run_pk)s AND project = %(project)s AND run_id = %(run_id)s"
)
# PostgreSQL: one row by the primary key, or a division by zero (an error, unlike a count of 0 rows, stops the
# statements after it in the same message, the group's COMMIT among them)
_TOUCH_RUN_POSTGRES = re.sub(r"%\((\w+)\)s", "%s", "WITH touched AS ({} RETURNING 1) SELECT 1 / count(*) FROM touched"
                             .format(_TOUCH_RUN_TEMPLATE.format(least="least", greatest="greatest")))
_TOUCH_RUN_PARAMS = re.findall(r"%\((\w+)\)s", _TOUCH_RUN_TEMPLATE)  # (positional: OneTrip joins statements)
_TOUCH_RUN_SQLITE = text(re.sub(r"%\((\w+)\)s", r":\1", _TOUCH_RUN_TEMPLATE.format(least="min", greatest="max")))
