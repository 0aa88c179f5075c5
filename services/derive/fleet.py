"""The fleet over a time range (GET /v1/fleet/window): each run's figures cut to the range from when its GPU time
was spent (the ledger's `usage`), and per time bucket (the dashboard's over-time charts). Each run's figures are the
ones the run list serves (services.derive.runs.listed_runs: a hung run's hang so far included)."""

from __future__ import annotations

import math

import numpy as np

from services.analysis.live import LiveConfig
from services.analysis.run_figures import ListedFigures
from services.analysis.usage import UsagePieces, bucket_width, pieces_of, usage_of_pieces, usage_windows
from services.derive.cache import AnalysisCache
from services.derive.runs import RunScope, list_item, listed_runs
from services.schemas.categories import EVAL, WASTE_KEYS
from services.schemas.fleet import FleetWindow, RunInWindow, WindowFigures
from services.schemas.ledger import WasteBreakdown, goodput_ratio
from services.schemas.usage import USAGE_KEYS


def fleet_window(analyses: AnalysisCache, scope: RunScope, *, since: float | None, until: float | None, now: float,
                 config: LiveConfig, budget_s: float, status: str | None = None, run_id: str | None = None,
                 buckets: int = 48, limit: int = 10_000) -> FleetWindow:
    """The runs of `scope` with events in [since, until] (until None: now), cut into at most `buckets` time
    buckets; waits at most `budget_s` over all runs for ledgers made stale by new events."""
    hi = now if until is None else until
    listed = listed_runs(analyses, scope, budget_s=budget_s, now=now, config=config, since=since, until=until,
                         limit=limit, run_id_part=run_id, status=status, with_usage=True)
    firsts = [r.figures.first_time for r in listed if r.figures.first_time is not None]
    lo = since if since is not None else (min(firsts) if firsts else hi)
    width = bucket_width(max(hi - lo, 1.0), buckets)
    origin = math.floor(lo / width) * width
    count = max(1, math.ceil((hi - origin) / width))
    edges = origin + width * np.arange(count + 1, dtype=np.float64)
    edges[0], edges[-1] = max(edges[0], lo), min(edges[-1], hi)  # the range's own edges: nothing outside it
    laid = [usage_of(run.listed) for run in listed]
    sums, per_bucket = usage_windows([usage for usage, _ in laid], since, hi, edges)
    # lists made once for all runs (numpy's tolist), keys that are zero in every bucket left out
    columns, clipped = per_bucket.transpose(0, 2, 1).tolist(), sums.tolist()
    nonzero = np.asarray(per_bucket.any(axis=1))
    out = []
    for r, (run, (_, laid_out)) in enumerate(zip(listed, laid, strict=True)):
        # constructed, not validated: floats from numpy by construction, and validating thousands of runs' buckets
        # cost more than cutting them (benchmarks.fleet_listing)
        out.append(RunInWindow.model_construct(
            run=list_item(run), window=window_figures(dict(zip(USAGE_KEYS, clipped[r], strict=True))),
            laid_out=laid_out, buckets={USAGE_KEYS[j]: columns[r][j] for j in np.flatnonzero(nonzero[r])}))
    return FleetWindow(since=since, until=hi, bucket_start=origin, bucket_s=width, bucket_count=count,
                       server_time=now, runs=out)


def usage_of(listed: ListedFigures) -> tuple[UsagePieces, bool]:
    """The ledger's usage; for a ledger stored before there was one, its totals spread evenly over its life
    (flagged: `False`)."""
    if listed.usage is not None:
        return listed.usage, True
    ledger = listed.figures
    totals = np.array([[ledger.productive_gpu_seconds, ledger.eval_gpu_seconds,
                        *(ledger.waste_gpu_seconds[k] for k in WASTE_KEYS)]])
    first = ledger.first_time or 0.0
    last = max(ledger.latest_time or first, first + 1e-6)
    return pieces_of(usage_of_pieces(np.array([first]), np.array([last]), totals)), False


def window_figures(clipped: dict[str, float]) -> WindowFigures:
    # constructed, not validated: floats by construction (numpy's tolist), one per field
    waste = WasteBreakdown.model_construct(None, **{k: clipped[k] for k in WASTE_KEYS})
    allocated = sum(clipped[k] for k in USAGE_KEYS)
    return WindowFigures.model_construct(allocated_gpu_seconds=allocated,
                                         productive_gpu_seconds=clipped["productive"], eval_gpu_seconds=clipped[EVAL],
                                         waste_gpu_seconds=waste, goodput=goodput_ratio(clipped["productive"],
                                                                                        allocated))
