"""What a collector process keeps of the runs it built, so that the next build of a live run reads only what changed
(services.storage.step_blocks): decoded step blocks, long runs' sealed blocks, and control events.

A block is read and decoded again only when its summary changed (its `changes` differ from the ones it was decoded
at; folding puts the new summary in directly). Control events are read again only when their count grew (they are
only ever added: retention deletes raw events only, never these), and then only the new ones.

All three share one bound in bytes, so that a process serving many live runs keeps every one of them warm while they
fit: a bound by count of runs (32, before) made a fleet's 40 live runs evict each other in turn, and the evicted
run's next build read the whole run again.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import pandas as pd

from services.analysis.rank_sketch import RankSketch
from services.analysis.step_blocks import BlockSteps, StepBlock

BlockKey = tuple[int, int, int]  # (run pk, attempt, block)


@dataclass(frozen=True, slots=True)
class KeptEvents:
    ids: frozenset[str]
    frame: pd.DataFrame
    renumbered: int = 0  # the run's renumbering they were read at (services.storage.attempt_numbers)
    nbytes: int = field(init=False, compare=False)  # what they hold: the frame with its strings, the ids

    def __post_init__(self) -> None:  # measured once (~2 ms for a thousand events), not at every look-up
        object.__setattr__(self, "nbytes", int(self.frame.memory_usage(index=True, deep=True).sum())
                           + sys.getsizeof(self.ids) + sum(sys.getsizeof(i) for i in self.ids))


@dataclass(frozen=True, slots=True)
class SealedBlocks:
    """A long run's closed blocks folded into one sketch (services.analysis.rank_sketch), with the `changes` each
    was summarised at and its per-step figures. Never changed once made: a build that folds more makes a new one."""

    changes: dict[tuple[int, int], int]  # (attempt, block) -> changes, blocks without rows included
    sketch: RankSketch
    steps: tuple[BlockSteps, ...]

    @property
    def nbytes(self) -> int:
        return self.sketch.nbytes + sum(s.nbytes for s in self.steps)


class SummaryCache:
    """Decoded step blocks (keyed by run, attempt, block and the `changes` they were summarised at), the sealed
    blocks of long runs (`SealedBlocks`) and the runs' control events (`KeptEvents`): at most `capacity_bytes` of
    all three, the least recently used blocks out first, then sealed runs, then events (module docstring).
    Thread-safe; one per analysis cache."""

    def __init__(self, capacity_bytes: int = 1 << 30) -> None:
        self._capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._blocks: OrderedDict[BlockKey, tuple[int, StepBlock | None]] = OrderedDict()
        self._bytes = 0
        self._events: OrderedDict[int, KeptEvents] = OrderedDict()
        self._sealed: OrderedDict[int, SealedBlocks] = OrderedDict()
        self._report_size: Callable[[int], None] = _ignore

    @property
    def nbytes(self) -> int:
        """Bytes held now (at most `capacity_bytes`): decoded blocks, sealed runs, control events."""
        return self._bytes

    def report_size_to(self, report: Callable[[int], None]) -> None:
        """Call `report` with the bytes held whenever they change (the collector's gauge of them)."""
        self._report_size = report
        report(self._bytes)

    def block(self, key: BlockKey, changes: int) -> tuple[bool, StepBlock | None]:
        """(found, the block's summary; None: a block without rows) for the block summarised at `changes`."""
        with self._lock:
            kept = self._blocks.get(key)
            if kept is None or kept[0] != changes:
                return False, None
            self._blocks.move_to_end(key)
            return True, kept[1]

    def keep_block(self, key: BlockKey, changes: int, summary: StepBlock | None) -> None:
        size = _size(summary)
        if size > self._capacity_bytes:
            return
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                if old[0] > changes:  # a newer summary is already here
                    self._blocks[key] = old
                    return
                self._bytes -= _size(old[1])
            self._blocks[key] = (changes, summary)
            self._bytes += size
            self._evict()
            held = self._bytes
        self._report_size(held)

    def _evict(self) -> None:
        while self._bytes > self._capacity_bytes and (self._blocks or self._sealed or self._events):
            if self._blocks:
                _, (_, dropped) = self._blocks.popitem(last=False)
                self._bytes -= _size(dropped)
            elif self._sealed:
                self._bytes -= self._sealed.popitem(last=False)[1].nbytes
            else:
                self._bytes -= self._events.popitem(last=False)[1].nbytes

    def drop_block(self, key: BlockKey) -> None:
        """Forget one block (its values went into the run's sealed sketch)."""
        with self._lock:
            kept = self._blocks.pop(key, None)
            if kept is None:
                return
            self._bytes -= _size(kept[1])
            held = self._bytes
        self._report_size(held)

    def sealed(self, run_pk: int) -> SealedBlocks | None:
        with self._lock:
            return _touch(self._sealed, run_pk)

    def keep_sealed(self, run_pk: int, sealed: SealedBlocks) -> None:
        with self._lock:
            old = self._sealed.pop(run_pk, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._sealed[run_pk] = sealed
            self._bytes += sealed.nbytes
            self._evict()
            held = self._bytes
        self._report_size(held)

    def events(self, run_pk: int) -> KeptEvents | None:
        with self._lock:
            return _touch(self._events, run_pk)

    def keep_events(self, run_pk: int, kept: KeptEvents) -> None:
        with self._lock:
            old = self._events.pop(run_pk, None)
            if old is not None:
                self._bytes -= old.nbytes
            if kept.nbytes <= self._capacity_bytes:
                self._events[run_pk] = kept
                self._bytes += kept.nbytes
                self._evict()
            held = self._bytes
        self._report_size(held)

    def holds(self, run_pk: int) -> bool:
        """Whether the run was read here before (its control events are kept): a build of it reads what changed."""
        with self._lock:
            return run_pk in self._events

    def forget(self, run_pk: int) -> None:
        """Drop what is kept of a run (pruned: never built again)."""
        with self._lock:
            events = self._events.pop(run_pk, None)
            if events is not None:
                self._bytes -= events.nbytes
            sealed = self._sealed.pop(run_pk, None)
            if sealed is not None:
                self._bytes -= sealed.nbytes
            for key in [k for k in self._blocks if k[0] == run_pk]:
                _, summary = self._blocks.pop(key)
                self._bytes -= _size(summary)
            held = self._bytes
        self._report_size(held)

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._events.clear()
            self._sealed.clear()
            self._bytes = 0
        self._report_size(0)


def _ignore(_: int) -> None:
    pass


def _size(summary: StepBlock | None) -> int:
    """Bytes a kept block holds (None: a block without rows)."""
    return summary.nbytes if summary is not None else 0


_V = TypeVar("_V")


def _touch(kept: OrderedDict[int, _V], run_pk: int) -> _V | None:
    """The run's entry, made the most recently used."""
    value = kept.get(run_pk)
    if value is not None:
        kept.move_to_end(run_pk)
    return value
