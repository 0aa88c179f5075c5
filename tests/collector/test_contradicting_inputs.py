"""Ledger inputs that contradict each other or are implausible alone (issue 11, point 9): an event implausible on its
own is a 422 naming the event and field; events that contradict each other are resolved by the documented rule of
docs/ledger.md ("Contradicting inputs") whether they arrive in one batch or several (issue 30, point 4: no rule
depends on where the sender cut its stream), and the partition productive + sum(waste) == allocated is exact."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.ledger_checks import assert_partition


def ev(event_id: str, kind: str, t: float, run_id: str = "r", **fields: Any) -> dict[str, Any]:
    return {"event_id": event_id, "run_id": run_id, "kind": kind, "time": t, **fields}


def start(event_id: str, t: float, rank: int = 0, **fields: Any) -> dict[str, Any]:
    return ev(event_id, "attempt_start", t, attempt=0, rank=rank, world_size=2, host="h", **fields)


def steps(event_id: str, t: float, rank: int) -> dict[str, Any]:
    return ev(event_id, "steps", t + 20, attempt=0, rank=rank, step=[1, 2], start=[t + 10, t + 15],
              end=[t + 15, t + 20])


def refused(client: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    response = client.post("/v1/events", json={"events": events})
    assert response.status_code == 422, response.text
    return response.json()["error"]


def accepted(client: Any, events: list[dict[str, Any]]) -> None:
    response = client.post("/v1/events", json={"events": events})
    assert response.status_code == 200, response.text


def ledgers_in_one_batch_and_split(client: Any, events: list[dict[str, Any]], cut: int,
                                   then: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`events` sent as one batch (run "one") and as two cut at `cut` (run "two"), each followed by `then`: both
    accepted, the same ledger (returned)."""
    for run_id, batches in (("one", [events]), ("two", [events[:cut], events[cut:]])):
        for batch in [*batches, then] if then else batches:
            accepted(client, [{**e, "run_id": run_id} for e in batch])
    one, two = (client.get(f"/v1/runs/{run_id}/waste").json() for run_id in ("one", "two"))
    assert_partition(one)
    assert {k: v for k, v in one.items() if k != "run_id"} == {k: v for k, v in two.items() if k != "run_id"}
    return one


T = time.time() - 3600


def test_an_attempt_end_before_its_start_keeps_the_steps_in_one_batch_as_across_batches(client) -> None:
    ledger = ledgers_in_one_batch_and_split(client, [
        ev("e0", "attempt_end", T - 100, attempt=0, rank=0, reason="completed"),
        ev("e1", "attempt_end", T - 100, attempt=0, rank=1, reason="completed"),
        start("s0", T), start("s1", T, rank=1), steps("p0", T, 0), steps("p1", T, 1),
        ev("end", "run_end", T - 100, status="finished")], cut=2)
    # the attempt ends at its last step (T + 20), never before its start: 10 s startup + 10 s of steps, x 2
    assert ledger["productive_gpu_seconds"] == pytest.approx(20.0)
    assert ledger["allocated_gpu_seconds"] == pytest.approx(40.0)


def test_a_requeue_whose_allocation_end_was_never_sent_is_accepted_in_one_batch_as_in_two(client) -> None:
    """Issue 30, point 4: a node is lost; its launcher never sends `allocation_end`; the requeued job's first
    process replays the spool (the first allocation's events) with the new allocation's start, in one batch. It
    was refused whole (422) while the same events in two batches were accepted, and the client quarantined the
    run's history. The first allocation ends where the next one starts (docs/ledger.md, "Allocation and queue")."""
    four = [ev("a1", "allocation_start", T, gpus=2),
            ev("s0", "attempt_start", T + 1, attempt=0, rank=0, world_size=1, host="lost"),
            ev("a2", "allocation_start", T + 60, gpus=2),
            ev("s1", "attempt_start", T + 61, attempt=1, rank=0, world_size=1, host="new")]
    ledger = ledgers_in_one_batch_and_split(client, four, cut=2, then=[ev("end", "run_end", T + 70, status="failed")])
    assert [(a["start"] - T, a["end"] - T, a["gpus"]) for a in ledger["allocations"]] == [
        pytest.approx((0, 60, 2)), pytest.approx((60, 70, 2))]  # the second: open, to the run's last event
    assert ledger["allocated_gpu_seconds"] == pytest.approx(60 * 2 + 10 * 2)
    assert ledger["queue_seconds"] == 0.0 and ledger["restarts"] == 1
    # attempt 0, killed with its node: startup T -> T+1, then its allocation held to its end with no attempt
    # after it there (teardown: hang, 59 s); attempt 1 never stepped: startup T+60 -> T+70; on 1 of 2 GPUs
    assert ledger["waste_gpu_seconds"] == pytest.approx(
        {"startup": 1 + 10, "checkpoint": 0, "rework": 0, "hang": 59, "straggler": 0, "idle": 70})


def test_a_second_allocation_start_in_one_batch_starts_a_new_allocation(client) -> None:
    ledger = ledgers_in_one_batch_and_split(client, [
        ev("a1", "allocation_start", T - 5, gpus=2), ev("a2", "allocation_start", T + 12, gpus=4),
        start("s0", T), start("s1", T, rank=1), steps("p0", T, 0), steps("p1", T, 1),
        ev("end", "run_end", T + 20, status="finished")], cut=1)
    # the first ends where the second starts: 17 s x 2 GPUs + (T + 20 - (T + 12)) x 4 GPUs
    assert ledger["allocated_gpu_seconds"] == pytest.approx(17 * 2 + 8 * 4)


def test_a_second_allocation_start_across_batches_starts_a_new_allocation(client) -> None:
    accepted(client, [ev("a1", "allocation_start", T - 5, gpus=2)])
    accepted(client, [ev("a2", "allocation_start", T + 12, gpus=4)])
    accepted(client, [start("s0", T), start("s1", T, rank=1), steps("p0", T, 0), steps("p1", T, 1),
                      ev("end", "run_end", T + 20, status="finished")])  # (no live hang grows the allocation)
    ledger = client.get("/v1/runs/r/waste").json()
    assert_partition(ledger)
    # the first ends where the second starts: 17 s x 2 GPUs + (T + 20 - (T + 12)) x 4 GPUs
    assert ledger["allocated_gpu_seconds"] == pytest.approx(17 * 2 + 8 * 4)


@pytest.mark.parametrize("order", [(2, 4), (4, 2)])
def test_two_allocation_starts_at_one_instant_count_the_larger_whatever_the_order(client, order) -> None:
    for i, gpus in enumerate(order):
        accepted(client, [ev(f"a{i}", "allocation_start", T - 5, gpus=gpus)])
    accepted(client, [start("s0", T), start("s1", T, rank=1), steps("p0", T, 0), steps("p1", T, 1),
                      ev("end", "run_end", T + 20, status="finished")])  # (no live hang grows the allocation)
    ledger = client.get("/v1/runs/r/waste").json()
    assert_partition(ledger)
    assert ledger["allocated_gpu_seconds"] == pytest.approx(25 * 4)


def test_a_step_spanning_a_century_is_a_422(client) -> None:
    step = ev("x", "step", 946_684_800.0, attempt=0, rank=0, step=1, start=946_684_800.0, end=4_102_444_799.0)
    error = refused(client, [start("s0", T), step])
    assert (error["index"], error["field"]) == (1, "end")  # after the collector's clock by decades
    now = time.time()
    long_step = ev("y", "step", now, attempt=0, rank=0, step=1, start=now - 2 * 86_400, end=now)
    error = refused(client, [start("s0", T), long_step])
    assert error["field"] == "end" and "GOODPUT_MAX_STEP_S" in error["message"]
    compact = ev("z", "steps", now, attempt=0, rank=0, step=[1, 2], start=[now - 2, now - 2 * 86_400],
                 end=[now - 1, now])
    assert refused(client, [compact])["field"] == "end.1"


def test_a_world_size_or_rank_above_the_limit_is_a_422(client) -> None:
    error = refused(client, [ev("w", "attempt_start", T, attempt=0, rank=0, world_size=65_537, host="h")])
    assert error["field"] == "world_size" and "GOODPUT_MAX_WORLD_SIZE" in error["message"]
    assert refused(client, [ev("g", "run_submitted", T, gpus=100_000)])["field"] == "gpus"
    assert refused(client, [ev("h", "heartbeat", T, attempt=0, rank=65_536)])["field"] == "rank"
    accepted(client, [ev("ok", "attempt_start", T, attempt=0, rank=65_535, world_size=65_536, host="h")])


def test_a_checkpoint_end_before_its_start_in_one_batch_is_a_write_of_no_length(client) -> None:
    ck: dict[str, Any] = {"attempt": 0, "rank": 0, "step": 2}
    ledger = ledgers_in_one_batch_and_split(client, [
        start("s0", T), steps("p0", T, 0), ev("c1", "checkpoint_start", T + 21, **ck),
        ev("c2", "checkpoint_end", T + 20.5, ok=True, **ck), ev("end", "run_end", T + 30, status="finished")], cut=3)
    assert ledger["waste_gpu_seconds"]["checkpoint"] == 0.0
    assert (ledger["checkpoints"]["count"], ledger["checkpoints"]["ok"]) == (1, 1)
    assert ledger["checkpoints"]["median_blocking_seconds"] == 0.0


def test_long_checkpoints_and_allocations_are_booked_in_one_batch_as_across_batches(client) -> None:
    """A day-long checkpoint write, a 100-day allocation: a limit on the pair held only when both ends came in one
    batch, so a sender could not tell whether its stream would be refused; the ledger books what was reported."""
    ck: dict[str, Any] = {"attempt": 0, "rank": 0, "step": 2}
    ledger = ledgers_in_one_batch_and_split(client, [
        ev("a", "allocation_start", T - 100 * 86_400, gpus=1), start("s0", T - 2 * 86_400 - 10),
        ev("c1", "checkpoint_start", T - 2 * 86_400, **ck), ev("c2", "checkpoint_end", T, ok=True, **ck),
        ev("b", "allocation_end", T + 10), ev("end", "run_end", T + 10, status="finished")], cut=3)
    assert ledger["allocated_gpu_seconds"] == pytest.approx(100 * 86_400 + 10)
    assert ledger["waste_gpu_seconds"]["checkpoint"] == pytest.approx(2 * 86_400)


def test_a_step_written_twice_split_across_batches_is_accepted_as_one_ok_checkpoint(client) -> None:
    """Lightning's save_last copy: start 1, end 1, start 2, end 2 at one step, and the client's batch boundary fell
    between start 1 and end 1. The second batch's first end is before its second start, and that is no
    contradiction (a CI run lost this checkpoint's end to a 422 here: its batch went to the client's quarantine)."""
    ck: dict[str, Any] = {"attempt": 0, "rank": 0, "step": 8}
    accepted(client, [start("s0", T), ev("c1", "checkpoint_start", T + 1.00, **ck)])
    accepted(client, [ev("c2", "checkpoint_end", T + 1.02, ok=True, **ck),
                      ev("c3", "checkpoint_start", T + 1.03, **ck),
                      ev("c4", "checkpoint_end", T + 1.05, ok=True, **ck)])
    listed = client.get("/v1/runs/r/checkpoints").json()["checkpoints"]
    assert [(c["step"], c["ok"], c["torn"]) for c in listed] == [(8, True, False)]
    assert (listed[0]["start"], listed[0]["end"]) == (pytest.approx(T + 1.00), pytest.approx(T + 1.05))
    # the same order in one batch is accepted too
    accepted(client, [ev(f"d{i}", kind, T + 2 + i / 100, ok=True, **{**ck, "step": 16}) if kind.endswith("end")
                      else ev(f"d{i}", kind, T + 2 + i / 100, **{**ck, "step": 16})
                      for i, kind in enumerate(["checkpoint_start", "checkpoint_end", "checkpoint_start",
                                                "checkpoint_end"])])


def test_an_event_a_day_after_the_collectors_clock_is_a_422(client) -> None:
    error = refused(client, [ev("f", "run_end", time.time() + 2 * 86_400, status="finished")])
    assert error["field"] == "time" and "GOODPUT_MAX_FUTURE_S" in error["message"]


@pytest.mark.parametrize("run_id", [".", "..", "...", "a/..", "../a", "a/./b"])
def test_run_ids_no_url_can_reach_are_a_422(client, run_id: str) -> None:
    error = refused(client, [ev("d", "run_end", T, run_id=run_id, status="finished")])
    assert error["field"] == "run_id" and "cannot be reached" in error["message"]
    dots_inside = f"x{run_id.replace('/', '-')}x"  # fine
    accepted(client, [ev("d", "run_end", T, run_id=dots_inside, status="finished")])
