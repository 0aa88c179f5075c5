"""Read endpoints for the dashboard: a run's timeline, per-rank compute, checkpoints and restarts.

Thin: each route asks `services.derive.views` for the cached views of the run's current version. The
GPU-second numbers themselves stay in `/v1/runs/{run_id}/waste`; these say when and where.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from services.collector.auth import ReadRunDep
from services.collector.deps import EngineDep, SettingsDep
from services.collector.schemas import ErrorResponse
from services.analysis.provisional import provisional_ledger
from services.derive.live import LEDGER_BUDGET_S, live_config, live_for_run, live_hang_of_answer
from services.storage.load import RunRef, get_run
from services.derive.views import current_views, recent_views, views_for_row
from services.derive.analyst import INTEREST

# How long /view?stale_ok=true waits for a fresh build before it answers with the stored one.
STALE_OK_BUDGET_S = 1.0

router = APIRouter(tags=["dashboard views"])
_404: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse}}

# The views are nested JSON documents whose shape services/analysis/views.py documents; they are served as
# plain dicts (`dict[str, Any]`) rather than duplicated as pydantic models.


async def _section(engine: EngineDep, ref: RunRef, *names: str) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        with engine.connect() as conn:
            run = get_run(conn, ref)
        return views_for_row(engine, run)[0]

    views = await run_in_threadpool(work)
    out: dict[str, Any] = {"run_id": views["run_id"], "status": views["status"], "version": views["version"]}
    out.update({name: views[name] for name in names})
    return out


@router.get("/v1/runs/{run_id:path}/timeline", responses=_404,
            summary="Allocations, attempts, where the time went, step progress (downsampled), failures, hangs")
async def get_timeline(run: ReadRunDep, engine: EngineDep) -> dict[str, Any]:
    return await _section(engine, run, "first_time", "latest_time", "timeline", "progress")


@router.get("/v1/runs/{run_id:path}/ranks", responses=_404,
            summary="Per-rank compute seconds per step (median, p90, mean), straggler GPU-seconds, heat map")
async def get_ranks(run: ReadRunDep, engine: EngineDep) -> dict[str, Any]:
    return await _section(engine, run, "ranks")


@router.get("/v1/runs/{run_id:path}/checkpoints", responses=_404,
            summary="Every checkpoint: attempt, step, start, end, blocking seconds, ok, torn")
async def get_checkpoints(run: ReadRunDep, engine: EngineDep) -> dict[str, Any]:
    return await _section(engine, run, "checkpoints", "checkpoints_total")


@router.get("/v1/runs/{run_id:path}/restarts", responses=_404,
            summary="Every restart: resume step and the rework, hang and startup GPU-seconds around it")
async def get_restarts(run: ReadRunDep, engine: EngineDep) -> dict[str, Any]:
    return await _section(engine, run, "restarts")


@router.get("/v1/runs/{run_id:path}/view", responses=_404,
            summary="Everything the dashboard's run page draws, in one document (timeline, ranks, tables, the "
                    "ledger of the same version, live)")
async def get_view(
    ref: ReadRunDep, engine: EngineDep, settings: SettingsDep,
    stale_ok: Annotated[bool, Query(description=(
        "answer within about a second: when the run changed and its views take longer to rebuild (a run of "
        "millions of steps), serve the last build (`stale: true`, `version` < `run_version`) while the "
        "rebuild goes on in the background"))] = False,
) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        with engine.connect() as conn:
            run = get_run(conn, ref)
        INTEREST.note(engine, run.pk)  # someone watches this run: background analysis takes it first
        if stale_ok:
            built, stale = recent_views(engine, run, budget_s=STALE_OK_BUDGET_S)
        else:
            built, stale = current_views(engine, run), False
        # the views were waited for already: the live part takes the ledger it finds
        live = live_for_run(engine, ref, time.time(), live_config(settings),
                            ledger_budget_s=0.0 if stale_ok else LEDGER_BUDGET_S)
        hang = live_hang_of_answer(live) if built.ledger.get("status") == "running" else None
        return {**built.views, "ledger": provisional_ledger(built.ledger, hang, live["server_time"]), "stale": stale,
                "run_version": max(run.version, built.version), "analysed_at": built.analysed_at,
                "analysis_seconds": built.analysis_seconds, "live": live}

    return await run_in_threadpool(work)


# GET /v1/runs/{run_id}/live and /v1/live (hang detection) are served by routes/live.py.
