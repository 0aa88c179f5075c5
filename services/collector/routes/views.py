"""Read endpoints for the dashboard: a run's timeline, per-rank compute, checkpoints and restarts.

Thin: each route asks `services.views_pipeline` for the cached views of the run's current version. The
GPU-second numbers themselves stay in `/v1/runs/{run_id}/waste`; these say when and where.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from services.collector.auth import READ_RUN
from services.collector.deps import EngineDep, SettingsDep
from services.collector.schemas import ErrorResponse
from services.live_pipeline import live_config, live_for_run
from services.views_pipeline import views_for_run

router = APIRouter(tags=["dashboard views"])
_404: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse}}

# The views are nested JSON documents whose shape services/analysis/views.py documents; they are served as
# plain dicts (`dict[str, Any]`) rather than duplicated as pydantic models.


async def _section(engine: EngineDep, run_id: str, *names: str) -> dict[str, Any]:
    views, _ = await run_in_threadpool(views_for_run, engine, run_id)
    out: dict[str, Any] = {"run_id": views["run_id"], "status": views["status"], "version": views["version"]}
    out.update({name: views[name] for name in names})
    return out


@router.get("/v1/runs/{run_id:path}/timeline", responses=_404, dependencies=[READ_RUN],
            summary="Allocations, attempts, where the time went, step progress (downsampled), failures, hangs")
async def get_timeline(run_id: str, engine: EngineDep) -> dict[str, Any]:
    return await _section(engine, run_id, "first_time", "latest_time", "timeline", "progress")


@router.get("/v1/runs/{run_id:path}/ranks", responses=_404, dependencies=[READ_RUN],
            summary="Per-rank compute seconds per step (median, p90, mean), straggler GPU-seconds, heat map")
async def get_ranks(run_id: str, engine: EngineDep) -> dict[str, Any]:
    return await _section(engine, run_id, "ranks")


@router.get("/v1/runs/{run_id:path}/checkpoints", responses=_404, dependencies=[READ_RUN],
            summary="Every checkpoint: attempt, step, start, end, blocking seconds, ok, torn")
async def get_checkpoints(run_id: str, engine: EngineDep) -> dict[str, Any]:
    return await _section(engine, run_id, "checkpoints", "checkpoints_total")


@router.get("/v1/runs/{run_id:path}/restarts", responses=_404, dependencies=[READ_RUN],
            summary="Every restart: resume step and the rework, hang and startup GPU-seconds around it")
async def get_restarts(run_id: str, engine: EngineDep) -> dict[str, Any]:
    return await _section(engine, run_id, "restarts")


@router.get("/v1/runs/{run_id:path}/view", responses=_404, dependencies=[READ_RUN],
            summary="Everything the dashboard's run page draws, in one document (timeline, ranks, tables, live)")
async def get_view(run_id: str, engine: EngineDep, settings: SettingsDep) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        views, _ = views_for_run(engine, run_id)
        return {**views, "live": live_for_run(engine, run_id, time.time(), live_config(settings))}

    return await run_in_threadpool(work)


# GET /v1/runs/{run_id}/live and /v1/live (hang detection) are served by routes/live.py.
