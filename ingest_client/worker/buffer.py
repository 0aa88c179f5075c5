"""Bounded, drop-oldest row buffer shared by the training thread and the flusher."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class RowBuffer:
    """A ``deque(maxlen=capacity)``: ``put`` never blocks, never takes a lock, never raises.

    When full, appending drops the oldest row; each drop is counted in ``dropped``. The count is
    approximate under concurrent drain (the flusher may pop between the length check and the
    append), which errs towards over-counting by at most a row per race.
    """

    __slots__ = ("_rows", "_capacity", "_wake_at", "wake", "dropped", "enabled")

    def __init__(self, capacity: int, wake_at: int) -> None:
        self._rows: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._capacity = capacity
        self._wake_at = max(1, min(wake_at, capacity))
        self.wake = threading.Event()
        self.dropped = 0
        self.enabled = True

    def put(self, row: tuple[Any, ...]) -> None:
        if not self.enabled:
            return
        rows = self._rows
        if len(rows) >= self._capacity:
            self.dropped += 1
        rows.append(row)  # O(1); deque.append is atomic under the GIL
        if len(rows) >= self._wake_at and not self.wake.is_set():
            self.wake.set()

    def drain(self) -> list[tuple[Any, ...]]:
        """Pop every row present now (flusher thread only)."""
        rows = self._rows
        popleft = rows.popleft
        out = []
        for _ in range(len(rows)):
            try:
                out.append(popleft())
            except IndexError:  # cleared concurrently (after fork); nothing left
                break
        return out

    def __len__(self) -> int:
        return len(self._rows)

    def disable(self) -> None:
        """Stop accepting rows and forget the ones held (used in a forked child)."""
        self.enabled = False
        self._rows.clear()
