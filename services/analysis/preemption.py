"""What preempting a running run now would destroy, in GPU-seconds, from its ledger (pure; no I/O, no clock).

cost = at-risk GPU-seconds (kept work since its last good checkpoint: recomputed after the restart)
     + expected restart GPU-seconds (wall seconds from a failure to useful work again, per failure, measured
       over the run's own failures by `advice.restart_seconds`; else its first attempt's startup; x its GPUs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from services.analysis.advice import restart_seconds, world_size


def expected_restart_seconds(ledger: dict[str, Any]) -> tuple[float, str]:
    """(seconds, basis): the run's measured restart cost, its first startup, or 0 with nothing measured."""
    measured = restart_seconds(ledger)
    if measured is not None:
        return measured, "failures"
    attempts = ledger.get("attempts", [])
    if attempts:
        world = max(int(attempts[0].get("world_size") or 0), 1)
        startup = float(attempts[0].get("gpu_seconds", {}).get("startup", 0.0))
        if startup > 0:
            return startup / world, "first_startup"
    return 0.0, "default"


def allocated_gpus(ledger: dict[str, Any]) -> int:
    """The GPUs a preemption frees: the open allocation's, else the world size."""
    open_allocations = [int(a["gpus"]) for a in ledger.get("allocations", []) if a.get("open")]
    return max(open_allocations[-1] if open_allocations else 0, world_size(ledger), 1)


def preemption_cost(ledger: dict[str, Any]) -> dict[str, Any]:
    restart_s, basis = expected_restart_seconds(ledger)
    gpus = allocated_gpus(ledger)
    at_risk = float(ledger.get("at_risk_gpu_seconds", 0.0))
    steps = [a["last_step"] for a in ledger.get("attempts", []) if a.get("last_step") is not None]
    return {
        "run_id": ledger["run_id"], "gpus": gpus, "cost_gpu_seconds": at_risk + restart_s * gpus,
        "at_risk_gpu_seconds": at_risk, "restart_gpu_seconds": restart_s * gpus, "restart_seconds": restart_s,
        "restart_basis": basis, "last_checkpoint_step": ledger.get("checkpoints", {}).get("last_ok_step"),
        "last_step": max(steps) if steps else None,
    }


def rank_preemption_candidates(ledgers: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Running runs, cheapest to preempt first (ties: more GPUs freed first, then run id)."""
    costs = [preemption_cost(ledger) for ledger in ledgers if ledger.get("status") == "running"]
    return sorted(costs, key=lambda c: (c["cost_gpu_seconds"], -c["gpus"], c["run_id"]))
