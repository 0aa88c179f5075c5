"""POST /v1/events answers outside FastAPI's routing (services/collector/routes/ingest.py): what the framework did
for it is done by the endpoint itself, and each part is checked here: other methods, a body that stops arriving, a
client that goes away, the request histogram, the error envelope and the OpenAPI operation."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

import services.storage.writer as writer_module
from services.collector.app import create_app
from services.collector.batch import parse_batch
from services.collector.routes.ingest import BodyDeadlines
from services.errors import Overloaded
from services.settings import IngestSettings, ServerSettings, ServiceSettings

T = 1_700_000_000.0


def _step(event_id: str, step: int) -> dict[str, Any]:
    return {"event_id": event_id, "run_id": "endpoint", "kind": "step", "time": T + step + 1, "attempt": 0,
            "rank": 0, "step": step, "start": T + step, "end": T + step + 0.5}


def test_other_methods_get_405_in_the_error_envelope(client: TestClient) -> None:
    for method in ("GET", "PUT", "DELETE"):
        response = client.request(method, "/v1/events")
        assert response.status_code == 405, response.text
        assert response.json()["error"]["code"] == "method_not_allowed"
        assert "POST" in response.json()["error"]["message"]


def test_a_rejected_batch_names_the_event_and_field_and_is_counted(client: TestClient) -> None:
    bad = _step("e1", 1) | {"end": "soon"}
    response = client.post("/v1/events", json={"events": [_step("e0", 0), bad]})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["index"] == 1 and error["event_id"] == "e1" and error["field"] == "end"
    metrics = client.get("/metrics").text
    assert re.search(r'^goodput_collector_rejected_batches_total\{code="invalid_event"\} 1\.0$', metrics, re.M)
    assert client.post("/v1/events", json={"events": [_step("e0", 0)]}).json() == {"accepted": 1, "duplicates": 0}


def test_every_answer_is_timed_under_the_route_template(client: TestClient) -> None:
    assert client.post("/v1/events", json={"events": [_step("a", 1)]}).status_code == 200
    assert client.post("/v1/events", content=b"{").status_code == 400
    assert client.get("/v1/events").status_code == 405
    metrics = client.get("/metrics").text
    for method, status in (("POST", "200"), ("POST", "400"), ("GET", "405")):
        labels = f'code="{status}",handler="/v1/events",method="{method}"'
        pattern = r"^goodput_collector_request_duration_seconds_count\{" + labels + r"\} 1\.0$"
        assert re.search(pattern, metrics, re.M), (method, status)
    assert re.search(r"^goodput_collector_write_queue_rows 0\.0$", metrics, re.M)


def test_the_ack_carries_the_send_interval(client: TestClient) -> None:
    response = client.post("/v1/events", json={"events": [_step("a", 1)]})
    assert response.headers["content-type"] == "application/json"
    assert float(response.headers["Goodput-Send-Interval"]) >= 0


def test_the_openapi_operation_is_documented(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v1/events"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/EventBatch"}
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/IngestAck"}
    assert {"400", "401", "403", "405", "408", "413", "415", "422", "503"} <= operation["responses"].keys()


# -- the body deadline and a client that leaves, driven through the ASGI interface ----------------------------


async def _call(app: Any, receive: Any) -> tuple[list[dict[str, Any]], float]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "path": "/v1/events", "raw_path": b"/v1/events", "root_path": "", "scheme": "http", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    started = time.monotonic()
    await app(scope, receive, send)
    return sent, time.monotonic() - started


def _run_with_lifespan(app: Any, body: Any) -> Any:
    async def main() -> Any:
        async with app.router.lifespan_context(app):
            return await body()
    return asyncio.run(main())


def test_a_body_that_stops_arriving_gets_408_after_the_timeout(database_url: str, engine: Engine) -> None:
    settings = ServiceSettings(server=ServerSettings(database_url=database_url, serve_dashboard=False,
                                                     warm_analyses_s=0), ingest=IngestSettings(body_timeout_s=0.5))
    app = create_app(settings, engine=engine)
    first = [True]

    async def receive() -> dict[str, Any]:
        if first[0]:
            first[0] = False
            return {"type": "http.request", "body": b'{"events": [', "more_body": True}
        await asyncio.sleep(3600)  # the rest never comes
        raise AssertionError

    sent, elapsed = _run_with_lifespan(app, lambda: _call(app, receive))
    assert sent[0]["status"] == 408
    assert b"body_timeout" in sent[1]["body"]
    assert 0.5 <= elapsed < 0.5 + 2 * BodyDeadlines.PERIOD_S + 1.0


def test_a_client_that_leaves_mid_body_gets_no_answer_and_stores_nothing(client: TestClient,
                                                                        engine: Engine) -> None:
    app = client.app
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": b'{"events": [', "more_body": True},
                                      {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    assert client.portal is not None
    sent, _ = client.portal.call(_call, app, receive)  # on the app's own loop, where its lifespan runs
    assert sent == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM events")).scalar_one() == 0
    assert re.search(r'\{code="499",handler="/v1/events",method="POST"\} 1\.0$', client.get("/metrics").text, re.M)


def test_deadlines_leave_fast_reads_alone_and_other_cancellations_as_they_are() -> None:
    async def main() -> None:
        deadlines = BodyDeadlines()
        watcher = asyncio.create_task(deadlines.watch())

        async def read(seconds: float, timeout_s: float) -> str:
            try:
                with deadlines.reading(timeout_s):
                    await asyncio.sleep(seconds)
                return "done"
            except TimeoutError:
                return "timed out"

        assert await read(0.01, 5) == "done"
        assert await read(5, 0.3) == "timed out"
        stopped = asyncio.create_task(read(5, 30))  # cancelled by someone else: the server stopping
        await asyncio.sleep(0.05)
        stopped.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopped
        assert deadlines._reading == {} and deadlines._expired == set()
        watcher.cancel()

    asyncio.run(main())



def test_a_full_write_queue_refuses_before_the_body_is_parsed(client: TestClient, monkeypatch) -> None:
    """Beyond capacity a refusal must be cheap: a body is not inflated and parsed only to be refused. Proof that it
    is not parsed: a malformed body gets the 503 of a full queue, not its 400."""
    gate = threading.Event()
    real_write = writer_module.write_batches  # type: ignore[attr-defined]

    def stalled_write(*args: Any, **kwargs: Any) -> Any:  # the database stalls until the gate opens
        assert gate.wait(60)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_batches", stalled_write)
    writer = client.app.state.writer  # type: ignore[attr-defined]
    held = []
    try:
        with pytest.raises(Overloaded):  # the queue fills up to its limit (nothing measured yet: its minimum)
            for i in range(1_000_000):
                body = json.dumps({"events": [_step(f"q{i}", i)]}).encode()
                held.append(writer.submit(parse_batch(body, max_events=10, max_rows=10)))
        response = client.post("/v1/events", content=b"{not json")
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] and response.json()["error"]["code"] == "overloaded"
        assert "waiting to be written" in response.json()["error"]["message"]
    finally:
        gate.set()
    assert all(f.result(timeout=60).accepted == 1 for f in held)
    assert client.post("/v1/events", content=b"{not json").status_code == 400  # parsed again once there is room
    metrics = client.get("/metrics").text
    assert re.search(r'^goodput_collector_overloaded_requests_total\{reason="write_queue"\} 1\.0$', metrics, re.M)
    assert re.search(r'^goodput_collector_overloaded_requests_total\{reason="body_budget"\} 0\.0$', metrics, re.M)


def test_a_body_is_parsed_only_with_room_held_for_its_rows(client: TestClient) -> None:
    """Room for a body's estimated rows is held in the write queue before it is parsed (BatchWriter.reserve): a
    body too big for the room left is refused without a parse, and bodies parsed at the same time can never fill
    the queue past its limit and be refused after their parse. Proof that a refused body is not parsed: malformed,
    it gets a full queue's 503, while a small malformed body that fits gets its 400."""
    writer = client.app.state.writer  # type: ignore[attr-defined]
    limit = writer.pending_limit  # nothing measured yet: its minimum
    with writer.reserve(limit - 100):  # a body being parsed holds nearly all the room
        assert writer.pending_events == limit - 100
        big = b'{"events": [' + b" " * 100_000 + b"!"  # thousands of rows by its size; malformed
        response = client.post("/v1/events", content=big)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "overloaded" and response.headers["Retry-After"] == "1"
        assert client.post("/v1/events", content=b"{not json").status_code == 400  # fits: parsed
        assert client.post("/v1/events", json={"events": [_step("fits", 1)]}).json()["accepted"] == 1
    assert writer.pending_events == 0
    assert client.post("/v1/events", content=big).status_code == 400  # room again: parsed, and malformed
    metrics = client.get("/metrics").text
    assert re.search(r'^goodput_collector_overloaded_requests_total\{reason="write_queue"\} 1\.0$', metrics, re.M)
