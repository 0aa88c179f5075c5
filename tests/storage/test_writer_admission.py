"""The writer's queue holds about `max_queue_s` of writing at the pace it measures itself writing, not a fixed
number of rows: beyond its capacity the collector answers 503 at once (the client keeps the records in its spool)
instead of queueing minutes of work that its clients time out on and send again (services.storage.writer)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import text

import services.storage.writer as writer_module
from services.collector.batch import parse_batch
from services.errors import Overloaded
from services.storage.records import IngestRecord
from services.storage.step_columns import stored_step_count
from services.storage.writer import BatchWriter, DrainRate

ROWS = 100


def _batch(i: int) -> list[IngestRecord]:
    now = time.time()
    event = {"event_id": f"e{i}", "run_id": "admission", "kind": "steps", "time": now, "attempt": 0, "rank": i,
             "step": list(range(1, ROWS + 1)), "start": [now - 2.0] * ROWS, "end": [now - 1.0] * ROWS}
    return parse_batch(json.dumps({"events": [event]}).encode(), max_events=10, max_rows=1000)


def test_the_drain_rate_is_rows_per_second_of_writing_over_the_last_groups() -> None:
    rate = DrainRate(window=2)
    measured: list[float | None] = [rate.rows_per_s]
    rate.record(1000, 1.0)
    rate.record(3000, 1.0)
    measured.append(rate.rows_per_s)
    rate.record(500, 0.5)  # the first group leaves the window
    measured.append(rate.rows_per_s)
    assert measured == [None, 2000.0, pytest.approx(3500 / 1.5)]


def test_the_pending_limit_follows_the_pace_within_its_bounds(engine) -> None:
    writer = BatchWriter(engine, max_pending_events=10_000, max_queue_s=0.5, min_pending_events=300, threads=1)
    assert writer.pending_limit == 300  # nothing measured yet
    writer.drain.record(4000, 1.0)
    assert writer.pending_limit == 2000
    writer.drain.record(400_000, 1.0)
    assert writer.pending_limit == 10_000  # the hard cap wins


def test_a_stalled_writer_queues_max_queue_s_of_work_then_refuses_and_loses_nothing(engine, monkeypatch) -> None:
    gate = threading.Event()
    gate.set()
    real_write = writer_module.write_batches  # type: ignore[attr-defined]

    def gated_write(*args, **kwargs):  # the database stalls while the gate is closed
        assert gate.wait(60)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_batches", gated_write)
    writer = BatchWriter(engine, max_queue_s=0.5, min_pending_events=ROWS, threads=1)
    writer.start()
    try:
        for i in range(20):  # the writer learns its pace
            assert writer.submit(_batch(i)).result(timeout=30).accepted == 1
        pace = writer.drain.rows_per_s
        assert pace is not None
        limit = writer.pending_limit
        assert limit == min(500_000, max(ROWS, int(pace * 0.5)))

        gate.clear()
        accepted = []
        with pytest.raises(Overloaded, match="waiting to be written"):
            for i in range(20, 1_000_000):
                accepted.append(writer.submit(_batch(i)))
        held = writer.pending_events
        assert held <= limit and held + (ROWS + 1) > limit  # full up to the limit, not beyond
        assert len(accepted) == held // (ROWS + 1)
        gate.set()
        assert all(f.result(timeout=60).accepted == 1 for f in accepted)
    finally:
        gate.set()
        writer.stop()
    with engine.connect() as conn:
        stored = stored_step_count(conn)
    assert stored == (20 + len(accepted)) * ROWS


def test_a_reservation_holds_room_before_the_parse_and_its_batch_is_never_refused(engine, monkeypatch) -> None:
    """The ingest endpoint reserves a body's estimated rows before it parses it: requests parsed at the same time
    cannot together overfill the queue, so a parsed batch is always queued (a refusal after the parse throws the
    parse away, and the client sends the whole body again)."""
    gate = threading.Event()
    real_write = writer_module.write_batches  # type: ignore[attr-defined]

    def gated_write(*args, **kwargs):
        assert gate.wait(60)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_batches", gated_write)
    writer = BatchWriter(engine, max_queue_s=0.5, min_pending_events=3 * (ROWS + 1), threads=1)
    writer.start()
    try:
        held = [writer.reserve(ROWS + 1) for _ in range(3)]  # three bodies being parsed fill the queue
        assert writer.pending_events == 3 * (ROWS + 1)
        with pytest.raises(Overloaded, match="waiting to be written"):  # a fourth is refused before its parse
            writer.reserve(1)
        with pytest.raises(Overloaded):  # and so is a batch submitted without a reservation
            writer.submit(_batch(99))
        # the three parsed batches are queued, whatever their real size against the estimate
        futures = [writer.submit(_batch(i), reserved=r) for i, r in enumerate(held)]
        assert writer.pending_events == 3 * (ROWS + 1)
        for r in held:
            r.release()  # already taken by its batch: changes nothing
        assert writer.pending_events == 3 * (ROWS + 1)
        gate.set()
        assert [f.result(timeout=60).accepted for f in futures] == [1, 1, 1]
        assert writer.pending_events == 0

        with writer.reserve(50):  # a body refused by its parse gives its room back
            assert writer.pending_events == 50
        assert writer.pending_events == 0
        gate.clear()
        estimate = writer.reserve(5)  # an estimate below the batch's size: the queue counts the real size
        future = writer.submit(_batch(4), reserved=estimate)
        assert writer.pending_events == ROWS + 1
        gate.set()
        assert future.result(timeout=60).accepted == 1 and writer.pending_events == 0
    finally:
        gate.set()
        writer.stop()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM events WHERE event_id LIKE 'e%'")).scalar() == 4


def test_the_second_writer_thread_writes_only_while_a_backlog_waits(engine, monkeypatch) -> None:
    """Small requests at a steady pace: one thread writes them all (fuller groups, the group's fixed cost paid
    less often). A backlog of HELPER_BACKLOG_ROWS rows: the second thread writes beside the first."""
    gate = threading.Event()
    gate.set()
    writers: list[str] = []
    real_write = writer_module.write_batches  # type: ignore[attr-defined]

    def observed_write(*args, **kwargs):
        writers.append(threading.current_thread().name)
        assert gate.wait(60)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_batches", observed_write)
    writer = BatchWriter(engine, threads=2)
    writer.start()
    try:
        for i in range(30):  # each one answered before the next: never a backlog
            assert writer.submit(_batch(i)).result(timeout=30).accepted == 1
        assert set(writers) == {"goodput-writer-0"}

        writers.clear()
        gate.clear()  # the database stalls: the first thread holds a group, the rest queues up behind it
        backlog = [writer.submit(_batch(30))]
        deadline = time.monotonic() + 30
        while not writers and time.monotonic() < deadline:
            time.sleep(0.01)
        backlog += [writer.submit(_batch(i)) for i in range(31, 31 + writer_module.HELPER_BACKLOG_ROWS // ROWS)]
        while len(set(writers)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(writers) == {"goodput-writer-0", "goodput-writer-1"}
        gate.set()
        assert all(f.result(timeout=60).accepted == 1 for f in backlog)
    finally:
        gate.set()
        started = time.monotonic()
        writer.stop()
        assert time.monotonic() - started < 5  # the helper, waiting for a backlog again, took its stop at once
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM events WHERE kind = 'steps'")).scalar_one() == len(backlog) + 30
