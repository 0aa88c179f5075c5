"""What to change: the run's recommendations (one advice engine, services.analysis.advice, worded with the
dashboard's number formats by services.reports.advice), and the ranks and hosts that straggle."""

from __future__ import annotations

import time

from fastapi import APIRouter

from services.collector.deps import AnalysesDep, LiveConfigDep, RunDep
from services.derive.advice import served_advice
from services.derive.stragglers import straggler_report
from services.schemas.advice import RunAdvice
from services.schemas.errors import NOT_FOUND
from services.schemas.stragglers import StragglerReport

router = APIRouter(tags=["advice"])


@router.get("/v1/runs/{run_id:path}/advice", response_model=RunAdvice, responses=NOT_FOUND,
            summary="What to change, ranked by the GPU-hours at stake: evidence, model, expected gain, confidence")
def get_advice(run: RunDep, analyses: AnalysesDep, live: LiveConfigDep) -> RunAdvice:
    return served_advice(analyses, run, time.time(), live)


@router.get("/v1/runs/{run_id:path}/stragglers", response_model=StragglerReport, responses=NOT_FOUND,
            summary="Which ranks and hosts straggle, how often, what it cost, and the cost at other scales")
def get_stragglers(run: RunDep, analyses: AnalysesDep) -> StragglerReport:
    return straggler_report(analyses, run)  # typed and validated when built
