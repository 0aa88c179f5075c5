"""Single-process mode: serve the dashboard from the collector's own FastAPI app under /dashboard/.

The Dash app (Flask, WSGI) runs behind a2wsgi's WSGIMiddleware, in a2wsgi's thread pool, and reads the API
of the same server over HTTP (see dashboards.data). In production run it as its own process instead
(`python -m dashboards --api http://collector:8000`), so slow dashboard queries never hold up ingestion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from a2wsgi import WSGIMiddleware
from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.types import ASGIApp

from dashboards.app import create_app
from services.settings import DashboardSettings

PREFIX = "/dashboard"


def mount_dashboard(app: FastAPI, config: DashboardSettings | None = None,
                    guard: Callable[[ASGIApp], ASGIApp] | None = None) -> None:
    """`guard` wraps the mounted app (the collector's access check: services.collector.auth.DashboardGuard)."""
    dash_app = create_app(config or DashboardSettings(), requests_pathname_prefix=f"{PREFIX}/")

    async def to_dashboard() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/")

    app.add_api_route(PREFIX, to_dashboard, include_in_schema=False)
    if not any(getattr(route, "path", None) == "/" for route in app.routes):
        app.add_api_route("/", to_dashboard, include_in_schema=False)
    # a2wsgi spells the ASGI interface with its own TypedDicts, starlette with plain mappings: the same protocol
    inner = cast(ASGIApp, WSGIMiddleware(dash_app.server, workers=8))
    app.mount(f"{PREFIX}/", guard(inner) if guard is not None else inner)
