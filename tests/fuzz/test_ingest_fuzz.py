"""Property-based fuzzing of POST /v1/events: never a 5xx; valid batches stored once; bad ones named and refused.

Runs on both backends: PostgreSQL refuses some strings SQLite keeps (a lone surrogate, NUL), and that must be a
4xx at the door, never a failed transaction.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.collector.app import create_app
from services.settings import IngestSettings, ServerSettings, ServiceSettings
from tests.fuzz.conftest import CASES, budget
from tests.fuzz.strategies import INJECTIONS, body, events, implausible, json_values, mutated, reachable

FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=budget(150),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@pytest.fixture
def client(database_url: str, engine) -> Iterator[TestClient]:
    settings_ = ServiceSettings(server=ServerSettings(database_url=database_url, serve_dashboard=False),
                                ingest=IngestSettings(max_body_bytes=1 << 20, max_events_per_batch=200))
    with TestClient(create_app(settings_, engine=engine), raise_server_exceptions=False) as c:
        yield c


def _assert_clean_refusal(response: Any) -> dict[str, Any]:
    assert response.status_code < 500, response.text
    if response.status_code == 200:
        return {}
    assert 400 <= response.status_code < 500
    error = response.json()["error"]
    assert error["code"] and error["message"]
    return error


def _ids_of_this_example(batch: list[dict[str, Any]], example: int) -> list[dict[str, Any]]:
    """The batch with its event ids made this example's own, and one id per content (a repeat keeps its id): an
    id repeated with other content is refused (409; tested below), and examples share one database."""
    content: dict[str, dict[str, Any]] = {}
    out = []
    for i, e in enumerate(batch):
        event_id = f"x{example}-{e['event_id']}"
        mine = {k: v for k, v in e.items() if k != "event_id"}
        if content.setdefault(event_id, mine) != mine:
            event_id = f"{event_id}-{i}"
        out.append({**e, "event_id": event_id})
    return out


def test_valid_batches_are_stored_exactly_once(client: TestClient) -> None:
    examples = iter(range(1 << 30))

    @FUZZ
    @given(st.lists(events(), min_size=1, max_size=12))
    def check(batch: list[dict[str, Any]]) -> None:
        CASES["hypothesis POST /v1/events valid"] += 1
        batch = _ids_of_this_example(batch, next(examples))
        first = client.post("/v1/events", content=body(batch), headers={"Content-Type": "application/json"})
        assert first.status_code == 200, first.text
        unique = len({(e["run_id"], e["event_id"]) for e in batch})
        assert first.json()["accepted"] + first.json()["duplicates"] == len(batch)
        again = client.post("/v1/events", content=gzip.compress(body(batch)),
                            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert again.status_code == 200 and again.json() == {"accepted": 0, "duplicates": len(batch)}
        assert unique >= first.json()["accepted"]

    check()


def test_an_event_id_sent_again_with_other_content_refuses_the_batch_naming_it(client: TestClient) -> None:
    examples = iter(range(1 << 30))

    @FUZZ
    @given(st.lists(events(), min_size=1, max_size=8), st.data())
    def check(batch: list[dict[str, Any]], data: st.DataObject) -> None:
        # A step record's id is kept only until its rank's rows move into block rows (services.storage.moved_repeats):
        # a second step record of the same rank in a higher block moves the first one's rows and forgets its id, and
        # a record sent again after that is recognised by its rows (a duplicate, whatever its other fields say).
        # The claim tested here is about ids the collector still holds.
        assume(max(Counter((e["run_id"], e.get("attempt"), e.get("rank")) for e in batch
                           if e["kind"] in ("step", "steps")).values(), default=0) <= 1)
        CASES["hypothesis POST /v1/events event_id reused"] += 1
        batch = _ids_of_this_example(batch, next(examples))
        assert client.post("/v1/events", content=body(batch), headers={"Content-Type": "application/json"}
                           ).status_code == 200
        index = data.draw(st.integers(0, len(batch) - 1))
        other = {**batch[index], "time": batch[index]["time"] + 0.5}  # another event under a stored id
        fresh = {**batch[0], "event_id": f"{batch[0]['event_id']}-fresh"}  # a new event: refused with it
        response = client.post("/v1/events", content=body([fresh, other]), headers={"Content-Type": "application/json"})
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert (error["code"], error["index"], error["event_id"]) == ("event_id_conflict", 1, other["event_id"])
        again = client.post("/v1/events", content=body([fresh]), headers={"Content-Type": "application/json"})
        assert again.json() == {"accepted": 1, "duplicates": 0}  # nothing of the refused batch was stored

    check()


def test_one_mutated_event_rejects_the_batch_naming_the_field(client: TestClient) -> None:
    @FUZZ
    @given(st.lists(events(run_id="fuzz-good"), min_size=0, max_size=3), mutated())
    def check(good: list[dict[str, Any]], bad: tuple[dict[str, Any], str]) -> None:
        CASES["hypothesis POST /v1/events mutated"] += 1
        event, _ = bad
        response = client.post("/v1/events", content=body([*good, event]),
                               headers={"Content-Type": "application/json"})
        error = _assert_clean_refusal(response)
        if error.get("code") == "invalid_event":
            assert error["index"] == len(good)
            assert error["field"] and repr(error["field"]) in error["message"]  # named, quoted as repr

    check()


def test_implausible_claims_get_a_422_naming_the_field(client: TestClient) -> None:
    @FUZZ
    @given(st.lists(events(run_id="fuzz-good"), min_size=0, max_size=3), implausible())
    def check(good: list[dict[str, Any]], bad: tuple[list[dict[str, Any]], str]) -> None:
        CASES["hypothesis POST /v1/events implausible"] += 1
        batch, field = bad
        response = client.post("/v1/events", content=body([*good, *batch]),
                               headers={"Content-Type": "application/json"})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_event" and error["field"] == field, error
        assert error["index"] >= len(good)

    check()


def test_arbitrary_bodies_and_encodings_never_crash_the_collector(client: TestClient) -> None:
    @FUZZ
    @given(st.one_of(st.binary(max_size=2000), json_values.map(lambda v: json.dumps(v).encode()),
                     st.builds(lambda v: json.dumps({"events": v}).encode(), json_values)),
           st.sampled_from([None, "gzip", "deflate", "br", "identity", "gzip, gzip", ""]),
           st.booleans())
    def check(raw: bytes, encoding: str | None, compress: bool) -> None:
        CASES["hypothesis POST /v1/events raw"] += 1
        headers = {"Content-Type": "application/json"}
        if encoding is not None:
            headers["Content-Encoding"] = encoding
        payload = gzip.compress(raw) if compress and encoding == "gzip" else (
            zlib.compress(raw) if compress and encoding == "deflate" else raw)
        _assert_clean_refusal(client.post("/v1/events", content=payload, headers=headers))

    check()


@pytest.mark.parametrize("text", ["\\ud800", "\\u0000", "nul\\u0000inside", "\\udfff\\ud800"])
def test_strings_a_database_cannot_hold_are_refused_at_the_door(client: TestClient, text: str) -> None:
    for field in ("run_id", "event_id", "host"):
        event = {"event_id": "e1", "run_id": "r1", "kind": "attempt_start", "time": 1.7e9, "attempt": 0,
                 "rank": 0, "world_size": 1, "host": "h"}
        raw = json.dumps({"events": [event]}).replace(f'"{event[field]}"', f'"{text}"', 1)
        response = client.post("/v1/events", content=raw.encode(), headers={"Content-Type": "application/json"})
        CASES["hypothesis POST /v1/events unstorable strings"] += 1
        assert response.status_code in (400, 422), (field, response.text)


def test_injection_strings_are_stored_and_returned_verbatim(client: TestClient) -> None:
    # a run id with a `..` path segment ("../../etc/passwd") is refused: no URL can reach it (docs/events.md)
    storable = [text for text in INJECTIONS if reachable(text)]
    assert len(storable) == len(INJECTIONS) - 1
    for i, text in enumerate(INJECTIONS):
        event = {"event_id": f"inj-{i}", "run_id": text, "kind": "attempt_start", "time": 1.7e9, "attempt": 0,
                 "rank": 0, "world_size": 1, "host": text}
        response = client.post("/v1/events", json={"events": [event]})
        assert response.status_code == (200 if text in storable else 422), text
    runs = {r["run_id"] for r in client.get("/v1/runs", params={"limit": 100}).json()["runs"]}
    assert set(storable) <= runs
    for text in storable:
        assert text in {r["run_id"] for r in client.get("/v1/runs", params={"run_id": text}).json()["runs"]}
