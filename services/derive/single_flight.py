"""At most one analysis per run and kind at a time in this process; everyone who asks shares its result.

Analysing a big run reads every step it has (seconds for millions of rows). Without this, a dashboard that
polls a live run, or ten people opening the same run, would start one full analysis per request, each for a
slightly newer version, and the work would pile up faster than it finishes. Here a request for a run whose
analysis is already running waits for that one (or, with a budget, takes what is stored) instead.

Each computation runs on its own daemon thread, so a caller can stop waiting (`wait(budget_s)`) without
cancelling it: the result is stored by the computation itself and the next request finds it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def run_key(engine: Any, run: Hashable) -> tuple[str, Hashable]:
    """A run's key in one database: two databases (tests, several collectors in one process) never share."""
    return str(engine.url), run


class SingleFlight(Generic[T]):
    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._running: dict[Hashable, Future[T]] = {}

    def submit(self, key: Hashable, compute: Callable[[], T]) -> Future[T]:
        """The running computation for `key`, or a new one started with `compute`."""
        with self._lock:
            future = self._running.get(key)
            if future is not None:
                return future
            future = Future()
            self._running[key] = future
        thread = threading.Thread(target=self._run, args=(key, future, compute), daemon=True,
                                  name=f"goodput-{self._name}")
        thread.start()
        return future

    def running(self, key: Hashable) -> Future[T] | None:
        with self._lock:
            return self._running.get(key)

    def _run(self, key: Hashable, future: Future[T], compute: Callable[[], T]) -> None:
        try:
            result = compute()
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter
            with self._lock:
                self._running.pop(key, None)
            future.set_exception(exc)
        else:
            with self._lock:
                self._running.pop(key, None)
            future.set_result(result)


class Pace:
    """When a background refresh of a run may start: not before `factor` x the last refresh's duration has
    passed since it finished (and at least `min_interval_s`), so refreshing a big live run in the background
    costs at most about 1/factor of a core however often its pages are polled. A small run (milliseconds to
    analyse) refreshes as soon as it is asked."""

    def __init__(self, factor: float = 4.0, min_interval_s: float = 0.0, capacity: int = 10_000) -> None:
        self._factor = factor
        self._min_interval_s = min_interval_s
        self._capacity = capacity
        self._lock = threading.Lock()
        self._last: dict[Hashable, tuple[float, float]] = {}  # key -> (finished, seconds), monotonic clock

    def record(self, key: Hashable, finished: float, seconds: float) -> None:
        with self._lock:
            if len(self._last) >= self._capacity:
                self._last.clear()
            self._last[key] = (finished, seconds)

    def due(self, key: Hashable, now: float) -> bool:
        with self._lock:
            last = self._last.get(key)
        if last is None:
            return True
        finished, seconds = last
        return now - finished >= max(self._min_interval_s, self._factor * seconds)
