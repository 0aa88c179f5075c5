"""The fleet over a time range: `GET /v1/fleet/window`, each run's figures cut to the range from when its GPU time
was spent (the ledger's `usage`), and per time bucket (the dashboard's over-time charts)."""

from __future__ import annotations

import math
import time
from typing import Annotated

import numpy as np
from fastapi import APIRouter, HTTPException, Query

from services.analysis.usage import bucket_width, clip_usage, usage_in_bins, usage_of_pieces
from services.collector.deps import AnalysesDep, LiveConfigDep, RunScopeDep
from services.collector.routes.runs import LIST_BUDGET_S, list_item
from services.derive.runs import listed_runs, runs_in_scope
from services.schemas.categories import EVAL, WASTE_KEYS
from services.schemas.fleet import FleetWindow, RunInWindow, WindowFigures
from services.schemas.ledger import Ledger, WasteBreakdown
from services.schemas.usage import USAGE_KEYS, Usage

router = APIRouter(tags=["runs"])

# A range's ends are epoch seconds of this era (to the year 2286): the bucket edges are built as an array, and an
# absurd range must be a 422, never an allocation (the OpenAPI fuzz once asked for 1.6e9 buckets' worth).
MAX_EPOCH_S = 1e10


@router.get("/v1/fleet/window", response_model=FleetWindow,
            summary="Every run's GPU time inside [since, until), in total and per time bucket")
def get_fleet_window(
    analyses: AnalysesDep,
    live: LiveConfigDep,
    scope: RunScopeDep,
    since: Annotated[float | None, Query(ge=0, le=MAX_EPOCH_S,
                                        description="the range's start (epoch seconds); none: all time")] = None,
    until: Annotated[float | None, Query(ge=0, le=MAX_EPOCH_S, description="the range's end; none: now")] = None,
    status: Annotated[str | None, Query(pattern="^(running|finished|failed|cancelled)$")] = None,
    run_id: Annotated[str | None, Query(max_length=256, description="substring of the run id")] = None,
    buckets: Annotated[int, Query(ge=1, le=500, description="at most this many time buckets")] = 48,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> FleetWindow:
    now = time.time()
    hi = now if until is None else until
    if since is not None and hi < since:
        raise HTTPException(422, f"until ({hi:.0f}) is before since ({since:.0f}): give a range that ends after "
                                 "it starts")
    rows = runs_in_scope(analyses, scope, since=since, until=until, limit=limit)
    listed = listed_runs(analyses, rows, budget_s=LIST_BUDGET_S, now=now, config=live, run_id_part=run_id,
                         status=status)
    firsts = [r.ledger.first_time for r in listed if r.ledger.first_time is not None]
    lo = since if since is not None else (min(firsts) if firsts else hi)
    width = bucket_width(max(hi - lo, 1.0), buckets)
    origin = math.floor(lo / width) * width
    count = max(1, math.ceil((hi - origin) / width))
    edges = origin + width * np.arange(count + 1, dtype=np.float64)
    edges[0], edges[-1] = max(edges[0], lo), min(edges[-1], hi)  # the range's own edges: nothing outside it
    out = []
    for run in listed:
        usage, laid_out = usage_of(run.ledger)
        clipped = clip_usage(usage, since, hi)
        per_bucket = usage_in_bins(usage, edges)
        out.append(RunInWindow(
            run=list_item(run), window=window_figures(clipped), laid_out=laid_out,
            buckets={key: [float(v) for v in per_bucket[:, j]] for j, key in enumerate(USAGE_KEYS)
                     if bool((per_bucket[:, j] != 0).any())}))
    return FleetWindow(since=since, until=hi, bucket_start=origin, bucket_s=width, bucket_count=count,
                       server_time=now, runs=out)


def usage_of(ledger: Ledger) -> tuple[Usage, bool]:
    """The ledger's usage; for a ledger stored before there was one, its totals spread evenly over its life
    (flagged: `False`)."""
    if ledger.usage is not None:
        return ledger.usage, True
    totals = np.array([[ledger.productive_gpu_seconds, ledger.eval_gpu_seconds,
                        *(ledger.waste_gpu_seconds[k] for k in WASTE_KEYS)]])
    first = ledger.first_time or 0.0
    last = max(ledger.latest_time or first, first + 1e-6)
    return usage_of_pieces(np.array([first]), np.array([last]), totals), False


def window_figures(clipped: dict[str, float]) -> WindowFigures:
    waste = WasteBreakdown(**{k: clipped[k] for k in WASTE_KEYS})
    allocated = sum(clipped[k] for k in USAGE_KEYS)
    return WindowFigures(allocated_gpu_seconds=allocated, productive_gpu_seconds=clipped["productive"],
                         eval_gpu_seconds=clipped[EVAL], waste_gpu_seconds=waste,
                         goodput=clipped["productive"] / allocated if allocated > 0 else None)
