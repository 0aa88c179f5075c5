from __future__ import annotations

from fastapi import APIRouter

from services.collector.auth import NETWORK
from services.collector.deps import EngineDep, WriterDep
from services.schemas.status import Health
from services.storage.db import database_status

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness and database reachability", dependencies=[NETWORK])
def healthz(engine: EngineDep, writer: WriterDep) -> Health:
    database = database_status(engine)
    return Health(status="ok" if database == "ok" else "degraded", database=database,
                  pending_events=writer.pending_events)
