from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from services.analysis.advice import checkpoint_advice
from services.collector.auth import READ_RUN
from services.collector.deps import EngineDep
from services.collector.schemas import ErrorResponse
from services.pipeline import fleet_ledgers, ledger_for_run, run_project

router = APIRouter(tags=["advice"])


@router.get("/v1/runs/{run_id:path}/advice", responses={404: {"model": ErrorResponse}},  # type: ignore[dict-item]
            dependencies=[READ_RUN], summary="What to change: the checkpoint interval from measured failure rate and checkpoint cost")
async def get_advice(run_id: str, engine: EngineDep) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        ledger = ledger_for_run(engine, run_id)
        # similar runs of the run's own project: other teams' runs say nothing here, and are not theirs to read
        fleet = fleet_ledgers(engine, project=run_project(engine, run_id))
        return {"run_id": ledger["run_id"], "checkpoint_interval": checkpoint_advice(ledger, fleet)}

    return await run_in_threadpool(work)
