"""Inflating a large gzip body never holds up the event loop: while one is being inflated, /healthz answers. A node
relay's small body inflates on the loop (the hop to a thread cost more than the inflating), up to a bound.

Deterministic, no timing threshold: the inflater is made to wait until /healthz has answered. Were inflation run on
the event loop, /healthz could not answer until that wait gave up, and the test would see it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from typing import Any

import pytest

import services.collector.routes.ingest as ingest_route
from services.collector.batch import decompress as real_decompress
from services.collector.batch import decompress_within as real_decompress_within

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
    body = gzip.compress(json.dumps(batch_of(steps=20_000)).encode())  # inflates past INLINE_INFLATED_BYTES
    assert len(gzip.decompress(body)) > ingest_route.INLINE_INFLATED_BYTES
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


def test_a_small_body_inflates_on_the_event_loop_and_a_bomb_on_the_inflating_thread(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    where: list[str] = []

    def on_loop(*args: Any) -> Any:
        try:
            asyncio.get_running_loop()
            where.append("loop")
        except RuntimeError:
            where.append(threading.current_thread().name)
        return real_decompress_within(*args)

    def on_thread(*args: Any) -> Any:
        where.append(threading.current_thread().name)
        return real_decompress(*args)

    monkeypatch.setattr(ingest_route, "decompress_within", on_loop)
    monkeypatch.setattr(ingest_route, "decompress", on_thread)
    small = gzip.compress(json.dumps(batch_of(steps=5)).encode())
    # a bomb: a few KB that inflate to 1 MB, past what the loop inflates (its first INLINE_INFLATED_BYTES are thrown
    # away, then the inflating thread does the whole)
    bomb = gzip.compress(json.dumps({**batch_of(steps=5), "padding": " " * (1 << 20)}).encode())
    assert len(bomb) <= ingest_route.INLINE_INFLATE_BYTES
    for body in (small, bomb):
        answer = client.post("/v1/events", content=body, headers={"Content-Encoding": "gzip"})
        assert answer.status_code == (200 if body is small else 422), answer.text  # padding: no field of a batch
    assert where[0] == "loop" and where[1] == "loop" and where[2].startswith("goodput-inflate"), where
    assert len(where) == 3, where


def batch_of(*, steps: int) -> dict[str, Any]:
    t = 1_700_000_000.0
    return {"events": [{"event_id": f"inflate-{steps}", "run_id": "inflate", "kind": "steps", "time": t + steps + 1,
                        "attempt": 0, "rank": 0, "step": list(range(steps)), "start": [t + s for s in range(steps)],
                        "end": [t + s + 0.5 for s in range(steps)]}]}
