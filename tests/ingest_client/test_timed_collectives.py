"""The Tracker surface for code that times collectives itself (the DDP comm hook, ingest_client/worker/hooks.py)."""

from __future__ import annotations

import time
from typing import Any

from ingest_client.transport import InMemoryTransport
from ingest_client.worker.timing import Emit


def wait_for_heartbeat(transport: InMemoryTransport, step: int, collectives: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if any(b["step"] == step and b["collectives"] == collectives for b in transport.of_kind("heartbeat")):
            return
        time.sleep(0.02)
    raise AssertionError(f"no heartbeat of step {step} with {collectives} collectives: "
                         f"{transport.of_kind('heartbeat')}")


def test_started_collectives_carry_the_in_progress_step_and_heartbeats_count_them_per_step(
        make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport, heartbeat_interval_s=0.05, flush_interval_s=0.02)
    tracker.resumed(6)
    emits = [tracker.collective_started(op) for op in ("all_reduce", "all_reduce", "broadcast")]
    wait_for_heartbeat(transport, step=7, collectives=3)
    now = time.time()
    tracker.record_step(7, now - 0.01, now)
    late = tracker.collective_started("all_gather")
    wait_for_heartbeat(transport, step=8, collectives=1)  # a new step counts from zero
    late(now, now + 0.001)
    for emit in emits:  # ended after step 7 did: still step 7's
        emit(now - 0.002, now - 0.001)
    assert tracker.flush(5.0)
    rows = [row for c in transport.of_kind("collectives")
            for row in zip(c["step"], c["op"], c["start"], c["end"], strict=True)]
    assert rows == [(8, "all_gather", now, now + 0.001), *[(7, op, now - 0.002, now - 0.001)
                                                          for op in ("all_reduce", "all_reduce", "broadcast")]]


class HeldTimer:
    """A timer whose intervals resolve only when drained, as CUDA events the GPU has not run yet."""

    kind = "cuda"

    def __init__(self) -> None:
        self.held: list[tuple[float, Emit]] = []

    def start(self) -> float:
        return time.time()

    def stop(self, token: float, emit: Emit) -> None:
        self.held.append((token, emit))

    def drain(self, timeout_s: float) -> bool:
        for start, emit in self.held:
            emit(start, start + 0.001)
        self.held.clear()
        return True


def test_flush_first_drains_the_timers_it_was_given_so_their_collectives_go_out_with_it(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport, flush_interval_s=5.0)
    timer = HeldTimer()
    tracker.drain_on_flush(timer)
    timer.stop(timer.start(), tracker.collective_started("all_reduce"))
    assert not transport.of_kind("collectives")
    assert tracker.flush(5.0)
    (collectives,) = transport.of_kind("collectives")
    assert collectives["step"] == [1] and collectives["op"] == ["all_reduce"] and not timer.held
