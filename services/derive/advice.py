"""What the advice engine reads for one run: its ledger of the current version (a hung run's hang so far booked
provisionally), its views (hosts, straggler flags), its resume check, its hosts' clocks as the collector measured
them and, when the run's own failures are too few for a failure rate, the ledgers of its project's runs.
`GET /v1/runs/{id}/advice` and the run's report read the same inputs, so they give the same advice."""

from __future__ import annotations

from services.analysis.advice import DEFAULT_CONFIG, AdviceInput
from services.analysis.live import LiveConfig
from services.derive.cache import AnalysisCache
from services.derive.ledger import fleet_ledgers
from services.derive.live import with_live_hang
from services.derive.resume import resume_check
from services.derive.views import current_views
from services.storage.clock_readings import host_collector_offsets
from services.storage.runs import RunRow


def advice_input(analyses: AnalysisCache, run: RunRow, now: float, live: LiveConfig) -> AdviceInput:
    analysed = current_views(analyses, run)
    ledger = with_live_hang(analyses.engine, run, analysed.ledger, now, live)
    needs_peers = (ledger.failures < DEFAULT_CONFIG.min_failures
                   and ledger.checkpoints.median_interval_seconds is not None)
    # peers of the run's own project only: other teams' runs say nothing here, and are not theirs to read
    peers = fleet_ledgers(analyses, project=run.project) if needs_peers else []
    with analyses.engine.connect() as conn:
        clocks = host_collector_offsets(conn, run.pk)
    return AdviceInput(ledger=ledger, views=analysed.views, resume_check=resume_check(analyses, run), peers=peers,
                       collector_clocks=clocks)
