"""Inflating a gzip body never holds up the event loop: while one body is being inflated, /healthz answers.

Deterministic, no timing threshold: the inflater is made to wait until /healthz has answered. Were inflation run on
the event loop, /healthz could not answer until that wait gave up, and the test would see it.
"""

from __future__ import annotations

import gzip
import json
import threading
from typing import Any

import pytest

import services.collector.routes.ingest as ingest_route
from services.collector.batch import decompress as real_decompress

WAIT_S = 20.0


def test_healthz_answers_while_a_body_is_being_inflated(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    inflating = threading.Event()
    healthz_answered = threading.Event()
    seen: dict[str, Any] = {}

    def slow_decompress(*args: Any, **kwargs: Any) -> Any:
        seen["thread"] = threading.current_thread().name
        inflating.set()
        seen["healthz_answered_meanwhile"] = healthz_answered.wait(WAIT_S)
        return real_decompress(*args, **kwargs)

    monkeypatch.setattr(ingest_route, "decompress", slow_decompress)
    t = 1_700_000_000.0
    batch = {"events": [{"event_id": "inflate-1", "run_id": "inflate", "kind": "step", "time": t + 2, "attempt": 0,
                         "rank": 0, "step": 1, "start": t, "end": t + 1}]}
    body = gzip.compress(json.dumps(batch).encode())
    answers: dict[str, int] = {}

    def post() -> None:
        answers["post"] = client.post("/v1/events", content=body, headers={
            "Content-Encoding": "gzip", "Content-Type": "application/json"}).status_code

    poster = threading.Thread(target=post)
    poster.start()
    assert inflating.wait(WAIT_S), "the body was never inflated"
    answers["healthz"] = client.get("/healthz").status_code
    healthz_answered.set()
    poster.join(WAIT_S * 2)

    assert seen["healthz_answered_meanwhile"], "/healthz waited for the inflation: it ran on the event loop"
    assert seen["thread"].startswith("goodput-inflate"), seen
    assert answers == {"healthz": 200, "post": 200}, answers
