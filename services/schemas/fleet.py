"""Response model of the fleet over a time range: each run's figures cut to the range, and per time bucket."""

from __future__ import annotations

from pydantic import BaseModel, Field

from services.schemas.ledger import WasteBreakdown
from services.schemas.runs import RunListItem


class WindowFigures(BaseModel):
    """A run's GPU-seconds inside the range only (services.analysis.usage): never more than GPUs x the range."""

    allocated_gpu_seconds: float
    productive_gpu_seconds: float
    eval_gpu_seconds: float = Field(0.0, description="validation between steps: neither productive nor waste")
    waste_gpu_seconds: WasteBreakdown
    goodput: float | None


class RunInWindow(BaseModel):
    run: RunListItem = Field(description="the run as /v1/runs lists it: figures of its whole life")
    window: WindowFigures
    buckets: dict[str, list[float]] = Field(description="GPU-seconds per bucket of the range, per key (productive, "
                                            "eval and the waste categories; keys that are zero in every bucket left "
                                            "out)")
    laid_out: bool = Field(description="false: the run's stored ledger predates the time layout; its figures "
                                       "are spread evenly over its life until it is analysed again")


class FleetWindow(BaseModel):
    since: float | None = Field(description="the range's start (null: from the first run's first event)")
    until: float = Field(description="the range's end (the server's clock when not given)")
    bucket_start: float = Field(description="the first bucket's start, a multiple of bucket_s")
    bucket_s: float
    bucket_count: int
    server_time: float
    runs: list[RunInWindow]
