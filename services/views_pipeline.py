"""Where storage and the dashboard's read models meet: load a run, build its views, keep them while unchanged.

The ledger is cached in the database by `services.pipeline`; the views are bigger and only the dashboard reads
them, so they live in a small in-process LRU keyed by (run_id, version) instead of a column: no migration,
and a new event (a new version) makes the entry stale exactly as it does for the ledger. Each process of
`goodput serve --workers N` has its own cache.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from sqlalchemy import Engine

from services.analysis.views import build_run_views
from services.pipeline import ledger_for_row
from services.storage.load import RunRow, get_run, load_run_data

logger = logging.getLogger(__name__)


class ViewsCache:
    """A thread-safe LRU of view dicts keyed by (run_id, version)."""

    def __init__(self, capacity: int = 32) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, tuple[int, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}

    def build_lock(self, run_id: str) -> threading.Lock:
        """One builder per run at a time: concurrent requests for a changed run wait for the first one."""
        with self._lock:
            return self._building.setdefault(run_id, threading.Lock())

    def get(self, run_id: str, version: int) -> dict[str, Any] | None:
        with self._lock:
            item = self._items.get(run_id)
            if item is None or item[0] != version:
                return None
            self._items.move_to_end(run_id)
            return item[1]

    def put(self, run_id: str, version: int, views: dict[str, Any]) -> None:
        with self._lock:
            self._items[run_id] = (version, views)
            self._items.move_to_end(run_id)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_CACHE = ViewsCache()


def views_for_run(engine: Engine, run_id: str, *, cache: ViewsCache = _CACHE) -> tuple[dict[str, Any], dict[str, Any]]:
    """(views, ledger) of the run; both describe the same stored version of the run."""
    with engine.connect() as conn:
        run = get_run(conn, run_id)
    return views_for_row(engine, run, cache=cache)


def views_for_row(engine: Engine, run: RunRow, *, cache: ViewsCache = _CACHE) -> tuple[dict[str, Any], dict[str, Any]]:
    ledger = ledger_for_row(engine, run)
    cached = cache.get(run.run_id, run.version)
    if cached is not None:
        return cached, ledger
    with cache.build_lock(run.run_id):
        cached = cache.get(run.run_id, run.version)  # built by the request we waited for
        if cached is not None:
            return cached, ledger
        return _build(engine, run, ledger, cache), ledger


def _build(engine: Engine, run: RunRow, ledger: dict[str, Any], cache: ViewsCache) -> dict[str, Any]:
    started = time.perf_counter()
    with engine.connect() as conn:
        data = load_run_data(conn, run)
    loaded = time.perf_counter()
    views = build_run_views(data, ledger)
    views["version"] = run.version
    cache.put(run.run_id, run.version, views)
    logger.info("views built for run %s (version %d): load %.2f s, analysis %.2f s", run.run_id, run.version,
                loaded - started, time.perf_counter() - loaded)
    return views
