"""A small thread-safe in-process LRU of results keyed by run ((project, run id)) and valid for one version of it.

For results too big or too rarely read to store in the database (the straggler report, the resume check):
a new event (a new version) makes an entry stale exactly as it does for the stored ledger. Each process of
`goodput serve --workers N` has its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class VersionCache:
    def __init__(self, capacity: int = 32) -> None:
        self._capacity = capacity
        self._items: OrderedDict[Hashable, tuple[int, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: Hashable, version: int) -> dict[str, Any] | None:
        item = self.latest(run_id)
        return item[1] if item is not None and item[0] == version else None

    def latest(self, run_id: Hashable) -> tuple[int, dict[str, Any]] | None:
        """The newest entry of the run, whatever its version."""
        with self._lock:
            item = self._items.get(run_id)
            if item is not None:
                self._items.move_to_end(run_id)
            return item

    def put(self, run_id: Hashable, version: int, value: dict[str, Any]) -> None:
        with self._lock:
            current = self._items.get(run_id)
            if current is not None and current[0] > version:
                return  # a newer result is already here
            self._items[run_id] = (version, value)
            self._items.move_to_end(run_id)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
