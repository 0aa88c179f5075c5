from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from services.analysis.advice import checkpoint_advice
from services.collector.auth import ReadRunDep
from services.collector.deps import EngineDep
from services.collector.schemas import ErrorResponse
from services.derive.ledger import fleet_ledgers, ledger_for_run

router = APIRouter(tags=["advice"])


@router.get("/v1/runs/{run_id:path}/advice", responses={404: {"model": ErrorResponse}},  # type: ignore[dict-item]
            summary="What to change: the checkpoint interval from measured failure rate and checkpoint cost")
async def get_advice(run: ReadRunDep, engine: EngineDep) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        ledger = ledger_for_run(engine, run)
        # similar runs of the run's own project: other teams' runs say nothing here, and are not theirs to read
        fleet = fleet_ledgers(engine, project=run.project)
        return {"run_id": ledger["run_id"], "checkpoint_interval": checkpoint_advice(ledger, fleet)}

    return await run_in_threadpool(work)
