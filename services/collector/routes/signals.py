"""Checkpoint requests (a scheduler asks a running run to checkpoint now) and what a running client polls.

POST /v1/runs/{run_id}/checkpoint-request   create one (201)
GET  /v1/runs/{run_id}/checkpoint-request   the run's requests, newest first, each with its fulfilment
GET  /v1/runs/{run_id}/signals              the oldest pending request, if any (polled by the client)
"""

from __future__ import annotations

import time

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from services.collector.auth import ClientRunDep, ReadRunDep, WriteRunDep
from services.collector.deps import EngineDep
from services.collector.live_models import (
    CheckpointRequestIn,
    CheckpointRequestOut,
    CheckpointRequests,
    Signals,
)
from services.collector.schemas import ErrorResponse
from services.derive.live import (
    checkpoint_requests_for_run,
    request_checkpoint,
    signals_for_run,
)

router = APIRouter(tags=["signals"])
_404: dict[int | str, dict[str, object]] = {404: {"model": ErrorResponse}}


@router.post("/v1/runs/{run_id:path}/checkpoint-request", status_code=201, response_model=CheckpointRequestOut,
             responses=_404, summary="Ask a running run to checkpoint now; its client learns of it within seconds")
async def post_checkpoint_request(run: WriteRunDep, engine: EngineDep,
                                  body: CheckpointRequestIn | None = None) -> CheckpointRequestOut:
    body = body or CheckpointRequestIn()
    made = await run_in_threadpool(lambda: request_checkpoint(engine, run, time.time(), reason=body.reason,
                                                              requested_by=body.requested_by))
    return CheckpointRequestOut(**made)


@router.get("/v1/runs/{run_id:path}/checkpoint-request", response_model=CheckpointRequests, responses=_404,
            summary="The run's checkpoint requests, newest first, with the checkpoint that fulfilled each")
async def get_checkpoint_requests(run: ReadRunDep, engine: EngineDep) -> CheckpointRequests:
    requests = await run_in_threadpool(checkpoint_requests_for_run, engine, run)
    return CheckpointRequests(run_id=run.run_id, requests=[CheckpointRequestOut(**r) for r in requests])


@router.get("/v1/runs/{run_id:path}/signals", response_model=Signals, responses=_404,
            summary="What a running client polls: the oldest pending checkpoint request")
async def get_signals(run: ClientRunDep, engine: EngineDep) -> Signals:
    pending = await run_in_threadpool(signals_for_run, engine, run)
    return Signals(run_id=run.run_id, server_time=time.time(),
                   checkpoint_request=CheckpointRequestOut(**pending) if pending else None)
