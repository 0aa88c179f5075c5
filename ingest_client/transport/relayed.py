"""A worker's records through its node's relay, or straight to the collector once the relay is gone.

The relay lives in `goodput launch` (ingest_client.launcher.relay). Should the launcher die (killed, out of memory)
while its workers train on, nothing listens at the relay's address any more and every post of theirs is refused: their
records would wait in their spools until the run's next process replays them, and the run would look silent at
the very moment someone looks at it. So a refused connection sends the batch to the collector instead, and every
later one too. A record the relay had already taken is then a duplicate at the collector, absorbed by its event
id. A relay that is only slow or busy (a timeout, a 503) is waited for as before: only a refused connection
means it is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ingest_client.transport.base import SendResult, Transport

logger = logging.getLogger(__name__)


class RelayedTransport:
    def __init__(self, relay: Transport, direct: Transport, *, relay_url: str = "", direct_url: str = "") -> None:
        self._relay = relay
        self._direct = direct
        self._relay_url = relay_url
        self._direct_url = direct_url
        self.relay_gone = False

    def send(self, events: Sequence[bytes], /, *, timeout_s: float | None = None) -> SendResult:
        if not self.relay_gone:
            result = self._relay.send(events, timeout_s=timeout_s)
            if not result.refused_connection:
                return result
            self.relay_gone = True
            logger.warning("goodput: the node relay at %s refuses connections (its `goodput launch` is gone); this "
                           "process now sends its records to the collector directly (%s)", self._relay_url,
                           self._direct_url)
        return self._direct.send(events, timeout_s=timeout_s)

    def close(self) -> None:
        self._relay.close()
        self._direct.close()
