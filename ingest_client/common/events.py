"""The wire format (docs/events.md, schema version 1) on the client side.

This module is the client's single source of truth for event kinds and field names. The training
thread only builds *rows* (small tuples, below); the flusher turns rows into wire records with
:class:`RecordBuilder`, packing the rows of one process into compact ``steps`` and
``collectives`` records.

Rows (built on the hot path, never validated there):

``(ROW_STEP, step, start, end, loss, lr)``
``(ROW_COLLECTIVE, step, op, start, end)``
``(ROW_EVENT, kind, time, fields)``   ``fields`` is a dict of the kind's extra fields, or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

SCHEMA_VERSION = 1
MAX_STEP = 2**53
MAX_OP_CHARS = 64
MAX_DETAIL_CHARS = 1000
MAX_DIGEST_CHARS = 128
MAX_CHECKPOINT_CHARS = 256  # a resume's `checkpoint` (path or id)
# Rows per compact record: keeps one record well under any sane body limit.
MAX_ROWS_PER_RECORD = 1000
# `time` must lie between 2000-01-01 and 2100-01-01.
MIN_TIME_S = 946684800.0
MAX_TIME_S = 4102444800.0

ROW_STEP = 0
ROW_COLLECTIVE = 1
ROW_EVENT = 2

# A wire record: a JSON object. Values are str/int/float/bool/None or lists of them.
Record = dict[str, Any]  # Any: JSON values of several shapes, checked by the builders below


class EventKind(str, Enum):
    RUN_SUBMITTED = "run_submitted"
    ALLOCATION_START = "allocation_start"
    ALLOCATION_END = "allocation_end"
    ATTEMPT_START = "attempt_start"
    RESUME = "resume"
    STEP = "step"
    STEPS = "steps"
    CHECKPOINT_START = "checkpoint_start"
    CHECKPOINT_END = "checkpoint_end"
    COLLECTIVE = "collective"
    COLLECTIVES = "collectives"
    HEARTBEAT = "heartbeat"
    DIGEST = "digest"
    ATTEMPT_END = "attempt_end"
    RUN_END = "run_end"
    CLIENT_STATS = "client_stats"
    PHASE_START = "phase_start"
    PHASE_END = "phase_end"


class Phase(str, Enum):
    """The phases a ``phase_start`` / ``phase_end`` pair may name (docs/events.md, "Phases")."""

    EVAL = "eval"  # validation or evaluation between training steps
    INIT_PROCESS_GROUP = "init_process_group"  # inside torch.distributed.init_process_group: waiting for peers


PHASE_NAMES = frozenset(p.value for p in Phase)


class AttemptEndReason(str, Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    PREEMPTED = "preempted"


class RunStatus(str, Enum):
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Kinds that carry `attempt` and `rank` (everything but the run-level kinds).
RUN_LEVEL_KINDS = frozenset(
    {EventKind.RUN_SUBMITTED, EventKind.ALLOCATION_START, EventKind.ALLOCATION_END, EventKind.RUN_END}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordContext:
    """What every record of one process shares. ``attempt``/``rank`` are None for the launcher; ``launch`` names
    the launch that numbered ``attempt`` (docs/events.md, "Attempt numbers")."""

    run_id: str
    attempt: int | None
    rank: int | None
    launch: str | None = None


def finite_or_none(value: object) -> float | None:
    """Return ``value`` as a finite float, or None (NaN/inf losses are not valid on the wire)."""
    if value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]  # also accepts 0-d tensors and numpy scalars
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def is_valid_step(step: object) -> bool:
    return type(step) is int and 0 <= step <= MAX_STEP


def is_valid_digest(value: object) -> bool:
    """1-128 printable characters (no control characters), as the collector accepts."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_DIGEST_CHARS
            and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value))


def _valid_resume_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """A resume's fields without an invalid ``checkpoint``/``checkpoint_step``/``digest`` (the step itself still
    counts)."""
    out = dict(fields)
    if "digest" in out and not is_valid_digest(out["digest"]):
        del out["digest"]
    if "checkpoint_step" in out and not is_valid_step(out["checkpoint_step"]):
        del out["checkpoint_step"]
    name = out.get("checkpoint")
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= MAX_CHECKPOINT_CHARS
                                 and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)):
        del out["checkpoint"]
    return out


def is_valid_time(t: object) -> bool:
    return isinstance(t, float | int) and MIN_TIME_S < t < MAX_TIME_S


class RecordBuilder:
    """Turn rows into wire records with deterministic, unique event ids ``<process id>-<seq>``."""

    def __init__(self, context: RecordContext, id_prefix: str) -> None:
        self._context = context
        self._id_prefix = id_prefix
        self._seq = 0
        self.invalid_rows = 0  # rows dropped because a field was out of range
        # Seconds inside collectives per in-progress step, sent as the step row's `comm` so the collector
        # can charge stragglers without reading every collective call. Collective rows of step s always
        # arrive before the step row of s (the step is recorded when it ends).
        self._comm_by_step: dict[int, float] = {}
        self._has_collectives = False

    def next_event_id(self) -> str:
        self._seq += 1
        return f"{self._id_prefix}-{self._seq}"

    def build(self, rows: Iterable[tuple[Any, ...]]) -> list[Record]:
        """Pack rows (in arrival order) into records: compact steps/collectives plus single events."""
        records: list[Record] = []
        steps: list[tuple[Any, ...]] = []
        collectives: list[tuple[Any, ...]] = []
        for row in rows:
            tag = row[0]
            if tag == ROW_STEP:
                steps.append(row)
            elif tag == ROW_COLLECTIVE:
                collectives.append(row)
            else:
                record = self._event_record(row)
                if record is not None:
                    records.append(record)
        for i in range(0, len(collectives), MAX_ROWS_PER_RECORD):
            self._append_packed(records, collectives[i : i + MAX_ROWS_PER_RECORD], self._collectives_record)
        for i in range(0, len(steps), MAX_ROWS_PER_RECORD):
            self._append_packed(records, steps[i : i + MAX_ROWS_PER_RECORD], self._steps_record)
        return records

    def _common(self, kind: str, time_s: float) -> Record:
        record: Record = {
            "event_id": self.next_event_id(),
            "run_id": self._context.run_id,
            "kind": kind,
            "time": float(time_s),
        }
        if kind not in RUN_LEVEL_KINDS and self._context.attempt is not None:
            record["attempt"] = self._context.attempt
            record["rank"] = self._context.rank
            if self._context.launch is not None:
                record["launch"] = self._context.launch
        return record

    def _event_record(self, row: tuple[Any, ...]) -> Record | None:
        _, kind, time_s, fields = row
        kind = EventKind(kind)
        if not is_valid_time(time_s):
            self.invalid_rows += 1
            return None
        if fields and "step" in fields and not is_valid_step(fields["step"]):
            self.invalid_rows += 1
            return None
        if kind is EventKind.DIGEST and not is_valid_digest(fields.get("value") if fields else None):
            self.invalid_rows += 1  # the collector would reject the whole batch for it
            return None
        if kind is EventKind.RESUME and fields:
            fields = _valid_resume_fields(fields)
        if kind in (EventKind.PHASE_START, EventKind.PHASE_END) and (fields or {}).get("name") not in PHASE_NAMES:
            self.invalid_rows += 1
            return None
        record = self._common(kind.value, time_s)
        if fields:
            record.update(fields)
        return record

    def _append_packed(
        self,
        records: list[Record],
        rows: list[tuple[Any, ...]],
        pack: Callable[[list[tuple[Any, ...]]], Record | None],
    ) -> None:
        if rows:
            record = pack(rows)
            if record is not None:
                records.append(record)

    def _span(self, step: Any, t0: Any, t1: Any) -> tuple[float, float] | None:
        """A step or collective row's start and end, its end no earlier than its start (a wall-clock step backwards
        must not make end < start); None, counted in `invalid_rows`, for an invalid step or start or no end."""
        start = finite_or_none(t0)
        end = finite_or_none(t1)
        if not is_valid_step(step) or start is None or end is None or not is_valid_time(start):
            self.invalid_rows += 1
            return None
        return start, max(start, end)

    def _steps_record(self, rows: list[tuple[Any, ...]]) -> Record | None:
        step: list[int] = []
        start: list[float] = []
        end: list[float] = []
        loss: list[float | None] = []
        lr: list[float | None] = []
        comm: list[float] = []
        for _, s, t0, t1, row_loss, row_lr in rows:
            span = self._span(s, t0, t1)
            if span is None:
                continue
            step.append(s)
            start.append(span[0])
            end.append(span[1])
            loss.append(finite_or_none(row_loss))
            lr.append(finite_or_none(row_lr))
            comm.append(min(self._comm_by_step.pop(s, 0.0), span[1] - span[0]))
        if not step:
            return None
        record = self._common(EventKind.STEPS.value, max(end))
        record["step"] = step
        record["start"] = start
        record["end"] = end
        if self._has_collectives:  # without any collective timing, comm is unknown rather than 0
            record["comm"] = comm
        for stale in [k for k in self._comm_by_step if k < min(step)]:
            del self._comm_by_step[stale]  # collectives of a step that never completed
        if any(v is not None for v in loss):
            record["loss"] = loss
        if any(v is not None for v in lr):
            record["lr"] = lr
        return record

    def _collectives_record(self, rows: list[tuple[Any, ...]]) -> Record | None:
        step: list[int] = []
        op: list[str] = []
        start: list[float] = []
        end: list[float] = []
        for _, s, row_op, t0, t1 in rows:
            span = self._span(s, t0, t1)
            if span is None:
                continue
            step.append(s)
            op.append(str(row_op)[:MAX_OP_CHARS] or "unknown")
            start.append(span[0])
            end.append(span[1])
            self._comm_by_step[s] = self._comm_by_step.get(s, 0.0) + (span[1] - span[0])
            self._has_collectives = True
        if not step:
            return None
        record = self._common(EventKind.COLLECTIVES.value, max(end))
        record["step"] = step
        record["op"] = op
        record["start"] = start
        record["end"] = end
        return record


def rows_in_record(record: Record) -> int:
    """How many logical events a record carries (the length of a compact record's arrays)."""
    steps = record.get("step")
    return len(steps) if isinstance(steps, list) else 1
