"""Errors raised by the ingest client.

Only ``init()`` (and the CLI entry points) raise; after ``init()`` the client never raises into
training code. Failures on the background thread become counters and rate-limited warnings.

    GoodputClientError
    ├── ConfigError          bad configuration (argument or GOODPUT_* environment variable)
    └── TransportError       a send failed (used inside transports; never escapes the flusher)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger("ingest_client")


class GoodputClientError(Exception):
    """Base class of every error raised by ``ingest_client``."""


class ConfigError(GoodputClientError, ValueError):
    """The client configuration is invalid; the message names the setting and its env var."""


class TransportError(GoodputClientError):
    """A batch could not be delivered (connection error, timeout, bad answer)."""


# Tests install a hook that collects errors swallowed on background threads, so that a bug in
# the flusher fails the test instead of becoming a silent counter (Sentry's `internal_exceptions`).
_internal_error_hook: Callable[[BaseException], None] | None = None


def set_internal_error_hook(hook: Callable[[BaseException], None] | None) -> None:
    """Install (or remove, with None) a callback that sees every swallowed internal error."""
    global _internal_error_hook
    _internal_error_hook = hook


def report_internal_error(exc: BaseException) -> None:
    """Record an unexpected error caught on a background path; never raises."""
    hook = _internal_error_hook
    if hook is not None:
        hook(exc)
