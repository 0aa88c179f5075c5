"""One rank's rows of a run, for the run page's drill-down: its steps, its collective seconds per step, and its
attempt events (services.analysis.rank_detail reads them)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from sqlalchemy import Connection, select

from services.analysis.collective_time import comm_frame, sum_collective_seconds
from services.storage.step_columns import column_rows
from services.storage.tables import Event, collectives, steps

RANK_EVENT_KINDS = ("attempt_start", "attempt_end")


def load_rank_steps(conn: Connection, run_pk: int, rank: int) -> pd.DataFrame:
    """The rank's steps (attempt, step, start, end, comm: NaN where the step reported none), in step order."""
    rows = conn.execute(
        select(steps.c.attempt, steps.c.step, steps.c.start_time, steps.c.end_time, steps.c.comm)
        .where(steps.c.run_pk == run_pk, steps.c.rank == rank).order_by(steps.c.attempt, steps.c.step)).all()
    matrix = np.array([(a, s, t0, t1, np.nan if c is None else c) for a, s, t0, t1, c in rows],
                      dtype=np.float64).reshape(-1, 5)
    frame = pd.DataFrame({"attempt": matrix[:, 0].astype(np.int64), "step": matrix[:, 1].astype(np.int64),
                          "start": matrix[:, 2], "end": matrix[:, 3], "comm": matrix[:, 4]})
    moved = column_rows(conn, run_pk, ranks=[rank])  # the blocks the rank has left (services.storage.step_columns)
    if not len(moved):
        return frame
    held = pd.DataFrame({"attempt": moved.attempt, "step": moved.rows.step, "start": moved.rows.start,
                         "end": moved.rows.end, "comm": moved.rows.comm})
    return (pd.concat([held, frame], ignore_index=True).sort_values(["attempt", "step"], kind="stable")
            .reset_index(drop=True))


def load_rank_comm(conn: Connection, run_pk: int, rank: int) -> pd.DataFrame:
    """The rank's seconds inside collectives per (attempt, step), from its collective calls (COMM_COLUMNS)."""
    rows = conn.execute(
        select(collectives.c.attempt, collectives.c.step, collectives.c.start_time, collectives.c.end_time)
        .where(collectives.c.run_pk == run_pk, collectives.c.rank == rank)).all()
    if not rows:
        return comm_frame()
    matrix = np.array(rows, dtype=np.float64)
    return sum_collective_seconds(matrix[:, 0], np.full(len(matrix), rank), matrix[:, 1], matrix[:, 2],
                                  matrix[:, 3])


def load_rank_events(conn: Connection, run_pk: int, rank: int) -> pd.DataFrame:
    """The rank's attempt events: kind, time, attempt, host, reason, world_size, exit_code."""
    rows = conn.execute(
        select(Event.kind, Event.time, Event.attempt, Event.data)
        .where(Event.run_pk == run_pk, Event.rank == rank, Event.kind.in_(RANK_EVENT_KINDS))
        .order_by(Event.time)).all()
    records = []
    for kind, time, attempt, data in rows:
        fields = (json.loads(data) if isinstance(data, str) else data) or {}
        records.append({"kind": kind, "time": float(time), "attempt": attempt, "host": fields.get("host"),
                        "reason": fields.get("reason"), "world_size": fields.get("world_size"),
                        "exit_code": fields.get("exit_code")})
    frame = pd.DataFrame(records, columns=["kind", "time", "attempt", "host", "reason", "world_size", "exit_code"])
    frame["attempt"] = frame["attempt"].astype("float64")
    for column in ("world_size", "exit_code"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame
