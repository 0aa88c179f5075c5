"""While several senders post, a small group waits for the batches that keep arriving, so that one transaction's
fixed cost is shared (services.storage.writer.Linger); it never waits when groups fill on their own, when arrivals
pause, or for a lone client."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import event

from services.collector.batch import parse_batch
from services.storage.records import IngestRecord
from services.storage.step_columns import stored_step_count
from services.storage.writer import BatchWriter, Linger


def _batch(i: int) -> list[IngestRecord]:
    now = time.time()
    record = {"event_id": f"e{i}", "run_id": "linger", "kind": "steps", "time": now, "attempt": 0, "rank": i,
              "step": [1, 2], "start": [now - 2.0, now - 1.0], "end": [now - 1.0, now]}
    return parse_batch(json.dumps({"events": [record]}).encode(), max_events=10, max_rows=1000)


def _arrivals(linger: Linger, gap_s: float, n: int = 50, until: float = 100.0) -> None:
    for i in range(n):
        linger.arrived(until - (n - 1 - i) * gap_s)


def test_a_small_group_waits_until_the_linger_ends_or_the_arrivals_pause() -> None:
    linger = Linger(0.05)
    _arrivals(linger, gap_s=0.004)
    linger.wrote(0.002)
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.0) == 3 * linger.gap_s  # the next arrival is due
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.04) == pytest.approx(0.01)  # what is left of 50 ms
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.06) == 0.0  # past it: written now


def test_while_the_senders_are_paced_a_group_waits_a_share_of_the_pace() -> None:
    pace_s = [5.0]
    linger = Linger(0.05, paced=lambda: pace_s[0])
    _arrivals(linger, gap_s=0.004)  # a post every 4 ms: unpaced, each wait for the next would end after 12 ms
    linger.wrote(0.002)
    # 4 % of the 5 s the senders wait anyway: until 200 ms after the group's first batch, not 50, whatever the gaps
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.0) == pytest.approx(0.2)
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.15) == pytest.approx(0.05)
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.21) == 0.0
    assert linger.wait_s(first_queued=10.0, rows=Linger.ROWS, now=10.0) == 0.0  # a full group is written now
    pace_s[0] = 60.0  # a long pace: at most 250 ms, well within the clients' timeout
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.2) == pytest.approx(0.05)
    pace_s[0] = 0.2  # senders not held back: the setting's 50 ms, and the next arrival waited for 3 gaps at most
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.0) == pytest.approx(3 * linger.gap_s)
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.04) == pytest.approx(0.01)
    off = Linger(0.0, paced=lambda: 5.0)  # off is off, whatever the pace
    _arrivals(off, gap_s=0.05)
    assert off.wait_s(first_queued=10.0, rows=3, now=10.0) == 0.0


def test_no_wait_for_a_full_group_for_groups_that_fill_on_their_own_or_when_off() -> None:
    linger = Linger(0.05)
    _arrivals(linger, gap_s=0.004)
    assert linger.wait_s(first_queued=10.0, rows=Linger.ROWS, now=10.0) == 0.0
    assert Linger(0.05).wait_s(first_queued=10.0, rows=3, now=10.0) == 0.0  # no stream of batches seen yet
    for _ in range(200):  # a group takes 40 ms to write: ten batches arrive meanwhile
        linger.wrote(0.04)
    assert linger.wait_s(first_queued=10.0, rows=3, now=10.0) == 0.0
    off = Linger(0.0)
    _arrivals(off, gap_s=0.004)
    assert off.wait_s(first_queued=10.0, rows=3, now=10.0) == 0.0
    lone = Linger(0.05, only_while=lambda: False)  # one sender: it would only wait for its own answer
    _arrivals(lone, gap_s=0.004)
    assert lone.wait_s(first_queued=10.0, rows=3, now=10.0) == 0.0


def test_batches_posted_one_after_another_are_written_in_one_transaction(engine) -> None:
    commits: list[float] = []
    event.listen(engine, "commit", lambda conn: commits.append(time.monotonic()))
    linger = Linger(5.0)
    writer = BatchWriter(engine, threads=1, linger=linger)
    writer.start()
    try:
        writer.submit(_batch(0)).result(30)  # the first write (runs created) alone: no stream of batches seen yet
        commits.clear()
        # as if batches had come every 200 ms: each wait for the next up to 600 ms
        _arrivals(linger, gap_s=0.2, until=time.monotonic())
        answers = []
        for i in range(1, 6):  # five senders, 20 ms apart: the first waits for the others
            answers.append(writer.submit(_batch(i)))
            time.sleep(0.02)
        results = [a.result(30) for a in answers]
    finally:
        writer.stop()
    assert [r.accepted for r in results] == [1] * 5
    assert len(commits) == 1
    with engine.connect() as conn:
        assert stored_step_count(conn) == 12


def test_the_wait_ends_when_arrivals_pause_not_at_the_linger(engine) -> None:
    writer = BatchWriter(engine, threads=1, linger=Linger(30.0))
    writer.start()
    try:
        writer.submit(_batch(0)).result(60)  # the runs created (no stream seen yet: no wait)
        answers = []
        for i in range(1, 11):  # a steady stream teaches the writer the usual gap (~10 ms)
            answers.append(writer.submit(_batch(i)))
            time.sleep(0.01)
        [a.result(60) for a in answers]
        posted = time.monotonic()
        done = threading.Event()
        writer.submit(_batch(11)).add_done_callback(lambda _: done.set())
        assert done.wait(10)  # three usual gaps and the write, far from the 30 s linger
        answered_s = time.monotonic() - posted
    finally:
        writer.stop()
    assert answered_s < 10
    with engine.connect() as conn:
        assert stored_step_count(conn) == 24
