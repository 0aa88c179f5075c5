"""The run's straggler report, consistent with its ledger; kept by the analysis cache (in memory) per version."""

from __future__ import annotations

from services.analysis.straggler_report import build_straggler_report
from services.derive.cache import AnalysisCache, Product
from services.derive.ledger import current_ledger
from services.schemas.stragglers import StragglerReport
from services.storage.load import load_run_data
from services.storage.runs import RunRow


def _build(analyses: AnalysisCache, run: RunRow) -> StragglerReport:
    ledger = current_ledger(analyses, run)
    with analyses.engine.connect() as conn:
        data = load_run_data(conn, run)
    return build_straggler_report(data, ledger)


STRAGGLERS = Product(name="stragglers", build=_build, model=StragglerReport, reads_raw_rows=True)


def straggler_report(analyses: AnalysisCache, run: RunRow) -> StragglerReport:
    return analyses.current(STRAGGLERS, run)
