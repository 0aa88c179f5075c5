"""Write a group of validated batches in one transaction and tell each batch what was new.

Runs: a run is identified by (project, run id). A batch writes into the runs of its write token's project
(project "default" for local clients while no token exists), creating them when new; two projects may use the
same run id without seeing or affecting each other.

Idempotency: `events` has the primary key (run_pk, event_id) and a digest of each event's content
(`content_hash`). An event whose id is already stored for its run (or appears earlier in the group) with the
same content is a duplicate (a retry): not written again, counted in `duplicates`. The same id with other
content is a conflict: the batch is refused whole (its result has `conflict`; nothing of it is stored), since
one of the two must be wrong and the collector cannot tell which. Events stored before revision 0005 have no
digest; a repeat of one is taken as a retry.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from services.storage import pgcopy
from services.storage.db import psycopg_connection
from services.storage.records import EventConflict, IngestRecord, IngestResult
from services.storage.runs import DEFAULT_PROJECT
from services.storage.step_blocks import mark_step_blocks
from services.storage.tables import Event, Run, collectives, steps

_INSERT_CHUNK = 2000


class ConflictingBatches(Exception):
    """Raised by `write_group` (before its caller commits) when batches of the group repeat stored event ids with
    other content: the caller rolls the transaction back and writes the group again without them."""

    def __init__(self, conflicts: dict[int, EventConflict]) -> None:
        super().__init__(f"{len(conflicts)} batches repeat event ids with other content")
        self.conflicts = conflicts


def write_batches(target: Engine | Connection, batches: Sequence[Sequence[IngestRecord]],
                  projects: Sequence[str | None] | None = None) -> list[IngestResult]:
    """`write_group` in its own transaction, committed; batches refused for a conflict are left out of a second
    transaction (each pass leaves out at least one, so this ends). One result per batch. `target`: an engine (a
    pooled connection per call) or a connection the caller holds (the writer's: no checkout and ping per group)."""
    projects = list(projects) if projects is not None else [None] * len(batches)
    refused: dict[int, EventConflict] = {}
    while True:
        keep = [b for b in range(len(batches)) if b not in refused]
        try:
            with _transaction(target) as conn:
                written = write_group(conn, [batches[b] for b in keep], [projects[b] for b in keep])
        except ConflictingBatches as exc:  # rolled back: nothing of the group was stored
            refused.update((keep[k], conflict) for k, conflict in exc.conflicts.items())
            continue
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
                projects: Sequence[str | None] | None = None) -> list[IngestResult]:
    """Insert every new event of every batch; commit is the caller's. Returns one result per batch.

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

    runs = _ensure_runs(conn, {key for b, batch in enumerate(keyed) if b not in conflicts for key, _ in batch})
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
            candidates.append((pk_key[0], record, data_json, digest))
            owner.append((b, index))

    inserted = _insert_events(conn, candidates, postgres)
    stored = _stored_hashes(conn, [(run_pk, r.event_id) for run_pk, r, _, _ in candidates
                                   if (run_pk, r.event_id) not in inserted])
    late: dict[int, EventConflict] = {}
    for (run_pk, record, _, digest), (b, index) in zip(candidates, owner, strict=True):
        other = stored.get((run_pk, record.event_id))
        if other is not None and other != digest and b not in late:
            late[b] = EventConflict(index=index, event_id=record.event_id, run_id=record.run_id)
    if late:
        raise ConflictingBatches(late)

    accepted = [0] * len(batches)
    new_records: list[tuple[int, IngestRecord]] = []
    for (run_pk, record, _, _), (b, _) in zip(candidates, owner, strict=True):
        if (run_pk, record.event_id) in inserted:
            accepted[b] += 1
            new_records.append((run_pk, record))
        else:
            duplicates[b] += 1

    _insert_steps(conn, new_records, postgres)
    _insert_collectives(conn, new_records)
    mark_step_blocks(conn, new_records)
    _touch_runs(conn, new_records)
    return [IngestResult(accepted=a, duplicates=d, conflict=conflicts.get(b))
            for b, (a, d) in enumerate(zip(accepted, duplicates, strict=True))]


def _stored_form(r: IngestRecord) -> tuple[str | None, str]:
    """(the `data` column's JSON, the content digest) of a record."""
    data_json = json.dumps(r.data, separators=(",", ":")) if r.data else None
    return data_json, content_hash(r, data_json)


def content_hash(r: IngestRecord, data_json: str | None) -> str:
    """blake2b-128 (hex) of what the record says: kind, time, attempt, rank, step, its other fields and every
    array of a compact record (bytes, dtype and length; an unsent column differs from a sent one). The same
    wire event validated twice gives the same digest. About 1 us per event plus ~1 GB/s of array bytes."""
    head = f"{r.kind}\x1f{r.time!r}\x1f{r.attempt}\x1f{r.rank}\x1f{r.step}\x1f{data_json or ''}"
    digest = hashlib.blake2b(head.encode(), digest_size=16)
    rows = r.step_rows
    if rows is not None:
        for column in (rows.step, rows.start, rows.end, rows.loss, rows.lr, rows.comm):
            _update_with_array(digest, column)
    collective = r.collective_rows
    if collective is not None:
        for column in (collective.step, collective.start, collective.end):
            _update_with_array(digest, column)
        digest.update("\x1f".join(collective.op).encode())
    return digest.hexdigest()


def _update_with_array(digest: Any, values: np.ndarray) -> None:
    digest.update(f"|{values.dtype.str}{len(values)}".encode())
    if values.ndim == 1 and len(values) > 1 and values.strides[0] == 0:
        digest.update(b"broadcast")  # a column the client did not send (one value viewed n times)
        digest.update(np.ascontiguousarray(values[:1]).data)
    else:
        digest.update(np.ascontiguousarray(values).data)


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


def _insert_events(conn: Connection, candidates: list[tuple[int, IngestRecord, str | None, str]],
                   postgres: bool) -> set[tuple[int, str]]:
    if not candidates:
        return set()
    insert = postgresql.insert if postgres else sqlite.insert
    statement = (
        insert(Event).on_conflict_do_nothing(index_elements=["run_pk", "event_id"])
        .returning(Event.run_pk, Event.event_id)
    )
    inserted: set[tuple[int, str]] = set()
    # One key order for every writer: concurrent transactions inserting the same ids wait, never deadlock.
    candidates = sorted(candidates, key=lambda c: (c[0], c[1].event_id))
    for i in range(0, len(candidates), _INSERT_CHUNK):
        rows = [
            {"run_pk": run_pk, "event_id": r.event_id, "kind": r.kind, "time": r.time, "attempt": r.attempt,
             "rank": r.rank, "step": r.step, "data": data_json, "content_hash": digest}
            for run_pk, r, data_json, digest in candidates[i:i + _INSERT_CHUNK]
        ]
        inserted.update((r[0], r[1]) for r in conn.execute(statement, rows))
    return inserted


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
    if postgres:  # one COPY, fed record by record: no concatenated copy of the batch's columns
        copy_step_columns(conn, (_step_columns(run_pk, r) for run_pk, r in parts))
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


_COPY_CHUNK_ROWS = 50_000  # ~5 MB of encoded rows at a time


def copy_steps(conn: Connection, cols: dict[str, np.ndarray]) -> None:
    """Binary COPY of step rows into PostgreSQL (also the benchmark's raw-COPY baseline)."""
    copy_step_columns(conn, [cols])


def copy_step_columns(conn: Connection, parts: Iterable[dict[str, np.ndarray]]) -> None:
    """One binary COPY of several column sets, encoded a chunk at a time (memory: one chunk, not the batch)."""
    sql = f"COPY steps ({', '.join(pgcopy.STEP_COPY_COLUMNS)}) FROM STDIN (FORMAT binary)"
    with psycopg_connection(conn).cursor() as cursor, cursor.copy(sql) as copy:
        copy.write(pgcopy.HEADER)
        for cols in parts:
            for i in range(0, len(cols["step"]), _COPY_CHUNK_ROWS):
                copy.write(pgcopy.encode_step_rows(*(cols[c][i:i + _COPY_CHUNK_ROWS]
                                                     for c in pgcopy.STEP_COPY_COLUMNS)))
        copy.write(pgcopy.TRAILER)


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


def _touch_runs(conn: Connection, records: list[tuple[int, IngestRecord]]) -> None:
    """Bump each written run's version (invalidates its stored ledger) and keep its summary columns."""
    per_run: dict[int, dict[str, Any]] = {}
    for run_pk, r in records:
        times = [r.time]
        if r.step_rows is not None and len(r.step_rows.step):
            times += [float(r.step_rows.start.min()), float(r.step_rows.end.max())]
        if r.collective_rows is not None and len(r.collective_rows.step):
            times += [float(r.collective_rows.start.min()), float(r.collective_rows.end.max())]
        info = per_run.setdefault(run_pk, {"first": min(times), "last": max(times), "end": None})
        info["first"] = min(info["first"], *times)
        info["last"] = max(info["last"], *times)
        if r.kind == "run_end" and r.data and (info["end"] is None or r.time >= info["end"][0]):
            info["end"] = (r.time, r.data["status"])
    now = time.time()
    # SQLite's two-argument min/max are PostgreSQL's least/greatest
    least, greatest = (func.min, func.max) if conn.dialect.name == "sqlite" else (func.least, func.greatest)
    for run_pk, info in sorted(per_run.items()):  # one lock order for every writer process: no deadlock
        values: dict[str, Any] = {
            "version": Run.version + 1,
            "received_at": now,
            "first_time": func.coalesce(least(Run.first_time, info["first"]), info["first"]),
            "last_time": func.coalesce(greatest(Run.last_time, info["last"]), info["last"]),
        }
        if info["end"] is not None:
            values["status"] = info["end"][1]
        conn.execute(update(Run).where(Run.id == run_pk).values(**values))
