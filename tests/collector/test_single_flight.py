"""One build per run at a time, shared by everyone who asks; background builds paced by their own cost."""

from __future__ import annotations

import threading

import pytest

from services.derive.cache import Pace, SingleFlight


def test_concurrent_requests_share_one_computation_and_the_next_one_starts_afresh() -> None:
    flights: SingleFlight[int] = SingleFlight("test")
    gate, calls = threading.Event(), []

    def compute() -> int:
        calls.append(1)
        assert gate.wait(30)
        return len(calls)

    futures = [flights.submit("run", compute) for _ in range(5)]
    assert flights.running("run") is futures[0] and all(f is futures[0] for f in futures)
    gate.set()
    assert [f.result(30) for f in futures] == [1] * 5
    assert flights.running("run") is None
    assert flights.submit("run", compute).result(30) == 2  # done: a later request computes again


def test_a_failed_computation_reaches_every_waiter_and_frees_the_run() -> None:
    flights: SingleFlight[int] = SingleFlight("test")
    gate = threading.Event()

    def fail() -> int:
        assert gate.wait(30)
        raise RuntimeError("the database went away")

    futures = [flights.submit("run", fail) for _ in range(3)]
    gate.set()
    for f in futures:
        with pytest.raises(RuntimeError, match="went away"):
            f.result(30)
    assert flights.submit("run", lambda: 7).result(30) == 7


def test_pace_waits_a_multiple_of_the_last_build_before_the_next() -> None:
    pace = Pace(factor=4.0, min_interval_s=0.5)
    assert pace.due("big", now=0.0)  # never built
    pace.record("big", finished=100.0, seconds=20.0)  # a 20 s analysis: next one 80 s later at the earliest
    assert not pace.due("big", now=179.0) and pace.due("big", now=180.0)
    pace.record("small", finished=100.0, seconds=0.01)  # milliseconds: the floor decides
    assert not pace.due("small", now=100.4) and pace.due("small", now=100.5)


def test_an_incremental_build_is_paced_by_its_own_factor() -> None:
    pace = Pace(factor=4.0, incremental_factor=1.0)
    pace.record("live", finished=100.0, seconds=2.0, incremental=True)  # read only what changed: 2 s later
    assert not pace.due("live", now=101.9) and pace.due("live", now=102.0)
    pace.record("live", finished=200.0, seconds=2.0)  # read the whole run: 8 s later
    assert not pace.due("live", now=207.9) and pace.due("live", now=208.0)
