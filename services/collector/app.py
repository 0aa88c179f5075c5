"""create_app(settings) -> the collector's FastAPI application."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.telemetry import TelemetryConfig
from sqlalchemy import Engine

from services.collector.auth import Authenticator, DashboardGuard
from services.collector.errors import install_error_handlers
from services.collector.pace import SendPace
from services.collector.routes import (
    advice,
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
from services.collector.schemas.ingest import EventBatch
from services.derive.analyst import WarmAnalyses
from services.derive.cache import AnalysisCache
from services.derive.retention import PruneJob
from services.settings import DashboardSettings, ServiceSettings
from services.storage.db import make_engine
from services.storage.writer import BatchWriter

logger = logging.getLogger(__name__)


def create_app(settings: ServiceSettings | None = None, *, engine: Engine | None = None) -> FastAPI:
    settings = settings or ServiceSettings()
    engine = engine or make_engine(settings.server.database_url)
    writer = BatchWriter(engine, max_pending_events=settings.ingest.writer_max_pending_events)
    analyses = AnalysisCache(engine)
    warm = WarmAnalyses(analyses, interval_s=settings.server.warm_analyses_s)
    retention = PruneJob(analyses, retention_days=settings.server.raw_retention_days,
                         interval_s=settings.server.prune_interval_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        _log_auth_mode(auth)
        app.state.inflater = ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-inflate")
        app.state.parser = ThreadPoolExecutor(max_workers=ingest.PARSE_THREADS, thread_name_prefix="goodput-parse")
        writer.start()
        warm.start()
        retention.start()
        try:
            yield
        finally:
            retention.stop()
            warm.stop()
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
    app.state.pace = SendPace(target_requests_per_s=settings.ingest.target_requests_per_s,
                              max_interval_s=settings.ingest.max_send_interval_s)
    install_error_handlers(app)
    metrics.install(app)  # app.state.metrics and the request-duration middleware
    app.include_router(ingest.router)
    app.include_router(reports.router)  # before runs, like views
    app.include_router(views.router)  # before runs: its /v1/runs/{run_id:path} would swallow .../timeline
    app.include_router(advice.router)  # before runs, like views
    app.include_router(live.router)  # before runs, like views
    app.include_router(signals.router)  # before runs, like views
    app.include_router(resume.router)  # before runs, like views
    app.include_router(fleet.router)
    app.include_router(runs.router)
    app.include_router(health.router)
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
    def openapi(self) -> dict[str, Any]:
        """The generated schema plus EventBatch, which the ingest route reads from the raw body itself."""
        if self.openapi_schema:
            return self.openapi_schema
        schema = get_openapi(title=self.title, version=self.version, description=self.description,
                             routes=self.routes)
        batch = EventBatch.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(batch.pop("$defs", {}))
        components["EventBatch"] = batch
        self.openapi_schema = schema
        return schema
