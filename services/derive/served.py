"""A run as served: the one way in for every surface that shows a run (the collector's routes, /metrics, the
reports). What the ledger says now, what the run page draws, what one rank did: each assembled here once, so the
figures of a run agree wherever they are read.

- `ledger_with_hang`: the ledger with a hung running run's hang so far booked provisionally
  (services.analysis.provisional), from a live verdict the caller already has. The only place that assembles it.
- `served_ledger`: the ledger of the run's current version (or one the caller has) with that hang, looking the
  verdict up when the caller has none (a few index lookups; none for a run that is not running).
- `run_view`: the run page's document: its views, their ledger with the hang, and its live status, computed once
  and read by both.
- `run_views`: the views of the run's current version (the page's parts: timeline, ranks, checkpoints, restarts).
- `rank_detail`: one rank's drill-down, read from its raw rows.
"""

from __future__ import annotations

import time

from services.analysis.collective_time import comm_frame
from services.analysis.live import LiveConfig, LiveStatus
from services.analysis.provisional import LiveHang, provisional_ledger
from services.analysis.rank_detail import build_rank_detail
from services.derive.cache import AnalysisCache
from services.derive.ledger import current_ledger
from services.derive.live import LEDGER_BUDGET_S, live_for_row, live_hang_of, live_status
from services.derive.views import current_views, recent_views
from services.errors import RunDetailPruned
from services.schemas.categories import RunStatus
from services.schemas.ledger import Ledger
from services.schemas.live import LiveRun
from services.schemas.ranks import RankDetail
from services.schemas.run_view import RunView
from services.schemas.views import RunViews
from services.storage.clock_readings import rank_collector_offset
from services.storage.rank_rows import load_rank_comm, load_rank_events, load_rank_steps
from services.storage.runs import RunRow

# How long the run page's view (stale_ok) waits for a fresh build before it answers with the stored one.
STALE_OK_BUDGET_S = 1.0


def ledger_with_hang(ledger: Ledger, verdict: LiveStatus | LiveRun | LiveHang | None, now: float) -> Ledger:
    """`ledger` with the hang so far of a running run that `verdict` calls hung (or the hang itself, judged
    already), booked provisionally up to `now`; the ledger as it is for a run that is not running."""
    if ledger.status != RunStatus.RUNNING.value:
        return ledger
    hang = verdict if isinstance(verdict, LiveHang) or verdict is None else live_hang_of(verdict)
    return provisional_ledger(ledger, hang, now)


def served_ledger(analyses: AnalysisCache, row: RunRow, now: float, config: LiveConfig, *,
                  ledger: Ledger | None = None) -> Ledger:
    """The ledger as served (GET /v1/runs/{run_id}/waste, the run list and detail, reports, advice): `ledger`, else
    the one of the run's current version, with a hung run's hang so far (its verdict looked up only while running)."""
    ledger = current_ledger(analyses, row) if ledger is None else ledger
    if ledger.status != RunStatus.RUNNING.value:
        return ledger
    return ledger_with_hang(ledger, live_status(analyses.engine, row, now, config), now)


def run_views(analyses: AnalysisCache, row: RunRow) -> RunViews:
    """The views of at least the version `row` was read at."""
    return current_views(analyses, row).views


def run_view(analyses: AnalysisCache, row: RunRow, config: LiveConfig, *, stale_ok: bool,
             now: float | None = None) -> RunView:
    """GET /v1/runs/{run_id}/view: the views, the ledger of the same build with the hang so far, and the live
    status the hang is read from (one verdict for both). With `stale_ok`, the newest build ready within
    STALE_OK_BUDGET_S (flagged stale while a newer one is made) and the ledger the live part finds at once."""
    analyses.note_watched(row.pk)  # someone watches this run: background analysis takes it first
    if stale_ok:
        built, stale = recent_views(analyses, row, budget_s=STALE_OK_BUDGET_S)
    else:
        built, stale = current_views(analyses, row), False
    # the views were waited for already: the live part takes the ledger it finds
    live = live_for_row(analyses, row, time.time() if now is None else now, config,
                        ledger_budget_s=0.0 if stale_ok else LEDGER_BUDGET_S, polled=False)
    return RunView.model_validate({
        **dict(built.views), "ledger": ledger_with_hang(built.ledger, live, live.server_time), "stale": stale,
        "run_version": max(row.version, built.version), "analysed_at": built.analysed_at,
        "analysis_seconds": built.analysis_seconds, "detail_pruned_at": row.detail_pruned_at, "live": live})


def rank_detail(analyses: AnalysisCache, row: RunRow, rank: int) -> RankDetail:
    """GET /v1/runs/{run_id}/ranks/{rank}: the rank's host, attempts, steps and failures, from its raw rows and the
    run's current views; RunDetailPruned once retention removed the rows."""
    if row.detail_pruned_at is not None:
        raise RunDetailPruned(row.run_id, row.detail_pruned_at, "a rank's steps are read from its raw rows")
    views = run_views(analyses, row)
    with analyses.engine.connect() as conn:
        steps = load_rank_steps(conn, row.pk, rank)
        comm = load_rank_comm(conn, row.pk, rank) if steps["comm"].isna().any() else comm_frame()
        events = load_rank_events(conn, row.pk, rank)
        collector = rank_collector_offset(conn, row.pk, rank)
    detail = build_rank_detail(views, rank, steps, comm, events)
    return detail.model_copy(update={"collector_clock_offset_seconds": collector})
