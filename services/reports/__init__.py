"""Per-run waste reports (JSON, CSV, self-contained HTML) and the fleet CSV. Pure: documents in, strings out."""

from __future__ import annotations

from services.reports.content import RunReport, build_breakdown, build_report
from services.reports.export import breakdown_csv, fleet_csv, report_json
from services.reports.html import report_html
from services.reports.recommend import DEFAULT_PROVIDERS, Provider, Recommendation, ReportInput, recommend

__all__ = ["DEFAULT_PROVIDERS", "Provider", "Recommendation", "ReportInput", "RunReport", "breakdown_csv",
           "build_breakdown", "build_report", "fleet_csv", "recommend", "report_html", "report_json"]
