from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from services.collector.auth import ReadRunDep, RunScopeDep
from services.collector.deps import EngineDep, SettingsDep
from services.collector.read_models import Ledger, RunDetail, RunList, RunListItem
from services.collector.schemas import ErrorResponse
from services.derive.live import ledger_now, live_config, with_live_hang
from services.derive.ledger import recent_ledger, run_detail
from services.storage.load import list_runs

router = APIRouter(tags=["runs"])

# How long one /v1/runs request waits, over all its runs, for ledgers made stale by new events; after that
# a run shows its last ledger (`stale: true`) while a background build catches up.
LIST_BUDGET_S = 1.0
_404 = {404: {"model": ErrorResponse}}


@router.get("/v1/runs", response_model=RunList, summary="Every run with its goodput, worst first by waste")
async def get_runs(
    engine: EngineDep,
    settings: SettingsDep,
    scope: RunScopeDep,
    status: Annotated[str | None, Query(pattern="^(running|finished|failed|cancelled)$")] = None,
    since: Annotated[float | None, Query(description="only runs with events at or after this epoch time")] = None,
    until: Annotated[float | None, Query(description="only runs with events at or before this epoch time")] = None,
    run_id: Annotated[str | None, Query(max_length=256, description="substring of the run id")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> RunList:
    def work() -> list[dict[str, Any]]:
        with engine.connect() as conn:
            rows = [] if scope.matches_nothing else list_runs(conn, since=since, until=until, limit=limit,
                                                              project=scope.project)
        deadline = time.monotonic() + LIST_BUDGET_S
        now, config = time.time(), live_config(settings)
        out = []
        for row in rows:
            if run_id and run_id not in row.run_id:
                continue
            ledger, stale = recent_ledger(engine, row, budget_s=max(deadline - time.monotonic(), 0.0))
            if status and ledger["status"] != status:
                continue
            ledger = with_live_hang(engine, row, ledger, now, config)  # a hung run's hang so far, provisionally
            out.append({
                "run_id": row.run_id, "project": row.project, "status": ledger["status"], "first_time": ledger["first_time"],
                "last_time": ledger["latest_time"], "allocated_gpu_seconds": ledger["allocated_gpu_seconds"],
                "productive_gpu_seconds": ledger["productive_gpu_seconds"], "goodput": ledger["goodput"],
                "waste_gpu_seconds": ledger["waste_gpu_seconds"], "restarts": ledger["restarts"], "stale": stale,
                "provisional": ledger.get("provisional"),
            })
        return out

    runs = await run_in_threadpool(work)
    return RunList(runs=[RunListItem(**r) for r in runs], count=len(runs))


@router.get("/v1/runs/{run_id:path}/waste", response_model=Ledger, responses=_404,  # type: ignore[arg-type]
            summary="The run's waste ledger in GPU-seconds")
async def get_waste(run: ReadRunDep, engine: EngineDep, settings: SettingsDep) -> Ledger:
    return Ledger(**await run_in_threadpool(ledger_now, engine, run, time.time(), live_config(settings)))


@router.get("/v1/runs/{run_id:path}", response_model=RunDetail, responses=_404,  # type: ignore[arg-type]
            summary="Attempts, restarts, last step and checkpoint, status")
async def get_run(run: ReadRunDep, engine: EngineDep, settings: SettingsDep) -> RunDetail:
    now, config = time.time(), live_config(settings)
    return RunDetail(**await run_in_threadpool(
        run_detail, engine, run, lambda row, ledger: with_live_hang(engine, row, ledger, now, config)))
