"""Waste reports: one run as JSON, CSV or HTML (its charts load plotly.js from here, or inline), and a CSV of every
run (the fleet).

Thin: services.derive.reports renders the run as served (its ledger and views kept per run version).
The report's `ledger` is the same model `GET /v1/runs/{run_id}/waste` serves, so the two documents agree to the
last digit.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from services.collector.deps import AnalysesDep, LiveConfigDep, RunDep, RunScopeDep
from services.derive.reports import ReportFormat, fleet_report, run_report
from services.derive.runs import runs_in_scope
from services.schemas.errors import NOT_FOUND

router = APIRouter(tags=["reports"])
_MEDIA = {"json": "application/json", "csv": "text/csv; charset=utf-8", "html": "text/html; charset=utf-8"}


@router.get(
    "/v1/runs/{run_id:path}/report", responses={**NOT_FOUND, 200: {"content": {m: {} for m in _MEDIA.values()}}},
    response_class=Response,
    summary="The run's waste report: ledger, restarts, checkpoints, stragglers, recommendations",
)
def get_report(request: Request, run: RunDep, analyses: AnalysesDep, live: LiveConfigDep,
               format: Annotated[ReportFormat, Query(description=(
                   "json, csv (one table: ledger, attempts, checkpoints, ranks) or html (prints well)"))] = "json",
               self_contained: Annotated[bool, Query(description=(
                   "html: inline plotly.js (a 4.9 MB file to send elsewhere); by default the page loads it from "
                   "this collector (GET /v1/assets/plotly.min.js)"))] = False,
               ) -> Response:
    plotly_src = None if self_contained or format != "html" else str(request.url_for("get_plotly_js"))
    report = run_report(analyses, run, time.time(), live, format, plotly_src=plotly_src)
    disposition = "inline" if format == "html" else "attachment"
    return Response(report.body, media_type=_MEDIA[format], headers={
        "Content-Disposition": f'{disposition}; filename="{report.filename}"'})


@router.get("/v1/reports/fleet.csv", response_class=Response, responses={200: {"content": {_MEDIA["csv"]: {}}}},
            summary="Every run's ledger as one CSV row, with its project (filter by time range, status, project)")
def get_fleet_csv(
    analyses: AnalysesDep,
    live: LiveConfigDep,
    scope: RunScopeDep,
    since: Annotated[float | None, Query(description="only runs with events at or after this epoch time")] = None,
    until: Annotated[float | None, Query(description="only runs with events at or before this epoch time")] = None,
    status: Annotated[str | None, Query(pattern="^(running|finished|failed|cancelled)$")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> Response:
    rows = runs_in_scope(analyses, scope, since=since, until=until, limit=limit)
    report = fleet_report(analyses, rows, time.time(), live, status=status)
    return Response(report.body, media_type=_MEDIA["csv"], headers={
        "Content-Disposition": f'attachment; filename="{report.filename}"'})
