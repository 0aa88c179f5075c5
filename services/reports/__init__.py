"""Per-run waste reports (JSON, CSV, self-contained HTML), the fleet CSV and the advice as every surface shows it.
Pure: documents in, strings out."""

from services.reports.advice import formats_for, run_advice
from services.reports.content import RunReport, build_breakdown, build_report
from services.reports.export import breakdown_csv, fleet_csv, report_filename, report_json
from services.reports.html import report_html

__all__ = ["RunReport", "breakdown_csv", "build_breakdown", "build_report", "fleet_csv", "formats_for",
           "report_filename", "report_html", "report_json", "run_advice"]
