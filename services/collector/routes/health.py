from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from services.collector.auth import NETWORK
from services.collector.deps import EngineDep, WriterDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness and database reachability", dependencies=[NETWORK])
async def healthz(engine: EngineDep, writer: WriterDep) -> dict[str, object]:
    def ping() -> str:
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return "ok"
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return f"unreachable: {exc.__class__.__name__}"

    database = await run_in_threadpool(ping)
    return {"status": "ok" if database == "ok" else "degraded", "database": database,
            "pending_events": writer.pending_events}
