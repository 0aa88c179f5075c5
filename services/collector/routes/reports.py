"""Waste reports: one run as JSON, CSV or HTML (its charts load plotly.js from here, or inline), and a CSV of every
run (the fleet).

Thin: the ledger and views come from services.derive (kept per run version); services.reports renders them.
The report's `ledger` is the same model `GET /v1/runs/{run_id}/waste` serves, so the two documents agree to the
last digit.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response

from services.collector.deps import AnalysesDep, LiveConfigDep, RunDep, RunScopeDep
from services.derive.advice import advice_input
from services.derive.runs import current_ledgers, runs_in_scope
from services.reports import breakdown_csv, build_report, fleet_csv, report_filename, report_html, report_json
from services.reports.advice import run_advice
from services.reports.export import FLEET_FILENAME
from services.schemas.errors import NOT_FOUND

router = APIRouter(tags=["reports"])
_MEDIA = {"json": "application/json", "csv": "text/csv; charset=utf-8", "html": "text/html; charset=utf-8"}
ReportFormat = Literal["json", "csv", "html"]
_RENDER = {"json": report_json, "csv": breakdown_csv}


@router.get(
    "/v1/runs/{run_id:path}/report", responses={**NOT_FOUND, 200: {"content": {m: {} for m in _MEDIA.values()}}},
    response_class=Response,
    summary="The run's waste report: ledger, restarts, checkpoints, stragglers, recommendations",
)
def get_report(request: Request, run: RunDep, analyses: AnalysesDep, live: LiveConfigDep,
               format: Annotated[ReportFormat, Query(description="json, csv (one row per category) "
                                                     "or html (prints well)")] = "json",
               self_contained: Annotated[bool, Query(description=(
                   "html: inline plotly.js (a 4.9 MB file to send elsewhere); by default the page loads it from "
                   "this collector (GET /v1/assets/plotly.min.js)"))] = False,
               ) -> Response:
    now = time.time()
    inp = advice_input(analyses, run, now, live)  # the ledger (a hung run's hang so far), views, resume check, peers
    report = build_report(inp.ledger, inp.views, generated_at=now, advice=run_advice(inp),
                          detail_pruned_at=run.detail_pruned_at)
    if format == "html":
        body = report_html(report, plotly_src=None if self_contained else str(request.url_for("get_plotly_js")))
    else:
        body = _RENDER[format](report)
    disposition = "inline" if format == "html" else "attachment"
    return Response(body, media_type=_MEDIA[format], headers={
        "Content-Disposition": f'{disposition}; filename="{report_filename(run.run_id, format)}"'})


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
    ledgers = current_ledgers(analyses, rows, now=time.time(), config=live)
    body = fleet_csv((row.project, ledger) for row, ledger in ledgers if status is None or ledger.status == status)
    return Response(body, media_type=_MEDIA["csv"], headers={
        "Content-Disposition": f'attachment; filename="{FLEET_FILENAME}"'})
