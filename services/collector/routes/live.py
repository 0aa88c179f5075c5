"""Live status: `GET /v1/live`, `GET /v1/runs/{run_id}/live` (hang detection) and `GET /v1/preemption-candidates`.

Fresh on every call (a few index lookups per running run, `services.derive.live`); the rules are in
`services.analysis.live` and docs/ledger.md.
"""

from __future__ import annotations

import time

from fastapi import APIRouter

from services.collector.deps import AnalysesDep, LiveConfigDep, RunDep, RunScopeDep
from services.derive.live import live_for_row, live_for_running_runs, preemption_candidates
from services.schemas.errors import NOT_FOUND
from services.schemas.live import LiveRun, LiveRuns, PreemptionCandidates

router = APIRouter(tags=["live"])


@router.get("/v1/runs/{run_id:path}/live", response_model=LiveRun, responses=NOT_FOUND,
            summary="Seconds since the run's last progress, hang threshold, hung flag, suspect ranks, at risk")
def get_live(run: RunDep, analyses: AnalysesDep, live: LiveConfigDep) -> LiveRun:
    return live_for_row(analyses, run, time.time(), live)


@router.get("/v1/live", response_model=LiveRuns,
            summary="Live status of every running run (of ?project=, and only the token's project): hung ones first")
def get_live_runs(analyses: AnalysesDep, live: LiveConfigDep, scope: RunScopeDep) -> LiveRuns:
    now = time.time()
    runs = [] if scope.matches_nothing else live_for_running_runs(analyses, now, live, project=scope.project)
    return LiveRuns(server_time=now, hung=sum(1 for r in runs if r.hung), runs=runs)


@router.get("/v1/preemption-candidates", response_model=PreemptionCandidates,
            summary="Running runs, cheapest to preempt now first: work since the last checkpoint + expected restart")
def get_preemption_candidates(analyses: AnalysesDep, live: LiveConfigDep,
                              scope: RunScopeDep) -> PreemptionCandidates:
    now = time.time()
    ranked = [] if scope.matches_nothing else preemption_candidates(analyses, now, live, project=scope.project)
    return PreemptionCandidates(server_time=now, candidates=ranked)
