"""GET /v1/fleet/window: each run's figures cut to the range from when its GPU time was spent, never more than its
GPUs x the range, and per bucket where it happened (a run written down by hand: tests/analysis/test_usage.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.analysis.scenarios import T0
from tests.analysis.test_usage import GPUS, HOUR, WORLD, three_hours
from tests.collector.test_live_api import post, running_sim


def run_of(answer: dict[str, Any], run_id: str) -> dict[str, Any]:
    return next(r for r in answer["runs"] if r["run"]["run_id"] == run_id)


def test_an_hour_of_a_run_is_what_it_spent_in_that_hour_in_the_buckets_where_it_happened(client) -> None:
    post(client, three_hours())
    answer = client.get("/v1/fleet/window", params={"since": T0 + HOUR, "until": T0 + 2 * HOUR}).json()
    run = run_of(answer, "s1")
    window = run["window"]
    assert window["allocated_gpu_seconds"] == pytest.approx(GPUS * HOUR)  # never more than GPUs x 1 h
    assert window["productive_gpu_seconds"] == pytest.approx(0.0)
    assert window["waste_gpu_seconds"] == pytest.approx({"startup": 0.0, "checkpoint": 300 * WORLD,
                                                         "rework": 3000 * WORLD, "hang": 300 * WORLD,
                                                         "straggler": 0.0, "idle": HOUR * (GPUS - WORLD)})
    assert run["run"]["allocated_gpu_seconds"] == pytest.approx(3 * GPUS * HOUR)  # the whole life, as /v1/runs
    width, first = answer["bucket_s"], answer["bucket_start"]
    assert width == 300.0 and first % width == 0 and first <= T0 + HOUR < first + width  # round, epoch-aligned
    hang = run["buckets"]["hang"]
    ends = [first + (i + 1) * width for i in range(answer["bucket_count"])]
    assert sum(hang) == pytest.approx(300 * WORLD)  # 6900-7200 only: the buckets it happened in, not smeared
    assert all(v == 0.0 for v, end in zip(hang, ends, strict=True) if end <= T0 + 6900)
    total = sum(sum(values) for values in run["buckets"].values())
    assert total == pytest.approx(window["allocated_gpu_seconds"])


def test_all_time_is_the_runs_whole_ledger(client) -> None:
    post(client, three_hours())
    run = run_of(client.get("/v1/fleet/window").json(), "s1")
    ledger = client.get("/v1/runs/s1/waste").json()
    assert run["laid_out"] is True
    assert run["window"]["allocated_gpu_seconds"] == pytest.approx(ledger["allocated_gpu_seconds"])
    assert run["window"]["waste_gpu_seconds"] == pytest.approx(ledger["waste_gpu_seconds"])


def test_a_hung_runs_last_hour_holds_its_hang_so_far_and_no_more_than_its_gpus(client) -> None:
    post(client, running_sim("stalled", stopped_ago_s=300.0))  # 4 ranks on 4 GPUs, hung
    now = time.time()
    run = run_of(client.get("/v1/fleet/window", params={"since": now - HOUR}).json(), "stalled")
    assert run["run"]["provisional"] is not None
    assert 0 < run["window"]["allocated_gpu_seconds"] <= 4 * HOUR
    assert run["window"]["waste_gpu_seconds"]["hang"] == pytest.approx(300.0 * 4, abs=20 * 4)


def test_a_range_of_any_length_has_at_most_the_buckets_asked_for(client) -> None:
    post(client, three_hours())
    answer = client.get("/v1/fleet/window", params={"since": 0, "buckets": 48}).json()  # 56 years
    assert answer["bucket_count"] <= 49 and answer["bucket_s"] % (7 * 86400) == 0
    assert sum(sum(v) for v in run_of(answer, "s1")["buckets"].values()) == pytest.approx(3 * GPUS * HOUR)


@pytest.mark.parametrize("params", [{"since": -1e15}, {"until": 1e300}, {"since": T0 + HOUR, "until": T0}])
def test_an_absurd_range_is_refused_with_a_message(client, params: dict[str, float]) -> None:
    response = client.get("/v1/fleet/window", params=params)
    assert response.status_code == 422, response.text
    assert "since" in response.text or "until" in response.text
