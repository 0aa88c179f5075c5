"""Phases of a training process outside its steps: ``with tracker.phase("eval"):``.

A phase is a ``phase_start`` / ``phase_end`` pair naming one of :class:`ingest_client.common.events.Phase`
(docs/events.md, "Phases"). Both are durable: the start is on disk before the phase runs, so a process killed inside
it still left it; the end says whether the block raised (``ok``). Each carries ``step``, the last step completed
when the phase began, so the collector pairs the ranks' starts and ends of one phase as it pairs their checkpoint
writes.

Phases happen a few times per attempt or every N steps (evaluation), never inside a step: two durable writes each.
On a CUDA job (steps on the GPU's timeline) an ``eval`` phase waits for the GPU at both ends, as a checkpoint does
at its start: it begins when the steps queued before it have run, and ends when its own GPU work has, so neither
is counted in the other (docs/timing.md). ``init_process_group`` runs before the first step and waits for nothing.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any, Protocol

from ingest_client.common.events import PHASE_NAMES, ROW_EVENT, EventKind, Phase

logger = logging.getLogger("ingest_client")
_warned: set[str] = set()


class PhaseRecorder(Protocol):
    """What a phase needs of its tracker (:class:`ingest_client.worker.tracker.Tracker` is one)."""

    _next_step: int

    def _wait_for_device(self) -> None: ...

    def _durable(self, row: tuple[Any, ...]) -> None: ...


class PhaseSpan:
    """``with tracker.phase(name):``; also usable as ``span.__enter__()`` / ``span.__exit__(...)`` from framework
    hooks that see the start and the end in different calls. An unknown name records nothing (warned once)."""

    __slots__ = ("_tracker", "name", "step", "_open")

    def __init__(self, tracker: PhaseRecorder, name: str | Phase) -> None:
        self._tracker = tracker
        self.name = name.value if isinstance(name, Phase) else str(name)
        self.step = 0
        self._open = False
        if self.name not in PHASE_NAMES and self.name not in _warned:
            _warned.add(self.name)
            logger.warning("goodput: tracker.phase(%r) is not a phase goodput knows (%s); it is not recorded",
                           self.name, ", ".join(sorted(PHASE_NAMES)))

    def __enter__(self) -> PhaseSpan:
        if self.name in PHASE_NAMES:
            if self.name == Phase.EVAL.value:
                self._tracker._wait_for_device()
            self.step = self._tracker._next_step - 1
            self._open = True
            self._tracker._durable((ROW_EVENT, EventKind.PHASE_START, time.time(),
                                    {"name": self.name, "step": self.step}))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._open:
            self._open = False
            if self.name == Phase.EVAL.value and exc_type is None:
                self._tracker._wait_for_device()
            self._tracker._durable((ROW_EVENT, EventKind.PHASE_END, time.time(),
                                    {"name": self.name, "step": self.step, "ok": exc_type is None}))
