"""What the collector hands to storage: validated events, normalised, independent of the wire models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

SERIES_KINDS = frozenset({"step", "steps", "collective", "collectives"})
SMALL = 64  # up to this many values, Python over a list beats NumPy's calls (a min or max: ~0.4 us against ~2)


def column_max(values: np.ndarray) -> float:
    """The largest of a column without NaN, as a Python number (an int for an integer column: a 64-bit step stays
    exact). A request's path takes several per record, of a record's usual few values: lists, not NumPy, up to SMALL."""
    largest: float = max(values.tolist()) if len(values) <= SMALL else values.max().item()
    return largest


def column_min(values: np.ndarray) -> float:
    """The smallest of a column without NaN (`column_max` says how)."""
    smallest: float = min(values.tolist()) if len(values) <= SMALL else values.min().item()
    return smallest


# The records and their rows are built once per event on every request's path: plain slotted classes, not frozen
# ones (a frozen dataclass sets each field through object.__setattr__: x2.8 the construction of an IngestRecord).
# Nothing changes them once built; storage makes new ones (dataclasses.replace) where it must.
@dataclass(slots=True)
class StepRows:
    step: np.ndarray  # int64
    start: np.ndarray  # float64
    end: np.ndarray
    loss: np.ndarray  # float64, NaN = not reported
    lr: np.ndarray
    comm: np.ndarray

    def take(self, which: np.ndarray | slice) -> StepRows:
        """These rows where a boolean mask is true, or a slice of them (numpy's indexing of every column)."""
        return StepRows(self.step[which], self.start[which], self.end[which], self.loss[which], self.lr[which],
                        self.comm[which])


@dataclass(slots=True)
class CollectiveRows:
    step: np.ndarray
    op: list[str]
    start: np.ndarray
    end: np.ndarray


@dataclass(slots=True, kw_only=True)
class IngestRecord:
    run_id: str
    event_id: str
    kind: str
    time: float
    attempt: int | None = None  # as sent: within `launch`; the run's number once storage numbered it
    rank: int | None = None
    step: int | None = None
    data: dict[str, Any] | None = None  # the kind's other fields, stored as JSON
    launch: str | None = None  # the launch the process belongs to (docs/events.md, "Attempt numbers")
    step_rows: StepRows | None = None
    collective_rows: CollectiveRows | None = None

    def renumbered(self, attempt: int) -> IngestRecord:
        """This record keyed by its run's attempt number, which says all its launch said (dataclasses.replace, by
        hand: it runs for every record of a launch, and replace costs x3.6 the construction)."""
        return IngestRecord(run_id=self.run_id, event_id=self.event_id, kind=self.kind, time=self.time,
                            attempt=attempt, rank=self.rank, step=self.step, data=self.data, launch=None,
                            step_rows=self.step_rows, collective_rows=self.collective_rows)


@dataclass(frozen=True, slots=True, kw_only=True)
class EventConflict:
    """A batch's event whose id is already stored (or earlier in the same write) for its run with other content."""

    index: int  # position of the event in its batch
    event_id: str
    run_id: str


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    duplicates: int
    conflict: EventConflict | None = None  # set when the batch was refused whole (nothing of it stored)
