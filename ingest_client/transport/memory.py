"""An in-memory transport for tests: records every batch, answers from a script."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from ingest_client.transport.base import SendResult, SendStatus


class InMemoryTransport:
    """Stores decoded events; ``script`` holds results to return first (then OK, deduplicated)."""

    def __init__(self, script: Sequence[SendResult] = ()) -> None:
        self._lock = threading.Lock()
        self._script = list(script)
        self.batches: list[list[dict[str, Any]]] = []  # every batch sent, including failed ones
        self.events: list[dict[str, Any]] = []  # events stored (unique event ids)
        self._seen: set[str] = set()
        self.duplicates = 0

    def send(self, events: Sequence[bytes], /, *, timeout_s: float | None = None) -> SendResult:
        decoded = [json.loads(e) for e in events]
        with self._lock:
            self.batches.append(decoded)
            if self._script:
                return self._script.pop(0)
            accepted = 0
            for event in decoded:
                if event["event_id"] in self._seen:
                    self.duplicates += 1
                    continue
                self._seen.add(event["event_id"])
                self.events.append(event)
                accepted += 1
        return SendResult(status=SendStatus.OK, http_status=200, accepted=accepted,
                          duplicates=len(decoded) - accepted)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["kind"] == kind]

    def close(self) -> None:
        pass
