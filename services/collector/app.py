"""create_app(settings) -> the collector's FastAPI application."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.telemetry import TelemetryConfig
from pydantic import BaseModel
from sqlalchemy import Engine
from starlette.types import Receive, Scope, Send

from services.collector.auth import Authenticator, DashboardGuard
from services.collector.errors import install_error_handlers
from services.collector.pace import SendPace
from services.collector.routes import (
    advice,
    assets,
    fleet,
    health,
    ingest,
    live,
    metrics,
    reports,
    resume,
    runs,
    signals,
    views,
    whoami,
)
from services.derive.background import BackgroundJobs
from services.derive.cache import AnalysisCache
from services.derive.memory import tune_allocator
from services.schemas.errors import ErrorResponse
from services.schemas.events import EventBatch, IngestAck
from services.settings import DashboardSettings, ServiceSettings, beside_an_analyst
from services.storage.db import make_engine
from services.storage.summary_cache import SummaryCache
from services.storage.writer import BatchWriter, Linger

logger = logging.getLogger(__name__)


# How long a thread holds the GIL while another waits for it (CPython's default: 5 ms). Each of the writer thread's
# round trips to PostgreSQL releases the GIL a few times inside the driver; while the event loop runs Python (under
# load, nearly always) the writer gets it back only when the loop is made to switch, so its groups' wall is their
# round trips times the interval: a group of 32 small requests took 179 ms beside a busy thread at 5 ms, 26 ms at
# 0.5 ms, 12 alone (`python -m benchmarks.writer_gil`). Small requests ran at 0.47-0.49 of the bare app against
# 0.42-0.47 (`benchmarks.requests`, alternating, a day the writer was the bound); the fleet's shape within a few
# percent (benchmarks/results/writer-gil-switch-interval_2core-vm-slow-day_202612.md).
GIL_SWITCH_INTERVAL_S = 0.0005


def create_served_app() -> FastAPI:
    """The app of `goodput serve` (each worker process calls it): `create_app` that also takes its start-up objects
    out of the garbage collector's way, sets up the C allocator against fragmentation (services.derive.memory) and
    hands the GIL over sooner (`GIL_SWITCH_INTERVAL_S`), which only a process that runs nothing else may do (not a
    test process)."""
    tune_allocator()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    return create_app(freeze_heap_at_start=True)


def create_app(settings: ServiceSettings | None = None, *, engine: Engine | None = None,
               freeze_heap_at_start: bool = False) -> FastAPI:
    settings = settings or ServiceSettings()
    if settings.server.analyst == "elsewhere":
        settings = beside_an_analyst(settings)  # no background job here; what is polled serves the stored analyses
    engine = engine or make_engine(settings.server.database_url)
    pace = SendPace(target_requests_per_s=settings.ingest.target_requests_per_s,
                    max_interval_s=settings.ingest.max_send_interval_s)
    # a group waits for more batches only while several senders post (a lone client waiting for its answer would
    # only wait longer), and longer while they are paced
    writer = BatchWriter(engine, max_pending_events=settings.ingest.writer_max_pending_events,
                         max_queue_s=settings.ingest.writer_max_queue_s,
                         linger=Linger(settings.ingest.writer_linger_s, only_while=lambda: pace.senders > 1,
                                       paced=lambda: pace.interval_s))
    analyses = AnalysisCache(engine, summaries=SummaryCache(capacity_bytes=settings.server.analysis_cache_mb << 20),
                             kept_elsewhere=settings.server.analyst == "elsewhere")
    background = BackgroundJobs(analyses, settings.server)  # GOODPUT_WARM_ANALYSES_S / PRUNE_INTERVAL_S 0: none

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        _log_auth_mode(auth)
        app.state.inflater = ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-inflate")
        app.state.parser = ThreadPoolExecutor(max_workers=ingest.PARSE_THREADS, thread_name_prefix="goodput-parse")
        app.state.body_deadlines = ingest.BodyDeadlines()
        deadline_watch = asyncio.create_task(app.state.body_deadlines.watch(), name="goodput-body-deadlines")
        analyses.summaries.report_size_to(app.state.metrics.instruments.analysis_cache.set)
        analyses.report_cpu_to(app.state.metrics.instruments.analysis_cpu.inc)
        writer.start()
        background.start()
        if freeze_heap_at_start:
            # Everything made so far (modules, the app, its routes and schemas: most of the process's objects)
            # lives as long as the process. Without this, each full collection walked them all: a 50-65 ms pause
            # every few seconds under load, the p99 of every request (benchmarks/requests.py: p99 60 -> 27 ms).
            gc.freeze()
        try:
            yield
        finally:
            deadline_watch.cancel()
            background.stop()
            writer.stop()
            app.state.inflater.shutdown(wait=False, cancel_futures=True)
            app.state.parser.shutdown(wait=False, cancel_futures=True)

    app = _Collector(
        telemetry=None if settings.server.opentelemetry else _NO_TELEMETRY,
        title="goodput collector",
        version="0.1.0",
        description="Ingests training events and serves where each run's GPU-seconds went.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.writer = writer
    app.state.analyses = analyses  # every derived product of a run (ledger, views, ...), shared with the analyst
    app.state.auth = auth = Authenticator(engine, cache_ttl_s=settings.server.auth_cache_ttl_s)
    app.state.body_budget = ingest.BodyBudget(settings.ingest.max_inflight_body_bytes,
                                              settings.ingest.max_inflight_body_bytes_per_client)
    app.ingest = ingest.IngestEndpoint(app.state)
    app.state.pace = pace
    install_error_handlers(app)
    metrics.install(app)  # app.state.metrics and the request-duration middleware
    app.include_router(reports.router)  # before runs, like views
    app.include_router(views.router)  # before runs: its /v1/runs/{run_id:path} would swallow .../timeline
    app.include_router(advice.router)  # before runs, like views
    app.include_router(live.router)  # before runs, like views
    app.include_router(signals.router)  # before runs, like views
    app.include_router(resume.router)  # before runs, like views
    app.include_router(fleet.router)
    app.include_router(runs.router)
    app.include_router(health.router)
    app.include_router(assets.router)
    app.include_router(whoami.router)
    app.include_router(metrics.router)
    if settings.server.serve_dashboard:
        _mount_dashboard(app, settings.dashboard)
    return app


# FastAPI's native OpenTelemetry asks the global providers on every request whether they are configured, even
# when no SDK is installed: ~20% of a small ingest request's cost (benchmarks/requests.py). Off unless asked for.
_NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}


def _mount_dashboard(app: FastAPI, config: DashboardSettings) -> None:
    """Single-process mode: the Dash app under /dashboard/, reading this same collector's API over HTTP."""
    try:
        from dashboards.mount import mount_dashboard
    except ImportError as exc:  # the dashboard's own dependencies are missing
        logger.warning("dashboard not served: %s (install goodput[server])", exc)
        return
    mount_dashboard(app, config, guard=lambda inner: DashboardGuard(inner, app.state.auth))


def _log_auth_mode(auth: Authenticator) -> None:
    try:
        enabled = auth.enabled()
    except Exception as exc:  # the database may come up later; requests will say so
        logger.warning("could not read the access tokens (%s); requests will be checked when it answers", exc)
        return
    if enabled:
        logger.warning("authentication on: every request needs a token (goodput token list)")
    else:
        logger.warning("authentication off: no access token exists, so only localhost clients are accepted; "
                       "create tokens with `goodput token create` to accept others")


class _Collector(FastAPI):
    ingest: ingest.IngestEndpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # POST /v1/events, nearly every request a collector gets, skips FastAPI's routing (routes/ingest.py)
        if scope["type"] == "http" and scope["path"] == ingest.PATH:
            await self.ingest(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        """The generated schema plus the ingest endpoint, which is not a FastAPI route, and EventBatch, which it
        reads from the raw body itself."""
        if self.openapi_schema:
            return self.openapi_schema
        schema = get_openapi(title=self.title, version=self.version, description=self.description,
                             routes=self.routes)
        schema["paths"] = {ingest.PATH: ingest.openapi_operation(), **schema.get("paths", {})}
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        modes: tuple[tuple[type[BaseModel], Literal["validation", "serialization"]], ...] = (
            (EventBatch, "validation"), (IngestAck, "serialization"), (ErrorResponse, "serialization"))
        for model, mode in modes:
            if model.__name__ not in components:  # ErrorResponse is there already, from the other routes
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)
                components.update(model_schema.pop("$defs", {}))
                components[model.__name__] = model_schema
        self.openapi_schema = schema
        return schema
