"""The run list, one run's summary and its waste ledger."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Response

from services.collector.deps import AnalysesDep, LiveConfigDep, RunDep, RunScopeDep
from services.collector.responses import model_response
from services.derive.runs import RunSummary, list_item, listed_runs, run_summary
from services.derive.served import served_ledger
from services.schemas.errors import NOT_FOUND
from services.schemas.ledger import Ledger
from services.schemas.runs import LastCheckpoint, RunDetail, RunList

router = APIRouter(tags=["runs"])

# How long one /v1/runs request waits, over all its runs, for ledgers made stale by new events; after that
# a run shows its last ledger (`stale: true`) while a background build catches up.
LIST_BUDGET_S = 1.0


@router.get("/v1/runs", response_model=RunList, summary="Every run with its goodput, worst first by waste")
def get_runs(
    analyses: AnalysesDep,
    live: LiveConfigDep,
    scope: RunScopeDep,
    status: Annotated[str | None, Query(pattern="^(running|finished|failed|cancelled)$")] = None,
    since: Annotated[float | None, Query(description="only runs with events at or after this epoch time")] = None,
    until: Annotated[float | None, Query(description="only runs with events at or before this epoch time")] = None,
    run_id: Annotated[str | None, Query(max_length=256, description="substring of the run id")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    listed = listed_runs(analyses, scope, budget_s=LIST_BUDGET_S, now=time.time(), config=live, since=since,
                         until=until, limit=limit, run_id_part=run_id, status=status)
    return model_response(RunList(runs=[list_item(run) for run in listed], count=len(listed)))


@router.get("/v1/runs/{run_id:path}/waste", response_model=Ledger, responses=NOT_FOUND,
            summary="The run's waste ledger in GPU-seconds")
def get_waste(run: RunDep, analyses: AnalysesDep, live: LiveConfigDep) -> Ledger:
    return served_ledger(analyses, run, time.time(), live)


@router.get("/v1/runs/{run_id:path}", response_model=RunDetail, responses=NOT_FOUND,
            summary="Attempts, restarts, last step and checkpoint, status")
def get_run(run: RunDep, analyses: AnalysesDep, live: LiveConfigDep) -> RunDetail:
    return _detail(run_summary(analyses, run, now=time.time(), config=live))


def _detail(summary: RunSummary) -> RunDetail:
    ledger, checkpoint = summary.ledger, summary.last_checkpoint
    last_steps = [a.last_step for a in ledger.attempts if a.last_step is not None]
    return RunDetail(run_id=ledger.run_id, project=summary.row.project, status=ledger.status,
                     first_time=ledger.first_time, last_time=ledger.latest_time, attempts=ledger.attempts,
                     world_sizes=sorted({a.world_size for a in ledger.attempts}), restarts=ledger.restarts,
                     last_step=max(last_steps) if last_steps else None,
                     last_checkpoint=None if checkpoint is None else LastCheckpoint(
                         step=checkpoint.step, attempt=checkpoint.attempt, end=checkpoint.end),
                     allocated_gpu_seconds=ledger.allocated_gpu_seconds, goodput=ledger.goodput,
                     provisional=ledger.provisional)
