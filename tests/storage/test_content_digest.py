"""An event's content digest is stored with it (`events.content_hash`) and compared with every resend of its id,
across versions of goodput: a digest that changed would make the retry of a stored event a conflict. The values
below were computed by the implementation that wrote the databases of earlier releases."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.collector.batch import parse_batch
from services.storage.write import _stored_form

T = 1764892800.25
EVENTS: list[tuple[dict[str, Any], str | None, str]] = [
    ({"event_id": "s1", "run_id": "r", "kind": "steps", "time": T, "attempt": 0, "rank": 3, "step": [7, 8, 9],
      "start": [T - 3.0, T - 2.0, T - 1.0], "end": [T - 2.0, T - 1.0, T], "comm": [0.125, 0.25, 0.5]},
     '{"n":3}', "0a837434994b15e4f7a2584d49b3eb25"),
    ({"event_id": "s2", "run_id": "r", "kind": "steps", "time": T, "attempt": 1, "rank": 0, "launch": "L",
      "step": [1], "start": [T - 1.0], "end": [T], "loss": [2.5]},
     '{"n":1}', "52b04729bf40a48a5bda34664a3477ec"),
    ({"event_id": "c1", "run_id": "r", "kind": "collectives", "time": T, "attempt": 0, "rank": 1, "step": [4, 4],
      "op": ["all_reduce", "broadcast"], "start": [T - 1.0, T - 0.5], "end": [T - 0.5, T]},
     '{"n":2}', "d5b8198a048d3603c5bf778d68c42002"),
    ({"event_id": "h1", "run_id": "r", "kind": "heartbeat", "time": T, "attempt": 0, "rank": 2, "step": 11},
     None, "c946e6bba349651a9d3d213bae4ab885"),
]


@pytest.mark.parametrize(("event", "data_json", "digest"), EVENTS, ids=[e["event_id"] for e, _, _ in EVENTS])
def test_the_stored_form_of_an_event_is_the_one_earlier_releases_stored(event, data_json, digest) -> None:
    (record,) = parse_batch(json.dumps({"events": [event]}).encode(), max_events=10, max_rows=100)
    assert _stored_form(record) == (data_json, digest)
