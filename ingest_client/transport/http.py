"""POST batches to ``{url}/v1/events`` with urllib (flusher thread only)."""

from __future__ import annotations

import email.utils
import gzip
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from ingest_client.transport.base import SendResult, SendStatus, encode_batch

GZIP_MIN_BYTES = 1024
REJECTED_STATUSES = frozenset({400, 401, 403, 413, 422})
MAX_RETRY_AFTER_S = 300.0
# A collector's pace beyond this is taken as this: a live figure never lags its events by more because of it
MAX_SEND_INTERVAL_S = 30.0
_MAX_MESSAGE_CHARS = 300


class HttpTransport:
    """Sends one batch per call. Other 4xx/5xx answers are retried (the data stays in the spool),
    since they more likely mean a misrouted URL or a broken deployment than a bad batch."""

    def __init__(self, events_url: str, *, token: str | None = None, timeout_s: float = 2.0,
                 sender: str | None = None) -> None:
        self.events_url = events_url
        self._timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json", "User-Agent": "goodput-ingest-client/1"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        if sender:  # the collector counts distinct senders to set its pace (Goodput-Send-Interval)
            self._headers["Goodput-Sender"] = sender

    def send(self, events: Sequence[bytes], /, *, timeout_s: float | None = None) -> SendResult:
        body = encode_batch(events)
        headers = dict(self._headers)
        if len(body) > GZIP_MIN_BYTES:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        timeout = self._timeout_s if timeout_s is None else max(0.05, min(timeout_s, self._timeout_s))
        # this host's clock as it sends: the collector measures the clock against its own (docs/events.md)
        headers["Goodput-Sent-At"] = f"{time.time():.6f}"
        request = urllib.request.Request(self.events_url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status = response.status
                text = response.read(64 * 1024)
                pace = parse_send_interval(response.headers.get("Goodput-Send-Interval"))
        except urllib.error.HTTPError as exc:
            return _result_from_error(exc)
        except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors
            reason = getattr(exc, "reason", exc)
            return SendResult(status=SendStatus.RETRY, message=f"{type(exc).__name__}: {reason}",
                              refused_connection=isinstance(reason, ConnectionRefusedError))
        if not 200 <= status < 300:
            return SendResult(status=SendStatus.RETRY, http_status=status, message=f"unexpected status {status}")
        accepted, duplicates = _parse_ack(text, len(events))
        return SendResult(status=SendStatus.OK, http_status=status, accepted=accepted, duplicates=duplicates,
                          send_interval_s=pace)

    def close(self) -> None:
        pass


def _result_from_error(exc: urllib.error.HTTPError) -> SendResult:
    try:
        text = exc.read(8 * 1024).decode("utf-8", "replace")
    except OSError:
        text = ""
    message = _error_message(text) or exc.reason or ""
    if exc.code in REJECTED_STATUSES:
        return SendResult(status=SendStatus.REJECTED, http_status=exc.code, message=str(message))
    retry_after = parse_retry_after(exc.headers.get("Retry-After") if exc.headers else None)
    return SendResult(
        status=SendStatus.RETRY, http_status=exc.code, retry_after_s=retry_after, message=str(message)
    )


def _error_message(text: str) -> str:
    try:
        payload = json.loads(text)
    except ValueError:
        return text.strip()[:_MAX_MESSAGE_CHARS]
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload))
        if isinstance(error, dict) and "message" in error:
            extra = {k: error[k] for k in ("code", "index", "event_id", "field") if k in error}
            return f"{error['message']} {extra}"[:_MAX_MESSAGE_CHARS] if extra else str(error["message"])
        return str(error)[:_MAX_MESSAGE_CHARS]
    return text.strip()[:_MAX_MESSAGE_CHARS]


def _parse_ack(text: bytes, n_events: int) -> tuple[int, int]:
    try:
        payload = json.loads(text or b"{}")
        return int(payload.get("accepted", n_events)), int(payload.get("duplicates", 0))
    except (ValueError, TypeError, AttributeError):
        return n_events, 0


def parse_send_interval(value: str | None) -> float | None:
    """Seconds from a ``Goodput-Send-Interval`` header, capped at MAX_SEND_INTERVAL_S; None if absent or bad."""
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    if seconds is None or seconds != seconds or seconds < 0:
        return None
    return min(seconds, MAX_SEND_INTERVAL_S)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date), capped; None if absent."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, min(seconds, MAX_RETRY_AFTER_S))
