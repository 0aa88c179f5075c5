"""Write a group of validated batches in one transaction and tell each batch what was new.

Idempotency: `events` has the primary key (run_pk, event_id); an event whose id is already stored (or appears
twice in the group) is a duplicate, and its step / collective rows are not written again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from services.storage import pgcopy
from services.storage.records import IngestRecord, IngestResult
from services.storage.tables import Event, Run, collectives, steps

_INSERT_CHUNK = 2000
DEFAULT_PROJECT = "default"


def write_group(conn: Connection, batches: Sequence[Sequence[IngestRecord]],
                projects: Sequence[str | None] | None = None) -> list[IngestResult]:
    """Insert every new event of every batch; commit is the caller's. Returns one result per batch.

    `projects[b]` is the project of batch b's write token: the runs it creates get that project, and a batch
    naming a run of another project is refused whole (its result has `forbidden_run`). None = no scoping
    (no tokens configured): new runs go to project "default".
    """
    projects = list(projects) if projects is not None else [None] * len(batches)
    forbidden = _check_projects(conn, batches, projects)
    claims: dict[str, str] = {}
    for batch, project, refused in zip(batches, projects, forbidden):
        if refused is None:
            for r in batch:
                claims.setdefault(r.run_id, project or DEFAULT_PROJECT)
    runs = _ensure_runs(conn, claims)
    run_pks = {run_id: pk for run_id, (pk, _) in runs.items()}
    for b, (batch, project) in enumerate(zip(batches, projects)):  # another process may have won a new run id
        if project is not None and forbidden[b] is None:
            forbidden[b] = next((r.run_id for r in batch if runs[r.run_id][1] != project), None)
    postgres = conn.dialect.name == "postgresql"

    seen: set[tuple[int, str]] = set()
    candidates: list[tuple[int, IngestRecord]] = []
    owner: list[int] = []  # batch index of each candidate
    duplicates = [0] * len(batches)
    for b, batch in enumerate(batches):
        if forbidden[b] is not None:
            continue
        for record in batch:
            key = (run_pks[record.run_id], record.event_id)
            if key in seen:
                duplicates[b] += 1
                continue
            seen.add(key)
            candidates.append((key[0], record))
            owner.append(b)

    inserted = _insert_events(conn, candidates, postgres)
    accepted = [0] * len(batches)
    new_records: list[tuple[int, IngestRecord]] = []
    for (run_pk, record), b in zip(candidates, owner):
        if (run_pk, record.event_id) in inserted:
            accepted[b] += 1
            new_records.append((run_pk, record))
        else:
            duplicates[b] += 1

    _insert_steps(conn, new_records, postgres)
    _insert_collectives(conn, new_records)
    _touch_runs(conn, new_records)
    return [IngestResult(accepted=a, duplicates=d, forbidden_run=f) for a, d, f in zip(accepted, duplicates, forbidden)]


def _check_projects(conn: Connection, batches: Sequence[Sequence[IngestRecord]],
                    projects: Sequence[str | None]) -> list[str | None]:
    """For each batch, the first run it names that belongs to another project (None = allowed).

    A run's project never changes, so the check is a read of the existing runs, plus the runs an earlier batch
    of this group is about to create; `write_group` checks again after creating runs, since another collector
    process may have created one of them meanwhile (the first writer's project wins)."""
    if not any(p is not None for p in projects):
        return [None] * len(batches)
    wanted = sorted({r.run_id for batch in batches for r in batch})
    owners = {row[0]: row[1] for row in conn.execute(select(Run.run_id, Run.project).where(Run.run_id.in_(wanted)))}
    out: list[str | None] = []
    for batch, project in zip(batches, projects):
        refused = None
        if project is not None:
            for run_id in dict.fromkeys(r.run_id for r in batch):
                if owners.setdefault(run_id, project) != project:
                    refused = run_id
                    break
        out.append(refused)
    return out


def _ensure_runs(conn: Connection, claims: dict[str, str]) -> dict[str, tuple[int, str]]:
    """{run_id: (pk, project)} of every claimed run, creating the missing ones with their claimed project."""
    if not claims:
        return {}
    wanted = sorted(claims)
    found = {r[0]: (r[1], r[2]) for r in conn.execute(
        select(Run.run_id, Run.id, Run.project).where(Run.run_id.in_(wanted)))}
    missing = [r for r in wanted if r not in found]
    if missing:
        insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        conn.execute(
            insert(Run).on_conflict_do_nothing(index_elements=["run_id"]),
            [{"run_id": r, "project": claims[r], "status": "running", "version": 0, "ledger_version": -1}
             for r in missing],
        )
        found.update((r[0], (r[1], r[2])) for r in conn.execute(
            select(Run.run_id, Run.id, Run.project).where(Run.run_id.in_(missing))))
    return found


def _insert_events(conn: Connection, candidates: list[tuple[int, IngestRecord]], postgres: bool) -> set[tuple[int, str]]:
    if not candidates:
        return set()
    insert = postgresql.insert if postgres else sqlite.insert
    statement = (
        insert(Event.__table__).on_conflict_do_nothing(index_elements=["run_pk", "event_id"])
        .returning(Event.__table__.c.run_pk, Event.__table__.c.event_id)
    )
    inserted: set[tuple[int, str]] = set()
    # One key order for every writer: concurrent transactions inserting the same ids wait, never deadlock.
    candidates = sorted(candidates, key=lambda c: (c[0], c[1].event_id))
    for i in range(0, len(candidates), _INSERT_CHUNK):
        rows = [
            {"run_pk": run_pk, "event_id": r.event_id, "kind": r.kind, "time": r.time, "attempt": r.attempt,
             "rank": r.rank, "step": r.step,
             "data": json.dumps(r.data, separators=(",", ":")) if r.data else None}
            for run_pk, r in candidates[i:i + _INSERT_CHUNK]
        ]
        inserted.update((r[0], r[1]) for r in conn.execute(statement, rows))
    return inserted


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
                {k: (None if isinstance(v, float) and v != v else v) for k, v in zip(names, values)}
                for values in zip(*(cols[k][i:i + _INSERT_CHUNK].tolist() for k in names))
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
    raw = conn.connection.driver_connection
    sql = f"COPY steps ({', '.join(pgcopy.STEP_COPY_COLUMNS)}) FROM STDIN (FORMAT binary)"
    with raw.cursor() as cursor, cursor.copy(sql) as copy:  # type: ignore[union-attr]
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
        for step, op, start, end in zip(c.step.tolist(), c.op, c.start.tolist(), c.end.tolist()):
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
        if r.kind == "run_end" and r.data:
            if info["end"] is None or r.time >= info["end"][0]:
                info["end"] = (r.time, r.data["status"])
    now = time.time()
    for run_pk, info in sorted(per_run.items()):  # one lock order for every writer process: no deadlock
        values: dict[str, Any] = {
            "version": Run.version + 1,
            "received_at": now,
            "first_time": func.coalesce(func.min(Run.first_time, info["first"]), info["first"])
            if conn.dialect.name == "sqlite" else func.least(func.coalesce(Run.first_time, info["first"]), info["first"]),
            "last_time": func.coalesce(func.max(Run.last_time, info["last"]), info["last"])
            if conn.dialect.name == "sqlite" else func.greatest(func.coalesce(Run.last_time, info["last"]), info["last"]),
        }
        if info["end"] is not None:
            values["status"] = info["end"][1]
        conn.execute(update(Run).where(Run.id == run_pk).values(**values))
