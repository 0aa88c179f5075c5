"""Send simulated events to a collector in batches, as a client would."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.api_client import ApiClient
from services.schemas.events import IngestAck


def send_events(api: ApiClient, events: Sequence[Mapping[str, Any]], *, batch_size: int = 500) -> IngestAck:
    """Every event, `batch_size` to a request; the acknowledgements added up."""
    accepted = duplicates = 0
    for i in range(0, len(events), batch_size):
        ack = api.send_events(events[i:i + batch_size])
        accepted += ack.accepted
        duplicates += ack.duplicates
    return IngestAck(accepted=accepted, duplicates=duplicates)
