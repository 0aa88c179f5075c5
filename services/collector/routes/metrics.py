"""`GET /metrics` (Prometheus text format) and the request-duration middleware.

`install(app)` is called once by `create_app`: it attaches the app's `MetricsService` and times every request.
The metric names and labels are documented in services/metrics/collectors.py and instruments.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, cast

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.collector.auth import READ_FLEET
from services.derive.live import live_config
from services.metrics import CONTENT_TYPE, CollectorInstruments, MetricsService

router = APIRouter(tags=["metrics"])
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def install(app: FastAPI) -> None:
    settings = app.state.settings
    service = MetricsService(app.state.analyses, settings.metrics, live=live_config(settings))
    app.state.metrics = service
    writer = app.state.writer
    app.add_middleware(RequestTimer, instruments=service.instruments, write_queue=lambda: writer.pending_events)


def _metrics_service(request: Request) -> MetricsService:
    return cast(MetricsService, request.app.state.metrics)


async def _service(request: Request) -> MetricsService:  # async: a plain def dependency costs a thread hop
    return _metrics_service(request)


MetricsDep = Annotated[MetricsService, Depends(_service)]




@router.get("/metrics", response_class=Response, summary="Prometheus metrics (text exposition format)",
            dependencies=[READ_FLEET], responses={200: {"content": {CONTENT_TYPE: {}}}})
def metrics(service: MetricsDep) -> Response:
    return Response(service.render(), media_type=CONTENT_TYPE)  # reads the database once per cache TTL at most


UNMATCHED = "unmatched"


def handler_label(scope: Scope) -> str:
    """The route template that answered: ``/v1/runs/{run_id:path}/waste`` (never the run id itself); for an app
    mounted under a prefix (the embedded dashboard), the mount's template, ``/dashboard/{path:path}``, whatever
    page or asset was asked for; ``unmatched`` for a path no route knows. A fixed set, whatever the paths."""
    route = scope.get("route")
    if isinstance(route, Mount):
        return _mount_template(route)
    path = getattr(route, "path", None)
    if isinstance(path, str) and path:
        return path
    app = scope.get("app")  # the router does not always leave a matched mount in the scope: match it here
    request_path = scope.get("path", "")
    for candidate in getattr(app, "routes", ()):
        if isinstance(candidate, Mount) and (request_path == candidate.path
                                             or request_path.startswith(candidate.path + "/")):
            return _mount_template(candidate)
    return UNMATCHED


def _mount_template(mount: Mount) -> str:
    return f"{mount.path}/{{path:path}}"


class RequestTimer:
    """Pure ASGI middleware: one histogram observation per HTTP request, labelled by `handler_label` (the route
    template), method and status code; after each request, this process's write queue (`write_queue()` rows)."""

    def __init__(self, app: ASGIApp, instruments: CollectorInstruments,
                 write_queue: Callable[[], int] | None = None) -> None:
        self.app = app
        self._histogram = instruments.request_seconds
        self._queue_gauge = instruments.write_queue
        self._write_queue = write_queue

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escapes the app becomes a 500 further out

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            method = scope.get("method", "")
            method = method if method in _METHODS else "other"
            self._histogram.labels(handler_label(scope), method, str(status)).observe(time.perf_counter() - started)
            if self._write_queue is not None:
                self._queue_gauge.set(self._write_queue())
