"""Memory stays bounded under load: request bodies in flight are capped across requests (503 + Retry-After
beyond it, which the client honours), as are the writer's pending rows (services.storage.writer)."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from services.collector.app import create_app
from services.collector.routes.ingest import BodyBudget
from services.errors import Overloaded
from services.settings import IngestSettings, ServerSettings, ServiceSettings


def test_the_body_budget_refuses_a_second_request_that_would_overflow_it() -> None:
    budget = BodyBudget(1000)
    with budget.hold() as first:
        first(800)
        with budget.hold() as second, pytest.raises(Overloaded):
            second(300)
        assert budget.used_bytes == 800  # the refused request holds nothing
    assert budget.used_bytes == 0
    with budget.hold() as alone:
        alone(5000)  # one request alone always fits (the body cap bounds it)


def _batch(i: int, steps: int) -> bytes:
    t = 1_700_000_000.0
    return json.dumps({"events": [{"event_id": f"e{i}", "run_id": "bp", "kind": "steps", "time": t, "attempt": 0,
                                   "rank": i, "step": list(range(1, steps + 1)), "start": [t] * steps,
                                   "end": [t + 1] * steps}]}).encode()


def test_concurrent_posts_over_the_budget_get_503_with_retry_after(database_url: str, engine) -> None:
    settings = ServiceSettings(server=ServerSettings(database_url=database_url, serve_dashboard=False),
                               ingest=IngestSettings(max_inflight_body_bytes=60_000))
    app = create_app(settings, engine=engine)

    async def run() -> list[httpx.Response]:
        async def body(i: int):
            data = _batch(i, 1000)  # ~40 kB each: two at once do not fit
            for k in range(0, len(data), 4096):
                yield data[k:k + 4096]
                await asyncio.sleep(0.01)  # a slow client: the body arrives over ~0.1 s

        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1234))
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport,
                                                                          base_url="http://t") as client:
            return list(await asyncio.gather(*(client.post("/v1/events", content=body(i),
                                                           headers={"Content-Type": "application/json"})
                                               for i in range(6))))

    out: list[list[httpx.Response]] = []  # in a thread of its own: the session may already run an event loop
    thread = threading.Thread(target=lambda: out.append(asyncio.run(run())))
    thread.start()
    thread.join(120)
    responses = out[0]
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses and 503 in statuses, statuses
    for r in responses:
        if r.status_code == 503:
            assert r.headers["Retry-After"] and r.json()["error"]["code"] == "overloaded"
