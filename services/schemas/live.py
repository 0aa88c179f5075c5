"""The live answer's types: what hang detection (services.analysis.live) builds, what services.derive.live returns,
what the API serves (GET /v1/runs/{id}/live, /v1/live, /v1/preemption-candidates, the checkpoint requests and
signals) and what the dashboard and the CLI read. One definition; no dict travels in its place.

docs/ledger.md ("Live hang detection") explains each figure. Times are epoch seconds on the collector's clock.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

RestartBasis = Literal["failures", "first_startup", "default"]


class Suspect(BaseModel):
    rank: int
    host: str | None = Field(None, description="the host its attempt_start named, if any")
    reasons: tuple[str, ...] = Field(description="why: behind the furthest rank, no heartbeat, ended its attempt, ...")


class RankLive(BaseModel):
    rank: int
    host: str | None = Field(None, description="the host its attempt_start named, if any")
    reported: bool = Field(description="sent attempt_start in this attempt")
    last_step: int | None
    last_step_end: float | None
    pending_step: int | None = Field(description="the step it is in (last completed + 1, or its heartbeat's)")
    collectives_in_pending_step: int | None = Field(description="collectives started or completed in it")
    last_heartbeat_time: float | None
    heartbeat_age_seconds: float | None
    silent: bool = Field(description="no heartbeat and no step end for 3 heartbeat intervals")
    behind: bool = Field(description="has not reached the step or collective the furthest rank reached")
    ended: str | None = Field(description="its attempt_end reason, if it sent one")
    clock_offset_seconds: float = Field(0.0, description=(
        "its clock minus the collector's, as the collector measured it (0: within a second); its times here are "
        "taken back by it, onto the collector's clock"))


class LiveRun(BaseModel):
    run_id: str
    project: str = Field(description="the run's project: a run is identified by (project, run_id)")
    status: str
    attempt: int | None
    world_size: int
    allocated_gpus: int
    version: int = Field(description="the run's version: changes with every write (the dashboard refetches on change)")
    server_time: float = Field(description="the collector's clock: every 'seconds since' is measured with it")
    latest_time: float | None
    seconds_since_last_event: float | None
    last_progress_time: float | None = Field(description="latest step end, checkpoint or (re)start")
    last_step: int | None
    pending_step: int | None
    seconds_since_progress: float | None
    median_step_seconds: float | None = Field(description="recent median seconds between step ends")
    threshold_seconds: float = Field(description="max(floor, factor x median step); larger at startup or "
                                     "during a checkpoint write")
    threshold_basis: str = Field(description="steps | floor | startup | checkpoint")
    hung: bool = Field(description="running, and no progress for longer than the threshold")
    hung_for_seconds: float | None
    suspects: list[Suspect] = Field(description="ranks holding the run up (only when hung)")
    suspect_ranks: list[int]
    suspects_truncated: int | None = Field(None, description=(
        "set when the list is cut (64 suspects per run at most, 16 in /v1/live): how many there were"))
    suspects_total: int = Field(0, description="every suspect, listed or not")
    never_reported: int = Field(0, description="ranks of the world that sent nothing in this attempt (counted, "
                                "listed only as far as the caps allow)")
    ranks_total: int = Field(0, description="ranks of the world: world_size, or the highest rank seen + 1")
    ranks_truncated: bool | None = Field(None, description=(
        "per-run endpoint: true when `ranks` lists fewer than ranks_total (128 rows at most: the listed suspects, "
        "then the ranks that reported, then the others, by rank)"))
    at_risk_gpu_seconds: float = Field(description=(
        "work since the last checkpoint, from the run's ledger: built within 0.5 s, else the last one stored while "
        "a newer one is built (beside an analyst process, GOODPUT_ANALYST, the one it stored in its last round)"))
    possibly_hung: bool = Field(description="= hung (older name)")
    stall_threshold_seconds: float = Field(description="= threshold_seconds (older name)")
    ranks: list[RankLive] | None = Field(None, description="ranks of the world, at most 128 (per-run endpoint only)")
    clock_offset_seconds: float = Field(0.0, description=(
        "the run's own clock (its reference clock: the ledger's times) minus the collector's, as the collector "
        "measured it from the requests (0: within a second); every time in this answer is on the collector's clock"))


class LiveRuns(BaseModel):
    server_time: float
    hung: int = Field(description="how many of the runs are hung")
    runs: list[LiveRun] = Field(description="running runs, hung first, then longest without progress first")


class PreemptionCost(BaseModel):
    run_id: str
    gpus: int = Field(description="the GPUs a preemption frees")
    cost_gpu_seconds: float = Field(description="at_risk_gpu_seconds + restart_gpu_seconds")
    at_risk_gpu_seconds: float
    restart_gpu_seconds: float = Field(description="expected restart seconds x GPUs")
    restart_seconds: float
    restart_basis: RestartBasis = Field(description="failures: measured over the run's failures; first_startup: "
                                        "its first attempt's startup; default: none measured yet")
    last_checkpoint_step: int | None
    last_step: int | None


class PreemptionCandidate(PreemptionCost):
    """What preempting a running run now would destroy (cost_gpu_seconds), with what the scheduler needs beside."""

    project: str = Field(description="the run's project: a run is identified by (project, run_id)")
    hung: bool
    pending_checkpoint_request: int | None = Field(description="id of a checkpoint request not yet fulfilled")


class PreemptionCandidates(BaseModel):
    server_time: float
    candidates: list[PreemptionCandidate] = Field(description="cheapest victim first")


class CheckpointRequestOut(BaseModel):
    id: int
    run_id: str
    requested_at: float = Field(description="the collector's clock")
    reason: str | None
    requested_by: str | None
    fulfilled_at: float | None = Field(description="time of the checkpoint_end that carried this request's id")
    fulfilled_step: int | None
    pending: bool


class CheckpointRequests(BaseModel):
    run_id: str
    requests: list[CheckpointRequestOut] = Field(description="newest first")


class Signals(BaseModel):
    """What a running client polls for (cheap: one indexed lookup)."""

    run_id: str
    server_time: float
    checkpoint_request: CheckpointRequestOut | None = Field(description="the oldest pending request, if any")


class CheckpointRequestIn(BaseModel):
    """The body of POST /v1/runs/{run_id}/checkpoint-request."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, StringConstraints(max_length=256)] | None = None
    requested_by: Annotated[str, StringConstraints(max_length=128)] | None = None
