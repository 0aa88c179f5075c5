"""A DDP communication hook that times each bucket's allreduce (torch imported lazily)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ingest_client.events import ROW_COLLECTIVE

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest_client.tracker import Tracker

_time = time.time
_perf = time.perf_counter


def build_ddp_comm_hook(tracker: Tracker, op: str = "all_reduce") -> Callable[[Any, Any], Any]:
    """Wrap torch's default ``allreduce_hook``; record a collective row when its future completes.

    Use: ``ddp_model.register_comm_hook(state=None, hook=tracker.ddp_comm_hook())``. ``state`` is the
    process group (None = the default group), as for ``allreduce_hook``. The completion callback
    runs on the communication thread and only appends to the tracker's deque.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    allreduce_hook = default_hooks.allreduce_hook
    put = tracker._put

    def timed_allreduce_hook(state: Any, bucket: Any) -> Any:  # Any: torch types, imported lazily
        step = tracker._next_step
        if tracker._coll_step != step:  # heartbeats report how many collectives of the step were started
            tracker._coll_step, tracker._coll_started = step, 0
        tracker._coll_started += 1
        start = _time()
        p0 = _perf()
        future = allreduce_hook(state, bucket)

        def _record(done: Any) -> Any:
            put((ROW_COLLECTIVE, step, op, start, start + (_perf() - p0)))
            return done.value()

        return future.then(_record)

    # DDP checks the hook's annotations; this module's are strings (`from __future__ import annotations`).
    timed_allreduce_hook.__annotations__ = {
        "state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor],
    }
    return timed_allreduce_hook
