"""Checkpoint requests (a scheduler asks a running run to checkpoint now) and what a running client polls.

POST /v1/runs/{run_id}/checkpoint-request   create one (201)
GET  /v1/runs/{run_id}/checkpoint-request   the run's requests, newest first, each with its fulfilment
GET  /v1/runs/{run_id}/signals              the oldest pending request, if any (polled by the client)
"""

from __future__ import annotations

import time

from fastapi import APIRouter

from services.collector.deps import ClientRunDep, EngineDep, RunDep, WriteRunDep
from services.derive.live import checkpoint_requests_for_run, request_checkpoint, signals_for_run
from services.schemas.errors import NOT_FOUND
from services.schemas.live import CheckpointRequestIn, CheckpointRequestOut, CheckpointRequests, Signals

router = APIRouter(tags=["signals"])


@router.post("/v1/runs/{run_id:path}/checkpoint-request", status_code=201, response_model=CheckpointRequestOut,
             responses=NOT_FOUND, summary="Ask a running run to checkpoint now; its client learns of it within seconds")
def post_checkpoint_request(run: WriteRunDep, engine: EngineDep,
                            body: CheckpointRequestIn | None = None) -> CheckpointRequestOut:
    body = body or CheckpointRequestIn()
    return request_checkpoint(engine, run, time.time(), reason=body.reason, requested_by=body.requested_by)


@router.get("/v1/runs/{run_id:path}/checkpoint-request", response_model=CheckpointRequests, responses=NOT_FOUND,
            summary="The run's checkpoint requests, newest first, with the checkpoint that fulfilled each")
def get_checkpoint_requests(run: RunDep, engine: EngineDep) -> CheckpointRequests:
    return CheckpointRequests(run_id=run.run_id, requests=checkpoint_requests_for_run(engine, run))


@router.get("/v1/runs/{run_id:path}/signals", response_model=Signals, responses=NOT_FOUND,
            summary="What a running client polls: the oldest pending checkpoint request")
def get_signals(run: ClientRunDep, engine: EngineDep) -> Signals:
    pending = signals_for_run(engine, run)
    return Signals(run_id=run.run_id, server_time=time.time(), checkpoint_request=pending)
