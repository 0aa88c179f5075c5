"""The pace the collector asks of its senders: fewer, fuller requests when many clients post at once.

Every client posts its records every flush interval (0.2 s by default): a fleet of thousands of ranks would send
more requests than one collector process can take, each nearly empty. So every ingest answer carries
`Goodput-Send-Interval: <seconds>`: senders seen in the last `WINDOW_S` / the process's target request rate,
capped at `max_interval_s`. A client leaves at least that long between two sends (ingest_client.worker.flusher); its
records wait in its spool meanwhile, and its next request carries them all. With few senders the interval is
below any client's own flush interval and changes nothing.

A sender is what the `Goodput-Sender` request header names (the client sends its process id), else the peer
address. Runs on the event loop only (the ingest route), so it takes no lock.
"""

from __future__ import annotations

import math
import time

HEADER = "Goodput-Send-Interval"
SENDER_HEADER = "goodput-sender"
WINDOW_S = 10.0
_MAX_SENDERS = 1_000_000  # beyond this many distinct names in one window the table is reset (a misbehaving client)


class SendPace:
    def __init__(self, *, target_requests_per_s: float, max_interval_s: float) -> None:
        self._target = target_requests_per_s
        self._max_interval_s = max_interval_s
        self._last_seen: dict[str, float] = {}
        self._counted_at = 0.0
        self._senders = 0
        self._header = "0.00"

    def seen(self, sender: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if len(self._last_seen) >= _MAX_SENDERS:
            self._last_seen.clear()
        self._last_seen[sender] = now
        if now - self._counted_at >= 1.0:
            self._count(now)

    @property
    def senders(self) -> int:
        """Distinct senders in the last window (as of the last count, at most a second old)."""
        return self._senders

    @property
    def interval_s(self) -> float:
        return min(self._max_interval_s, self._senders / self._target)

    @property
    def retry_after_s(self) -> int:
        """Retry-After (whole seconds, at least 1) of a request refused for load: the pace, so that a refused sender
        comes back in its turn rather than sooner than the senders that were answered (a refusal costs the
        collector a read; a storm of early retries is load it could have spent writing)."""
        return max(1, math.ceil(self.interval_s))

    @property
    def header_value(self) -> str:
        return self._header

    def _count(self, now: float) -> None:
        cutoff = now - WINDOW_S
        self._last_seen = {k: t for k, t in self._last_seen.items() if t >= cutoff}
        self._senders = len(self._last_seen)
        self._counted_at = now
        self._header = f"{self.interval_s:.2f}"


def sender_of(headers: list[tuple[bytes, bytes]], client: tuple[str, int] | None) -> str:
    for name, value in headers:
        if name == b"goodput-sender":
            return value[:128].decode("latin-1")
    return f"{client[0]}:{client[1]}" if client else "?"
