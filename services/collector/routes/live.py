"""Live status: `GET /v1/live`, `GET /v1/runs/{run_id}/live` (hang detection) and `GET /v1/preemption-candidates`.

Fresh on every call (a few index lookups per running run, `services.derive.live`); the rules are in
`services.analysis.live` and docs/ledger.md.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from services.collector.auth import ReadRunDep, RunScopeDep
from services.collector.deps import EngineDep, SettingsDep
from services.collector.live_models import LiveRun, LiveRuns, PreemptionCandidate, PreemptionCandidates
from services.collector.schemas import ErrorResponse
from services.derive.live import live_config, live_for_run, live_for_running_runs, preemption_candidates

router = APIRouter(tags=["live"])


@router.get("/v1/runs/{run_id:path}/live", response_model=LiveRun, responses={404: {"model": ErrorResponse}},  # type: ignore[dict-item]
            summary="Seconds since the run's last progress, hang threshold, hung flag, suspect ranks, at risk")
async def get_live(run: ReadRunDep, engine: EngineDep, settings: SettingsDep) -> LiveRun:
    live = await run_in_threadpool(live_for_run, engine, run, time.time(), live_config(settings))
    return LiveRun(**live)


@router.get("/v1/live", response_model=LiveRuns,
            summary="Live status of every running run (of ?project=, and only the token's project): hung ones first")
async def get_live_runs(engine: EngineDep, settings: SettingsDep, scope: RunScopeDep) -> LiveRuns:
    now = time.time()

    def work() -> list[dict[str, Any]]:
        if scope.matches_nothing:
            return []
        return live_for_running_runs(engine, now, live_config(settings), project=scope.project)

    runs = await run_in_threadpool(work)
    return LiveRuns(server_time=now, hung=sum(1 for r in runs if r["hung"]), runs=[LiveRun(**r) for r in runs])


@router.get("/v1/preemption-candidates", response_model=PreemptionCandidates,
            summary="Running runs, cheapest to preempt now first: work since the last checkpoint + expected restart")
async def get_preemption_candidates(engine: EngineDep, settings: SettingsDep,
                                    scope: RunScopeDep) -> PreemptionCandidates:
    now = time.time()

    def work() -> list[dict[str, Any]]:
        if scope.matches_nothing:
            return []
        return preemption_candidates(engine, now, live_config(settings), project=scope.project)

    ranked = await run_in_threadpool(work)
    return PreemptionCandidates(server_time=now, candidates=[PreemptionCandidate(**c) for c in ranked])
