from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from services.collector.auth import WritePrincipalDep
from services.collector.batch import decompress, parse_batch
from services.collector.deps import SettingsDep, WriterDep
from services.collector.routes.metrics import IngestCountersDep
from services.collector.schemas import ErrorResponse, EventBatch, IngestAck
from services.errors import InvalidBatch, Overloaded

router = APIRouter(tags=["ingest"])

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 403, 413, 415, 422, 503)}


@router.post(
    "/v1/events",
    response_model=IngestAck,
    responses=_ERRORS,  # type: ignore[arg-type]
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/EventBatch"}}}}},
    summary="Ingest a batch of events (all or nothing; duplicates absorbed)",
)
async def ingest_events(request: Request, writer: WriterDep, settings: SettingsDep,
                        counters: IngestCountersDep, principal: WritePrincipalDep) -> IngestAck:
    budget: BodyBudget = request.app.state.body_budget
    with counters.rejections(), budget.hold() as take:  # counts 400 / 413 / 415 / 422 by error code
        raw = await _read_capped(request, settings.max_body_bytes, take)
        body = decompress(raw, request.headers.get("content-encoding"), settings.max_body_bytes)
        if body is not raw:
            take(len(body))  # the inflated copy counts too
        records = await run_in_threadpool(parse_batch, body, max_events=settings.max_events_per_batch,
                                          max_rows=settings.max_rows_per_batch)
    result = await asyncio.wrap_future(writer.submit(records, project=principal.project))
    counters.ingested(result.accepted, result.duplicates)
    return IngestAck(accepted=result.accepted, duplicates=result.duplicates)


class BodyBudget:
    """Bytes of request bodies being read, inflated and parsed at the same time, across all requests: bounded
    (GOODPUT_MAX_INFLIGHT_BODY_BYTES), so memory stays bounded however many clients post at once. A request
    that would go over it gets 503 + Retry-After (Overloaded) at once; one request alone always fits.
    Used from the event loop only, so no lock."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0

    @contextmanager
    def hold(self) -> Iterator[Callable[[int], None]]:
        held = 0

        def take(n: int) -> None:
            nonlocal held
            if self.used_bytes > held and self.used_bytes + n > self.limit_bytes:
                raise Overloaded(f"the collector is reading {self.used_bytes} bytes of other requests' bodies "
                                 f"(limit {self.limit_bytes})")
            self.used_bytes += n
            held += n

        try:
            yield take
        finally:
            self.used_bytes -= held


async def _read_capped(request: Request, max_bytes: int, take: Callable[[int], None]) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise InvalidBatch(f"the body is {declared} bytes, more than the {max_bytes}-byte limit; send smaller batches",
                           status=413, code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        take(len(chunk))
        if size > max_bytes:
            raise InvalidBatch(f"the body is larger than the {max_bytes}-byte limit; send smaller batches",
                               status=413, code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


# Referenced by the OpenAPI request body above.
EVENT_BATCH_SCHEMA = EventBatch
