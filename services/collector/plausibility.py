"""Plausibility of a validated batch: what each of its events claims, against configurable limits.

The wire models (services.schemas.events) check each event alone against fixed bounds; this checks what
depends on settings or the collector's clock (docs/events.md, "Plausibility limits"):

- a world size, rank + 1 or GPU count above `max_world_size`;
- a time (an event's, a step's or collective's start or end) more than `max_future_s` after the server's clock;
- a step or collective lasting more than `max_step_s`.

Every rule judges one event on its own, never one event against another: where a sender cuts its stream into
batches is its own affair (a requeue's replay sends the dead allocation's events and the new allocation's start
together), so the same events must be accepted however they are batched. Events that contradict each other are
the ledger's to resolve, in one batch as across batches (docs/ledger.md, "Contradicting inputs").

The first failure becomes an InvalidBatch (422) naming the event's index, id and field; nothing of the batch is
stored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.errors import InvalidBatch
from services.settings import PlausibilitySettings
from services.storage.records import SMALL, IngestRecord


def check_plausible(records: Sequence[IngestRecord], limits: PlausibilitySettings, *, now: float) -> None:
    """Raise InvalidBatch (422) for the first event of the batch that breaks a limit or contradicts another."""
    latest = now + limits.max_future_s
    spans_ok = _spans_plausible(records, limits, latest)
    for index, record in enumerate(records):
        _check_claims(index, record, limits)
        if record.time > latest:
            _fail(index, record, "time", f"time {record.time} is {record.time - now:.0f} s after the collector's "
                  f"clock ({now:.0f}), more than GOODPUT_MAX_FUTURE_S ({limits.max_future_s:g} s); check the "
                  "host's clock")
        rows = record.step_rows if record.step_rows is not None else record.collective_rows
        if rows is not None and not spans_ok:
            _check_spans(index, record, rows.start, rows.end, limits, latest, now)


def _spans_plausible(records: Sequence[IngestRecord], limits: PlausibilitySettings, latest: float) -> bool:
    """Whether every step and collective row of the batch is within the limits: all records' rows at once (a batch
    of small records costs a few array operations, not a few per record). When not, `_check_spans` finds and names
    the first record that breaks one."""
    spans = [rows for r in records
             if (rows := r.step_rows if r.step_rows is not None else r.collective_rows) is not None]
    if not spans:
        return True
    if len(spans) == 1:
        start, end = spans[0].start, spans[0].end
    else:
        start = np.concatenate([rows.start for rows in spans])
        end = np.concatenate([rows.end for rows in spans])
    # (a NaN fails both: the record-by-record check then decides, as it always did)
    if len(end) <= SMALL:  # up to SMALL rows (a small request's few): Python's comparisons, not NumPy's calls
        longest = limits.max_step_s
        return all(e <= latest and e - s <= longest for s, e in zip(start.tolist(), end.tolist(), strict=True))
    return float(end.max()) <= latest and float((end - start).max()) <= limits.max_step_s


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


def _fail(index: int, record: IngestRecord, field: str, message: str) -> None:
    raise InvalidBatch(f"event {index} (event_id {record.event_id!r}): field {field!r}: {message}; the whole batch "
                       "was rejected, nothing stored", status=422, code="invalid_event", index=index,
                       event_id=record.event_id, field=field)

