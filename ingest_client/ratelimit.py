"""A logger wrapper that emits the same warning at most once per interval."""

from __future__ import annotations

import logging
import time


class RateLimitedLogger:
    """Log warnings keyed by a short string, at most once per ``interval_s`` per key.

    Used by the background thread so that a dead collector costs one warning line a minute,
    not one per batch.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last_s: dict[str, float] = {}

    def warning(self, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``key`` was logged within the interval; return True if logged."""
        now = time.monotonic()
        last = self._last_s.get(key)
        if last is not None and now - last < self._interval_s:
            return False
        self._last_s[key] = now
        self._logger.warning(msg, *args)
        return True
