"""Transports deliver encoded event batches to a collector (HTTP) or to memory (tests)."""

from __future__ import annotations

from ingest_client.transport.base import SendResult, SendStatus, Transport
from ingest_client.transport.http import HttpTransport
from ingest_client.transport.memory import InMemoryTransport

__all__ = ["HttpTransport", "InMemoryTransport", "SendResult", "SendStatus", "Transport"]
