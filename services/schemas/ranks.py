"""One rank of a run, as GET /v1/runs/{run_id}/ranks/{rank} serves it (built by services.analysis.rank_detail,
which states its rules)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from services.schemas.views import RankRow


class RankAttempt(BaseModel):
    attempt: int
    host: str | None
    start: float | None = Field(description="the rank's attempt_start, else its first step's start")
    end: float | None = Field(description="the rank's attempt_end, else its last step's end")
    reason: str | None = Field(description="the reason of the rank's own attempt_end (None: it sent none)")
    failed: bool = Field(description="the attempt failed (the run's failures)")
    steps: int
    first_step: int | None
    last_step: int | None
    median_compute_s: float | None
    median_collective_s: float | None


class RankFailure(BaseModel):
    attempt: int
    time: float
    step: int | None = Field(description="the run's step at the failure")
    reason: str
    reported_failure: bool = Field(description="this rank's own attempt_end said failed")
    rank_last_step: int | None = Field(description="the rank's last step in that attempt")
    steps_behind: int | None = Field(description="the failure's step minus the rank's last step")


class RankSteps(BaseModel):
    attempt: list[int]
    step: list[int]
    end: list[float]
    compute_s: list[float]
    collective_s: list[float | None]
    steps_total: int
    steps_per_point: int


class RankDetail(BaseModel):
    run_id: str
    rank: int
    known: bool = Field(description="the run has a step or an attempt event of this rank")
    host: str | None
    host_ranks: list[int] = Field(description="every rank seen on the same host, this one included")
    world_size: int | None
    row: RankRow | None = Field(description="the rank's compute figures as the run page's per-rank chart has them")
    clock_offset_seconds: float | None = Field(None, description=(
        "its host's clock offset from the run's reference clock, measured from the step ends (null: not "
        "measured); its times here are taken back by it"))
    collector_clock_offset_seconds: float | None = Field(None, description=(
        "its clock minus the collector's in its latest attempt, as the collector measured it from the requests "
        "(0: within a second; null: not measured)"))
    run_median_compute_s: float | None = Field(description="the median of all ranks' median compute per step")
    compute_source: str = Field(description="step duration minus collectives, or step duration")
    attempts: list[RankAttempt]
    failures: list[RankFailure]
    steps: RankSteps
    version: int = Field(description="the run version of the views used")
