"""``init()``: build the one Tracker of this process from arguments, environment and defaults."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from ingest_client.config import ClientConfig
from ingest_client.context import context_from_env
from ingest_client.signals import ExitHooks
from ingest_client.tracker import Tracker
from ingest_client.transport.base import Transport

logger = logging.getLogger("ingest_client")

_lock = threading.Lock()
_tracker: Tracker | None = None
_hooks: ExitHooks | None = None


def init(
    run_id: str | None = None,
    url: str | None = None,
    token: str | None = None,
    mode: str | None = None,
    spool_dir: str | Path | None = None,
    *,
    transport: Transport | None = None,
    **options: object,
) -> Tracker:
    """Create, start and return this process's Tracker; raises ConfigError on bad configuration.

    Each argument falls back to its ``GOODPUT_*`` variable, then to its default (see
    :mod:`ingest_client.config`); ``options`` are the other ClientConfig fields
    (``queue_capacity``, ``spool_max_bytes``, ``sigterm_reason``, ``install_handlers``, ...).
    A second call in the same process returns the running tracker.
    """
    global _tracker, _hooks
    with _lock:
        if _tracker is not None and _tracker._pid == os.getpid() and _tracker.enabled:
            logger.warning("goodput.init() called again; returning the running tracker")
            return _tracker
        config = ClientConfig.from_env(
            run_id=run_id, url=url, token=token, mode=mode, spool_dir=spool_dir, **options
        )
        context = context_from_env(run_id=config.run_id, attempt_base=config.attempt_base)
        tracker = Tracker(config, context, transport=transport).start()
        if config.install_handlers and tracker.enabled:
            _hooks = ExitHooks(tracker)
            _hooks.install()
        _tracker = tracker
        return tracker


def get_tracker() -> Tracker | None:
    """The tracker made by ``init()`` in this process, if any."""
    return _tracker


def reset_for_tests(timeout_s: float = 1.0) -> None:
    """Shut the global tracker down and uninstall its hooks (test isolation)."""
    global _tracker, _hooks
    with _lock:
        if _hooks is not None:
            _hooks.uninstall()
            _hooks = None
        if _tracker is not None:
            _tracker.shutdown(timeout_s)
            _tracker = None
