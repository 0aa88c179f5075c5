"""Read endpoints for the dashboard: the run page's document, and its parts (timeline, per-rank compute,
checkpoints, restarts).

Thin: each route asks `services.derive.views` for the typed views of the run's current version (or, for the page
with stale_ok, the last build while a newer one is made) and answers with them or the part it serves (the views
were validated once, when built or loaded; their sub-models pass into the answer as they are). The GPU-second
numbers themselves are the ledger's (`/v1/runs/{run_id}/waste`); the views say when and where.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Query

from services.analysis.provisional import provisional_ledger
from services.analysis.rank_detail import build_rank_detail
from services.analysis.run_data import comm_frame
from services.collector.deps import AnalysesDep, LiveConfigDep, RunDep
from services.derive.curves import training_curves
from services.derive.live import LEDGER_BUDGET_S, live_for_row, live_hang_of
from services.derive.views import current_views, recent_views
from services.errors import RunDetailPruned
from services.schemas.errors import NOT_FOUND
from services.schemas.ranks import RankDetail
from services.schemas.run_view import RunCheckpoints, RunRanks, RunRestarts, RunTimeline, RunView
from services.schemas.views import TrainingCurves
from services.storage.clock_readings import rank_collector_offset
from services.storage.rank_rows import load_rank_comm, load_rank_events, load_rank_steps

# How long /view?stale_ok=true waits for a fresh build before it answers with the stored one.
STALE_OK_BUDGET_S = 1.0

router = APIRouter(tags=["dashboard views"])


@router.get("/v1/runs/{run_id:path}/timeline", response_model=RunTimeline, responses=NOT_FOUND,
            summary="Allocations, attempts, where the time went, step progress (downsampled), failures, hangs")
def get_timeline(run: RunDep, analyses: AnalysesDep) -> RunTimeline:
    return RunTimeline.model_validate(current_views(analyses, run).views, from_attributes=True)


@router.get("/v1/runs/{run_id:path}/ranks", response_model=RunRanks, responses=NOT_FOUND,
            summary="Per-rank compute seconds per step (median, p90, mean), straggler GPU-seconds, heat map")
def get_ranks(run: RunDep, analyses: AnalysesDep) -> RunRanks:
    return RunRanks.model_validate(current_views(analyses, run).views, from_attributes=True)


@router.get("/v1/runs/{run_id:path}/ranks/{rank}", response_model=RankDetail, responses=NOT_FOUND,
            summary="One rank: its host, attempts, steps' compute and collective time, the failures it was part of")
def get_rank(run: RunDep, analyses: AnalysesDep,
             rank: Annotated[int, Path(ge=0, le=2**31 - 1, description="the rank's number in its run")]) -> RankDetail:
    if run.detail_pruned_at is not None:
        raise RunDetailPruned(run.run_id, run.detail_pruned_at, "a rank's steps are read from its raw rows")
    views = current_views(analyses, run).views
    with analyses.engine.connect() as conn:
        steps = load_rank_steps(conn, run.pk, rank)
        comm = load_rank_comm(conn, run.pk, rank) if steps["comm"].isna().any() else comm_frame()
        events = load_rank_events(conn, run.pk, rank)
        collector = rank_collector_offset(conn, run.pk, rank)
    detail = build_rank_detail(views, rank, steps, comm, events)
    return detail.model_copy(update={"collector_clock_offset_seconds": collector})


@router.get("/v1/runs/{run_id:path}/curves", response_model=TrainingCurves, responses=NOT_FOUND,
            summary="Loss, learning rate and step time over time per attempt (at most 2,000 points a metric, each "
                    "bucket's lowest and highest kept), restarts and checkpoints marked")
def get_curves(run: RunDep, analyses: AnalysesDep) -> TrainingCurves:
    return training_curves(analyses, run)


@router.get("/v1/runs/{run_id:path}/checkpoints", response_model=RunCheckpoints, responses=NOT_FOUND,
            summary="Every checkpoint: attempt, step, start, end, blocking seconds, ok, torn")
def get_checkpoints(run: RunDep, analyses: AnalysesDep) -> RunCheckpoints:
    return RunCheckpoints.model_validate(current_views(analyses, run).views, from_attributes=True)


@router.get("/v1/runs/{run_id:path}/restarts", response_model=RunRestarts, responses=NOT_FOUND,
            summary="Every restart: resume step and the rework, hang and startup GPU-seconds around it")
def get_restarts(run: RunDep, analyses: AnalysesDep) -> RunRestarts:
    return RunRestarts.model_validate(current_views(analyses, run).views, from_attributes=True)


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
    analyses.note_watched(run.pk)  # someone watches this run: background analysis takes it first
    if stale_ok:
        built, stale = recent_views(analyses, run, budget_s=STALE_OK_BUDGET_S)
    else:
        built, stale = current_views(analyses, run), False
    # the views were waited for already: the live part takes the ledger it finds
    live = live_for_row(analyses, run, time.time(), live_config,
                        ledger_budget_s=0.0 if stale_ok else LEDGER_BUDGET_S)
    hang = live_hang_of(live) if built.ledger.status == "running" else None
    return RunView.model_validate({
        **dict(built.views), "ledger": provisional_ledger(built.ledger, hang, live.server_time), "stale": stale,
        "run_version": max(run.version, built.version), "analysed_at": built.analysed_at,
        "analysis_seconds": built.analysis_seconds, "detail_pruned_at": run.detail_pruned_at, "live": live})
