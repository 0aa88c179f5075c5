"""A run's report and the fleet CSV as the API serves them: the run as served (its ledger with a hung run's hang so
far, its views, the advice read from the same inputs as GET /v1/runs/{id}/advice) rendered by services.reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.analysis.live import LiveConfig
from services.derive.advice import advice_input
from services.derive.cache import AnalysisCache
from services.derive.runs import current_ledgers
from services.reports import breakdown_csv, build_report, fleet_csv, report_filename, report_html, report_json
from services.reports.advice import run_advice
from services.reports.export import FLEET_FILENAME
from services.storage.runs import RunRow

ReportFormat = Literal["json", "csv", "html"]
_RENDER = {"json": report_json, "csv": breakdown_csv}


@dataclass(frozen=True, slots=True)
class Document:
    body: str
    filename: str  # what it is saved as


def run_report(analyses: AnalysisCache, row: RunRow, now: float, config: LiveConfig, format: ReportFormat, *,
               plotly_src: str | None = None) -> Document:
    """The run's waste report; its `ledger` is the one GET /v1/runs/{run_id}/waste serves, to the last digit.
    `plotly_src`: where the HTML page loads plotly.js from (None: inlined, a self-contained file)."""
    inp = advice_input(analyses, row, now, config)  # the ledger (a hung run's hang so far), views, resume check, peers
    report = build_report(inp.ledger, inp.views, generated_at=now, advice=run_advice(inp),
                          detail_pruned_at=row.detail_pruned_at)
    body = report_html(report, plotly_src=plotly_src) if format == "html" else _RENDER[format](report)
    return Document(body, report_filename(row.run_id, format))


def fleet_report(analyses: AnalysisCache, rows: list[RunRow], now: float, config: LiveConfig, *,
                 status: str | None = None) -> Document:
    """One CSV row per run of `rows` (whose status is `status`, when given): its project and ledger as served."""
    ledgers = current_ledgers(analyses, rows, now=now, config=config)
    body = fleet_csv((row.project, ledger) for row, ledger in ledgers if status is None or ledger.status == status)
    return Document(body, FLEET_FILENAME)
