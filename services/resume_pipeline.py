"""Load a run with its losses, learning rates and digests, and check its resumes; kept per (run_id, version).

The check reads every step's loss and lr (`load_run_data(..., detail=True)`), so its result is cached like the
dashboard's views: an in-process LRU keyed by (run_id, version), stale as soon as the run receives an event.
Only the default tolerances are cached; a request with its own tolerances is computed afresh.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import Engine

from services.analysis.resume_check import ResumeCheckConfig, build_resume_check
from services.storage.load import get_run, load_run_data
from services.views_pipeline import ViewsCache

logger = logging.getLogger(__name__)

DEFAULT_CONFIG = ResumeCheckConfig()
_CACHE = ViewsCache(capacity=16)


def resume_check(engine: Engine, run_id: str, config: ResumeCheckConfig | None = None, *,
                 cache: ViewsCache = _CACHE) -> dict[str, Any]:
    """GET /v1/runs/{run_id}/resume-check: the run's resume check as a JSON-able dict (with the run's version)."""
    config = config or DEFAULT_CONFIG
    with engine.connect() as conn:
        run = get_run(conn, run_id)
    cacheable = config == DEFAULT_CONFIG
    if cacheable and (cached := cache.get(run.run_id, run.version)) is not None:
        return cached
    with cache.build_lock(run.run_id):
        if cacheable and (cached := cache.get(run.run_id, run.version)) is not None:
            return cached
        started = time.perf_counter()
        with engine.connect() as conn:
            data = load_run_data(conn, run, detail=True)
        loaded = time.perf_counter()
        check = build_resume_check(data, config=config).to_dict()
        check["version"] = run.version
        if cacheable:
            cache.put(run.run_id, run.version, check)
        logger.info("resume check of run %s (version %d): %s, %d finding(s); load %.2f s, analysis %.2f s",
                    run.run_id, run.version, check["verdict"], len(check["findings"]), loaded - started,
                    time.perf_counter() - loaded)
        return check
