"""Plausibility of a validated batch: what its events claim, against configurable limits and against each other.

The wire models (services.collector.schemas.ingest) check each event alone against fixed bounds; this checks what
depends on settings or the collector's clock, and contradictions between events of one batch
(docs/events.md, "Plausibility limits"):

- a world size, rank + 1 or GPU count above `max_world_size`;
- a time (an event's, a step's or collective's start or end) more than `max_future_s` after the server's clock;
- a step or collective lasting more than `max_step_s`;
- inside the batch: an `attempt_end` before the same rank's `attempt_start` of that attempt, a `checkpoint_end`
  before the `checkpoint_start` that precedes it in the batch (same attempt, rank, step) or longer than
  `max_checkpoint_s`, an allocation
  (`allocation_start` to the next `allocation_end`) longer than `max_allocation_s`, and a second
  `allocation_start` of a run while its first is still open.

The first failure becomes an InvalidBatch (422) naming the event's index, id and field; nothing of the batch is
stored. Contradictions across batches are the ledger's to resolve (docs/ledger.md, "Contradicting inputs").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.errors import InvalidBatch
from services.settings import PlausibilitySettings
from services.storage.records import IngestRecord


def check_plausible(records: Sequence[IngestRecord], limits: PlausibilitySettings, *, now: float) -> None:
    """Raise InvalidBatch (422) for the first event of the batch that breaks a limit or contradicts another."""
    latest = now + limits.max_future_s
    for index, record in enumerate(records):
        _check_claims(index, record, limits)
        if record.time > latest:
            _fail(index, record, "time", f"time {record.time} is {record.time - now:.0f} s after the collector's "
                  f"clock ({now:.0f}), more than GOODPUT_MAX_FUTURE_S ({limits.max_future_s:g} s); check the "
                  "host's clock")
        rows = record.step_rows if record.step_rows is not None else record.collective_rows
        if rows is not None:
            _check_spans(index, record, rows.start, rows.end, limits, latest, now)
    _check_pairs(records, limits)


def _check_claims(index: int, record: IngestRecord, limits: PlausibilitySettings) -> None:
    data = record.data or {}
    cap = limits.max_world_size
    for name in ("world_size", "gpus"):
        value = data.get(name)
        if isinstance(value, int) and value > cap:
            _fail(index, record, name, f"{name} {value} is more than GOODPUT_MAX_WORLD_SIZE ({cap}); a larger job "
                  "needs the collector's limit raised")
    for name, value in (("rank", record.rank), ("local_rank", data.get("local_rank"))):
        if isinstance(value, int) and value >= cap:
            _fail(index, record, name, f"{name} {value} is not below GOODPUT_MAX_WORLD_SIZE ({cap})")


def _check_spans(index: int, record: IngestRecord, start: np.ndarray, end: np.ndarray,
                 limits: PlausibilitySettings, latest: float, now: float) -> None:
    compact = record.kind in ("steps", "collectives")
    if len(end):
        late = np.flatnonzero(end > latest)
        if len(late):
            i = int(late[0])
            _fail(index, record, f"end.{i}" if compact else "end",
                  f"end {float(end[i])} is {float(end[i]) - now:.0f} s after the collector's clock, more than "
                  f"GOODPUT_MAX_FUTURE_S ({limits.max_future_s:g} s); check the host's clock")
        long = np.flatnonzero(end - start > limits.max_step_s)
        if len(long):
            i = int(long[0])
            what = "step" if record.kind in ("step", "steps") else "collective"
            _fail(index, record, f"end.{i}" if compact else "end",
                  f"the {what} lasts {float(end[i] - start[i]):.0f} s (start {float(start[i])}, end "
                  f"{float(end[i])}), more than GOODPUT_MAX_STEP_S ({limits.max_step_s:g} s)")


def _check_pairs(records: Sequence[IngestRecord], limits: PlausibilitySettings) -> None:
    """Contradictions between events of the batch (duplicates of one event_id are the same event: skipped)."""
    seen: set[tuple[str, str]] = set()
    attempt_starts: dict[tuple[str, int, int], float] = {}
    checkpoint_starts: dict[tuple[str, int, int, int], float] = {}
    allocations: dict[str, list[tuple[float, int, int, IngestRecord]]] = {}
    pending: list[tuple[int, IngestRecord]] = []
    for index, record in enumerate(records):
        if (record.run_id, record.event_id) in seen:
            continue
        seen.add((record.run_id, record.event_id))
        kind = record.kind
        if kind == "attempt_start":
            key = (record.run_id, int(record.attempt or 0), int(record.rank or 0))
            attempt_starts[key] = min(record.time, attempt_starts.get(key, record.time))
        elif kind == "checkpoint_start":
            checkpoint_starts[_checkpoint_key(record)] = record.time
        elif kind == "checkpoint_end":
            # Judged against the start before it in the batch, not any start of the step: a step written twice
            # (Lightning's save_last copy) sends end 1, start 2, end 2, and a batch may begin at end 1.
            _check_checkpoint_end(index, record, checkpoint_starts.get(_checkpoint_key(record)), limits)
        elif kind in ("allocation_start", "allocation_end"):
            # ends sort before starts at the same time: an end and the next start at one instant is a requeue
            allocations.setdefault(record.run_id, []).append(
                (record.time, 1 if kind == "allocation_start" else 0, index, record))
        if kind == "attempt_end":
            pending.append((index, record))
    for index, record in pending:  # an attempt has one start per rank: judged against it, whichever came first
        started = attempt_starts.get((record.run_id, int(record.attempt or 0), int(record.rank or 0)))
        if started is not None and record.time < started:
            _fail(index, record, "time", f"attempt_end at {record.time} is before the same rank's "
                  f"attempt_start of attempt {record.attempt} at {started}; an attempt cannot end before it "
                  "starts (check the host's clock)")
    for run_events in allocations.values():
        _check_allocations(sorted(run_events, key=lambda e: (e[0], e[1], e[2])), limits)


def _checkpoint_key(record: IngestRecord) -> tuple[str, int, int, int]:
    return record.run_id, int(record.attempt or 0), int(record.rank or 0), int(record.step or 0)


def _check_checkpoint_end(index: int, record: IngestRecord, started: float | None,
                          limits: PlausibilitySettings) -> None:
    if started is None:
        return  # its start came in an earlier batch
    if record.time < started:
        _fail(index, record, "time", f"checkpoint_end at {record.time} is before its checkpoint_start at "
              f"{started} (attempt {record.attempt}, rank {record.rank}, step {record.step})")
    if record.time - started > limits.max_checkpoint_s:
        _fail(index, record, "time", f"the checkpoint lasts {record.time - started:.0f} s, more than "
              f"GOODPUT_MAX_CHECKPOINT_S ({limits.max_checkpoint_s:g} s)")


def _check_allocations(ordered: list[tuple[float, int, int, IngestRecord]], limits: PlausibilitySettings) -> None:
    open_start: IngestRecord | None = None
    for time, is_start, index, record in ordered:
        if is_start:
            if open_start is not None:
                _fail(index, record, "kind", f"a second allocation_start at {time} while the allocation started at "
                      f"{open_start.time} (event_id {open_start.event_id!r}) has no allocation_end in this batch; "
                      "send the first one's allocation_end before a new allocation starts")
            open_start = record
        elif open_start is not None:
            if time - open_start.time > limits.max_allocation_s:
                _fail(index, record, "time", f"the allocation lasts {time - open_start.time:.0f} s (from "
                      f"{open_start.time}), more than GOODPUT_MAX_ALLOCATION_S ({limits.max_allocation_s:g} s)")
            open_start = None


def _fail(index: int, record: IngestRecord, field: str, message: str) -> None:
    raise InvalidBatch(f"event {index} (event_id {record.event_id!r}): field {field!r}: {message}; the whole batch "
                       "was rejected, nothing stored", status=422, code="invalid_event", index=index,
                       event_id=record.event_id, field=field)

