"""The run's ledger: what every figure in GPU-seconds comes from (/waste, the run list, reports, advice, live status,
metrics). Kept in `runs` with the version it describes (services.storage.runs), built through the analysis cache.

`current_ledger` answers for the run's current version, building the ledger when the stored one is stale (or
joining the build in progress, a views build included: it makes the same ledger). `recent_ledger` is for pages
that poll (the run list, live status): it waits at most `budget_s` for a fresh ledger and otherwise answers
with the stored one, flagged stale, while the build finishes in the background and stores its result.
"""

from __future__ import annotations

import logging
import time
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from services.analysis.ledger import build_ledger
from services.derive.cache import AnalysisCache, Built, Product
from services.schemas.ledger import Ledger
from services.storage.load import CompletedCheckpoint, last_ok_checkpoint
from services.storage.runs import RunRow, list_runs, store_ledger
from services.storage.step_blocks import load_summarised_run_data

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def stored_ledger(_: AnalysisCache, run: RunRow, at_least: int = -1) -> Built[Ledger] | None:
    if run.ledger_version < at_least:
        return None
    ledger = parse_stored_ledger(run)
    return None if ledger is None else Built(run.ledger_version, ledger)


def parse_stored_ledger(run: RunRow) -> Ledger | None:
    """The run's stored ledger; None when there is none, or when another version of goodput wrote it and its fields
    no longer match the Ledger (after an upgrade): the caller then builds it again from the events."""
    if run.ledger_json is None:
        return None
    return parse_stored(Ledger, run.ledger_json, what="ledger", run_id=run.run_id)


def parse_stored(model: type[M], stored_json: str, *, what: str, run_id: str) -> M | None:
    try:
        return model.model_validate_json(stored_json)
    except ValidationError as exc:
        logger.warning("the stored %s of run %s does not match this version of goodput (%d fields); building it "
                       "again from the run's events", what, run_id, exc.error_count())
        return None


def _build(analyses: AnalysisCache, run: RunRow) -> Ledger:
    started = time.monotonic()
    data = load_summarised_run_data(analyses.engine, run, analyses.summaries)
    ledger = build_ledger(data)
    with analyses.engine.begin() as conn:
        store_ledger(conn, run.pk, run.version, ledger)
    seconds = time.monotonic() - started
    if seconds > 1.0:
        logger.info("ledger of run %s (version %d) built in %.1f s", run.run_id, run.version, seconds)
    return ledger


def incremental(analyses: AnalysisCache, run: RunRow) -> bool:
    """Whether a build of the run now reads only what changed: this process read the run before (its decoded step
    blocks and control events are in `analyses.summaries`)."""
    return analyses.summaries.holds(run.pk)


LEDGER = Product(name="ledger", build=_build, stored=stored_ledger, incremental=incremental)


def current_ledger(analyses: AnalysisCache, run: RunRow) -> Ledger:
    """The ledger of at least the version `run` was read at."""
    return analyses.current(LEDGER, run)


def recent_ledger(analyses: AnalysisCache, run: RunRow, *, budget_s: float,
                  polled: bool = False) -> tuple[Ledger, bool]:
    """(ledger, stale): the current ledger if it is stored or built within `budget_s`, else the stored one
    (`polled`: see AnalysisCache.recent)."""
    return analyses.recent_or_current(LEDGER, run, budget_s=budget_s, polled=polled)


def last_checkpoint(analyses: AnalysisCache, run: RunRow, ledger: Ledger) -> CompletedCheckpoint | None:
    """The run's last checkpoint that completed (none to look for when its ledger counts none)."""
    if ledger.checkpoints.last_ok_step is None:
        return None
    with analyses.engine.connect() as conn:
        return last_ok_checkpoint(conn, run.pk)


def fleet_ledgers(analyses: AnalysisCache, *, project: str | None = None, limit: int = 2000) -> list[Ledger]:
    """The ledgers of the most recent runs of `project` (all projects: None), for fleet-wide estimates. Stored
    ledgers are taken as they are (an estimate over many runs does not wait for one that is being re-analysed)."""
    with analyses.engine.connect() as conn:
        rows = list_runs(conn, limit=limit, project=project)
    return [recent_ledger(analyses, row, budget_s=0.0, polled=True)[0] for row in rows]
