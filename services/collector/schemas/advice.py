"""Response models of what to change: checkpoint-interval advice (services.analysis.advice) and the straggler
report (services.analysis.straggler_types, built by services.analysis.straggler_report)."""

from __future__ import annotations

from pydantic import BaseModel

from services.analysis.advice import CheckpointAdvice
from services.analysis.straggler_types import (
    ScaleProjection,
    StragglerHost,
    StragglerRank,
    StragglerReport,
    StragglerThresholds,
)

__all__ = [  # the straggler report's models are services.analysis.straggler_types'; re-exported for the API's users
    "RunAdvice", "ScaleProjection", "StragglerHost", "StragglerRank", "StragglerReport", "StragglerThresholds",
]


class RunAdvice(BaseModel):
    run_id: str
    checkpoint_interval: CheckpointAdvice
