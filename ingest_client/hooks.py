"""A DDP communication hook that times each bucket's allreduce (torch imported lazily).

Timing goes through ``ingest_client.timing``: CPU clocks for CPU buckets (gloo), CUDA events for CUDA buckets
(NCCL), where a CPU clock would stamp the end before the collective has run on the GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ingest_client.events import ROW_COLLECTIVE
from ingest_client.timing import IntervalTimer, timer_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest_client.tracker import Tracker


def build_ddp_comm_hook(tracker: Tracker, op: str = "all_reduce", clock: str = "auto"
                        ) -> Callable[[Any, Any], Any]:
    """Wrap torch's default ``allreduce_hook``; record a collective row per bucket, timed by ``clock``.

    Use: ``ddp_model.register_comm_hook(state=None, hook=tracker.ddp_comm_hook())``. ``state`` is the
    process group (None = the default group), as for ``allreduce_hook``. ``clock``: ``"auto"`` (CUDA events for
    CUDA buckets, else CPU clocks), ``"cpu"`` or ``"cuda"``; chosen at the first bucket. With CPU clocks the
    completion callback appends the row to the tracker's deque; with CUDA events a resolver thread appends it
    once the GPU has run the collective (``Tracker.flush`` waits for those still pending).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    allreduce_hook = default_hooks.allreduce_hook
    put = tracker._put
    timers: list[IntervalTimer] = []

    def timed_allreduce_hook(state: Any, bucket: Any) -> Any:  # Any: torch types, imported lazily
        step = tracker._next_step
        if tracker._coll_step != step:  # heartbeats report how many collectives of the step were started
            tracker._coll_step, tracker._coll_started = step, 0
        tracker._coll_started += 1
        if not timers:
            timers.append(timer_for(bucket.buffer(), clock))
            if timers[0].kind != "cpu":  # Tracker.flush / shutdown drain what the GPU has not resolved yet
                tracker.__dict__.setdefault("_timers", []).append(timers[0])
        timer = timers[0]
        token = timer.start()
        future = allreduce_hook(state, bucket)

        def _emit(start: float, end: float) -> None:
            put((ROW_COLLECTIVE, step, op, start, end))

        def _record(done: Any) -> Any:
            timer.stop(token, _emit)  # CUDA: this callback's current stream waits on the collective
            return done.value()

        return future.then(_record)

    # DDP checks the hook's annotations; this module's are strings (`from __future__ import annotations`).
    timed_allreduce_hook.__annotations__ = {
        "state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor],
    }
    return timed_allreduce_hook
