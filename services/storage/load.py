"""Read one run's events back as the analysis core's RunData, and the run index."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection, select

from services.analysis.run_data import RunData, collectives_frame, events_frame, steps_frame
from services.errors import RunNotFound
from services.storage import pgcopy
from services.storage.records import SERIES_KINDS
from services.storage.tables import Event, Run, collectives, steps


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    pk: int
    run_id: str
    status: str
    first_time: float | None
    last_time: float | None
    received_at: float | None
    version: int
    ledger_version: int
    ledger_json: str | None


_RUN_COLUMNS = (Run.id, Run.run_id, Run.status, Run.first_time, Run.last_time, Run.received_at, Run.version,
                Run.ledger_version, Run.ledger_json)


def _run_row(row: Any) -> RunRow:
    return RunRow(pk=row[0], run_id=row[1], status=row[2], first_time=row[3], last_time=row[4],
                  received_at=row[5], version=row[6], ledger_version=row[7], ledger_json=row[8])


def get_run(conn: Connection, run_id: str) -> RunRow:
    row = conn.execute(select(*_RUN_COLUMNS).where(Run.run_id == run_id)).first()
    if row is None:
        raise RunNotFound(run_id)
    return _run_row(row)


def list_runs(conn: Connection, *, since: float | None = None, until: float | None = None,
              status: str | None = None, limit: int = 1000) -> list[RunRow]:
    query = select(*_RUN_COLUMNS)
    if since is not None:
        query = query.where(Run.last_time >= since)
    if until is not None:
        query = query.where(Run.first_time <= until)
    if status is not None:
        query = query.where(Run.status == status)
    query = query.order_by(Run.last_time.desc()).limit(limit)
    return [_run_row(r) for r in conn.execute(query).all()]


def load_run_data(conn: Connection, run: RunRow) -> RunData:
    return RunData(
        run_id=run.run_id,
        events=_load_events(conn, run.pk),
        steps=_load_steps(conn, run.pk),
        collectives=_load_collectives(conn, run.pk),
    )


def _load_events(conn: Connection, run_pk: int) -> pd.DataFrame:
    table = Event.__table__
    rows = conn.execute(
        select(table.c.kind, table.c.time, table.c.attempt, table.c.rank, table.c.step, table.c.data)
        .where(table.c.run_pk == run_pk, table.c.kind.not_in(sorted(SERIES_KINDS)))
    ).all()
    dicts = []
    for kind, time, attempt, rank, step, data in rows:
        d = json.loads(data) if data else {}
        d.update(kind=kind, time=time, attempt=attempt, rank=rank, step=step)
        dicts.append(d)
    return events_frame(dicts)


def _load_steps(conn: Connection, run_pk: int) -> pd.DataFrame:
    if conn.dialect.name == "postgresql":
        return _load_steps_copy(conn, run_pk)
    result = conn.execute(
        select(steps.c.attempt, steps.c.rank, steps.c.step, steps.c.start_time, steps.c.end_time,
               steps.c.loss, steps.c.lr, steps.c.comm).where(steps.c.run_pk == run_pk)
    )
    rows = result.all()
    if not rows:
        return steps_frame()
    arr = np.array(rows, dtype=object).T
    return steps_frame(
        attempt=arr[0].astype(np.int64), rank=arr[1].astype(np.int64), step=arr[2].astype(np.int64),
        start=arr[3].astype(np.float64), end=arr[4].astype(np.float64),
        loss=arr[5].tolist(), lr=arr[6].tolist(), comm=arr[7].tolist(),
    )


def _load_steps_copy(conn: Connection, run_pk: int) -> pd.DataFrame:
    """PostgreSQL: binary COPY of the run's rows, decoded by numpy in one call (about 20x a row fetch)."""
    sql = (
        "COPY (SELECT attempt, rank, step, start_time, end_time, coalesce(loss, 'NaN'), coalesce(lr, 'NaN'), "
        f"coalesce(comm, 'NaN') FROM steps WHERE run_pk = {int(run_pk)}) TO STDOUT (FORMAT binary)"
    )
    buffer = io.BytesIO()
    raw = conn.connection.driver_connection
    with raw.cursor() as cursor, cursor.copy(sql) as copy:  # type: ignore[union-attr]
        for chunk in copy:
            buffer.write(chunk)
    rows = pgcopy.decode_step_rows(buffer.getvalue())
    return pd.DataFrame({
        "attempt": rows["attempt"].astype(np.int64), "rank": rows["rank"].astype(np.int64),
        "step": rows["step"].astype(np.int64), "start": rows["start"].astype(np.float64),
        "end": rows["end"].astype(np.float64), "loss": rows["loss"].astype(np.float64),
        "lr": rows["lr"].astype(np.float64), "comm": rows["comm"].astype(np.float64),
    })


def _load_collectives(conn: Connection, run_pk: int) -> pd.DataFrame:
    rows = conn.execute(
        select(collectives.c.attempt, collectives.c.rank, collectives.c.step, collectives.c.op,
               collectives.c.start_time, collectives.c.end_time).where(collectives.c.run_pk == run_pk)
    ).all()
    if not rows:
        return collectives_frame()
    attempt, rank, step, op, start, end = zip(*rows)
    return collectives_frame(attempt=attempt, rank=rank, step=step, op=op, start=start, end=end)


def last_ok_checkpoint(conn: Connection, run_pk: int) -> dict[str, Any] | None:
    rows = conn.execute(
        select(Event.step, Event.attempt, Event.time, Event.data)
        .where(Event.run_pk == run_pk, Event.kind == "checkpoint_end")
        .order_by(Event.time.desc()).limit(1000)
    ).all()
    for step, attempt, time, data in rows:
        if data and json.loads(data).get("ok"):
            return {"step": step, "attempt": attempt, "end": time}
    return None
