"""End-of-attempt detection: normal exit, uncaught exception, SIGTERM; each chains what was there.

- ``atexit``: ``attempt_end(completed)`` (unless already ended), then ``shutdown(exit_timeout_s)``.
- ``sys.excepthook``: ``attempt_end(failed, detail="<Type>: <message>")``, then the previous hook.
- ``SIGTERM``: ``attempt_end(<sigterm_reason>)`` (unless already ended) and a short flush of whatever
  is still in memory, then the previous handler; if
  that was ``SIG_DFL``, restore it and re-raise the signal so the process still dies of SIGTERM. A SIGTERM that
  lands while its thread is inside a durable spool write is handled the moment that write has finished.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any

from ingest_client.common.errors import report_internal_error
from ingest_client.worker.tracker import Tracker

SIGTERM_FLUSH_TIMEOUT_S = 2.0


class ExitHooks:
    """Installs (and can uninstall) the three hooks for one tracker."""

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        self._prev_excepthook: Any = None  # Any: sys.excepthook's exact type is private
        self._prev_sigterm: Any = None  # Any: a handler, SIG_DFL, SIG_IGN or None
        self._sigterm_installed = False
        self._in_sigterm = False

    def install(self) -> None:
        atexit.register(self._at_exit)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        if threading.current_thread() is threading.main_thread():
            self._prev_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True

    def uninstall(self) -> None:
        atexit.unregister(self._at_exit)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if self._sigterm_installed and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._prev_sigterm if self._prev_sigterm is not None else signal.SIG_DFL)
            self._sigterm_installed = False

    def _at_exit(self) -> None:
        try:
            if self._tracker.end_attempt("completed") or self._tracker.enabled:
                self._tracker.shutdown(self._tracker.config.exit_timeout_s)
        except Exception as exc:
            report_internal_error(exc)

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            self._tracker.end_attempt("failed", detail=f"{exc_type.__name__}: {exc}")
        except Exception as err:
            report_internal_error(err)
        previous = self._prev_excepthook or sys.__excepthook__
        previous(exc_type, exc, tb)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._in_sigterm:  # a second SIGTERM during the first (Slurm and torchrun both send one): let it finish
            return
        if self._tracker.defer_while_spooling(lambda: self._on_sigterm(signum, frame)):
            return  # this thread was inside a durable write (an excepthook's attempt_end, say): handled right after
        self._in_sigterm = True
        tracker = self._tracker
        try:
            # Flush even if the attempt had already ended (an exception's excepthook, or exit in progress):
            # its last rows may still be in memory, and re-raising SIGTERM below ends the process at once.
            ended_now = tracker.end_attempt(_sigterm_reason(tracker.config.sigterm_reason), detail="SIGTERM")
            if ended_now or tracker.enabled:
                tracker.flush(min(SIGTERM_FLUSH_TIMEOUT_S, tracker.config.exit_timeout_s))
        except Exception as exc:
            report_internal_error(exc)
        previous = self._prev_sigterm
        if callable(previous):
            try:
                previous(signum, frame)
            finally:
                self._in_sigterm = False  # the previous handler returned: the next SIGTERM is handled again
        elif previous == signal.SIG_IGN:
            self._in_sigterm = False
            return
        else:  # SIG_DFL, or a handler not installed from Python: die of the signal as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


# Set by `goodput launch` under a scheduler: the file it creates when the scheduler signals it (preemption warning,
# SIGTERM). A worker's SIGTERM then means the scheduler ended the job (preempted), not torchrun stopping the
# survivors of a crashed worker (failed).
PREEMPTED_MARKER_ENV = "GOODPUT_PREEMPTED_MARKER"
PREEMPTED_MARKER_WAIT_S = 0.3  # the scheduler signals the launcher and the workers at the same moment


def _sigterm_reason(configured: str) -> str:
    marker = os.environ.get(PREEMPTED_MARKER_ENV, "").strip()
    if not marker or configured != "failed":
        return configured
    deadline = time.monotonic() + PREEMPTED_MARKER_WAIT_S
    while True:
        if os.path.exists(marker):
            return "preempted"
        if time.monotonic() >= deadline:
            return "failed"
        time.sleep(0.02)
