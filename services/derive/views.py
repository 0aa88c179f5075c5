"""The run page's views (timeline, ranks, checkpoints, restarts) with the ledger they were drawn from.

One build loads the run once and makes both its ledger and its views from one painting of it (reusing the
stored ledger when it describes the same version); it stores the views in `run_views` and the ledger in
`runs` in one transaction, so a stored build's views and the run's ledger describe the same version.

- `current_views`: the views of at least the run's version the caller read (the API's default).
- `recent_views`: for the run page, which must draw in well under 2 s even for a run of ten million steps
  that keeps receiving events. It waits at most `budget_s` for a fresh build; otherwise it answers with the
  stored build, flagged stale, while the build goes on in the background (paced by the analysis cache).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from services.analysis.attempts import build_run_structure
from services.analysis.claims import paint_run
from services.analysis.ledger import build_ledger
from services.analysis.views import build_run_views
from services.derive.cache import AnalysisCache, Built, Product
from services.derive.ledger import LEDGER, incremental, parse_stored, stored_ledger
from services.schemas.ledger import Ledger
from services.schemas.views import RunViews
from services.storage.run_views import load_views, store_views
from services.storage.runs import RunRow, store_ledger
from services.storage.step_blocks import load_summarised_run_data

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class AnalysedViews:
    version: int
    analysed_at: float  # server clock
    analysis_seconds: float
    ledger: Ledger
    views: RunViews  # services.analysis.views.build_run_views, of the run version they describe


def _stored(analyses: AnalysisCache, run: RunRow, at_least: int = -1) -> Built[AnalysedViews] | None:
    with analyses.engine.connect() as conn:
        row = load_views(conn, run.pk, at_least)
    if row is None or row.views_json is None or row.ledger_json is None:
        return None
    ledger = parse_stored(Ledger, row.ledger_json, what="ledger", run_id=run.run_id)
    views = parse_stored(RunViews, row.views_json, what="views", run_id=run.run_id)
    if ledger is None or views is None:
        return None
    return Built(row.version, AnalysedViews(version=row.version, analysed_at=row.analysed_at,
                                            analysis_seconds=row.analysis_seconds, ledger=ledger, views=views))


def _build(analyses: AnalysisCache, run: RunRow) -> AnalysedViews:
    started = time.perf_counter()
    read_before = incremental(analyses, run)
    data = load_summarised_run_data(analyses.engine, run, analyses.summaries)
    loaded = time.perf_counter()
    painting = paint_run(build_run_structure(data))  # read by both the ledger and the views
    stored = stored_ledger(analyses, run, run.version)
    ledger = stored.value if stored is not None and stored.version == run.version else build_ledger(data, painting)
    views = build_run_views(data, ledger, version=run.version, painting=painting)
    finished = time.perf_counter()
    built = AnalysedViews(version=run.version, analysed_at=time.time(), analysis_seconds=finished - started,
                          ledger=ledger, views=views)
    with analyses.engine.begin() as conn:
        store_ledger(conn, run.pk, run.version, ledger)
        store_views(conn, run.pk, version=run.version, analysed_at=built.analysed_at,
                    analysis_seconds=built.analysis_seconds, views_json=views.model_dump_json())
    logger.info("views built for run %s (version %d, %s): load %.2f s, ledger and views %.2f s", run.run_id,
                run.version, "incremental" if read_before else "whole run read", loaded - started, finished - loaded)
    return built


VIEWS = Product(name="views", build=_build, stored=_stored, includes=(LEDGER.name,), incremental=incremental)


def current_views(analyses: AnalysisCache, run: RunRow) -> AnalysedViews:
    """The build of at least the version `run` was read at."""
    return analyses.current(VIEWS, run)


def recent_views(analyses: AnalysisCache, run: RunRow, *, budget_s: float) -> tuple[AnalysedViews, bool]:
    """(the newest build of the run's views that is ready within `budget_s`, whether it is stale)."""
    return analyses.recent_or_current(VIEWS, run, budget_s=budget_s)
