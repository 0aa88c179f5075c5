from __future__ import annotations

import gzip
import json
import random

import pytest

from tests.analysis.scenarios import reference_s1
from tests.ledger_checks import assert_partition


def post(client, events, **kwargs):
    return client.post("/v1/events", json={"events": events}, **kwargs)


def test_reference_scenario_through_the_api(client) -> None:
    response = post(client, reference_s1())
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": len(reference_s1()), "duplicates": 0}
    ledger = client.get("/v1/runs/s1/waste").json()
    assert ledger["allocated_gpu_seconds"] == pytest.approx(4160)
    assert ledger["productive_gpu_seconds"] == pytest.approx(2400)
    assert ledger["waste_gpu_seconds"] == pytest.approx(
        {"startup": 480, "checkpoint": 160, "rework": 400, "hang": 480, "straggler": 0, "idle": 240})
    assert ledger["queue_seconds"] == pytest.approx(100)
    assert ledger["goodput"] == pytest.approx(0.5769230769)
    assert ledger["restarts"] == 1
    assert_partition(ledger)

    detail = client.get("/v1/runs/s1").json()
    assert detail["status"] == "finished"
    assert detail["restarts"] == 1
    assert detail["world_sizes"] == [8]
    assert detail["last_step"] == 300
    assert detail["last_checkpoint"]["step"] == 200
    assert [a["resume_step"] for a in detail["attempts"]] == [0, 100]

    runs = client.get("/v1/runs").json()["runs"]
    assert [(r["run_id"], r["status"]) for r in runs] == [("s1", "finished")]
    assert runs[0]["goodput"] == pytest.approx(ledger["goodput"])
    assert runs[0]["allocated_gpu_seconds"] == pytest.approx(4160)


def test_a_retried_batch_is_absorbed_as_duplicates(client) -> None:
    events = reference_s1()
    assert post(client, events).json() == {"accepted": len(events), "duplicates": 0}
    before = client.get("/v1/runs/s1/waste").json()
    assert post(client, events).json() == {"accepted": 0, "duplicates": len(events)}
    half = events[: len(events) // 2]
    assert post(client, half + half[:3]).json() == {"accepted": 0, "duplicates": len(half) + 3}
    assert client.get("/v1/runs/s1/waste").json() == before


def test_duplicates_inside_one_batch_are_stored_once(client) -> None:
    events = reference_s1()
    assert post(client, events + events[:10]).json() == {"accepted": len(events), "duplicates": 10}
    assert client.get("/v1/runs/s1/waste").json()["allocated_gpu_seconds"] == pytest.approx(4160)


def test_replayed_steps_under_new_event_ids_count_once(client) -> None:
    events = reference_s1()
    post(client, events)
    replay = [dict(e, event_id=e["event_id"] + "-replay") for e in events if e["kind"] == "steps"]
    # the records whose rows moved into block rows are recognised by their rows (services.storage.moved_repeats);
    # those of each rank's current block are stored again, as late rows; the ledger counts every step once
    answer = post(client, replay).json()
    assert answer["accepted"] + answer["duplicates"] == len(replay) and answer["duplicates"] > 0
    ledger = client.get("/v1/runs/s1/waste").json()
    assert ledger["productive_gpu_seconds"] == pytest.approx(2400)
    assert_partition(ledger)


def test_events_in_any_order_and_batching_give_the_same_ledger(client) -> None:
    events = reference_s1()
    shuffled = events[:]
    random.Random(7).shuffle(shuffled)
    for i in range(0, len(shuffled), 17):
        assert post(client, [dict(e, run_id="s1-shuffled") for e in shuffled[i:i + 17]]).status_code == 200
    post(client, events)
    a = client.get("/v1/runs/s1/waste").json()
    b = client.get("/v1/runs/s1-shuffled/waste").json()
    for key in ("allocated_gpu_seconds", "productive_gpu_seconds", "waste_gpu_seconds", "steps", "restarts"):
        assert a[key] == b[key]


def test_gzip_bodies_are_accepted(client) -> None:
    body = gzip.compress(json.dumps({"events": reference_s1()}).encode())
    response = client.post("/v1/events", content=body,
                           headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == len(reference_s1())


def test_unknown_run_is_a_404_that_says_so(client) -> None:
    for path in ("/v1/runs/nope", "/v1/runs/nope/waste"):
        response = client.get(path)
        assert response.status_code == 404
        assert "no run 'nope'" in response.json()["error"]["message"]


def test_run_ids_with_slashes_and_quotes_round_trip(client) -> None:
    run_id = "team/exp-1 'quoted' <b>"
    events = [dict(e, run_id=run_id) for e in reference_s1()]
    assert post(client, events).status_code == 200
    from urllib.parse import quote

    ledger = client.get(f"/v1/runs/{quote(run_id, safe='')}/waste").json()
    assert ledger["run_id"] == run_id
    assert ledger["allocated_gpu_seconds"] == pytest.approx(4160)


def test_openapi_schema_and_docs_are_served(client) -> None:
    schema = client.get("/openapi.json").json()
    assert "/v1/events" in schema["paths"] and "EventBatch" in schema["components"]["schemas"]
    assert client.get("/docs").status_code == 200
