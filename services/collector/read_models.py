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


class RunningTail(BaseModel):
    since: float = Field(description="start of the trailing time no claim covers (idle so far)")
    until: float = Field(description="the ledger's end (the run's latest event, or now with a provisional hang)")
    gpus: int = Field(description="GPUs the last attempt's claims count on")
    allocated_gpus: int
    grows: bool = Field(description="the allocation extends with time (open, or derived from the attempts)")


class ProvisionalHang(BaseModel):
    hang_gpu_seconds: float = Field(description="hang GPU-seconds booked provisionally (included in "
                                    "waste_gpu_seconds.hang): the run is flagged hung and its attempt has not ended")
    since: float = Field(description="the run's last progress (epoch seconds)")
    as_of: float = Field(description="the collector's clock when it was booked; the figure grows with it")
    from_idle_gpu_seconds: float = Field(description="of it, time the stored ledger had booked as idle")
    added_allocated_gpu_seconds: float = Field(description="allocated GPU-seconds added from the ledger's end to as_of")


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
    running_tail: RunningTail | None = Field(None, description="a running run's trailing unclaimed time")
    provisional: ProvisionalHang | None = Field(None, description="present while the run is flagged hung: "
                                                "the hang so far, booked provisionally until the attempt ends")


class RunListItem(BaseModel):
    run_id: str
    project: str = Field(description="the run's project: a run is identified by (project, run_id)")
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
    provisional: ProvisionalHang | None = Field(None, description="present while the run is flagged hung: its "
                                                "hang so far is in the figures, provisionally")


class RunList(BaseModel):
    runs: list[RunListItem]
    count: int


class LastCheckpoint(BaseModel):
    step: int
    attempt: int
    end: float


class RunDetail(BaseModel):
    run_id: str
    project: str = Field(description="the run's project: a run is identified by (project, run_id)")
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
    provisional: ProvisionalHang | None = Field(None, description="present while the run is flagged hung: its "
                                                "hang so far is in allocated and goodput, provisionally")
