"""Waste reports: one run as JSON, CSV or self-contained HTML, and a CSV of every run (the fleet).

Thin: the ledger and views come from the pipelines (cached per run version); services.reports renders them.
The report's `ledger` is serialised through the same response model as `GET /v1/runs/{run_id}/waste`, so the
two documents agree to the last digit.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from services.collector.auth import ReadRunDep, RunScopeDep
from services.collector.deps import EngineDep, SettingsDep
from services.collector.read_models import Ledger
from services.collector.schemas import ErrorResponse
from services.derive.live import live_config, with_live_hang
from services.derive.ledger import ledger_for_row
from services.reports import breakdown_csv, build_report, fleet_csv, report_html, report_json
from services.derive.resume import resume_check
from services.storage.load import get_run, list_runs
from services.derive.views import views_for_row

router = APIRouter(tags=["reports"])
_404: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse}}
_MEDIA = {"json": "application/json", "csv": "text/csv; charset=utf-8", "html": "text/html; charset=utf-8"}
ReportFormat = Literal["json", "csv", "html"]


def _filename(run_id: str, suffix: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)[:120] + suffix


def _wire_ledger(ledger: dict[str, Any]) -> dict[str, Any]:
    return Ledger(**ledger).model_dump(mode="json")


@router.get(
    "/v1/runs/{run_id:path}/report", responses={**_404, 200: {"content": {m: {} for m in _MEDIA.values()}}},
    response_class=Response,
    summary="The run's waste report: ledger, restarts, checkpoints, stragglers, recommendations",
)
async def get_report(run: ReadRunDep, engine: EngineDep, settings: SettingsDep,
                     format: Annotated[ReportFormat, Query(description="json, csv (one row per category) "
                                                           "or html (self-contained, prints well)")] = "json",
                     ) -> Response:
    def work() -> str:
        with engine.connect() as conn:
            row = get_run(conn, run)
        views, ledger = views_for_row(engine, row)
        now = time.time()
        ledger = with_live_hang(engine, row, ledger, now, live_config(settings))  # a hung run's hang so far
        report = build_report(_wire_ledger(ledger), views, generated_at=now,
                              resume_check=resume_check(engine, run))
        if format == "csv":
            return breakdown_csv(report)
        if format == "html":
            return report_html(report)
        return report_json(report)

    body = await run_in_threadpool(work)
    disposition = "inline" if format == "html" else "attachment"
    return Response(body, media_type=_MEDIA[format], headers={
        "Content-Disposition": f'{disposition}; filename="{_filename(run.run_id, "-report." + format)}"'})


@router.get("/v1/reports/fleet.csv", response_class=Response, responses={200: {"content": {_MEDIA["csv"]: {}}}},
            summary="Every run's ledger as one CSV row, with its project (filter by time range, status, project)")
async def get_fleet_csv(
    engine: EngineDep,
    settings: SettingsDep,
    scope: RunScopeDep,
    since: Annotated[float | None, Query(description="only runs with events at or after this epoch time")] = None,
    until: Annotated[float | None, Query(description="only runs with events at or before this epoch time")] = None,
    status: Annotated[str | None, Query(pattern="^(running|finished|failed|cancelled)$")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> Response:
    def work() -> str:
        with engine.connect() as conn:
            rows = [] if scope.matches_nothing else list_runs(conn, since=since, until=until, limit=limit,
                                                              project=scope.project)
        now, config = time.time(), live_config(settings)
        ledgers = [{**_wire_ledger(with_live_hang(engine, row, ledger_for_row(engine, row), now, config)),
                    "project": row.project} for row in rows]
        return fleet_csv(ledger for ledger in ledgers if status is None or ledger["status"] == status)

    body = await run_in_threadpool(work)
    return Response(body, media_type=_MEDIA["csv"], headers={
        "Content-Disposition": 'attachment; filename="goodput-fleet.csv"'})
