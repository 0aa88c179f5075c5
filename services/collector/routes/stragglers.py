from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from services.collector.auth import ReadRunDep
from services.collector.deps import EngineDep
from services.collector.schemas import ErrorResponse
from services.derive.stragglers import straggler_report

router = APIRouter(tags=["advice"])


@router.get("/v1/runs/{run_id:path}/stragglers", responses={404: {"model": ErrorResponse}},  # type: ignore[dict-item]
            summary="Which ranks and hosts straggle, how often, what it cost, and the cost at other scales")
async def get_stragglers(run: ReadRunDep, engine: EngineDep) -> dict[str, Any]:
    return await run_in_threadpool(straggler_report, engine, run)
