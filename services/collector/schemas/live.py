"""Response and request models of the live endpoints: hang detection, preemption cost, checkpoint requests.

The answers' models are the analysis layer's (services.analysis.live_types), re-exported here; the request body
is defined here."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

from services.analysis.live_types import (
    CheckpointRequestOut,
    CheckpointRequests,
    LiveRun,
    LiveRuns,
    PreemptionCandidate,
    PreemptionCandidates,
    RankLive,
    Signals,
    Suspect,
)

__all__ = [
    "CheckpointRequestIn", "CheckpointRequestOut", "CheckpointRequests", "LiveRun", "LiveRuns",
    "PreemptionCandidate", "PreemptionCandidates", "RankLive", "Signals", "Suspect",
]


class CheckpointRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, StringConstraints(max_length=256)] | None = None
    requested_by: Annotated[str, StringConstraints(max_length=128)] | None = None
