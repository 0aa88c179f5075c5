"""A DDP communication hook that times each bucket's allreduce (torch imported lazily).

Timing goes through ``ingest_client.worker.timing``: CPU clocks for CPU buckets (gloo), CUDA events for CUDA buckets
(NCCL), where a CPU clock would stamp the end before the collective has run on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ingest_client.worker.timing import Emit, IntervalTimer, timer_for


class CollectiveRecorder(Protocol):
    """What the hook needs of a tracker (:class:`ingest_client.worker.tracker.Tracker` is one)."""

    def collective_started(self, op: str) -> Emit: ...

    def drain_on_flush(self, timer: IntervalTimer) -> None: ...

    def note_collective_clock(self, kind: str) -> None: ...


def build_ddp_comm_hook(tracker: CollectiveRecorder, op: str = "all_reduce", clock: str = "auto"
                        ) -> Callable[[Any, Any], Any]:
    """Wrap torch's default ``allreduce_hook``; record a collective row per bucket, timed by ``clock``.

    Use: ``ddp_model.register_comm_hook(state=None, hook=tracker.ddp_comm_hook())``. ``state`` is the
    process group (None = the default group), as for ``allreduce_hook``. ``clock``: ``"auto"`` (CUDA events for
    CUDA buckets, else CPU clocks), ``"cpu"`` or ``"cuda"``; chosen at the first bucket. Each bucket's row is
    recorded through the ``emit`` that ``Tracker.collective_started`` returned as the bucket started: with CPU clocks
    by the completion callback, with CUDA events by a resolver thread once the GPU has run the collective
    (``Tracker.flush`` waits for those still pending: ``Tracker.drain_on_flush``).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    allreduce_hook = default_hooks.allreduce_hook
    started = tracker.collective_started
    timers: list[IntervalTimer] = []

    def timed_allreduce_hook(state: Any, bucket: Any) -> Any:  # Any: torch types, imported lazily
        emit = started(op)
        if not timers:
            timers.append(timer_for(bucket.buffer(), clock))
            tracker.drain_on_flush(timers[0])
            tracker.note_collective_clock(timers[0].kind)
        timer = timers[0]
        token = timer.start()
        future = allreduce_hook(state, bucket)

        def _record(done: Any) -> Any:
            timer.stop(token, emit)  # CUDA: this callback's current stream waits on the collective
            return done.value()

        return future.then(_record)

    # DDP checks the hook's annotations; this module's are strings (`from __future__ import annotations`).
    timed_allreduce_hook.__annotations__ = {
        "state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor],
    }
    return timed_allreduce_hook
