"""Runs as the read API lists and describes them: each with its ledger as served (services.derive.served: a hung
run's hang so far booked provisionally), read under the caller's scope."""

from __future__ import annotations

import time
from dataclasses import dataclass

from services.analysis.live import LiveConfig
from services.derive.cache import AnalysisCache
from services.derive.ledger import last_checkpoint, recent_ledger
from services.derive.served import served_ledger
from services.schemas.ledger import Ledger
from services.schemas.runs import RunListItem
from services.storage.load import CompletedCheckpoint
from services.storage.runs import RunRow, list_runs


@dataclass(frozen=True, slots=True)
class RunScope:
    """Which runs a list shows: `project` for SQL filters (None = every project). A reader of one project who
    asks for another (`?project=Q`) gets an empty list (`matches_nothing`), not the other project's runs."""

    project: str | None
    matches_nothing: bool = False


@dataclass(frozen=True, slots=True)
class ListedRun:
    row: RunRow
    ledger: Ledger
    stale: bool  # the run received events since `ledger` was built; a newer one is being built


@dataclass(frozen=True, slots=True)
class RunSummary:
    row: RunRow
    ledger: Ledger
    last_checkpoint: CompletedCheckpoint | None


def runs_in_scope(analyses: AnalysisCache, scope: RunScope, *, since: float | None = None,
                  until: float | None = None, limit: int = 1000) -> list[RunRow]:
    if scope.matches_nothing:
        return []
    with analyses.engine.connect() as conn:
        return list_runs(conn, since=since, until=until, limit=limit, project=scope.project)


def listed_runs(analyses: AnalysisCache, rows: list[RunRow], *, budget_s: float, now: float, config: LiveConfig,
                run_id_part: str | None = None, status: str | None = None) -> list[ListedRun]:
    """The runs of `rows` whose id contains `run_id_part` and whose status is `status` (when given), each with its
    ledger: waits at most `budget_s` over all of them for ledgers made stale by new events; after that a run
    shows its last ledger (stale) while a background build catches up."""
    deadline = time.monotonic() + budget_s
    out = []
    for row in rows:
        if run_id_part and run_id_part not in row.run_id:
            continue
        ledger, stale = recent_ledger(analyses, row, budget_s=max(deadline - time.monotonic(), 0.0))
        if status and ledger.status != status:
            continue
        out.append(ListedRun(row, served_ledger(analyses, row, now, config, ledger=ledger), stale))
    return out


def list_item(listed: ListedRun) -> RunListItem:
    ledger = listed.ledger
    return RunListItem(run_id=listed.row.run_id, project=listed.row.project, status=ledger.status,
                       first_time=ledger.first_time, last_time=ledger.latest_time,
                       allocated_gpu_seconds=ledger.allocated_gpu_seconds,
                       productive_gpu_seconds=ledger.productive_gpu_seconds,
                       eval_gpu_seconds=ledger.eval_gpu_seconds, goodput=ledger.goodput,
                       waste_gpu_seconds=ledger.waste_gpu_seconds, restarts=ledger.restarts, stale=listed.stale,
                       provisional=ledger.provisional)


def current_ledgers(analyses: AnalysisCache, rows: list[RunRow], *, now: float, config: LiveConfig
                    ) -> list[tuple[RunRow, Ledger]]:
    """Each run's ledger of its current version, a hung run's hang so far included."""
    return [(row, served_ledger(analyses, row, now, config)) for row in rows]


def run_summary(analyses: AnalysisCache, row: RunRow, *, now: float, config: LiveConfig) -> RunSummary:
    """GET /v1/runs/{run_id}: the run's ledger of its current version (a hung run's hang included) and its last
    completed checkpoint."""
    ledger = served_ledger(analyses, row, now, config)
    return RunSummary(row, ledger, last_checkpoint(analyses, row, ledger))
