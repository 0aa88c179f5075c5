"""Hand-made ledgers for the report tests: the figures a rule reads, everything else empty."""

from __future__ import annotations

from typing import Any

from services.schemas.categories import WASTE_KEYS
from services.schemas.ledger import CheckpointSummary, Ledger, StepSummary, WasteBreakdown

NO_CHECKPOINTS = CheckpointSummary(count=0, ok=0, failed=0, torn=0, median_blocking_seconds=None,
                                   median_interval_seconds=None, median_interval_steps=None, last_ok_step=None)


def ledger(allocated: float = 100_000.0, *, checkpoints: CheckpointSummary = NO_CHECKPOINTS, **fields: Any) -> Ledger:
    """A finished run's ledger with `allocated` GPU-seconds; waste categories given by name (the rest 0, productive
    what remains), other ledger fields as keywords."""
    waste = {key: float(fields.pop(key, 0.0)) for key in WASTE_KEYS}
    figures: dict[str, Any] = {
        "run_id": "r", "status": "finished", "allocated_gpu_seconds": allocated,
        "productive_gpu_seconds": allocated - sum(waste.values()), "waste_gpu_seconds": WasteBreakdown(**waste),
        "goodput": None, "queue_seconds": 0.0, "allocated_wall_seconds": 0.0, "at_risk_gpu_seconds": 0.0,
        "restarts": 0, "failures": 0, "mtbf_seconds": None, "checkpoints": checkpoints,
        "steps": StepSummary(furthest=None, kept=0, reworked=0, computed=0), "straggler_gpu_seconds_by_rank": {},
        "attempts": [], "allocations": [], "first_time": None, "latest_time": None,
    }
    return Ledger(**(figures | fields))
