"""The queue: time waiting for the scheduler (it holds no GPUs, so no goodput prediction)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from services.analysis.advice.context import RunContext, count
from services.schemas.advice import Recommendation


def queue(run: RunContext) -> Iterable[Recommendation]:
    ledger, f, config = run.ledger, run.f, run.config
    queue, wall = ledger.queue_seconds, ledger.allocated_wall_seconds
    if queue < config.queue_min_seconds or queue / (queue + wall) < config.queue_share:
        return
    allocations = sorted(ledger.allocations, key=lambda a: a.start)
    requeue = sum(max(b.start - a.end, 0.0) for a, b in pairwise(allocations))
    n_requeues = max(len(allocations) - 1, 0)
    requeued = (f"; {f.duration(requeue)} of it in {count(f, n_requeues, 'requeue')}" if requeue > 0 else "")
    fix = ("Restart inside the allocation (torchrun --max-restarts) so a failure does not go back to the queue; "
           if requeue > 0 else "")
    measured = ledger.goodput
    yield run.rec_without_gain(
        "queue", "queue", title="Wait less in the queue",
        wording=(f"The run waited {f.duration(queue)} for the scheduler, {f.percent(queue / (queue + wall))} of the "
                 f"time from submission to the end of its allocation{requeued}. {fix}ask for a partition or "
                 "reservation with free capacity, or for fewer GPUs if the job scales down."),
        at_stake=0.0,
        evidence=[run.ev("queue_seconds", "waiting in the queue", queue, "seconds"),
                  run.ev("allocated_wall_seconds", "holding GPUs", wall, "seconds"),
                  run.ev("requeue_seconds", "waiting after requeues", requeue, "seconds")],
        model=("queue_time", "Queue time holds no GPUs: it delays the result, it does not waste GPU time."),
        condition=(f"No goodput prediction: queue time holds no GPUs (goodput stays "
                   f"{f.percent(measured) if measured is not None else '—'}); the result would come "
                   f"{f.duration(queue)} sooner."),
        measured="submission and allocation times")
