"""What to change: the checkpoint interval (from the measured failure rate and checkpoint cost) and the ranks and
hosts that straggle."""

from __future__ import annotations

from fastapi import APIRouter

from services.analysis.advice import checkpoint_advice
from services.collector.deps import AnalysesDep, RunDep
from services.collector.schemas.advice import RunAdvice, StragglerReport
from services.collector.schemas.errors import NOT_FOUND
from services.derive.ledger import current_ledger, fleet_ledgers
from services.derive.stragglers import straggler_report

router = APIRouter(tags=["advice"])


@router.get("/v1/runs/{run_id:path}/advice", response_model=RunAdvice, responses=NOT_FOUND,
            summary="What to change: the checkpoint interval from measured failure rate and checkpoint cost")
def get_advice(run: RunDep, analyses: AnalysesDep) -> RunAdvice:
    ledger = current_ledger(analyses, run)
    # similar runs of the run's own project: other teams' runs say nothing here, and are not theirs to read
    fleet = fleet_ledgers(analyses, project=run.project)
    return RunAdvice(run_id=ledger.run_id, checkpoint_interval=checkpoint_advice(ledger, fleet))


@router.get("/v1/runs/{run_id:path}/stragglers", response_model=StragglerReport, responses=NOT_FOUND,
            summary="Which ranks and hosts straggle, how often, what it cost, and the cost at other scales")
def get_stragglers(run: RunDep, analyses: AnalysesDep) -> StragglerReport:
    return straggler_report(analyses, run)  # typed and validated when built
