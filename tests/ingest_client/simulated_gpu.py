"""A GPU stream in wall time, for the CUDA timer's code paths on a machine without one.

The host queues kernels (``launch(seconds)``) and returns at once; the stream runs them one after another, starting
each when the previous one is done or when it was queued, whichever is later. An event recorded on the stream
completes when the stream reaches it; ``synchronize`` waits (really sleeps) until then. This is the behaviour the
issue's H200 loops have: a host that never reads back runs ahead, and ``torch.save`` waits for the queue.
"""

from __future__ import annotations

import threading
import time


class SimulatedEvent:
    def __init__(self, gpu: SimulatedGpu) -> None:
        self._gpu = gpu
        self.at: float | None = None  # wall time at which the stream reaches the event

    def query(self) -> bool:
        return self.at is not None and time.time() >= self.at

    def elapsed_time(self, end: SimulatedEvent) -> float:
        assert self.at is not None and end.at is not None and self.query() and end.query(), "events not complete"
        return (end.at - self.at) * 1000.0

    def synchronize(self) -> None:
        assert self.at is not None
        time.sleep(max(0.0, self.at - time.time()))


class SimulatedGpu:
    """The ``CudaDevice`` interface of ``ingest_client.worker.timing`` over one simulated stream."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue_ends = time.time()  # when the work queued so far will be done
        self.events_created = 0

    def launch(self, seconds: float) -> None:
        with self._lock:
            self._queue_ends = max(self._queue_ends, time.time()) + seconds

    def idle_at(self) -> float:
        with self._lock:
            return max(self._queue_ends, time.time())

    def synchronize_all(self) -> None:
        time.sleep(max(0.0, self.idle_at() - time.time()))

    def new_event(self) -> SimulatedEvent:
        self.events_created += 1
        return SimulatedEvent(self)

    def record(self, event: SimulatedEvent) -> None:
        event.at = self.idle_at()

    def record_anchor(self, event: SimulatedEvent) -> None:
        event.at = time.time()  # an idle stream: the event runs as it is recorded

    def synchronize(self, event: SimulatedEvent) -> None:
        event.synchronize()

    def bind_thread(self) -> None:
        pass
