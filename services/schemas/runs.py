"""Response models of the run list and one run's summary (its ledger itself: services.schemas.ledger)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from services.schemas.ledger import AttemptLedger, ProvisionalHang, WasteBreakdown


class RunListItem(BaseModel):
    run_id: str
    project: str = Field(description="the run's project: a run is identified by (project, run_id)")
    status: str
    first_time: float | None
    last_time: float | None
    allocated_gpu_seconds: float
    productive_gpu_seconds: float
    eval_gpu_seconds: float = Field(0.0, description="validation between steps: neither productive nor waste")
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
    attempts: list[AttemptLedger]
    world_sizes: list[int]
    restarts: int
    last_step: int | None
    last_checkpoint: LastCheckpoint | None
    allocated_gpu_seconds: float
    goodput: float | None
    provisional: ProvisionalHang | None = Field(None, description="present while the run is flagged hung: its "
                                                "hang so far is in allocated and goodput, provisionally")
