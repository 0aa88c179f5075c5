from __future__ import annotations

import gzip
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from ingest_client.transport import HttpTransport, SendStatus
from ingest_client.transport.http import parse_retry_after
from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.fake_collector import FakeCollector, Reply, closed_port_url


def _hot_path_worst_s(tracker: Any, n: int = 2000) -> float:
    worst = 0.0
    for step in range(1, n + 1):
        t0 = time.perf_counter()
        with tracker.step(step):
            pass
        worst = max(worst, time.perf_counter() - t0)
    return worst


def test_events_reach_the_collector_gzipped_with_bearer_token(make_tracker: Any) -> None:
    collector = FakeCollector(token="s3cret")
    try:
        tracker = make_tracker(url=collector.url, token="s3cret")
        for step in range(1, 201):
            tracker.record_step(step, time.time(), time.time(), loss=1.0)
        assert tracker.flush(5.0)
        assert collector.step_numbers() == list(range(1, 201))
        assert {r["auth"] for r in collector.requests} == {"Bearer s3cret"}
        assert any(r["encoding"] == "gzip" for r in collector.requests)
        assert not collector.problems
    finally:
        collector.stop()


def test_small_bodies_are_not_compressed(collector: FakeCollector) -> None:
    transport = HttpTransport(collector.url + "/v1/events")
    event = b'{"event_id":"a-1","run_id":"r","kind":"heartbeat","time":1700000000.0,"attempt":0,"rank":0}'
    result = transport.send([event])
    assert result.status is SendStatus.OK and result.accepted == 1
    assert collector.requests[0]["encoding"] is None
    assert gzip.decompress(gzip.compress(b"x")) == b"x"


def test_hot_path_never_blocks_when_the_collector_is_down(make_tracker: Any, tmp_path: Path) -> None:
    tracker = make_tracker(url=closed_port_url(), flush_interval_s=0.01)
    assert _hot_path_worst_s(tracker) < 0.05
    assert tracker.flush(2.0) is False  # nothing acknowledged...
    assert [s for r in spooled_records(tmp_path / "spool") if r["kind"] == "steps" for s in r["step"]] == list(
        range(1, 2001)
    )  # ...but everything is on disk
    assert tracker.stats().send_failures >= 1


def test_hot_path_never_blocks_when_the_collector_is_slow(make_tracker: Any, collector: FakeCollector) -> None:
    collector.delay_s = 0.5
    tracker = make_tracker(url=collector.url, flush_interval_s=0.01, http_timeout_s=0.2)
    started = time.perf_counter()
    assert _hot_path_worst_s(tracker) < 0.05
    assert time.perf_counter() - started < 1.0
    collector.delay_s = 0.0
    assert tracker.flush(5.0)
    assert collector.step_numbers() == list(range(1, 2001))


def test_503_with_retry_after_is_honoured_then_delivered_once(make_tracker: Any, collector: FakeCollector) -> None:
    collector.script = [Reply(503, {"error": {"message": "busy"}}, {"Retry-After": "0.4"})]
    tracker = make_tracker(url=collector.url, flush_interval_s=0.02)
    tracker.record_step(1, time.time(), time.time())
    assert collector.wait_for(lambda c: 1 in c.step_numbers(), timeout_s=5.0)
    times = [r["time"] for r in collector.requests]
    assert times[1] - times[0] >= 0.39
    assert collector.requests[0]["status"] == 503
    assert collector.duplicates == 0
    assert tracker.stats().send_failures == 1


def test_connection_errors_back_off_exponentially_with_jitter(
    make_tracker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest_client import flusher
    from ingest_client.transport import InMemoryTransport, SendResult

    monkeypatch.setattr(flusher, "BACKOFF_BASE_S", 0.05)
    sent_at: list[float] = []

    class TimedTransport(InMemoryTransport):
        def send(self, events: Any, /, *, timeout_s: float | None = None) -> SendResult:
            sent_at.append(time.monotonic())
            return super().send(events, timeout_s=timeout_s)

    transport = TimedTransport(script=[SendResult(status=SendStatus.RETRY, message="down")] * 4)
    tracker = make_tracker(transport=transport, flush_interval_s=0.01)
    tracker.record_step(1, time.time(), time.time())
    deadline = time.monotonic() + 10
    while not transport.of_kind("steps") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert transport.of_kind("steps")[0]["step"] == [1]
    assert len(transport.batches) == 5
    gaps = [b - a for a, b in zip(sent_at, sent_at[1:])]
    # Ceilings 0.05, 0.1, 0.2, 0.4 s; each delay is drawn from [ceiling/2, ceiling].
    for gap, ceiling in zip(gaps, [0.05, 0.1, 0.2, 0.4]):
        assert ceiling / 2 - 0.005 <= gap <= ceiling + 0.1
    assert tracker.stats().send_failures == 4


@pytest.mark.parametrize("status", [400, 401, 403, 413, 422])
def test_permanent_rejection_is_not_retried_and_is_logged_once(
    status: int, make_tracker: Any, collector: FakeCollector, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    collector.script = [Reply(status, {"error": {"code": "x", "message": f"nope-{status}"}})]
    caplog.set_level(logging.WARNING, logger="ingest_client")
    tracker = make_tracker(url=collector.url, flush_interval_s=0.02)
    tracker.record_step(1, time.time(), time.time())
    tracker.flush(5.0)
    time.sleep(0.2)
    assert len(collector.requests) == 1, "a rejected batch is never sent again"
    assert tracker.stats().rejected_events == 2  # attempt_start + steps
    warnings = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(warnings) == 1 and str(status) in warnings[0] and f"nope-{status}" in warnings[0]
    tracker.record_step(2, time.time(), time.time())
    assert tracker.flush(5.0)
    assert collector.step_numbers() == [2]


def test_unreachable_collector_costs_one_warning_line(make_tracker: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ingest_client")
    tracker = make_tracker(url=closed_port_url(), flush_interval_s=0.01)
    for i in range(5):
        tracker.record_step(i + 1, time.time(), time.time())
        tracker.flush(0.5)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "unreachable" in lines[0]


def test_retry_after_parsing() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("junk") is None
    assert parse_retry_after("100000") == 300.0
    assert 0 <= parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") <= 0.0 + 1e-9
