"""Runs as the read API lists and describes them: each with its ledger as served (services.derive.served: a hung
run's hang so far booked provisionally), read under the caller's scope."""

from __future__ import annotations

import time
from dataclasses import dataclass

from services.analysis.live import LiveConfig
from services.analysis.provisional import LiveHang
from services.analysis.run_figures import (
    ListedFigures,
    RunFigures,
    listed_figures,
    provisional_figures,
    usage_from_bytes,
)
from services.derive.cache import AnalysisCache
from services.derive.ledger import LEDGER, last_checkpoint, parse_stored, recent_ledger
from services.derive.live import live_hangs
from services.derive.served import ledger_with_hang, served_ledger
from services.schemas.ledger import Ledger
from services.schemas.runs import RunListItem
from services.storage.load import CompletedCheckpoint
from services.storage.runs import RunRow, StoredFigures, get_runs_by_pk, list_run_figures, list_runs


@dataclass(frozen=True, slots=True)
class RunScope:
    """Which runs a list shows: `project` for SQL filters (None = every project). A reader of one project who
    asks for another (`?project=Q`) gets an empty list (`matches_nothing`), not the other project's runs."""

    project: str | None
    matches_nothing: bool = False


@dataclass(frozen=True, slots=True)
class ListedRun:
    row: RunRow  # as the list read it: without its ledger (`ledger_json` None)
    listed: ListedFigures  # its ledger's figures, a hung run's hang so far included
    stale: bool  # the run received events since its ledger was built; a newer one is being built

    @property
    def figures(self) -> RunFigures:
        return self.listed.figures


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


def listed_runs(analyses: AnalysisCache, scope: RunScope, *, budget_s: float, now: float, config: LiveConfig,
                since: float | None = None, until: float | None = None, limit: int = 1000,
                run_id_part: str | None = None, status: str | None = None,
                with_usage: bool = False) -> list[ListedRun]:
    """The runs in `scope` with events in [since, until] whose id contains `run_id_part` and whose status is `status`
    (when given), each with its ledger's figures (and usage: `with_usage`), the most recent `limit` first.

    A run whose stored ledger is current is listed from the figures stored with that ledger (one query for all of
    them), a hung run's hang so far booked on them (services.analysis.run_figures.provisional_figures). The others
    (figures stored before they kept the running tail, or none) take their ledger: the list waits at most `budget_s`
    over all of them for ledgers made stale by new events; after that a run shows its last ledger (stale) while a
    background build catches up; a hung run's hang so far is booked provisionally."""
    if scope.matches_nothing:
        return []
    with analyses.engine.connect() as conn:
        stored = list_run_figures(conn, since=since, until=until, limit=limit, project=scope.project,
                                  with_usage=with_usage)
    current = [(run, _current_figures(run)) for run in stored if not run_id_part or run_id_part in run.row.run_id]
    hangs = live_hangs(analyses.engine, [run.row for run, figures in current
                                         if figures is not None and figures.status == "running"], now, config)
    from_ledger = [run.row.pk for run, figures in current
                   if figures is None or (run.row.pk in hangs and not figures.knows_running_tail)]
    with analyses.engine.connect() as conn:  # their rows with their ledgers, in one query
        rows = get_runs_by_pk(conn, from_ledger)
    deadline = time.monotonic() + budget_s
    out = []
    for run, figures in current:
        hang = hangs.get(run.row.pk)
        if figures is not None and (hang is None or figures.knows_running_tail):
            listed, stale = ListedFigures(figures, usage_from_bytes(figures, run.usage)), False
            if hang is not None:  # its hang so far booked on the figures: the same as on its whole ledger
                listed = provisional_figures(listed, hang, now)
        elif run.row.pk not in rows:  # deleted since the list was read
            continue
        else:
            listed, stale = _from_ledger(analyses, rows[run.row.pk], hang,
                                         budget_s=max(deadline - time.monotonic(), 0.0), now=now, config=config)
        if status and listed.figures.status != status:
            continue
        out.append(ListedRun(run.row, listed, stale))
    return out


def _current_figures(run: StoredFigures) -> RunFigures | None:
    """The stored figures when they are the run's current ledger's; None: take the ledger."""
    row = run.row
    if run.figures_json is None or not (row.ledger_version >= row.version or LEDGER.is_final(row)):
        return None
    return parse_stored(RunFigures, run.figures_json, what="figures", run_id=row.run_id)


def _from_ledger(analyses: AnalysisCache, row: RunRow, hang: LiveHang | None, *, budget_s: float, now: float,
                 config: LiveConfig) -> tuple[ListedFigures, bool]:
    """The run's figures from its whole ledger: its hang so far booked (`hang`, judged already; else judged now)."""
    ledger, stale = recent_ledger(analyses, row, budget_s=budget_s)
    if hang is None:
        return listed_figures(served_ledger(analyses, row, now, config, ledger=ledger)), stale
    return listed_figures(ledger_with_hang(ledger, hang, now)), stale


def list_item(listed: ListedRun) -> RunListItem:
    ledger = listed.figures
    # constructed, not validated: every field is a validated RunFigures field or the run's row (validating 3,000
    # items was a fifth of /v1/fleet/window's time: benchmarks.fleet_listing)
    return RunListItem.model_construct(run_id=listed.row.run_id, project=listed.row.project, status=ledger.status,
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
