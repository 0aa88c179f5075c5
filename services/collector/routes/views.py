"""Read endpoints for the dashboard: the run page's document, and its parts (timeline, per-rank compute,
checkpoints, restarts).

Thin: each route asks `services.derive.served` for the run as served: the typed views of the run's current version
(or, for the page with stale_ok, the last build while a newer one is made), and answers with them or the part it
serves (the views were validated once, when built or loaded; their sub-models pass into the answer as they are).
The GPU-second numbers themselves are the ledger's (`/v1/runs/{run_id}/waste`); the views say when and where.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from services.collector.deps import AnalysesDep, LiveConfigDep, RunDep
from services.derive.curves import training_curves
from services.derive.served import rank_detail, run_view, run_views
from services.schemas.errors import NOT_FOUND
from services.schemas.ranks import RankDetail
from services.schemas.run_view import RunCheckpoints, RunRanks, RunRestarts, RunTimeline, RunView
from services.schemas.views import TrainingCurves

router = APIRouter(tags=["dashboard views"])


@router.get("/v1/runs/{run_id:path}/timeline", response_model=RunTimeline, responses=NOT_FOUND,
            summary="Allocations, attempts, where the time went, step progress (downsampled), failures, hangs")
def get_timeline(run: RunDep, analyses: AnalysesDep) -> RunTimeline:
    return RunTimeline.model_validate(run_views(analyses, run), from_attributes=True)


@router.get("/v1/runs/{run_id:path}/ranks", response_model=RunRanks, responses=NOT_FOUND,
            summary="Per-rank compute seconds per step (median, p90, mean), straggler GPU-seconds, heat map")
def get_ranks(run: RunDep, analyses: AnalysesDep) -> RunRanks:
    return RunRanks.model_validate(run_views(analyses, run), from_attributes=True)


@router.get("/v1/runs/{run_id:path}/ranks/{rank}", response_model=RankDetail, responses=NOT_FOUND,
            summary="One rank: its host, attempts, steps' compute and collective time, the failures it was part of")
def get_rank(run: RunDep, analyses: AnalysesDep,
             rank: Annotated[int, Path(ge=0, le=2**31 - 1, description="the rank's number in its run")]) -> RankDetail:
    return rank_detail(analyses, run, rank)


@router.get("/v1/runs/{run_id:path}/curves", response_model=TrainingCurves, responses=NOT_FOUND,
            summary="Loss, learning rate and step time over time per attempt (at most 2,000 points a metric, each "
                    "bucket's lowest and highest kept), restarts and checkpoints marked")
def get_curves(run: RunDep, analyses: AnalysesDep) -> TrainingCurves:
    return training_curves(analyses, run)


@router.get("/v1/runs/{run_id:path}/checkpoints", response_model=RunCheckpoints, responses=NOT_FOUND,
            summary="Every checkpoint: attempt, step, start, end, blocking seconds, ok, torn")
def get_checkpoints(run: RunDep, analyses: AnalysesDep) -> RunCheckpoints:
    return RunCheckpoints.model_validate(run_views(analyses, run), from_attributes=True)


@router.get("/v1/runs/{run_id:path}/restarts", response_model=RunRestarts, responses=NOT_FOUND,
            summary="Every restart: resume step and the rework, hang and startup GPU-seconds around it")
def get_restarts(run: RunDep, analyses: AnalysesDep) -> RunRestarts:
    return RunRestarts.model_validate(run_views(analyses, run), from_attributes=True)


@router.get("/v1/runs/{run_id:path}/view", response_model=RunView, responses=NOT_FOUND,
            summary="Everything the dashboard's run page draws, in one document (timeline, ranks, tables, the "
                    "ledger of the same version, live)")
def get_view(
    run: RunDep, analyses: AnalysesDep, live_config: LiveConfigDep,
    stale_ok: Annotated[bool, Query(description=(
        "answer within about a second: when the run changed and its views take longer to rebuild (a run of "
        "millions of steps), serve the last build (`stale: true`, `version` < `run_version`) while the "
        "rebuild goes on in the background"))] = False,
) -> RunView:
    return run_view(analyses, run, live_config, stale_ok=stale_ok)
