"""A run's report: the ledger, a per-category breakdown, restarts, checkpoints, stragglers and the advice.
Pure: the caller passes the ledger, the views, the advice and the time of writing; `RunReport.to_json_dict` is the
document `GET /v1/runs/{id}/report` serves. The advice is the engine's (services.reports.advice.run_advice), the
same `GET /v1/runs/{id}/advice` serves: its recommendations and notes go into the report unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from services.analysis.advice import AdviceInput
from services.analysis.views import build_restart_rows
from services.presentation import CATEGORY_ORDER
from services.reports.advice import run_advice
from services.schemas.advice import MeasuredRun, Recommendation, RunAdvice
from services.schemas.categories import EVAL, PRODUCTIVE
from services.schemas.ledger import CheckpointSummary, Ledger
from services.schemas.resume import ResumeCheck
from services.schemas.views import CheckpointRow, RankCompute, RestartRow, RunViews

REPORT_VERSION = 2  # 2: recommendations are the advice engine's (services.schemas.advice), with its notes
MAX_STRAGGLER_ROWS = 32
ALLOCATED = "allocated"  # the breakdown's last row: the whole the categories partition


class BreakdownRow(BaseModel):
    category: str = Field(description="productive, a waste category, or allocated (the last row)")
    gpu_seconds: float
    gpu_hours: float
    share: float | None = Field(description="of allocated; None when nothing was allocated")


class StragglerRow(BaseModel):
    rank: int
    host: str | None
    straggler_gpu_seconds: float
    share_of_straggler: float | None
    median_compute_seconds: float | None


class ReportCheckpoints(BaseModel):
    summary: CheckpointSummary
    rows: list[CheckpointRow] | None = Field(None, description="every checkpoint, from the views (when given)")
    rows_total: int | None = None

    @model_serializer(mode="wrap")
    def _rows_only_when_known(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if self.rows is None:  # a report from the ledger alone has no rows at all, not empty ones
            del out["rows"], out["rows_total"]
        return out


class RunReport(BaseModel):
    report_version: int
    run_id: str
    generated_at: float
    ledger: Ledger
    breakdown: list[BreakdownRow]
    restarts: list[RestartRow]
    checkpoints: ReportCheckpoints
    stragglers: list[StragglerRow]
    ranks: list[StragglerRow] = Field(default_factory=list, description=(
        "every rank the views list (GET /v1/runs/{id}/view's ranks.rows), the costliest in straggler time first, "
        "then by rank"))
    median_compute_within: float | None = Field(
        None, description="None: the stragglers' median compute is exact. Else the run is long and its medians come "
                          "from fixed-size per-rank histograms, within this relative error (GET /v1/runs/{id}/views' "
                          "ranks.figures_within)")
    measured: MeasuredRun = Field(description="the advice's measured figures (GET /v1/runs/{id}/advice's)")
    recommendations: list[Recommendation] = Field(description="GET /v1/runs/{id}/advice's, unchanged")
    advice_notes: list[str] = Field(description="what the advice weighed and did not advise")
    # server clock when retention deleted the run's raw rows: the report is built from its stored analyses
    detail_pruned_at: float | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def build_breakdown(ledger: Ledger) -> list[BreakdownRow]:
    """One row per category (productive, eval, then the six waste categories) and a last `allocated` row:
    GPU-seconds, GPU-hours and share of allocated (None when nothing was allocated)."""
    allocated = ledger.allocated_gpu_seconds
    values = {PRODUCTIVE: ledger.productive_gpu_seconds, EVAL: ledger.eval_gpu_seconds,
              **dict(ledger.waste_gpu_seconds.items())}
    rows = []
    for category in (*CATEGORY_ORDER, ALLOCATED):
        gpu_s = allocated if category == ALLOCATED else values[category]
        rows.append(BreakdownRow(category=category, gpu_seconds=gpu_s, gpu_hours=gpu_s / 3600.0,
                                 share=gpu_s / allocated if allocated > 0 else None))
    return rows


def build_stragglers(ledger: Ledger, views: RunViews | None) -> list[StragglerRow]:
    """Ranks charged with straggler time, costliest first, with their host and median compute when known."""
    by_rank = {rank: gpu_s for rank, gpu_s in ledger.straggler_gpu_seconds_by_rank.items() if gpu_s > 0}
    total = sum(by_rank.values())
    rows_by_rank = {r.rank: r for r in views.ranks.rows} if views is not None else {}
    out = []
    for rank, gpu_s in sorted(by_rank.items(), key=lambda kv: -kv[1])[:MAX_STRAGGLER_ROWS]:
        row = rows_by_rank.get(rank)
        out.append(StragglerRow(rank=rank, host=row.host if row else None, straggler_gpu_seconds=gpu_s,
                                share_of_straggler=gpu_s / total if total else None,
                                median_compute_seconds=row.median_compute_s if row else None))
    return out


def build_ranks(ledger: Ledger, views: RunViews | None) -> list[StragglerRow]:
    """Every rank of the views, the costliest in straggler time first, then by rank."""
    by_rank = ledger.straggler_gpu_seconds_by_rank
    total = sum(by_rank.values())
    rows = sorted(views.ranks.rows, key=lambda r: (-by_rank.get(r.rank, 0.0), r.rank)) if views is not None else []
    return [StragglerRow(rank=r.rank, host=r.host, straggler_gpu_seconds=by_rank.get(r.rank, 0.0),
                         share_of_straggler=by_rank.get(r.rank, 0.0) / total if total else None,
                         median_compute_seconds=r.median_compute_s) for r in rows]


def _figures_within(views: RunViews | None) -> float | None:
    ranks = views.ranks if views is not None else None
    return ranks.figures_within if isinstance(ranks, RankCompute) else None


def build_report(ledger: Ledger, views: RunViews | None, *, generated_at: float, advice: RunAdvice | None = None,
                 resume_check: ResumeCheck | None = None, peers: Sequence[Ledger] = (),
                 detail_pruned_at: float | None = None) -> RunReport:
    """`ledger` is the run's ledger as GET /v1/runs/{id}/waste serves it; `views` the run's dashboard views of the
    same version (services.analysis.views), or None for a report from the ledger alone; `advice` the run's advice
    as GET /v1/runs/{id}/advice serves it, else made here from the ledger, views, `resume_check` (the run's
    GET /v1/runs/{id}/resume-check, when known) and `peers` (its project's ledgers, for a failure rate)."""
    checkpoints = ReportCheckpoints(summary=ledger.checkpoints)
    if views is not None:
        checkpoints = ReportCheckpoints(summary=ledger.checkpoints, rows=list(views.checkpoints),
                                        rows_total=views.checkpoints_total)
    restarts = list(views.restarts) if views is not None else build_restart_rows(ledger)
    if advice is None:
        advice = run_advice(AdviceInput(ledger=ledger, views=views, resume_check=resume_check, peers=peers))
    return RunReport(report_version=REPORT_VERSION, run_id=ledger.run_id, generated_at=generated_at, ledger=ledger,
                     breakdown=build_breakdown(ledger), restarts=restarts, checkpoints=checkpoints,
                     stragglers=build_stragglers(ledger, views), ranks=build_ranks(ledger, views),
                     median_compute_within=_figures_within(views),
                     measured=advice.measured,
                     recommendations=advice.recommendations, advice_notes=advice.notes,
                     detail_pruned_at=detail_pruned_at)
