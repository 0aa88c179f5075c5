"""The input of every analysis: one run's events as three DataFrames with documented columns.

`events`       one row per control event (everything but steps and collectives):
               EVENT_COLUMNS = kind, time, attempt, rank, step, gpus, world_size, host, ok, reason, status, value,
               checkpoint_step, digest, name, detail, exit_code, collectives
               (attempt/rank/step/gpus/world_size/checkpoint_step/exit_code/collectives are float with NaN where the
               kind has no such field; `value` is a `digest` event's string, None elsewhere; `checkpoint_step` is
               the step of the checkpoint a `resume` says it loaded, `digest` its digest of the state it loaded, None
               elsewhere;
               `detail` an `attempt_end`'s or `run_end`'s text; `exit_code` the exit status `goodput launch` saw
               for a worker (negative: the signal that killed it); `collectives` a heartbeat's count)
`steps`        one row per completed optimizer step on one rank:
               STEP_COLUMNS = attempt, rank, step, start, end, loss, lr, comm (NaN = not reported)
`collectives`  one row per collective call on one rank:
               COLLECTIVE_COLUMNS = attempt, rank, step, op, start, end
`comm`         optional: collective seconds summed per (attempt, rank, step): COMM_COLUMNS

`run_data_from_events` turns wire-format events (docs/events.md), compact records included, into a RunData.
Storage builds the same frames straight from its tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from services.analysis.step_summary import StepSummary

EVENT_COLUMNS = ("kind", "time", "attempt", "rank", "step", "gpus", "world_size", "host", "ok", "reason", "status",
                 "value", "checkpoint_step", "digest", "name", "detail", "exit_code", "collectives")
STEP_COLUMNS = ("attempt", "rank", "step", "start", "end", "loss", "lr", "comm")
COLLECTIVE_COLUMNS = ("attempt", "rank", "step", "op", "start", "end")
COMM_COLUMNS = ("attempt", "rank", "step", "seconds")

_NUMERIC_EVENT_FIELDS = ("attempt", "rank", "step", "gpus", "world_size", "checkpoint_step", "exit_code",
                         "collectives")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunData:
    run_id: str
    events: pd.DataFrame
    steps: pd.DataFrame
    collectives: pd.DataFrame
    # Collective seconds already summed per (attempt, rank, step), duplicates removed (COMM_COLUMNS); when
    # set, it stands for `collectives` in the ledger (storage computes it in the database).
    comm: pd.DataFrame | None = None
    # The step rows reduced per block (services.analysis.step_blocks); when set, `steps` is empty and the ledger
    # and views read this instead (storage keeps it up to date as rows arrive).
    step_summary: StepSummary | None = None


def events_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Control events -> the `events` frame (extra fields of a row are ignored)."""
    listed = rows if isinstance(rows, list) else list(rows)
    columns: dict[str, list[Any]] = {c: [row.get(c) for row in listed] for c in EVENT_COLUMNS}
    frame = pd.DataFrame(
        {
            "kind": pd.Series(columns["kind"], dtype=object),
            "time": pd.Series(columns["time"], dtype="float64"),
            **{c: pd.Series(columns[c], dtype="float64") for c in _NUMERIC_EVENT_FIELDS},
            "host": pd.Series(columns["host"], dtype=object),
            "ok": pd.Series(columns["ok"], dtype=object),
            "reason": pd.Series(columns["reason"], dtype=object),
            "status": pd.Series(columns["status"], dtype=object),
            "value": pd.Series(columns["value"], dtype=object),
            "digest": pd.Series(columns["digest"], dtype=object),
            "name": pd.Series(columns["name"], dtype=object),
            "detail": pd.Series(columns["detail"], dtype=object),
        }
    )
    return frame[list(EVENT_COLUMNS)]


def ranks_own(events: pd.DataFrame) -> pd.DataFrame:
    """The events the ranks sent themselves: all but what `goodput launch` observed of a worker (an `attempt_end`
    with `exit_code`, sent when torchrun saw the worker exit). Those name why an attempt failed; when it ended and
    when a rank was last seen come from the ranks' own records (docs/ledger.md, "Why an attempt failed")."""
    observed = events["exit_code"].notna()
    return events[~observed] if bool(observed.any()) else events


def steps_frame(
    attempt: Any = (), rank: Any = (), step: Any = (), start: Any = (), end: Any = (),
    loss: Any = None, lr: Any = None, comm: Any = None,
) -> pd.DataFrame:
    n = len(step)
    return pd.DataFrame(
        {
            "attempt": np.asarray(attempt, dtype=np.int64).reshape(n),
            "rank": np.asarray(rank, dtype=np.int64).reshape(n),
            "step": np.asarray(step, dtype=np.int64).reshape(n),
            "start": np.asarray(start, dtype=np.float64).reshape(n),
            "end": np.asarray(end, dtype=np.float64).reshape(n),
            "loss": _optional_floats(loss, n),
            "lr": _optional_floats(lr, n),
            "comm": _optional_floats(comm, n),
        },
        copy=False,  # one block per column: no 1.5 s copy into a 2-D block for a run of ten million steps
    )


def collectives_frame(
    attempt: Any = (), rank: Any = (), step: Any = (), op: Any = (), start: Any = (), end: Any = ()
) -> pd.DataFrame:
    n = len(step)
    return pd.DataFrame(
        {
            "attempt": np.asarray(attempt, dtype=np.int64).reshape(n),
            "rank": np.asarray(rank, dtype=np.int64).reshape(n),
            "step": np.asarray(step, dtype=np.int64).reshape(n),
            "op": pd.Series(list(op), dtype=object),
            "start": np.asarray(start, dtype=np.float64).reshape(n),
            "end": np.asarray(end, dtype=np.float64).reshape(n),
        }
    )


def _optional_floats(values: Any, n: int) -> np.ndarray:
    if values is None:
        return np.full(n, np.nan)
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        return values.astype(np.float64, copy=False).reshape(n)  # NaN already stands for "not reported"
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64).reshape(n)


def run_data_from_events(run_id: str, events: Iterable[Mapping[str, Any]]) -> RunData:
    """Wire-format events of one run (already validated) -> RunData. Events of other runs are skipped."""
    controls: list[Mapping[str, Any]] = []
    steps: dict[str, list[Any]] = {c: [] for c in STEP_COLUMNS}
    colls: dict[str, list[Any]] = {c: [] for c in COLLECTIVE_COLUMNS}
    for ev in events:
        if ev.get("run_id", run_id) != run_id:
            continue
        kind = ev["kind"]
        if kind == "step":
            _append_steps(steps, ev, [ev["step"]], [ev["start"]], [ev["end"]],
                          [ev.get("loss")], [ev.get("lr")], [ev.get("comm")])
        elif kind == "steps":
            n = len(ev["step"])
            _append_steps(steps, ev, ev["step"], ev["start"], ev["end"],
                          ev.get("loss") or [None] * n, ev.get("lr") or [None] * n, ev.get("comm") or [None] * n)
        elif kind == "collective":
            _append_collectives(colls, ev, [ev["step"]], [ev["op"]], [ev["start"]], [ev["end"]])
        elif kind == "collectives":
            _append_collectives(colls, ev, ev["step"], ev["op"], ev["start"], ev["end"])
        else:
            controls.append(ev)
    return RunData(
        run_id=run_id,
        events=events_frame(controls),
        steps=steps_frame(**steps),
        collectives=collectives_frame(**colls),
    )


def _append_steps(acc: dict[str, list[Any]], ev: Mapping[str, Any], step: Any, start: Any, end: Any,
                  loss: Any, lr: Any, comm: Any) -> None:
    n = len(step)
    acc["attempt"].extend([ev["attempt"]] * n)
    acc["rank"].extend([ev["rank"]] * n)
    acc["step"].extend(step)
    acc["start"].extend(start)
    acc["end"].extend(end)
    acc["loss"].extend(loss)
    acc["lr"].extend(lr)
    acc["comm"].extend(comm)


def _append_collectives(acc: dict[str, list[Any]], ev: Mapping[str, Any], step: Any, op: Any,
                        start: Any, end: Any) -> None:
    n = len(step)
    acc["attempt"].extend([ev["attempt"]] * n)
    acc["rank"].extend([ev["rank"]] * n)
    acc["step"].extend(step)
    acc["op"].extend(op)
    acc["start"].extend(start)
    acc["end"].extend(end)
