"""Read one run's events back as the analysis core's RunData (the run itself: services.storage.runs)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection, select

from services.analysis.collective_time import comm_frame, sum_collective_seconds
from services.analysis.run_data import RunData, collectives_frame, events_frame, steps_frame
from services.storage import pgcopy
from services.storage.db import psycopg_connection, sqlite_connection
from services.storage.records import SERIES_KINDS
from services.storage.runs import RunRow
from services.storage.step_columns import column_rows
from services.storage.tables import Event, collectives


def load_run_data(conn: Connection, run: RunRow, *, detail: bool = False) -> RunData:
    """The run's events for analysis.

    By default only what the ledger reads: steps without loss / lr, and collective time already summed per
    (attempt, rank, step) in the database (`RunData.comm`). `detail=True` adds loss, lr and every collective call.
    """
    steps = _load_steps(conn, run.pk, detail=detail)
    if detail:
        return RunData(run_id=run.run_id, events=_load_events(conn, run.pk), steps=steps,
                       collectives=_load_collectives(conn, run.pk))
    # Steps that carry their own collective seconds (what the client sends) need no collective rows.
    needs_rows = bool(steps["comm"].isna().any())
    return RunData(run_id=run.run_id, events=_load_events(conn, run.pk), steps=steps,
                   collectives=collectives_frame(), comm=_load_comm(conn, run.pk) if needs_rows else comm_frame())


def _load_events(conn: Connection, run_pk: int, *, event_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """The run's control events (`event_ids`: only those)."""
    return _load_events_with_ids(conn, run_pk, event_ids=event_ids)[0]


def _load_events_with_ids(conn: Connection, run_pk: int, *, event_ids: Sequence[str] | None = None,
                          heartbeats: bool = True) -> tuple[pd.DataFrame, list[str]]:
    """The run's control events (`event_ids`: only those) and their ids, row for row, read as plain DBAPI tuples
    (a run of 1,000 ranks has ~45k of them: SQLAlchemy Row objects cost more than the query).

    Heartbeats are read as each (attempt, rank)'s earliest and latest only (`_HEARTBEAT_EXTREMES`): a rank sends
    one every 5 s for the run's whole life (a 256-rank run, 51 a second), and analysis reads of them only an
    attempt's or a rank's first and last sign of life and the latest one's step and collectives, which the two
    rows keep. `event_ids` never selects heartbeats (the analysis cache keeps the other control events by id and
    asks for the heartbeats' extremes each time: `load_heartbeat_extremes`)."""
    kinds = sorted(SERIES_KINDS | {"heartbeat"})
    postgres = conn.dialect.name == "postgresql"
    p = "%s" if postgres else "?"
    sql = (f"SELECT kind, time, attempt, rank, step, data, event_id FROM events WHERE run_pk = {p} "
           f"AND kind NOT IN ({', '.join(p for _ in kinds)})")
    params: list[Any] = [int(run_pk), *kinds]
    if event_ids is not None:
        sql += f" AND event_id IN ({', '.join(p for _ in event_ids)})"
        params += list(event_ids)
    elif heartbeats:
        sql += " UNION ALL " + _HEARTBEAT_EXTREMES.format(p=p)
        params.append(int(run_pk))
    return _events_frame(_fetch_rows(conn, sql, params))


def load_heartbeat_extremes(conn: Connection, run_pk: int) -> pd.DataFrame:
    """Each (attempt, rank)'s earliest and latest heartbeat, as control events (see `_load_events_with_ids`)."""
    p = "%s" if conn.dialect.name == "postgresql" else "?"
    return _events_frame(_fetch_rows(conn, _HEARTBEAT_EXTREMES.format(p=p), [int(run_pk)]))[0]


# row_number() rather than min/max: the latest heartbeat's own step and collectives are read (live hang detection)
_HEARTBEAT_EXTREMES = (
    "SELECT kind, time, attempt, rank, step, data, event_id FROM ("
    "SELECT kind, time, attempt, rank, step, data, event_id, "
    "row_number() OVER (PARTITION BY attempt, rank ORDER BY time, event_id) AS earliest, "
    "row_number() OVER (PARTITION BY attempt, rank ORDER BY time DESC, event_id DESC) AS latest "
    "FROM events WHERE run_pk = {p} AND kind = 'heartbeat') AS beats WHERE earliest = 1 OR latest = 1")


def _fetch_rows(conn: Connection, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    if conn.dialect.name == "postgresql":
        with psycopg_connection(conn).cursor() as pg_cursor:
            return pg_cursor.execute(sql, params).fetchall()
    cursor = sqlite_connection(conn).cursor()
    try:
        return cursor.execute(sql, params).fetchall()
    finally:
        cursor.close()


def _events_frame(rows: list[tuple[Any, ...]]) -> tuple[pd.DataFrame, list[str]]:
    dicts = []
    ids = []
    for kind, time, attempt, rank, step, data, event_id in rows:
        d = json.loads(data) if data else {}
        d.update(kind=kind, time=time, attempt=attempt, rank=rank, step=step)
        dicts.append(d)
        ids.append(str(event_id))
    return events_frame(dicts), ids


_STEP_COLUMNS = {"attempt": ">i4", "rank": ">i4", "step": ">i8", "start": ">f8", "end": ">f8", "comm": ">f8"}
_STEP_DETAIL_COLUMNS = {**_STEP_COLUMNS, "loss": ">f8", "lr": ">f8"}
_SQL_NAMES = {"start": "start_time", "end": "end_time"}
_KEY_COLUMNS = ("attempt", "rank", "step")
COLLECTIVE_TIME_COLUMNS = {"attempt": ">i4", "rank": ">i4", "step": ">i8", "start": ">f8", "end": ">f8"}
_COLLECTIVE_TIME_SQL = "SELECT attempt, rank, step, start_time, end_time FROM collectives WHERE run_pk = {param}"


def _load_steps(conn: Connection, run_pk: int, *, detail: bool) -> pd.DataFrame:
    columns = _STEP_DETAIL_COLUMNS if detail else _STEP_COLUMNS
    values = _head_steps(conn, run_pk, columns, detail=detail)
    moved = column_rows(conn, run_pk)
    if len(moved):  # the blocks ranks have left (services.storage.step_columns), put in index order with the rest
        held = {"attempt": moved.attempt, "rank": moved.rank,
                **{c: getattr(moved.rows, c) for c in columns if c not in ("attempt", "rank")}}
        head = values or {c: held[c][:0] for c in columns}
        values = {c: np.concatenate([np.asarray(part[c]).astype(np.int64 if c in _KEY_COLUMNS else np.float64)
                                     for part in (held, head)]) for c in columns}
        order = _index_order(values["attempt"], values["rank"], values["step"])
        values = {c: np.asarray(v)[order] for c, v in values.items()}
    if values is None:
        return steps_frame()
    return steps_frame(**{c: values.get(c) for c in ("attempt", "rank", "step", "start", "end")},
                       loss=values.get("loss"), lr=values.get("lr"), comm=values["comm"])


def _index_order(attempt: np.ndarray, rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """np.lexsort((step, rank, attempt)) of the blocks' rows followed by the rows in `steps`, each part in
    (attempt, rank) order: a stable sort by (attempt, rank) merges the two, and when it leaves each rank's steps
    ascending (no replayed rows) it is that order, at a third of the cost."""
    merged = np.lexsort((rank, attempt))
    a, r, s = attempt[merged], rank[merged], step[merged]
    same_rank = (a[1:] == a[:-1]) & (r[1:] == r[:-1])
    if bool(np.all(~same_rank | (s[1:] >= s[:-1]))):
        return merged
    return np.lexsort((step, rank, attempt))


def _head_steps(conn: Connection, run_pk: int, columns: dict[str, str], *,
                detail: bool) -> dict[str, np.ndarray] | None:
    """The run's rows in `steps` (each rank's current block), in index order; None: none."""
    names = [_SQL_NAMES.get(c, c) for c in columns]
    if conn.dialect.name == "postgresql":
        values = _steps_as_arrays(conn, run_pk, names, columns)  # NaN stands for "not reported"
        return values if len(values["step"]) else None
    # SQLite: NULL becomes -1 (never a valid value: comm >= 0) or, for loss / lr, goes through objects.
    select_list = ", ".join(f"ifnull({n}, -1.0)" if n == "comm" else n for n in names)
    # in index order: the analysis finds the rows sorted and skips its own sort
    fetched = _fetch_tuples(conn, f"SELECT {select_list} FROM steps WHERE run_pk = ? ORDER BY attempt, rank, step",
                            int(run_pk))
    if not fetched:
        return None
    if detail:
        matrix = np.array(fetched, dtype=object)
        values = {c: matrix[:, i] for i, c in enumerate(columns)}
        for c in ("loss", "lr"):
            values[c] = np.array([np.nan if v is None else v for v in values[c]], dtype=np.float64)
    else:
        matrix = np.array(fetched, dtype=np.float64)
        values = {c: matrix[:, i] for i, c in enumerate(columns)}
    comm = values["comm"].astype(np.float64)
    values["comm"] = np.where(comm < 0, np.nan, comm)
    return values


def _load_comm(conn: Connection, run_pk: int) -> pd.DataFrame:
    if conn.dialect.name == "postgresql":
        rows = pgcopy.copy_out(conn, _COLLECTIVE_TIME_SQL.format(param=int(run_pk)), COLLECTIVE_TIME_COLUMNS)
        columns = [rows[c] for c in COLLECTIVE_TIME_COLUMNS]
    else:
        fetched = _fetch_tuples(conn, _COLLECTIVE_TIME_SQL.format(param="?"), int(run_pk))
        matrix = np.array(fetched, dtype=np.float64).reshape(-1, 5)
        columns = [matrix[:, k] for k in range(5)]
    return sum_collective_seconds(*columns)


def _fetch_tuples(conn: Connection, sql: str, run_pk: int) -> list[tuple[Any, ...]]:
    """Plain tuples from the DBAPI cursor: numpy converts them 20x faster than SQLAlchemy Row objects."""
    cursor = sqlite_connection(conn).cursor()
    try:
        return cursor.execute(sql, (run_pk,)).fetchall()
    finally:
        cursor.close()


_INDEX_ORDER_PLAN = ("enable_seqscan", "enable_bitmapscan", "enable_sort", "enable_hashagg")
_PY_NAMES = {"start_time": "start", "end_time": "end"}
_NAN = "'NaN'::float8"


def _steps_as_arrays(conn: Connection, run_pk: int, names: list[str], columns: dict[str, str]
                     ) -> dict[str, np.ndarray]:
    """PostgreSQL: one row per (attempt, rank) holding each column as the concatenated binary values of its
    steps (big-endian int8 / float8, no per-value header), turned into numpy arrays without a Python object per
    value. A row per step costs a protocol message and a Python iteration each; this costs one per rank, and
    half the bytes of a float8[] (which frames every value with its length)."""
    aggregated = [n for n in names if n not in ("attempt", "rank")]
    # Every column of a group is built over the same rows in the same order, so they line up.
    select_list = ", ".join(
        f"string_agg({'int8send' if columns[_PY_NAMES.get(n, n)] == '>i8' else 'float8send'}"
        f"({f'coalesce({n}, {_NAN})' if n in ('loss', 'lr', 'comm') else n}), ''::bytea)" for n in aggregated)
    # Read along the (run_pk, attempt, rank, step) index and aggregate as the rows stream by: no hash table, no
    # sort, and each group's values come in step order, so the analysis finds the rows sorted. Left to itself the
    # planner may hash or sort millions of rows instead (3x slower, spilling to disk), so for this one query
    # the other plans are priced out.
    sql = (f"SELECT attempt, rank, count(*), {select_list} FROM steps WHERE run_pk = %s GROUP BY attempt, rank "
           "ORDER BY attempt, rank")
    with psycopg_connection(conn).cursor(binary=True) as cursor:
        for setting in _INDEX_ORDER_PLAN:
            cursor.execute(f"SET LOCAL {setting} = off")
        try:
            rows = cursor.execute(sql, (int(run_pk),)).fetchall()
        finally:
            for setting in _INDEX_ORDER_PLAN:
                cursor.execute(f"RESET {setting}")
    if not rows:
        return {c: np.zeros(0) for c in columns}
    counts = np.array([r[2] for r in rows], dtype=np.int64)
    out = {"attempt": np.repeat([r[0] for r in rows], counts), "rank": np.repeat([r[1] for r in rows], counts)}
    for k, name in enumerate(aggregated):
        key = _PY_NAMES.get(name, name)
        wire = np.dtype(columns[key])
        out[key] = np.frombuffer(b"".join(r[3 + k] for r in rows), dtype=wire).astype(wire.newbyteorder("="))
    return out


def _load_collectives(conn: Connection, run_pk: int) -> pd.DataFrame:
    rows = conn.execute(
        select(collectives.c.attempt, collectives.c.rank, collectives.c.step, collectives.c.op,
               collectives.c.start_time, collectives.c.end_time).where(collectives.c.run_pk == run_pk)
    ).all()
    if not rows:
        return collectives_frame()
    attempt, rank, step, op, start, end = zip(*rows, strict=True)
    return collectives_frame(attempt=attempt, rank=rank, step=step, op=op, start=start, end=end)


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    step: int
    attempt: int
    end: float


def last_ok_checkpoint(conn: Connection, run_pk: int) -> CompletedCheckpoint | None:
    rows = conn.execute(
        select(Event.step, Event.attempt, Event.time, Event.data)
        .where(Event.run_pk == run_pk, Event.kind == "checkpoint_end")
        .order_by(Event.time.desc()).limit(1000)
    ).all()
    for step, attempt, time, data in rows:
        if step is not None and attempt is not None and data and json.loads(data).get("ok"):
            return CompletedCheckpoint(step, attempt, time)
    return None
