"""Live hang detection: `GET /v1/live` and `GET /v1/runs/{run_id}/live`, with the server's clock.

Fresh on every call (a few index lookups per running run, `services.live_pipeline`); the rules are in
`services.analysis.live` and docs/ledger.md.
"""

from __future__ import annotations

import time

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from services.collector.deps import EngineDep, SettingsDep
from services.collector.live_models import LiveRun, LiveRuns
from services.collector.schemas import ErrorResponse
from services.live_pipeline import live_config, live_for_run, live_for_running_runs

router = APIRouter(tags=["live"])


@router.get("/v1/runs/{run_id:path}/live", response_model=LiveRun, responses={404: {"model": ErrorResponse}},  # type: ignore[dict-item]
            summary="Seconds since the run's last progress, hang threshold, hung flag, suspect ranks, at risk")
async def get_live(run_id: str, engine: EngineDep, settings: SettingsDep) -> LiveRun:
    live = await run_in_threadpool(live_for_run, engine, run_id, time.time(), live_config(settings))
    return LiveRun(**live)


@router.get("/v1/live", response_model=LiveRuns, summary="Live status of every running run: hung ones first")
async def get_live_runs(engine: EngineDep, settings: SettingsDep) -> LiveRuns:
    now = time.time()
    runs = await run_in_threadpool(live_for_running_runs, engine, now, live_config(settings))
    return LiveRuns(server_time=now, hung=sum(1 for r in runs if r["hung"]), runs=[LiveRun(**r) for r in runs])
