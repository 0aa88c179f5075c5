from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from fastapi import APIRouter, Request, Response

from services.collector.auth import Principal
from services.collector.batch import decompress, parse_batch
from services.collector.deps import WritePrincipalDep
from services.collector.pace import HEADER as PACE_HEADER
from services.collector.pace import SendPace, sender_of
from services.collector.plausibility import check_plausible
from services.collector.routes.metrics import IngestCounters
from services.collector.schemas.errors import ErrorResponse
from services.collector.schemas.ingest import IngestAck
from services.errors import InvalidBatch, Overloaded
from services.settings import IngestSettings, ServiceSettings
from services.storage.records import IngestRecord
from services.storage.writer import BatchWriter

router = APIRouter(tags=["ingest"])

_ERRORS: dict[int | str, dict[str, Any]] = {status: {"model": ErrorResponse}
                                            for status in (400, 401, 403, 408, 413, 415, 422, 503)}


@router.post(
    "/v1/events",
    response_model=IngestAck,
    responses={**_ERRORS, 200: {"headers": {PACE_HEADER: {
        "description": "seconds the collector asks each sender to leave between two posts (services/collector/pace.py)",
        "schema": {"type": "number"}}}}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/EventBatch"}}}}},
    summary="Ingest a batch of events (all or nothing; duplicates absorbed)",
)
async def ingest_events(request: Request, principal: WritePrincipalDep) -> Response:
    # async, unlike the read routes: the body is read from the request's stream on the event loop, under a
    # timeout and the body budget, before any thread is spent on it; big bodies are parsed on a thread. The
    # app's objects come from app.state rather than as dependencies: resolving each costs more than a small
    # batch's whole validation (benchmarks/requests.py).
    state = request.app.state
    writer: BatchWriter = state.writer
    settings: ServiceSettings = state.settings
    counters = IngestCounters(state.metrics.instruments)
    budget: BodyBudget = state.body_budget
    pace: SendPace = state.pace
    pace.seen(sender_of(request.scope["headers"], request.scope.get("client")))
    with counters.rejections(), budget.hold(_client_key(principal, request)) as take:  # counts 4xx by code
        limits = settings.ingest
        raw = await _read_capped(request, limits.max_body_bytes, take, limits.body_timeout_s)
        body = await _inflate(request, raw, limits, take)
        if len(body) <= INLINE_PARSE_BYTES:
            records = _validated(body, settings)
        else:
            parser: ThreadPoolExecutor = state.parser
            records = await asyncio.get_running_loop().run_in_executor(parser, _validated, body, settings)
    result = await asyncio.wrap_future(writer.submit(records, project=principal.project))
    counters.ingested(result.accepted, result.duplicates)
    # IngestAck's JSON written directly: FastAPI would validate and encode the model again for every request
    return Response(b'{"accepted":%d,"duplicates":%d}' % (result.accepted, result.duplicates),
                    media_type="application/json", headers={PACE_HEADER: pace.header_value})


# Bodies up to this size are parsed on the event loop: a small batch (one rank's few steps, ~300 bytes) validates
# in tens of microseconds, less than the hop to a worker thread and back; bigger ones go to the app's parsing
# threads so that a large upload never holds up the loop.
INLINE_PARSE_BYTES = 16 * 1024
# Parsing threads per process. Few on purpose: parsing holds the GIL, and with one thread per waiting request
# (AnyIO's pool: 40) the writer threads got a fortieth of it each while their transactions held row locks; the
# other workers' writers queued behind those locks and an overloaded collector stopped answering at all
# (benchmarks.load, 10,240 ranks through node relays: transactions "idle in transaction" for 20 s). Bodies waiting
# for a parser stay within the body budget (GOODPUT_MAX_INFLIGHT_BODY_BYTES).
PARSE_THREADS = 2


def _validated(body: bytes | bytearray, settings: ServiceSettings) -> list[IngestRecord]:
    limits = settings.ingest
    records = parse_batch(body, max_events=limits.max_events_per_batch, max_rows=limits.max_rows_per_batch)
    check_plausible(records, settings.plausibility, now=time.time())
    return records


async def _inflate(request: Request, raw: bytearray, limits: IngestSettings,
                   take: Callable[[int], None]) -> bytes | bytearray:
    """Undo Content-Encoding on the app's one inflating thread (zlib releases the GIL): neither the event loop
    nor more than one core is ever spent inflating, however many clients post bombs at once."""
    encoding = request.headers.get("content-encoding")
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return raw
    inflater: ThreadPoolExecutor = request.app.state.inflater
    body = await asyncio.get_running_loop().run_in_executor(inflater, decompress, raw, encoding,
                                                            limits.max_body_bytes)
    take(len(body))  # the inflated copy counts too
    return body


def _client_key(principal: Principal, request: Request) -> str:
    if principal.token_id is not None:
        return f"token:{principal.token_id}"
    return f"address:{request.client.host if request.client else '?'}"


class BodyBudget:
    """Bytes of request bodies being read, inflated and parsed at the same time: bounded across all requests
    (GOODPUT_MAX_INFLIGHT_BODY_BYTES), so memory stays bounded however many clients post at once, and per client
    (GOODPUT_MAX_INFLIGHT_BODY_BYTES_PER_CLIENT), so one client's stalled or huge uploads leave room for the
    others. A request that would go over either gets 503 + Retry-After (Overloaded) at once; a request with
    nothing else in flight for its client always fits its client's share, and one alone always fits."""

    def __init__(self, limit_bytes: int, per_client_bytes: int | None = None) -> None:
        self.limit_bytes = limit_bytes
        self.per_client_bytes = per_client_bytes if per_client_bytes is not None else limit_bytes
        self.used_bytes = 0
        self.used_by_client: dict[str, int] = {}
        self._lock = threading.Lock()  # take() runs on the event loop and in the decoding thread

    @contextmanager
    def hold(self, client: str = "") -> Iterator[Callable[[int], None]]:
        held = 0

        def take(n: int) -> None:
            nonlocal held
            with self._lock:
                mine = self.used_by_client.get(client, 0)
                if mine > held and mine + n > self.per_client_bytes:
                    raise Overloaded(f"this client's uploads in progress hold {mine} bytes (limit "
                                     f"{self.per_client_bytes} per client)")
                if self.used_bytes > held and self.used_bytes + n > self.limit_bytes:
                    raise Overloaded(f"the collector is reading {self.used_bytes} bytes of other requests' bodies "
                                     f"(limit {self.limit_bytes})")
                self.used_bytes += n
                self.used_by_client[client] = mine + n
                held += n

        try:
            yield take
        finally:
            with self._lock:
                self.used_bytes -= held
                left = self.used_by_client.get(client, 0) - held
                if left > 0:
                    self.used_by_client[client] = left
                else:
                    self.used_by_client.pop(client, None)


async def _read_capped(request: Request, max_bytes: int, take: Callable[[int], None],
                       timeout_s: float) -> bytearray:
    """The body, read into one buffer: with a Content-Length, one buffer of exactly that size, reserved in the
    budget up front (no growing, no copies: memory is the body, once); without one, a buffer grown as it comes."""
    declared = request.headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else None
    if size is not None and size > max_bytes:
        raise InvalidBatch(f"the body is {declared} bytes, more than the {max_bytes}-byte limit; send smaller batches",
                           status=413, code="body_too_large")
    try:
        async with asyncio.timeout(timeout_s):
            if size is not None:
                return await _read_sized(request, size, take)
            return await _read_growing(request, max_bytes, take)
    except TimeoutError:
        raise InvalidBatch(f"the body did not arrive within {timeout_s:g} s; nothing was stored, send it again "
                           "(GOODPUT_BODY_TIMEOUT_S)", status=408, code="body_timeout") from None


async def _read_sized(request: Request, size: int, take: Callable[[int], None]) -> bytearray:
    take(size)
    body = bytearray(size)
    filled = 0
    with memoryview(body) as view:
        async for chunk in request.stream():
            if filled + len(chunk) > size:
                raise InvalidBatch(f"the body is longer than its Content-Length ({size})", status=400,
                                   code="malformed_body")
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
    if filled != size:
        raise InvalidBatch(f"the body ended after {filled} of its {size} bytes (Content-Length); send it again",
                           status=400, code="malformed_body")
    return body


async def _read_growing(request: Request, max_bytes: int, take: Callable[[int], None]) -> bytearray:
    body = bytearray()
    async for chunk in request.stream():
        take(len(chunk))
        if len(body) + len(chunk) > max_bytes:
            raise InvalidBatch(f"the body is larger than the {max_bytes}-byte limit; send smaller batches",
                               status=413, code="body_too_large")
        body += chunk
    return body

