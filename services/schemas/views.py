"""The run page's views: what `build_run_views` returns, what `run_views` stores (as its JSON), what the API serves
(GET /v1/runs/{run_id}/view and its parts) and what the reports read. One definition; no dict travels in its place.

services.analysis.views builds them and documents their bounds; the GPU-second figures are the ledger's, the views
say when and where.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from services.schemas.clocks import HostClock


class CheckpointRow(BaseModel):
    attempt: int
    step: int
    start: float
    end: float
    blocking_seconds: float
    ok: bool
    torn: bool  # never completed: blocked until the attempt's next step or its end


class FailureCause(BaseModel):
    """Why an attempt failed, as far as its events say (services.analysis.failures; docs/ledger.md, "Why an attempt
    failed"). None where the events do not tell."""

    rank: int | None = Field(None, description="the first rank that failed")
    basis: str | None = Field(None, description=(
        "how `rank` was told: exit (goodput launch saw torchrun report its exit first), error (its own failure "
        "report came first), silent (it went silent first, killed without a word)"))
    host: str | None = Field(None, description="that rank's host (its attempt_start's)")
    exit_code: int | None = Field(None, description=(
        "its exit status as torchrun reported it to goodput launch; negative: killed by that signal"))
    signal: str | None = Field(None, description="the signal a negative exit_code names, e.g. SIGKILL")
    error: str | None = Field(None, description=(
        "the error text a rank reported (its attempt_end's detail: '<Type>: <message>'), the failing rank's if any"))
    error_rank: int | None = Field(None, description="the rank that reported `error`")
    hung_ranks: list[int] = Field(default_factory=list, description=(
        "the ranks behind the furthest one when the attempt stopped (step, then collectives started in it): the "
        "others waited for them; empty when every rank stood at one place"))
    log_hint: str | None = Field(None, description="where the workers' own output is (not in the events)")


class RestartRow(BaseModel):
    """What the failure before a restart cost, in GPU-seconds: rework and hang are booked on the attempt that
    failed, startup on the attempt that restarted."""

    attempt: int
    time: float
    after: str  # the failed attempt's end reason ("failed" / "ended" when it reported none)
    failed_at_step: int | None
    resume_step: int | None
    steps_reworked: int
    rework_gpu_seconds: float
    hang_gpu_seconds: float
    startup_gpu_seconds: float
    cause: FailureCause | None = Field(None, description="why the attempt before the restart failed (None: it did not)")


class AllocationSpan(BaseModel):
    start: float
    end: float
    gpus: int
    open: bool


class AttemptSpan(BaseModel):
    attempt: int
    start: float
    end: float
    reason: str | None
    failed: bool
    world_size: int
    resume_step: int | None
    first_step: int | None
    last_step: int | None
    first_step_start: float | None
    last_step_end: float | None


class Segment(BaseModel):
    start: float
    end: float
    category: str = Field(description="a waste category, productive or idle: how the ledger painted this time")


class HangSpan(BaseModel):
    attempt: int
    start: float = Field(description="the failed attempt's last step end")
    end: float
    seconds: float


class Failure(BaseModel):
    attempt: int
    time: float
    step: int | None
    reason: str
    cause: FailureCause | None = None


class Restart(BaseModel):
    attempt: int
    time: float
    resume_step: int | None


class Progress(BaseModel):
    """One attempt's step number over time (each step's end), downsampled."""

    attempt: int
    time: list[float]
    step: list[int]
    steps_total: int
    rework_after_step: int | None = Field(description="steps after this one were thrown away (reworked later)")


class Timeline(BaseModel):
    """Lists hold the latest rows up to their cap: `<list>_total` says how many there were, `<list>_truncated`
    whether some were left out."""

    allocations: list[AllocationSpan]
    allocations_total: int
    allocations_truncated: bool
    attempts: list[AttemptSpan]
    attempts_total: int
    attempts_truncated: bool
    segments: list[Segment] = Field(description="where the time went, adjacent pieces of one category merged")
    idle_gaps: list[Segment]
    hangs: list[HangSpan]
    hangs_total: int
    hangs_truncated: bool
    failures: list[Failure]
    failures_total: int
    failures_truncated: bool
    restarts: list[Restart]
    restarts_total: int
    restarts_truncated: bool
    progress: list[Progress]


class ProgressStats(BaseModel):
    median_step_seconds: float | None = Field(description="median gap between step ends, last 1,000 steps")
    last_progress_time: float | None
    last_step: int | None


class RankRow(BaseModel):
    rank: int
    host: str | None
    steps: int
    median_compute_s: float
    p90_compute_s: float
    mean_compute_s: float
    straggler_gpu_seconds: float
    is_straggler: bool
    clock_offset_seconds: float | None = Field(None, description=(
        "its host's clock offset from the run's reference clock (the ledger's `clocks`); null: not measured"))


class Heatmap(BaseModel):
    rank_labels: list[str]
    ranks_per_row: int
    step_centers: list[int]
    step_edges: list[float]
    z: list[list[float | None]] = Field(description="mean compute seconds per (rank group, step bucket); "
                                                    "a group shows its slowest rank; null: no step there")


class RankCompute(BaseModel):
    rows: list[RankRow]
    rows_total: int
    rows_truncated: bool
    median_compute_s: float
    heatmap: Heatmap
    compute_source: str = Field(description="step duration, or step duration minus collectives")
    straggler_ranks: list[int]
    figures_within: float | None = Field(
        default=None, description="None: every per-rank figure is exact. Else a long run's medians and p90s are "
                                  "drawn from fixed-size per-rank histograms, within this relative error "
                                  "(services.analysis.rank_sketch); counts and means stay exact.")
    clocks: list[HostClock] = Field(default_factory=list, description=(
        "each host's clock offset from the run's reference clock, measured from its ranks' step ends and taken out "
        "before painting (docs/ledger.md, 'Clocks')"))


class NoRankCompute(BaseModel):
    """A run without steps yet."""

    model_config = ConfigDict(extra="forbid")

    rows: list[RankRow]
    heatmap: None
    compute_source: None
    straggler_ranks: list[int]


class RunViews(BaseModel):
    """Everything the run page draws besides the ledger's numbers, for one version of the run."""

    run_id: str
    status: str
    first_time: float | None
    latest_time: float | None
    timeline: Timeline
    progress: ProgressStats
    ranks: RankCompute | NoRankCompute
    checkpoints: list[CheckpointRow]
    checkpoints_total: int
    checkpoints_truncated: bool
    restarts: list[RestartRow]
    restarts_total: int
    restarts_truncated: bool
    version: int = Field(description="the run version these views describe")


class CurveSeries(BaseModel):
    """One metric of one attempt over time, downsampled (services.analysis.curves)."""

    attempt: int
    time: list[float] = Field(description="each point's step end (the last rank's), epoch seconds")
    step: list[int]
    value: list[float]
    points_total: int = Field(description="steps of this attempt with a value, before downsampling")


class CurveMark(BaseModel):
    time: float
    step: int | None
    label: str


class TrainingCurves(BaseModel):
    """GET /v1/runs/{run_id}/curves: loss, learning rate and step time over time, one series per attempt (a restart
    starts a new one), each metric at most `max_points` points over all of its attempts (every bucket of steps
    keeps its lowest and highest value, so a spike survives); restarts and completed checkpoints marked."""

    run_id: str
    loss: list[CurveSeries] = Field(description="mean over the ranks that reported a loss for the step")
    lr: list[CurveSeries] = Field(description="the learning rate the step reported (the highest of its ranks')")
    step_seconds: list[CurveSeries] = Field(description="from the step's first rank start to its last rank end")
    restarts: list[CurveMark]
    checkpoints: list[CurveMark] = Field(description="completed checkpoints (their end), the latest 5,000")
    max_points: int = Field(description="per metric, over all of its attempts")
    downsampled: bool = Field(description="some metric had more steps than max_points")
    throughput: None = Field(None, description=(
        "not reported: the events carry no tokens or samples per step, so no throughput is drawn"))
