"""Response models of what to change: the run's advice (services.analysis.advice_types, built by the engine in
services.analysis.advice) and the straggler report (services.analysis.straggler_types, built by
services.analysis.straggler_report). Re-exported here for the API's users."""

from __future__ import annotations

from services.analysis.advice_types import (
    AdviceModel,
    Confidence,
    Evidence,
    Gain,
    MeasuredRun,
    Recommendation,
    RunAdvice,
)
from services.analysis.straggler_types import (
    ScaleProjection,
    StragglerHost,
    StragglerRank,
    StragglerReport,
    StragglerThresholds,
)

__all__ = [
    "AdviceModel", "Confidence", "Evidence", "Gain", "MeasuredRun", "Recommendation", "RunAdvice", "ScaleProjection",
    "StragglerHost", "StragglerRank", "StragglerReport", "StragglerThresholds",
]
