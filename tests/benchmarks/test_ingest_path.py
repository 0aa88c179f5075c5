"""benchmarks.ingest_path's requests are what a node relay posts at the 5 s pace, and valid for the collector."""

from __future__ import annotations

import random
import time

import pytest

from benchmarks.ingest_path import RANKS_PER_RELAY, STEPS_PER_RECORD, relay_body, route_part
from services.settings import ServiceSettings


@pytest.mark.parametrize("heartbeats", [False, True])
def test_a_relay_request_holds_each_rank_s_merged_steps_and_a_heartbeat_if_asked(heartbeats: bool) -> None:
    t0 = time.time() - 3600
    body = relay_body(relay=33, round_=2, t0=t0, rng=random.Random(1), heartbeats=heartbeats)
    records, readings = route_part(body, ServiceSettings())
    steps = [r for r in records if r.kind == "steps"]
    assert [r.kind for r in records] == (["steps", "heartbeat"] if heartbeats else ["steps"]) * RANKS_PER_RELAY
    assert len({r.event_id for r in records}) == len(records)
    assert {r.rank for r in records} == {(33 * RANKS_PER_RELAY + k) % 256 for k in range(RANKS_PER_RELAY)}
    for r in steps:  # relay 33: ranks 8-15 of run 1, which is 53 steps on; round 2: its steps 11-15
        assert r.step_rows is not None
        assert r.step_rows.step.tolist() == list(range(53 + 2 * STEPS_PER_RECORD + 1, 53 + 3 * STEPS_PER_RECORD + 1))
    assert len(readings.lead) == RANKS_PER_RELAY  # one clock reading per rank of the request
