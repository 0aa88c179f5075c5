"""What routes declare they need, resolved per request: `def route(run: RunDep, analyses: AnalysesDep) -> Model`.

The run dependencies resolve `{run_id}` (and `?project=`) under the caller's token scope to the run's row, or
answer 404 for a run the caller may not see (services.collector.auth). The app's shared objects (engine,
writer, settings, analysis cache) live in `app.state`, set once by `create_app`; their dependencies are `async def`
because FastAPI runs a plain `def` dependency on a worker thread, and a thread hop per dependency per request was
most of the cost of an ingest request (benchmarks/requests.py).
"""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request
from sqlalchemy import Engine

from services.analysis.live import LiveConfig
from services.collector.auth import (
    Principal,
    caller,
    client_run,
    readable_run,
    run_scope,
    writable_run,
)
from services.derive.cache import AnalysisCache
from services.derive.live import live_config
from services.derive.runs import RunScope
from services.settings import ServiceSettings
from services.storage.runs import RunRow
from services.storage.writer import BatchWriter


async def _engine(request: Request) -> Engine:
    return cast(Engine, request.app.state.engine)


async def _writer_of_batches(request: Request) -> BatchWriter:
    return cast(BatchWriter, request.app.state.writer)


async def _settings(request: Request) -> ServiceSettings:
    return cast(ServiceSettings, request.app.state.settings)


async def _analyses(request: Request) -> AnalysisCache:
    return cast(AnalysisCache, request.app.state.analyses)


async def _live(settings: Annotated[ServiceSettings, Depends(_settings)]) -> LiveConfig:
    return live_config(settings)


EngineDep = Annotated[Engine, Depends(_engine)]
WriterDep = Annotated[BatchWriter, Depends(_writer_of_batches)]
SettingsDep = Annotated[ServiceSettings, Depends(_settings)]
AnalysesDep = Annotated[AnalysisCache, Depends(_analyses)]  # every derived product of a run: ledger, views, ...
LiveConfigDep = Annotated[LiveConfig, Depends(_live)]  # hang detection's thresholds (settings.live)

PrincipalDep = Annotated[Principal, Depends(caller)]
RunScopeDep = Annotated[RunScope, Depends(run_scope)]  # the runs a list may show the caller
# The run a route of one run (/v1/runs/{run_id}/...) works on, resolved for the caller: every such route takes one.
RunDep = Annotated[RunRow, Depends(readable_run)]
WriteRunDep = Annotated[RunRow, Depends(writable_run)]
ClientRunDep = Annotated[RunRow, Depends(client_run)]
