"""The floor of our own stack for `benchmarks.requests`: FastAPI + uvicorn reading and parsing the same body as
the collector's ingest route and answering with the same acknowledgement, storing nothing.

    uvicorn benchmarks.bare_app:app --port 8001
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request

app = FastAPI()


@app.post("/v1/events")
async def ingest(request: Request) -> dict[str, Any]:
    batch = json.loads(await request.body())
    return {"accepted": len(batch["events"]), "duplicates": 0}
