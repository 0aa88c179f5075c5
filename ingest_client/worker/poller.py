"""The ``goodput-signals`` thread: polls ``GET {url}/v1/runs/{run_id}/signals`` for checkpoint requests.

The training thread never waits for it: :meth:`Tracker.should_checkpoint` reads one attribute this thread sets.
A failed poll (collector down, timeout, 404 before the run's first events arrive) changes nothing and costs
one rate-limited warning a minute at most; an answer that is not the collector's (a web page, a redirect, which
is never followed: it would take the token along) is said once. Each poll has a deadline for the whole request
(GOODPUT_HTTP_TIMEOUT_S). The thread never raises.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any
from urllib.parse import quote

from ingest_client.common.errors import report_internal_error
from ingest_client.transport.request import Answer, exchange
from ingest_client.worker.ratelimit import RateLimitedLogger

logger = logging.getLogger(__name__)


class SignalPoller:
    def __init__(self, base_url: str, run_id: str, *, interval_s: float, timeout_s: float,
                 token: str | None = None) -> None:
        self.url = f"{base_url.rstrip('/')}/v1/runs/{quote(run_id, safe='')}/signals"
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._headers = {"Accept": "application/json", "User-Agent": "goodput-ingest-client/1"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self.pending: int | None = None  # id of a checkpoint request not honoured yet (read by the training thread)
        self.failures = 0
        self._honoured: set[int] = set()
        self._stop = threading.Event()
        self._warn = RateLimitedLogger(logger)
        self._thread = threading.Thread(target=self._run, name="goodput-signals", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def take(self) -> int | None:
        """The pending request's id, now honoured: later polls ignore it even while the collector still lists it."""
        rid = self.pending
        if rid is not None:
            self._honoured.add(rid)
            self.pending = None
        return rid

    def poll_once(self) -> None:
        try:
            answer = exchange(self.url, method="GET", headers=self._headers, timeout_s=self.timeout_s)
        except (OSError, ValueError) as exc:
            self.failures += 1
            self._warn.warning("signals", "goodput: polling %s for checkpoint requests failed: %s", self.url, exc)
            return
        payload = _signals(answer)
        if payload is None:
            self.failures += 1
            if answer.status == 404:  # the collector has no event of this run yet
                return
            if answer.status < 400 or _signals_error(answer) is None:  # not the collector's answer: the URL is wrong
                self._warn.once("signals-foreign", "goodput: polling %s for checkpoint requests: it answered %s, not "
                                "the collector: check GOODPUT_URL (the collector's base URL, reached without a login "
                                "page or a redirect)", self.url, answer.describe())
            else:
                self._warn.warning("signals", "goodput: polling %s for checkpoint requests: HTTP %s %s", self.url,
                                   answer.status, _signals_error(answer))
            return
        found = payload.get("checkpoint_request")
        if not isinstance(found, dict):
            return
        rid = found.get("id")
        if isinstance(rid, int) and rid not in self._honoured:
            self.pending = rid

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll_once()
            except Exception as exc:  # never let a bug here reach training
                report_internal_error(exc)
                self._warn.warning("signals-internal", "goodput: internal error in the signal poller: %r", exc)


def _signals(answer: Answer) -> dict[str, Any] | None:
    """The collector's answer to a poll (``{"run_id", "server_time", "checkpoint_request"}``), or None."""
    if answer.status != 200:
        return None
    try:
        payload = json.loads(answer.body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) and "server_time" in payload else None


def _signals_error(answer: Answer) -> object:
    """The collector's error envelope's content, or None when the body is not one."""
    try:
        payload = json.loads(answer.body)
    except ValueError:
        return None
    return payload.get("error", payload.get("detail")) if isinstance(payload, dict) else None
