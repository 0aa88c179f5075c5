"""Response models of the read API."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WasteBreakdown(BaseModel):
    startup: float
    checkpoint: float
    rework: float
    hang: float
    straggler: float
    idle: float


class CheckpointSummary(BaseModel):
    count: int
    ok: int
    failed: int
    torn: int
    median_blocking_seconds: float | None
    median_interval_seconds: float | None
    median_interval_steps: float | None
    last_ok_step: int | None


class StepSummary(BaseModel):
    furthest: int | None
    kept: int
    reworked: int
    computed: int


class AttemptOut(BaseModel):
    attempt: int
    start: float
    end: float
    end_reported: bool
    reason: str | None
    failed: bool
    world_size: int
    hosts: list[str]
    resume_step: int | None
    resume_reported: bool
    first_step: int | None
    last_step: int | None
    steps_kept: int
    steps_reworked: int
    gpu_seconds: dict[str, float]


class AllocationOut(BaseModel):
    start: float
    end: float
    gpus: int
    open: bool
    reported: bool


class Ledger(BaseModel):
    run_id: str
    status: str
    allocated_gpu_seconds: float
    productive_gpu_seconds: float
    waste_gpu_seconds: WasteBreakdown
    goodput: float | None = Field(description="productive / allocated; null when nothing was allocated")
    queue_seconds: float = Field(description="wall seconds waiting in the scheduler's queue (not GPU time)")
    allocated_wall_seconds: float
    at_risk_gpu_seconds: float = Field(description="a running run's work since its last checkpoint (in productive)")
    restarts: int
    failures: int
    mtbf_seconds: float | None
    checkpoints: CheckpointSummary
    steps: StepSummary
    straggler_gpu_seconds_by_rank: dict[str, float]
    attempts: list[AttemptOut]
    allocations: list[AllocationOut]
    first_time: float | None
    latest_time: float | None


class RunListItem(BaseModel):
    run_id: str
    status: str
    first_time: float | None
    last_time: float | None
    allocated_gpu_seconds: float
    productive_gpu_seconds: float
    goodput: float | None
    waste_gpu_seconds: WasteBreakdown
    restarts: int
    stale: bool = Field(False, description="the run received events since these figures were computed; a "
                                           "newer ledger is being built (GET /v1/runs/{run_id}/waste waits for it)")


class RunList(BaseModel):
    runs: list[RunListItem]
    count: int


class LastCheckpoint(BaseModel):
    step: int
    attempt: int
    end: float


class RunDetail(BaseModel):
    run_id: str
    status: str
    first_time: float | None
    last_time: float | None
    attempts: list[AttemptOut]
    world_sizes: list[int]
    restarts: int
    last_step: int | None
    last_checkpoint: LastCheckpoint | None
    allocated_gpu_seconds: float
    goodput: float | None
