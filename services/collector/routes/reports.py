"""Waste reports: one run as JSON, CSV or self-contained HTML, and a CSV of every run (the fleet).

Thin: the ledger and views come from services.derive (kept per run version); services.reports renders them.
The report's `ledger` is the same model `GET /v1/runs/{run_id}/waste` serves, so the two documents agree to the
last digit.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response

from services.collector.deps import AnalysesDep, LiveConfigDep, RunDep, RunScopeDep
from services.collector.schemas.errors import NOT_FOUND
from services.derive.live import with_live_hang
from services.derive.resume import resume_check
from services.derive.runs import current_ledgers, runs_in_scope
from services.derive.views import current_views
from services.reports import breakdown_csv, build_report, fleet_csv, report_html, report_json

router = APIRouter(tags=["reports"])
_MEDIA = {"json": "application/json", "csv": "text/csv; charset=utf-8", "html": "text/html; charset=utf-8"}
ReportFormat = Literal["json", "csv", "html"]
_RENDER = {"json": report_json, "csv": breakdown_csv, "html": report_html}


def _filename(run_id: str, suffix: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)[:120] + suffix


@router.get(
    "/v1/runs/{run_id:path}/report", responses={**NOT_FOUND, 200: {"content": {m: {} for m in _MEDIA.values()}}},
    response_class=Response,
    summary="The run's waste report: ledger, restarts, checkpoints, stragglers, recommendations",
)
def get_report(run: RunDep, analyses: AnalysesDep, live: LiveConfigDep,
               format: Annotated[ReportFormat, Query(description="json, csv (one row per category) "
                                                     "or html (self-contained, prints well)")] = "json",
               ) -> Response:
    analysed = current_views(analyses, run)
    now = time.time()
    ledger = with_live_hang(analyses.engine, run, analysed.ledger, now, live)  # a hung run's hang so far
    report = build_report(ledger, analysed.views, generated_at=now, resume_check=resume_check(analyses, run),
                          detail_pruned_at=run.detail_pruned_at)
    body = _RENDER[format](report)
    disposition = "inline" if format == "html" else "attachment"
    return Response(body, media_type=_MEDIA[format], headers={
        "Content-Disposition": f'{disposition}; filename="{_filename(run.run_id, "-report." + format)}"'})


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
        "Content-Disposition": 'attachment; filename="goodput-fleet.csv"'})
