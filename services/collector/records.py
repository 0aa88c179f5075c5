"""A validated wire event (services.schemas.events) -> the IngestRecord that storage writes: the events' storage
mapping, kept out of the documents so that they import pydantic only.

A compact record's columns arrive as packed arrays (the standard library's `array`) and are read by NumPy without a
copy; a column the client did not send is a read-only view of one NaN that takes no memory.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np

from services.schemas.events import Collective, Collectives, Event, Step, Steps
from services.storage.records import SMALL, CollectiveRows, IngestRecord, StepRows

# Fields that IngestRecord has columns for; every other field of an event goes to its `data`.
_COLUMNS = {"event_id", "run_id", "kind", "time", "attempt", "rank", "step", "launch"}  # (never changed)


def record_of(event: Event) -> IngestRecord:
    """The record storage writes for one validated event."""
    compact = _COMPACT.get(type(event))
    return compact(event) if compact is not None else _plain(event)


def _plain(event: Event) -> IngestRecord:
    fields = event.model_dump(exclude=_COLUMNS, exclude_none=True)
    return IngestRecord(
        run_id=event.run_id, event_id=event.event_id, kind=event.kind,
        time=event.time, attempt=getattr(event, "attempt", None), rank=getattr(event, "rank", None),
        step=getattr(event, "step", None), data=fields or None, launch=getattr(event, "launch", None),
    )


def _step(event: Event) -> IngestRecord:
    assert isinstance(event, Step)
    rows = StepRows(
        step=np.array([event.step], dtype=np.int64), start=np.array([event.start]), end=np.array([event.end]),
        loss=np.array([_nan(event.loss)]), lr=np.array([_nan(event.lr)]), comm=np.array([_nan(event.comm)]),
    )
    return IngestRecord(run_id=event.run_id, event_id=event.event_id, kind=event.kind, time=event.time,
                        attempt=event.attempt, rank=event.rank, launch=event.launch, step=event.step, step_rows=rows)


def _steps(event: Event) -> IngestRecord:
    assert isinstance(event, Steps)
    n = len(event.step)
    rows = StepRows(
        step=_ints(event.step), start=_floats(event.start), end=_floats(event.end), loss=_nans(event.loss, n),
        lr=_nans(event.lr, n), comm=_nans(event.comm, n),
    )
    return IngestRecord(run_id=event.run_id, event_id=event.event_id, kind=event.kind, time=event.time,
                        attempt=event.attempt, rank=event.rank, launch=event.launch, step=_highest(event.step),
                        data={"n": n}, step_rows=rows)


def _collective(event: Event) -> IngestRecord:
    assert isinstance(event, Collective)
    rows = CollectiveRows(step=np.array([event.step], dtype=np.int64), op=[event.op],
                          start=np.array([event.start]), end=np.array([event.end]))
    return IngestRecord(run_id=event.run_id, event_id=event.event_id, kind=event.kind, time=event.time,
                        attempt=event.attempt, rank=event.rank, launch=event.launch, step=event.step,
                        collective_rows=rows)


def _collectives(event: Event) -> IngestRecord:
    assert isinstance(event, Collectives)
    rows = CollectiveRows(step=_ints(event.step), op=list(event.op), start=_floats(event.start),
                          end=_floats(event.end))
    return IngestRecord(run_id=event.run_id, event_id=event.event_id, kind=event.kind, time=event.time,
                        attempt=event.attempt, rank=event.rank, launch=event.launch, step=_highest(event.step),
                        data={"n": len(event.step)}, collective_rows=rows)


_COMPACT: dict[type[Event], Callable[[Event], IngestRecord]] = {
    Step: _step, Steps: _steps, Collective: _collective, Collectives: _collectives,
}


def _ints(values: array[int] | list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _highest(steps: array[int] | list[int]) -> int:
    """The highest step: Python's max up to SMALL values (a record's usual few), NumPy's above."""
    return int(max(steps)) if len(steps) <= SMALL else int(np.max(_ints(steps)))


def _floats(values: array[float] | list[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _nans(values: array[float] | list[float | None] | None, n: int) -> np.ndarray:
    """A column the client did not send: a read-only view of one NaN, n long, that takes no memory. (A column it
    sent is already a packed array: asarray reads it as it is.) Views of the usual lengths are made once:
    np.broadcast_to costs more than the rest of a small record's conversion."""
    if values is not None:
        return np.asarray(values, dtype=np.float64)
    if n < len(_NAN_VIEWS):
        return _NAN_VIEWS[n]
    return np.broadcast_to(np.float64(np.nan), (n,))


_NAN_VIEWS = [np.broadcast_to(np.float64(np.nan), (n,)) for n in range(1025)]  # read-only: safe to share
