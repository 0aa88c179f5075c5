"""Send simulated events to a collector over HTTP, in batches, as a client would."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class SendResult:
    accepted: int
    duplicates: int


def send_events(url: str, events: Sequence[dict[str, Any]], *, token: str | None = None,
                batch_size: int = 500, client: httpx.Client | None = None) -> SendResult:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    http = client or httpx.Client(timeout=60.0)
    accepted = duplicates = 0
    try:
        for i in range(0, len(events), batch_size):
            response = http.post(f"{url.rstrip('/')}/v1/events", json={"schema_version": 1,
                                 "events": list(events[i:i + batch_size])}, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"the collector answered {response.status_code}: {response.text[:500]}")
            body = response.json()
            accepted += body["accepted"]
            duplicates += body["duplicates"]
    finally:
        if own:
            http.close()
    return SendResult(accepted=accepted, duplicates=duplicates)
