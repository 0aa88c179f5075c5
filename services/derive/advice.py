"""What the advice engine reads for one run: its ledger of the current version (a hung run's hang so far booked
provisionally), its views (hosts, straggler flags), its resume check, its hosts' clocks as the collector measured
them and, when the run's own failures are too few for a failure rate, the ledgers of its project's runs.
`GET /v1/runs/{id}/advice` and the run's report read the same inputs, so they give the same advice."""

from __future__ import annotations

from services.analysis.advice import DEFAULT_CONFIG, AdviceInput
from services.analysis.live import LiveConfig
from services.derive.cache import AnalysisCache
from services.derive.ledger import fleet_ledgers
from services.derive.resume import resume_check
from services.derive.served import served_ledger
from services.derive.views import current_views
from services.reports.advice import run_advice
from services.schemas.advice import RunAdvice
from services.storage.clock_readings import host_collector_offsets
from services.storage.runs import RunRow


def advice_input(analyses: AnalysisCache, run: RunRow, now: float, live: LiveConfig) -> AdviceInput:
    analysed = current_views(analyses, run)
    ledger = served_ledger(analyses, run, now, live, ledger=analysed.ledger)
    needs_peers = (ledger.failures < DEFAULT_CONFIG.min_failures
                   and ledger.checkpoints.median_interval_seconds is not None)
    # peers of the run's own project only: other teams' runs say nothing here, and are not theirs to read
    peers = fleet_ledgers(analyses, project=run.project) if needs_peers else []
    with analyses.engine.connect() as conn:
        clocks = host_collector_offsets(conn, run.pk)
    return AdviceInput(ledger=ledger, views=analysed.views, resume_check=resume_check(analyses, run), peers=peers,
                       collector_clocks=clocks)


def served_advice(analyses: AnalysisCache, run: RunRow, now: float, live: LiveConfig) -> RunAdvice:
    """GET /v1/runs/{run_id}/advice: the engine's recommendations, worded as every surface shows them."""
    return run_advice(advice_input(analyses, run, now, live))
