"""The Transport protocol and the result of one send."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ingest_client.common.events import SCHEMA_VERSION


class SendStatus(str, Enum):
    OK = "ok"  # the collector stored the batch (accepted and/or duplicates)
    RETRY = "retry"  # transient: keep the batch and send it again later
    REJECTED = "rejected"  # permanent (400/401/403/413/422): resending it as is fails the same (the flusher
    # quarantines it for `goodput sync`, or splits it after a 413)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendResult:
    status: SendStatus
    http_status: int | None = None
    accepted: int = 0
    duplicates: int = 0
    retry_after_s: float | None = None
    # OK answers: the interval between posts the collector asks of each sender now (Goodput-Send-Interval)
    send_interval_s: float | None = None
    message: str = ""
    refused_connection: bool = False  # nothing listens at the address (RETRY): the receiver is gone, not busy
    # RETRY: something answered that is not the collector (a web server's page, a login redirect): the URL is wrong
    foreign_answer: bool = False


class Transport(Protocol):
    """Delivers one batch. ``events`` are JSON-encoded wire records, as stored in the spool."""

    def send(self, events: Sequence[bytes], /, *, timeout_s: float | None = None) -> SendResult: ...

    def close(self) -> None: ...


def encode_batch(events: Sequence[bytes]) -> bytes:
    """The request body ``{"schema_version": 1, "events": [...]}`` without re-encoding records."""
    return b'{"schema_version":%d,"events":[' % SCHEMA_VERSION + b",".join(events) + b"]}"
