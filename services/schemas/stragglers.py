"""The straggler report's type: what `build_straggler_report` returns, what the analysis cache keeps, what the API
serves (GET /v1/runs/{run_id}/stragglers). services.analysis.stragglers' module docstring states the rules."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class StragglerRank(BaseModel):
    rank: int
    host: str | None
    straggler_gpu_seconds: float
    share: float = Field(description="of the run's straggler GPU-seconds")
    slowest_steps: int
    slow_steps: int
    steps: int
    slow_step_share: float
    pattern: Literal["persistent", "sporadic", "never"]
    compared_steps: int
    slower_steps: int
    slower_step_share: float
    chance_p: float = Field(description="chance of being slower this often with no special rank")
    median_excess_seconds: float
    median_excess_share: float | None
    flagged: bool


class StragglerHost(BaseModel):
    host: str
    ranks: list[int]
    straggler_gpu_seconds: float
    slowest_steps: int
    flagged_ranks: list[int]
    share: float
    flagged: bool = Field(description="one of its ranks is flagged")


class ScaleProjection(BaseModel):
    ranks: int
    step_time_factor: float = Field(description="expected step time over the step time without stragglers")
    straggler_share: float


class StragglerThresholds(BaseModel):
    slow_factor: float
    persistent_share: float
    min_steps: int
    consistent_share: float
    family_alpha: float
    material_excess: float
    flag_share: float


class StragglerReport(BaseModel):
    run_id: str
    straggler_gpu_seconds: float = Field(description="the ledger's straggler waste")
    straggler_share: float = Field(description="of the run's allocated GPU-seconds")
    world_size: int
    ranks: list[StragglerRank] = Field(description="costliest first")
    hosts: list[StragglerHost]
    steps: int
    slow_step_probability: float | None
    slowdown: float | None
    slow_factor: float
    projection: list[ScaleProjection] = Field(description="the straggler cost at other scales")
    thresholds: StragglerThresholds
