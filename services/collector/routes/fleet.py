"""The fleet over a time range: `GET /v1/fleet/window`, each run's figures cut to the range from when its GPU time
was spent (the ledger's `usage`), and per time bucket (the dashboard's over-time charts)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response

from services.collector.deps import AnalysesDep, LiveConfigDep, RunScopeDep
from services.collector.responses import model_response
from services.collector.routes.runs import LIST_BUDGET_S
from services.derive.fleet import fleet_window
from services.schemas.fleet import FleetWindow

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
) -> Response:
    now = time.time()
    hi = now if until is None else until
    if since is not None and hi < since:
        raise HTTPException(422, f"until ({hi:.0f}) is before since ({since:.0f}): give a range that ends after "
                                 "it starts")
    return model_response(fleet_window(analyses, scope, since=since, until=until, now=now, config=live,
                                       budget_s=LIST_BUDGET_S, status=status, run_id=run_id, buckets=buckets,
                                       limit=limit))
