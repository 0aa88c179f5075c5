"""A logger wrapper that emits the same warning at most once per interval, or once for good."""

from __future__ import annotations

import logging
import sys
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
        self._said: set[str] = set()

    def warning(self, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``key`` was logged within the interval; return True if logged."""
        now = time.monotonic()
        last = self._last_s.get(key)
        if last is not None and now - last < self._interval_s:
            return False
        self._last_s[key] = now
        self._logger.warning(msg, *args)
        return True

    def once(self, key: str, msg: str, *args: object) -> bool:
        """Say ``msg % args`` the first time ``key`` comes, never again: for what a person must act on (records
        kept but not sent, records not kept). Through logging when the application gave it a handler, else on
        stderr (the client installs only a NullHandler, so its warnings would otherwise reach nobody)."""
        if key in self._said:
            return False
        self._said.add(key)
        self._last_s[key] = time.monotonic()  # warning() with the same key repeats it a whole interval later
        if not self._logger.isEnabledFor(logging.WARNING):
            return False
        if reaches_a_handler(self._logger):
            self._logger.warning(msg, *args)
        else:
            try:
                sys.stderr.write((msg % args if args else msg) + "\n")
            except (AttributeError, OSError, ValueError):  # no stderr, or a closed one: nobody to tell
                return False
        return True


def reaches_a_handler(logger: logging.Logger) -> bool:
    """Whether a warning logged on ``logger`` reaches a handler other than a NullHandler."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) and h.level <= logging.WARNING for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False
