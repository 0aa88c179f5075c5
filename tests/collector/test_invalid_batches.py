"""Every kind of invalid batch is rejected whole with a 4xx that names the problem, and nothing is stored."""

from __future__ import annotations

import gzip
from typing import Any

import pytest

T = 1_700_000_000.0


def good(i: int = 0) -> dict[str, Any]:
    return {"event_id": f"ok-{i}", "run_id": "bad-run", "kind": "step", "time": T + 2, "attempt": 0, "rank": 0,
            "step": i + 1, "start": T, "end": T + 1}


def with_(**changes: Any) -> dict[str, Any]:
    event = {**good(99), "event_id": "the-bad-one", **changes}
    return {k: v for k, v in event.items() if v is not _DROP}


_DROP = object()

CASES = [
    ("wrong type", with_(step="7"), "step"),
    ("float where int", with_(attempt=1.5), "attempt"),
    ("bool where int", with_(rank=True), "rank"),
    ("missing field", with_(end=_DROP), "end"),
    ("missing kind", with_(kind=_DROP), "kind"),
    ("unknown kind", with_(kind="teleport"), "kind"),
    ("unknown field", with_(colour="red"), "colour"),
    ("end before start", with_(start=T + 5, end=T + 1), "end"),
    ("time far in the past", with_(time=12.0), "time"),
    ("time far in the future", with_(time=1e12), "time"),
    ("step beyond 2**53", with_(step=2**53 + 1), "step"),
    ("negative rank", with_(rank=-1), "rank"),
    ("oversize event id", with_(event_id="x" * 129), "event_id"),
    ("oversize run id", with_(run_id="r" * 257), "run_id"),
    ("control characters", with_(run_id="bad\nrun"), "run_id"),
    ("world size 0", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "attempt_start", "time": T,
                      "attempt": 0, "rank": 0, "world_size": 0, "host": "h"}, "world_size"),
    ("world size 10**7", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "attempt_start", "time": T,
                          "attempt": 0, "rank": 0, "world_size": 10**7, "host": "h"}, "world_size"),
    ("rank outside world", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "attempt_start", "time": T,
                            "attempt": 0, "rank": 8, "world_size": 8, "host": "h"}, "rank"),
    ("bad reason", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "attempt_end", "time": T,
                    "attempt": 0, "rank": 0, "reason": "tired"}, "reason"),
    ("compact arrays of unequal length", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "steps",
                                          "time": T, "attempt": 0, "rank": 0, "step": [1, 2], "start": [T],
                                          "end": [T + 1, T + 2]}, "start"),
    ("compact end before start", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "steps", "time": T,
                                  "attempt": 0, "rank": 0, "step": [1, 2], "start": [T, T + 5],
                                  "end": [T + 1, T + 2]}, "end.1"),
    ("oversize op name", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "collective", "time": T,
                          "attempt": 0, "rank": 0, "step": 1, "op": "a" * 65, "start": T, "end": T + 1}, "op"),
    ("unknown phase", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "phase_start", "time": T,
                       "attempt": 0, "rank": 0, "name": "warmup", "step": 0}, "name"),
    ("phase end without ok", {"event_id": "the-bad-one", "run_id": "bad-run", "kind": "phase_end", "time": T,
                              "attempt": 0, "rank": 0, "name": "eval", "step": 0}, "ok"),
]


def _assert_nothing_stored(client) -> None:
    assert client.get("/v1/runs/bad-run").status_code == 404
    assert client.get("/v1/runs").json()["count"] == 0


@pytest.mark.parametrize(("name", "bad", "field"), CASES, ids=[c[0] for c in CASES])
def test_invalid_event_rejects_the_whole_batch_naming_index_id_and_field(client, name, bad, field) -> None:
    response = client.post("/v1/events", json={"events": [good(0), bad, good(1)]})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["index"] == 1
    assert error["field"] == field
    assert "event 1" in error["message"] and field in error["message"]
    if isinstance(bad.get("event_id"), str) and len(bad["event_id"]) <= 128:
        assert error["event_id"] == "the-bad-one"
        assert "the-bad-one" in error["message"]
    _assert_nothing_stored(client)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinite_numbers_are_rejected(client, literal: str) -> None:
    body = ('{"events": [{"event_id": "n", "run_id": "bad-run", "kind": "step", "time": 1700000002, "attempt": 0, '
            f'"rank": 0, "step": 1, "start": 1700000000, "end": 1700000001, "loss": {literal}}}]}}')
    response = client.post("/v1/events", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "loss"
    assert "finite" in response.json()["error"]["message"]
    _assert_nothing_stored(client)


@pytest.mark.parametrize(("body", "code"), [
    (b'{"events": [', "malformed_json"),
    (b"", "malformed_json"),
    (b"[1, 2]", "invalid_batch"),
    (b'{"events": "no"}', "invalid_batch"),
    (b'{"events": [], "extra": 1}', "invalid_batch"),
])
def test_malformed_bodies_get_a_400_or_422(client, body: bytes, code: str) -> None:
    response = client.post("/v1/events", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code in (400, 422), response.text
    assert response.json()["error"]["code"] == code
    _assert_nothing_stored(client)


def test_an_empty_batch_is_rejected(client) -> None:
    response = client.post("/v1/events", json={"events": []})
    assert response.status_code == 422
    assert "no events" in response.json()["error"]["message"]


def test_schema_version_from_the_future_is_rejected(client) -> None:
    response = client.post("/v1/events", json={"schema_version": 2, "events": [good()]})
    assert response.status_code == 422
    assert "schema_version" in response.json()["error"]["message"]
    _assert_nothing_stored(client)


@pytest.fixture
def small_client(settings, engine):
    from fastapi.testclient import TestClient

    from services.collector.app import create_app

    ingest = settings.ingest.model_copy(update={"max_events_per_batch": 5, "max_body_bytes": 4096,
                                                "max_rows_per_batch": 50})
    limited = settings.model_copy(update={"ingest": ingest})
    with TestClient(create_app(limited, engine=engine)) as test_client:
        yield test_client


def test_oversize_batches_and_bodies_get_a_413(small_client) -> None:
    too_many = small_client.post("/v1/events", json={"events": [good(i) for i in range(6)]})
    assert too_many.status_code == 413 and "limit of 5" in too_many.json()["error"]["message"]
    rows = {"event_id": "big", "run_id": "bad-run", "kind": "steps", "time": T, "attempt": 0, "rank": 0,
            "step": list(range(1, 61)), "start": [T] * 60, "end": [T + 1] * 60}
    too_many_rows = small_client.post("/v1/events", json={"events": [rows]})
    assert too_many_rows.status_code == 413 and "rows" in too_many_rows.json()["error"]["message"]
    huge = small_client.post("/v1/events", json={"events": [with_(event_id="x" * 100)] * 40})
    assert huge.status_code == 413
    bomb = gzip.compress(b'{"events": [' + b" " * 100_000 + b"]}")
    inflated = small_client.post("/v1/events", content=bomb, headers={"Content-Encoding": "gzip"})
    assert inflated.status_code == 413 and "decompressed" in inflated.json()["error"]["message"]
    _assert_nothing_stored(small_client)


def test_a_body_that_is_not_gzip_is_rejected(client) -> None:
    response = client.post("/v1/events", content=b"not gzip", headers={"Content-Encoding": "gzip"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_encoding"


@pytest.mark.parametrize("damage", ["truncated (no CRC trailer)", "trailing garbage", "a second gzip member",
                                    "a wrong CRC"])
def test_a_damaged_gzip_stream_is_rejected_whole(client, damage: str) -> None:
    import json
    import struct

    stream = gzip.compress(json.dumps({"events": [good(1)]}).encode())
    damaged = {
        "truncated (no CRC trailer)": stream[:-8],
        "trailing garbage": stream + b"garbage",
        "a second gzip member": stream + gzip.compress(json.dumps({"events": [good(2)]}).encode()),
        "a wrong CRC": stream[:-8] + struct.pack("<I", (struct.unpack("<I", stream[-8:-4])[0] + 1) % 2**32)
        + stream[-4:],
    }[damage]
    response = client.post("/v1/events", content=damaged, headers={"Content-Encoding": "gzip"})
    assert response.status_code == 400, (damage, response.text)
    assert response.json()["error"]["code"] == "bad_encoding", response.text
    _assert_nothing_stored(client)
    assert client.post("/v1/events", content=stream, headers={"Content-Encoding": "gzip"}).status_code == 200
