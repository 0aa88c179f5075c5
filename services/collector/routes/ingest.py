"""POST /v1/events, the busiest endpoint by far: every rank of every run posts here every few tenths of a second.

It is a plain ASGI app that the collector calls before FastAPI's routing (`_Collector.__call__`), not a FastAPI
route: the router, dependency resolution, exit stacks and five middleware layers cost more than the rest of a
small request together (a 2-step record: ~250 us of ~500 us, `python -m benchmarks.requests`, py-spy). It does
what they did, explicitly: the access check (a write token, or a local client while no token exists), one
request-duration observation, and every error answered by services.collector.errors as on any other route. Its
OpenAPI operation is declared by `openapi_operation()`, so the schema and the fuzz tests see it as before.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http import HTTPStatus
from typing import Any

from starlette.datastructures import State
from starlette.types import Message, Receive, Scope, Send

from services.collector.auth import Authenticator, require_writer
from services.collector.batch import decompress, decompress_within, parse_batch
from services.collector.errors import error_response
from services.collector.pace import HEADER as PACE_HEADER
from services.collector.pace import SendPace, sender_of
from services.collector.plausibility import check_plausible
from services.errors import InvalidBatch, Overloaded
from services.metrics import CollectorInstruments
from services.settings import IngestSettings, ServiceSettings
from services.storage.clock_readings import ClockReadings, RequestClock, readings_of
from services.storage.records import IngestRecord
from services.storage.writer import BatchWriter, batch_weight

PATH = "/v1/events"
_PACE_HEADER = PACE_HEADER.lower().encode()
SENT_AT_HEADER = "Goodput-Sent-At"  # the sender's clock as it sent the request (services.storage.clock_readings)
_ERROR_STATUSES = (400, 401, 403, 405, 408, 413, 415, 422, 503)


class _Disconnected(Exception):
    """The client went away before its body was whole: there is no one to answer."""


class IngestEndpoint:
    """The ASGI app of `POST /v1/events`; any other method gets 405."""

    def __init__(self, state: State) -> None:
        self._state = state  # the app's state: the parsing threads appear in it only when the app starts
        self._row_size = RowSize()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        method = scope["method"]
        try:
            if method != "POST":
                raise _NotAllowed(method)
            ack = await self._ingest(scope, receive)
        except _Disconnected:
            self._observe(method, 499, started)
            return
        except Exception as exc:  # every error becomes its JSON answer, as on FastAPI's routes
            response = error_response(exc, method, PATH)
            await response(scope, receive, send)
            self._observe(method, response.status_code, started)
            return
        # IngestAck's JSON written directly: a model and a Response object would be built and encoded per request
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(ack)),
            (_PACE_HEADER, self._state.pace.header_value.encode())]})
        await send({"type": "http.response.body", "body": ack})
        self._observe(method, 200, started)

    async def _ingest(self, scope: Scope, receive: Receive) -> bytes:
        state = self._state
        auth: Authenticator = state.auth
        writer: BatchWriter = state.writer
        settings: ServiceSettings = state.settings
        instruments: CollectorInstruments = state.metrics.instruments
        budget: BodyBudget = state.body_budget
        pace: SendPace = state.pace
        received_at = time.time()
        principal = require_writer(await auth.authenticate_scope(scope))
        headers = _Headers(scope["headers"])
        clock = RequestClock(received_at=received_at, sent_at=_sent_at(headers.sent_at))
        pace.seen(sender_of(scope["headers"], scope.get("client")))
        client = f"token:{principal.token_id}" if principal.token_id is not None else \
            f"address:{scope['client'][0] if scope.get('client') else '?'}"
        try:
            with budget.hold(client) as take:
                limits = settings.ingest
                raw = await _read_capped(receive, headers.content_length, limits.max_body_bytes, take,
                                         state.body_deadlines, limits.body_timeout_s)
                # refused before the costly part (inflating, parsing): beyond capacity, refusals must be cheap, or
                # they take the cores the writers need. The body is read all the same: the connection stays usable
                writer.refuse_when_full()
                body = await self._inflate(raw, headers.content_encoding, limits, take)
                # room in the write queue held for the body's rows before the parse: parsed bodies are never
                # refused, so an overloaded collector spends no core on parses it throws away
                with writer.reserve(self._row_size.rows_in(len(body))) as reservation:
                    if len(body) <= INLINE_PARSE_BYTES:
                        records, readings = validate_body(body, settings, clock)
                    else:
                        parser: ThreadPoolExecutor = state.parser
                        records, readings = await asyncio.get_running_loop().run_in_executor(
                            parser, validate_body, body, settings, clock)
                    weight = batch_weight(records)
                    self._row_size.learn(len(body), weight)
                    answer = writer.submit_on_loop(records, project=principal.project, reserved=reservation,
                                                   weight=weight, clocks=readings)
            result = await answer
        except InvalidBatch as exc:
            instruments.count_rejected(exc.code)
            raise
        except Overloaded as exc:
            instruments.count_overloaded(exc.reason)
            exc.retry_after_s = pace.retry_after_s  # back in the sender's turn, not sooner than the others
            raise
        instruments.count_ingested(result.accepted, result.duplicates)
        return b'{"accepted":%d,"duplicates":%d}' % (result.accepted, result.duplicates)

    async def _inflate(self, raw: bytearray, encoding: str | None, limits: IngestSettings,
                       take: Callable[[int], None]) -> bytes | bytearray:
        """Undo Content-Encoding. A small body (a node relay's, ~1 KB) inflates on the event loop, up to
        INLINE_INFLATED_BYTES: the hop to a thread and back cost ten times the inflating. Any other, or one that
        inflates to more, inflates on the app's one inflating thread (zlib releases the GIL): neither the event loop
        nor more than one core is spent inflating large bodies, however many clients post bombs at once."""
        if encoding is None or encoding.strip().lower() in ("", "identity"):
            return raw
        body = decompress_within(raw, encoding, limits.max_body_bytes, INLINE_INFLATED_BYTES) \
            if len(raw) <= INLINE_INFLATE_BYTES else None
        if body is None:
            inflater: ThreadPoolExecutor = self._state.inflater
            body = await asyncio.get_running_loop().run_in_executor(inflater, decompress, raw, encoding,
                                                                    limits.max_body_bytes)
        take(len(body))  # the inflated copy counts too
        return body

    def _observe(self, method: str, status: int, started: float) -> None:
        instruments: CollectorInstruments = self._state.metrics.instruments
        instruments.request_timer(PATH, method, status).observe(time.perf_counter() - started)
        instruments.write_queue.set(self._state.writer.pending_events)


class _NotAllowed(InvalidBatch):
    def __init__(self, method: str) -> None:
        super().__init__(f"{PATH} takes POST only, not {method}", status=405, code="method_not_allowed")


class _Headers:
    """The request headers the endpoint reads, found in one pass over the scope's raw headers."""

    __slots__ = ("content_length", "content_encoding", "sent_at")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.content_length: str | None = None
        self.content_encoding: str | None = None
        self.sent_at: str | None = None
        for name, value in raw:
            if name == b"content-length":
                self.content_length = value.decode("latin-1")
            elif name == b"content-encoding":
                self.content_encoding = value.decode("latin-1")
            elif name == b"goodput-sent-at":
                self.sent_at = value.decode("latin-1")


def _sent_at(value: str | None) -> float | None:
    """The Goodput-Sent-At header's epoch seconds; a value that is not one is refused (400), never guessed."""
    if value is None:
        return None
    try:
        sent = float(value)
    except ValueError:
        sent = math.nan
    if not math.isfinite(sent) or sent < 0:
        raise InvalidBatch(f"the {SENT_AT_HEADER} header must be the sender's clock in epoch seconds "
                           f"(time.time()), got {value[:40]!r}", status=400, code="bad_header",
                           field=SENT_AT_HEADER)
    return sent


def openapi_operation() -> dict[str, Any]:
    """The endpoint's OpenAPI operation (its schemas: EventBatch, IngestAck, ErrorResponse; `_Collector.openapi`)."""
    def error(status: int) -> dict[str, Any]:
        return {"description": HTTPStatus(status).phrase,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}

    ok = {"description": "Successful Response",
          "headers": {PACE_HEADER: {
              "description": "seconds the collector asks each sender to leave between two posts "
                             "(services/collector/pace.py)",
              "schema": {"type": "number"}}},
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestAck"}}}}
    return {"post": {
        "tags": ["ingest"],
        "summary": "Ingest a batch of events (all or nothing; duplicates absorbed)",
        "operationId": "ingest_events_v1_events_post",
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/EventBatch"}}}},
        "responses": {"200": ok, **{str(status): error(status) for status in _ERROR_STATUSES}},
    }}


# Compressed bodies up to this size are inflated on the event loop while they inflate to at most
# INLINE_INFLATED_BYTES (~0.1 ms of zlib's time; a thread hop costs ~80 us of CPU): what a node relay posts.
INLINE_INFLATE_BYTES = 16 * 1024
INLINE_INFLATED_BYTES = 256 * 1024
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


def validate_body(body: bytes | bytearray, settings: ServiceSettings,
                  clock: RequestClock) -> tuple[list[IngestRecord], ClockReadings]:
    """A body parsed and checked as the ingest route takes it (also timed alone by benchmarks.ingest_path)."""
    limits = settings.ingest
    records = parse_batch(body, max_events=limits.max_events_per_batch, max_rows=limits.max_rows_per_batch)
    check_plausible(records, settings.plausibility, now=time.time())
    return records, readings_of(records, clock)


class RowSize:
    """Body bytes per write-queue row (`batch_weight`) of the batches this process parsed lately: how many rows an
    unparsed body will be, for the room `BatchWriter.reserve` holds. It starts low (more rows estimated, so an
    overloaded collector that just started refuses early rather than late) and follows the bodies it parses."""

    START_BYTES = 48.0
    SMOOTHING = 0.05  # each parsed batch moves the estimate 5 % of the way to its own bytes per row
    BOUNDS = (8.0, 4096.0)

    def __init__(self) -> None:
        self.bytes_per_row = self.START_BYTES

    def rows_in(self, body_bytes: int) -> int:
        return max(1, round(body_bytes / self.bytes_per_row))

    def learn(self, body_bytes: int, rows: int) -> None:
        low, high = self.BOUNDS
        measured = min(high, max(low, body_bytes / max(1, rows)))
        self.bytes_per_row += self.SMOOTHING * (measured - self.bytes_per_row)


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
                                     f"{self.per_client_bytes} per client)", reason="body_budget")
                if self.used_bytes > held and self.used_bytes + n > self.limit_bytes:
                    raise Overloaded(f"the collector is reading {self.used_bytes} bytes of other requests' bodies "
                                     f"(limit {self.limit_bytes})", reason="body_budget")
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


async def _read_capped(receive: Receive, declared: str | None, max_bytes: int, take: Callable[[int], None],
                       deadlines: BodyDeadlines, timeout_s: float) -> bytearray:
    """The body, read into one buffer: with a Content-Length, one buffer of exactly that size, reserved in the
    budget up front (no growing, no copies: memory is the body, once); without one, a buffer grown as it comes."""
    size = int(declared) if declared is not None and declared.isdigit() else None
    if size is not None and size > max_bytes:
        raise InvalidBatch(f"the body is {declared} bytes, more than the {max_bytes}-byte limit; send smaller batches",
                           status=413, code="body_too_large")
    try:
        with deadlines.reading(timeout_s):
            if size is not None:
                return await _read_sized(receive, size, take)
            return await _read_growing(receive, max_bytes, take)
    except TimeoutError:
        raise InvalidBatch(f"the body did not arrive within {timeout_s:g} s; nothing was stored, send it again "
                           "(GOODPUT_BODY_TIMEOUT_S)", status=408, code="body_timeout") from None


class BodyDeadlines:
    """Requests whose body is still arriving, each with its deadline (GOODPUT_BODY_TIMEOUT_S); one task on the
    event loop cancels the overdue ones a few times a second. Cheaper than a timer per request (asyncio.timeout:
    ~5% of a small request's cost), and a deadline met within `PERIOD_S` is all a body timeout needs."""

    PERIOD_S = 0.25

    def __init__(self) -> None:
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()

    def reading(self, timeout_s: float) -> _Reading:
        """A block that raises TimeoutError if it is still running `timeout_s` from now (while `watch` runs)."""
        return _Reading(self, timeout_s)

    async def watch(self) -> None:
        """Run for the app's lifetime (its lifespan starts and cancels it)."""
        while True:
            await asyncio.sleep(self.PERIOD_S)
            now = time.monotonic()
            for task in [t for t, deadline in self._reading.items() if deadline <= now]:
                del self._reading[task]
                self._expired.add(task)
                task.cancel()


class _Reading:
    """`BodyDeadlines.reading`'s block (a class, not @contextmanager: no generator per request)."""

    __slots__ = ("_deadlines", "_timeout_s", "_task")
    _task: asyncio.Task[Any]

    def __init__(self, deadlines: BodyDeadlines, timeout_s: float) -> None:
        self._deadlines = deadlines
        self._timeout_s = timeout_s

    def __enter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._deadlines._reading[task] = time.monotonic() + self._timeout_s

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        deadlines, task = self._deadlines, self._task
        deadlines._reading.pop(task, None)
        if task in deadlines._expired:
            deadlines._expired.discard(task)
            if exc_type is asyncio.CancelledError:
                task.uncancel()
                raise TimeoutError from None
        # cancelled for another reason (the server is stopping), or no exception: left as it is


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def _read_sized(receive: Receive, size: int, take: Callable[[int], None]) -> bytearray:
    take(size)
    body = bytearray(size)
    filled = 0
    with memoryview(body) as view:
        async for chunk in _chunks(receive):
            if filled + len(chunk) > size:
                raise InvalidBatch(f"the body is longer than its Content-Length ({size})", status=400,
                                   code="malformed_body")
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
    if filled != size:
        raise InvalidBatch(f"the body ended after {filled} of its {size} bytes (Content-Length); send it again",
                           status=400, code="malformed_body")
    return body


async def _read_growing(receive: Receive, max_bytes: int, take: Callable[[int], None]) -> bytearray:
    body = bytearray()
    async for chunk in _chunks(receive):
        take(len(chunk))
        if len(body) + len(chunk) > max_bytes:
            raise InvalidBatch(f"the body is larger than the {max_bytes}-byte limit; send smaller batches",
                               status=413, code="body_too_large")
        body += chunk
    return body
