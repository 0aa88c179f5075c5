"""What preempting a running run now would destroy, in GPU-seconds, from its ledger (pure; no I/O, no clock).

cost = at-risk GPU-seconds (kept work since its last good checkpoint: recomputed after the restart)
     + expected restart GPU-seconds (wall seconds from a failure to useful work again, per failure, measured
       over the run's own failures by `advice.restart_seconds`; else its first attempt's startup; x its GPUs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from services.analysis.advice import restart_seconds, world_size
from services.schemas.categories import RunStatus, WasteCategory
from services.schemas.ledger import Ledger
from services.schemas.live import PreemptionCost, RestartBasis

K = TypeVar("K", int, str, tuple[Any, ...])



def expected_restart_seconds(ledger: Ledger) -> tuple[float, RestartBasis]:
    """(seconds, basis): the run's measured restart cost, its first startup, or 0 with nothing measured."""
    measured = restart_seconds(ledger)
    if measured is not None:
        return measured, "failures"
    if ledger.attempts:
        first = ledger.attempts[0]
        startup = float(first.gpu_seconds.get(WasteCategory.STARTUP.value, 0.0))
        if startup > 0:
            return startup / max(first.world_size, 1), "first_startup"
    return 0.0, "default"


def allocated_gpus(ledger: Ledger) -> int:
    """The GPUs a preemption frees: the open allocation's, else the world size."""
    open_allocations = [a.gpus for a in ledger.allocations if a.open]
    return max(open_allocations[-1] if open_allocations else 0, world_size(ledger), 1)


def preemption_cost(ledger: Ledger) -> PreemptionCost:
    restart_s, basis = expected_restart_seconds(ledger)
    gpus = allocated_gpus(ledger)
    at_risk = ledger.at_risk_gpu_seconds
    steps = [a.last_step for a in ledger.attempts if a.last_step is not None]
    return PreemptionCost(
        run_id=ledger.run_id, gpus=gpus, cost_gpu_seconds=at_risk + restart_s * gpus, at_risk_gpu_seconds=at_risk,
        restart_gpu_seconds=restart_s * gpus, restart_seconds=restart_s, restart_basis=basis,
        last_checkpoint_step=ledger.checkpoints.last_ok_step, last_step=max(steps) if steps else None,
    )


def cheapest_to_preempt(runs: Iterable[tuple[K, Ledger]]) -> list[tuple[K, PreemptionCost]]:
    """The running runs among `runs` with their cost, cheapest to preempt first (ties: more GPUs freed first, then
    run id, then the caller's key: run ids repeat across projects)."""
    costs = [(key, preemption_cost(ledger)) for key, ledger in runs if ledger.status == RunStatus.RUNNING.value]
    return sorted(costs, key=lambda kc: (kc[1].cost_gpu_seconds, -kc[1].gpus, kc[1].run_id, kc[0]))
