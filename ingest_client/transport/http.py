"""POST batches to ``{url}/v1/events`` (flusher thread only), through :func:`ingest_client.transport.request.exchange`:
a deadline for the whole request, no redirects."""

from __future__ import annotations

import email.utils
import gzip
import http.client
import json
import time
from collections.abc import Sequence

from ingest_client.transport.base import SendResult, SendStatus, encode_batch
from ingest_client.transport.request import Answer, exchange

GZIP_MIN_BYTES = 1024
REJECTED_STATUSES = frozenset({400, 401, 403, 413, 422})
# Refused for what the batch holds: believed only with the collector's error envelope, since the client then
# isolates and quarantines records (a web server's 400 page at a wrong URL would send every record there)
_REFUSED_FOR_CONTENT = frozenset({400, 422})
MAX_RETRY_AFTER_S = 300.0
# A collector's pace beyond this is taken as this: a live figure never lags its events by more because of it
MAX_SEND_INTERVAL_S = 30.0
_MAX_MESSAGE_CHARS = 300
FOREIGN_SUFFIX = ", not the collector's answer"  # ends the message of a foreign answer


class HttpTransport:
    """Sends one batch per call. Other 4xx/5xx answers are retried (the data stays in the spool),
    since they more likely mean a misrouted URL or a broken deployment than a bad batch. So is an answer that is
    not the collector's (``foreign_answer``): a 2xx without its acknowledgement of this batch, any redirect."""

    def __init__(self, events_url: str, *, token: str | None = None, timeout_s: float = 2.0,
                 sender: str | None = None) -> None:
        self.events_url = events_url
        self._timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json", "Accept": "application/json",
                         "User-Agent": "goodput-ingest-client/1"}
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
        try:
            answer = exchange(self.events_url, method="POST", headers=headers, data=body, timeout_s=timeout)
        except (OSError, ValueError) as exc:
            return SendResult(status=SendStatus.RETRY, message=f"{type(exc).__name__}: {exc}",
                              refused_connection=isinstance(exc, ConnectionRefusedError))
        if 200 <= answer.status < 300:
            counts = acknowledged(answer.body, len(events))
            if counts is None:
                return _foreign(answer)
            return SendResult(status=SendStatus.OK, http_status=answer.status, accepted=counts[0],
                              duplicates=counts[1], send_interval_s=parse_send_interval(
                                  answer.headers.get("Goodput-Send-Interval")))
        if answer.status < 400:
            return _foreign(answer)
        return _result_from_error(answer)

    def close(self) -> None:
        pass


def acknowledged(body: bytes, n_records: int) -> tuple[int, int] | None:
    """(accepted, duplicates) when ``body`` is the collector's acknowledgement of a batch of ``n_records``
    (docs/events.md: ``{"accepted": n, "duplicates": d}``, every record counted once); else None."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    accepted, duplicates = payload.get("accepted"), payload.get("duplicates")
    if type(accepted) is not int or type(duplicates) is not int or accepted < 0 or duplicates < 0:
        return None
    return (accepted, duplicates) if accepted + duplicates == n_records else None


def _foreign(answer: Answer) -> SendResult:
    return SendResult(status=SendStatus.RETRY, http_status=answer.status, foreign_answer=True,
                      message=f"{answer.describe()[:_MAX_MESSAGE_CHARS]}{FOREIGN_SUFFIX}")


def _result_from_error(answer: Answer) -> SendResult:
    envelope = _error_envelope(answer.body)
    if answer.status in _REFUSED_FOR_CONTENT and envelope is None:
        return _foreign(answer)
    message = (envelope or " ".join(answer.body[:_MAX_MESSAGE_CHARS].decode("utf-8", "replace").split())
               or http.client.responses.get(answer.status, ""))
    if answer.status in REJECTED_STATUSES:
        return SendResult(status=SendStatus.REJECTED, http_status=answer.status, message=message)
    retry_after = parse_retry_after(answer.headers.get("Retry-After"))
    return SendResult(status=SendStatus.RETRY, http_status=answer.status, retry_after_s=retry_after, message=message)


def _error_envelope(body: bytes) -> str | None:
    """The message of the collector's error answer (``{"error": {"message": ...}}``), or None when it is not one."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    error = payload.get("error", payload.get("detail")) if isinstance(payload, dict) else None
    if error is None:
        return None
    if isinstance(error, dict) and "message" in error:
        extra = {k: error[k] for k in ("code", "index", "event_id", "field") if k in error}
        return f"{error['message']} {extra}"[:_MAX_MESSAGE_CHARS] if extra else str(error["message"])
    return str(error)[:_MAX_MESSAGE_CHARS]


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
