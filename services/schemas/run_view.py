"""Response models of the run page's views (GET /v1/runs/{run_id}/view and its parts: timeline, ranks,
checkpoints, restarts). The views themselves are services.schemas.views' `RunViews` (built by
services.analysis.views, which documents their bounds); the GPU-second figures are the ledger's (`RunView.ledger`),
the views say when and where."""

from __future__ import annotations

from pydantic import BaseModel, Field

from services.schemas.ledger import Ledger
from services.schemas.live import LiveRun
from services.schemas.views import (
    CheckpointRow,
    NoRankCompute,
    ProgressStats,
    RankCompute,
    RestartRow,
    RunViews,
    Timeline,
)


class RunView(RunViews):
    """GET /v1/runs/{run_id}/view: the views, the ledger of the same version and the run's live status."""

    ledger: Ledger = Field(description="the ledger the views were drawn from (a hung run's hang so far included)")
    stale: bool = Field(description="with stale_ok=true: the run received events since this build; a newer one "
                                    "is being built")
    run_version: int = Field(description="the run's version now (> version while stale)")
    analysed_at: float = Field(description="the collector's clock when this build finished")
    analysis_seconds: float = Field(description="what the build took (load, ledger and views)")
    detail_pruned_at: float | None = Field(None, description=(
        "the collector's clock when retention deleted the run's raw rows (GOODPUT_RAW_RETENTION_DAYS): this build "
        "is final; events received later (run_version > version) are not analysed"))
    live: LiveRun


class RunPart(BaseModel):
    run_id: str
    status: str
    version: int = Field(description="the run version this part describes")


class RunTimeline(RunPart):
    first_time: float | None
    latest_time: float | None
    timeline: Timeline
    progress: ProgressStats


class RunRanks(RunPart):
    ranks: RankCompute | NoRankCompute


class RunCheckpoints(RunPart):
    checkpoints: list[CheckpointRow]
    checkpoints_total: int


class RunRestarts(RunPart):
    restarts: list[RestartRow]
