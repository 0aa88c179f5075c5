"""Load a run with its losses, learning rates and digests, and check its resumes; kept per (run, version).

The check reads every step's loss and lr (`load_run_data(..., detail=True)`), so its result is cached like the
straggler report: an in-process LRU keyed by ((project, run id), version), stale as soon as the run receives an event.
Only the default tolerances are cached; a request with its own tolerances is computed afresh.

`recent_resume_check` is for the dashboard, which must not wait for a big run: it waits at most `budget_s`,
then answers with the last check of the run (flagged stale) or, when there is none yet, says it is pending,
while one background check per run goes on and caches its result for the next request.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from sqlalchemy import Engine

from services.analysis.resume_check import ResumeCheckConfig, build_resume_check
from services.derive.single_flight import SingleFlight, run_key
from services.storage.load import RunRef, RunRow, get_run, load_run_data
from services.derive.version_cache import VersionCache

logger = logging.getLogger(__name__)

DEFAULT_CONFIG = ResumeCheckConfig()
_CACHE = VersionCache(capacity=16)
_BUILDS: SingleFlight[dict[str, Any]] = SingleFlight("resume-check")


class ResumeCheckPending(Exception):
    """The run's first resume check is still being computed."""


def resume_check(engine: Engine, ref: RunRef, config: ResumeCheckConfig | None = None, *,
                 cache: VersionCache = _CACHE) -> dict[str, Any]:
    """GET /v1/runs/{run_id}/resume-check: the run's resume check as a JSON-able dict (with the run's version)."""
    config = config or DEFAULT_CONFIG
    with engine.connect() as conn:
        run = get_run(conn, ref)
    if config != DEFAULT_CONFIG:
        return _check(engine, run, config)
    while (cached := cache.get(run.ref, run.version)) is None:
        build = _BUILDS.submit(run_key(engine, run.ref), lambda: _check_and_cache(engine, run.ref, cache))
        latest = build.result()
        if latest["version"] >= run.version:
            return latest
    return cached


def recent_resume_check(engine: Engine, ref: RunRef, *, budget_s: float,
                        cache: VersionCache = _CACHE) -> tuple[dict[str, Any], bool]:
    """(check, stale) with the default tolerances; raises ResumeCheckPending when no check is ready in time."""
    with engine.connect() as conn:
        run = get_run(conn, ref)
    cached = cache.latest(run.ref)
    if cached is not None and cached[0] >= run.version:
        return cached[1], False
    future = _BUILDS.submit(run_key(engine, run.ref), lambda: _check_and_cache(engine, run.ref, cache))
    try:
        check = future.result(timeout=budget_s)
        if check["version"] >= run.version:
            return check, False
    except FutureTimeout:
        pass
    cached = cache.latest(run.ref)
    if cached is None:
        raise ResumeCheckPending(ref.run_id)
    return cached[1], True


def _check_and_cache(engine: Engine, ref: RunRef, cache: VersionCache) -> dict[str, Any]:
    with engine.connect() as conn:
        run = get_run(conn, ref)  # read again: the newest version when the check starts
    check = _check(engine, run, DEFAULT_CONFIG)
    cache.put(run.ref, run.version, check)
    return check


def _check(engine: Engine, run: RunRow, config: ResumeCheckConfig) -> dict[str, Any]:
    started = time.perf_counter()
    with engine.connect() as conn:
        data = load_run_data(conn, run, detail=True)
    loaded = time.perf_counter()
    check = build_resume_check(data, config=config).to_dict()
    check["version"] = run.version
    logger.info("resume check of run %s (version %d): %s, %d finding(s); load %.2f s, analysis %.2f s",
                run.run_id, run.version, check["verdict"], len(check["findings"]), loaded - started,
                time.perf_counter() - loaded)
    return check
