"""The run's resume check: its steps with losses, learning rates and digests loaded and compared across restarts.

The check reads every step's loss and lr (`load_run_data(..., detail=True)`), so its result is kept by the
analysis cache (in memory: a few recent runs), stale as soon as the run receives an event. Only the default
tolerances are kept; a request with its own tolerances is computed afresh.

`recent_resume_check` is for the dashboard, which must not wait for a big run: it waits at most `budget_s`,
then answers with the last check of the run (flagged stale) or, when there is none yet, says it is pending,
while the check goes on in the background.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import Engine

from services.analysis.resume_check import ResumeCheckConfig, build_resume_check
from services.derive.cache import AnalysisCache, Product
from services.errors import RunDetailPruned
from services.schemas.resume import ResumeCheck
from services.storage.load import load_run_data
from services.storage.runs import RunRow

logger = logging.getLogger(__name__)

DEFAULT_CONFIG = ResumeCheckConfig()


class ResumeCheckPending(Exception):
    """The run's first resume check is still being computed."""


def _check(engine: Engine, run: RunRow, config: ResumeCheckConfig) -> ResumeCheck:
    started = time.perf_counter()
    with engine.connect() as conn:
        data = load_run_data(conn, run, detail=True)
    loaded = time.perf_counter()
    check = build_resume_check(data, config=config, version=run.version)
    logger.info("resume check of run %s (version %d): %s, %d finding(s); load %.2f s, analysis %.2f s",
                run.run_id, run.version, check.verdict, len(check.findings), loaded - started,
                time.perf_counter() - loaded)
    return check


RESUME_CHECK = Product(name="resume-check", build=lambda analyses, run: _check(analyses.engine, run, DEFAULT_CONFIG),
                       model=ResumeCheck, reads_raw_rows=True)


def resume_check(analyses: AnalysisCache, run: RunRow, config: ResumeCheckConfig = DEFAULT_CONFIG
                 ) -> ResumeCheck:
    """GET /v1/runs/{run_id}/resume-check: the run's resume check (of the run's version)."""
    if config != DEFAULT_CONFIG:
        if run.detail_pruned_at is not None:
            raise RunDetailPruned(run.run_id, run.detail_pruned_at,
                                  "a resume check with other tolerances than the default reads every step's loss")
        return _check(analyses.engine, run, config)
    return analyses.current(RESUME_CHECK, run)


def recent_resume_check(analyses: AnalysisCache, run: RunRow, *, budget_s: float) -> tuple[ResumeCheck, bool]:
    """(check, stale) with the default tolerances; raises ResumeCheckPending when no check is ready in time."""
    recent = analyses.recent(RESUME_CHECK, run, budget_s=budget_s)
    if recent is None:
        raise ResumeCheckPending(run.run_id)
    return recent
