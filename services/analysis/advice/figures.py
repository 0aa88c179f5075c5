"""Figures of a ledger the advice rests on: the world size, the failure rate (the run's own, or pooled with its
project's runs of similar size), the restart cost, the mean step, the GPUs never used."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.analysis.advice.config import DEFAULT_CONFIG
from services.schemas.advice import FailureRateSource
from services.schemas.categories import PRODUCTIVE, WasteCategory
from services.schemas.ledger import AttemptLedger, Ledger

HANG = WasteCategory.HANG.value
STARTUP = WasteCategory.STARTUP.value
IDLE = WasteCategory.IDLE.value


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRate:
    mtbf_seconds: float
    source: FailureRateSource
    failures: int
    runs: int
    observed_seconds: float
    world_range: tuple[int, int] | None  # the world sizes pooled (project source)



def world_size(ledger: Ledger) -> int:
    return max((a.world_size for a in ledger.attempts), default=0)


def restart_seconds(ledger: Ledger) -> float | None:
    """Wall seconds from a failure to useful work again: detection (hang) plus restart (startup of the
    attempts that followed a failure), per failure."""
    attempts = ledger.attempts
    if not ledger.failures or len(attempts) < 2:
        return None
    gpu_s = sum(a.gpu_seconds.get(STARTUP, 0.0) for a in attempts[1:])
    gpu_s += sum(a.gpu_seconds.get(HANG, 0.0) for a in attempts)
    world = world_size(ledger) or 1
    return gpu_s / world / ledger.failures


def failure_rate(ledger: Ledger, peers: Iterable[Ledger], min_failures: int = DEFAULT_CONFIG.min_failures
                 ) -> FailureRate | None:
    """The run's own MTBF when it failed at least `min_failures` times; else pooled with its project's runs of
    half to twice its world size when that adds failures and reaches `min_failures`; else the run's own from
    fewer failures (rough); None when neither the run nor its peers failed."""
    failures, wall = ledger.failures, ledger.allocated_wall_seconds
    if failures >= min_failures and wall > 0:
        return FailureRate(mtbf_seconds=wall / failures, source="run", failures=failures, runs=1,
                           observed_seconds=wall, world_range=None)
    size = world_size(ledger)
    similar = [p for p in peers if p.run_id != ledger.run_id and size and size / 2 <= world_size(p) <= size * 2]
    pooled = failures + sum(p.failures for p in similar)
    pooled_wall = wall + sum(p.allocated_wall_seconds for p in similar)
    if pooled >= min_failures and pooled > failures and pooled_wall > 0:
        return FailureRate(mtbf_seconds=pooled_wall / pooled, source="project", failures=pooled,
                           runs=len(similar) + 1, observed_seconds=pooled_wall,
                           world_range=(max(size // 2, 1), size * 2))
    if failures and wall > 0:
        return FailureRate(mtbf_seconds=wall / failures, source="run", failures=failures, runs=1,
                           observed_seconds=wall, world_range=None)
    return None


def gpus_of(attempt: AttemptLedger, ledger: Ledger) -> int:
    """GPUs an attempt's claims count on: min(world size, GPUs of the allocation it runs in)."""
    held = [a.gpus for a in ledger.allocations if a.start < attempt.end and a.end > attempt.start]
    return max(min(attempt.world_size, max(held)) if held else attempt.world_size, 1)


def mean_step_seconds(ledger: Ledger) -> float | None:
    """Mean wall seconds of a kept step (first rank's start to last rank's end), from the attempts' productive
    GPU-seconds before the straggler carve-out."""
    gpu_s = sum(a.gpu_seconds.get(PRODUCTIVE, 0.0) for a in ledger.attempts)
    steps = sum(a.steps_kept * gpus_of(a, ledger) for a in ledger.attempts)
    return gpu_s / steps if steps > 0 and gpu_s > 0 else None


def unused_gpu_seconds(ledger: Ledger) -> tuple[float, int, int]:
    """(GPU-seconds of allocated GPUs no attempt's world used, GPUs, of which unused) over the allocations; the
    GPUs figures are those of the allocation that left the most GPU-seconds unused."""
    total, worst, gpus, unused = 0.0, -1.0, 0, 0
    for alloc in ledger.allocations:
        used = max((a.world_size for a in ledger.attempts if a.start < alloc.end and a.end > alloc.start), default=0)
        spare = max(alloc.gpus - used, 0)
        gpu_s = spare * max(alloc.end - alloc.start, 0.0)
        total += gpu_s
        if spare and gpu_s > worst:
            worst, gpus, unused = gpu_s, alloc.gpus, spare
    return min(total, ledger.waste_gpu_seconds[IDLE]), gpus, unused
