from __future__ import annotations

import dataclasses
import gc
import gzip
import itertools
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ingest_client.transport import HttpTransport, InMemoryTransport, SendResult, SendStatus
from ingest_client.transport.http import parse_retry_after
from ingest_client.worker.spool import read_frames
from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.fake_collector import FakeCollector, Reply, closed_port_url


def _hot_path_worst_s(tracker: Any, n: int = 2000) -> float:
    """The slowest `step()` call. The garbage collector is off while measuring: late in a full test run this
    process holds millions of objects and one full collection (0.5 s seen in CI) would land in some call; that
    pause is the host process's, not a wait on the collector, which is what this measures."""
    worst = 0.0
    gc.disable()
    try:
        for step in range(1, n + 1):
            t0 = time.perf_counter()
            with tracker.step(step):
                pass
            worst = max(worst, time.perf_counter() - t0)
    finally:
        gc.enable()
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
    from ingest_client.transport import InMemoryTransport, SendResult
    from ingest_client.worker import flusher

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
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    # Ceilings 0.05, 0.1, 0.2, 0.4 s; each delay is drawn from [ceiling/2, ceiling].
    for gap, ceiling in zip(gaps, [0.05, 0.1, 0.2, 0.4], strict=False):  # the first four sends
        assert ceiling / 2 - 0.005 <= gap <= ceiling + 0.1
    assert tracker.stats().send_failures == 4


def _quarantined(spool: Path) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Every quarantined batch under ``spool``: its records and its reason file."""
    out = []
    for path in sorted(spool.rglob("*.quarantine")):
        records = [json.loads(p) for p in read_frames(path, 0, max_events=10**9, max_bytes=10**12).payloads]
        out.append((records, json.loads(Path(f"{path}.json").read_text())))
    return out


@pytest.mark.parametrize("status", [400, 422])
def test_a_refused_batch_is_halved_until_the_refused_record_is_alone_and_only_it_is_quarantined(
    status: int, make_tracker: Any, collector: FakeCollector, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The first batch (attempt_start, steps) is refused, then its first half (attempt_start) alone: that record
    is quarantined with its reason, logged once; the steps sent with it arrive, and so do later ones."""
    collector.script = [Reply(status, {"error": {"code": "x", "message": f"nope-{status}"}})] * 2
    caplog.set_level(logging.WARNING, logger="ingest_client")
    tracker = make_tracker(url=collector.url, flush_interval_s=0.02)
    tracker.record_step(1, time.time(), time.time())
    tracker.flush(5.0)
    tracker.record_step(2, time.time(), time.time())
    assert tracker.flush(5.0)
    assert [r["status"] for r in collector.requests] == [status, status, 200, 200]
    assert [r["n"] for r in collector.requests[:3]] == [2, 1, 1], "halved down to the refused record"
    assert collector.step_numbers() == [1, 2]
    stats = tracker.stats()
    assert stats.rejected_events == stats.quarantined_events == 1
    kept = _quarantined(tmp_path / "spool")
    assert [[r["kind"] for r in records] for records, _ in kept] == [["attempt_start"]]
    assert kept[0][1]["http_status"] == status and f"nope-{status}" in kept[0][1]["message"]
    assert kept[0][1]["records"] == 1 and kept[0][1]["time"] > 0
    warnings = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warnings) == 1, "once per reason"
    assert str(status) in warnings[0] and f"nope-{status}" in warnings[0] and "goodput sync" in warnings[0]
    collector.script = [Reply(status, {"error": {"code": "x", "message": f"nope-{status}"}})]
    tracker.record_step(3, time.time(), time.time())
    assert tracker.flush(5.0)  # a record refused alone: quarantined, not sent again
    tracker.record_step(4, time.time(), time.time())
    assert tracker.flush(5.0)
    assert collector.step_numbers() == [1, 2, 4]
    assert tracker.stats().quarantined_events == 2


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_quarantines_one_batch_then_pauses_sending_and_keeps_the_rest_in_the_spool(
    status: int, make_tracker: Any, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    collector = FakeCollector(token="right")
    try:
        caplog.set_level(logging.WARNING, logger="ingest_client")
        # 401: a token the collector does not know; 403: one it knows, not allowed to write this run
        tracker = make_tracker(url=collector.url, token="wrong" if status == 401 else "right", flush_interval_s=0.02)
        collector.script = [Reply(status, {"error": {"code": "x", "message": "forbidden"}})] if status == 403 else []
        tracker.record_step(1, time.time(), time.time())
        assert tracker.flush(5.0) is False
        for step in range(2, 50):
            tracker.record_step(step, time.time(), time.time())
            assert tracker.flush(0.2) is False  # flushes do not hammer the collector either
        time.sleep(0.3)
        assert len(collector.requests) == 1, "one refusal, then a pause of AUTH_BACKOFF_BASE_S or more"
        assert tracker.stats().quarantined_events == 2
        tracker.shutdown(1.0)
        kept = _quarantined(tmp_path / "spool")
        assert [s for records, _ in kept for r in records if r["kind"] == "steps" for s in r["step"]] == [1]
        unsent = [s for r in spooled_records(tmp_path / "spool") if r["kind"] == "steps" for s in r["step"]]
        assert unsent[-48:] == list(range(2, 50)), "later steps wait in the spool"
        messages = [r.getMessage() for r in caplog.records]
        refusals = [m for m in messages if " records with HTTP " in m]
        assert len(refusals) == 1 and f"HTTP {status}" in refusals[0] and "GOODPUT_TOKEN" in refusals[0]
        assert any("did not acknowledge every event" in m and "goodput sync" in m for m in messages), messages
    finally:
        collector.stop()


def test_413_halves_the_batch_until_it_fits_and_everything_arrives_once(
    make_tracker: Any, collector: FakeCollector, tmp_path: Path
) -> None:
    offline = make_tracker(mode="offline", flush_interval_s=0.01)
    for step in range(1, 201):
        offline.record_step(step, time.time(), time.time())
        if step % 5 == 0:
            offline.digest(step, f"d{step}")  # between two steps records: they do not merge (worker.coalesce)
            offline.flush(1.0)  # one steps record per flush: 40 of them
    offline.shutdown(1.0)
    collector.max_events = 7
    tracker = make_tracker(url=collector.url, flush_interval_s=0.01)
    tracker.record_step(201, time.time(), time.time())
    assert tracker.flush(10.0)
    assert collector.step_numbers() == list(range(1, 202)) and collector.duplicates == 0
    assert [r["status"] for r in collector.requests if r["status"] == 413]  # it was refused, then split
    assert max(r["n"] for r in collector.requests if r["status"] == 200) <= 7
    assert tracker.stats().rejected_events == 0 and not _quarantined(tmp_path / "spool")


def test_a_single_record_refused_as_too_large_is_quarantined(make_tracker: Any, collector: FakeCollector,
                                                               tmp_path: Path) -> None:
    collector.script = [Reply(413, {"error": {"code": "body_too_large", "message": "too big"}})] * 2
    tracker = make_tracker(url=collector.url, flush_interval_s=0.02)
    tracker.record_step(1, time.time(), time.time())  # attempt_start + steps: split into two, the first refused
    assert tracker.flush(5.0)
    kept = _quarantined(tmp_path / "spool")
    assert [[r["kind"] for r in records] for records, _ in kept] == [["attempt_start"]]
    assert kept[0][1]["http_status"] == 413
    assert collector.step_numbers() == [1]


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
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: retry now


class _SlowPacedTransport(InMemoryTransport):
    """A collector that answers each post in 80 ms (far away, or gathering requests into one write) and asks for
    half a second between posts."""

    def send(self, events: Sequence[bytes], /, *, timeout_s: float | None = None) -> SendResult:
        time.sleep(0.08)
        result = super().send(events, timeout_s=timeout_s)
        return dataclasses.replace(result, send_interval_s=0.5)


def test_a_slow_collector_gets_one_post_per_round_not_one_per_flush(make_tracker: Any) -> None:
    transport = _SlowPacedTransport()
    tracker = make_tracker(transport=transport, flush_interval_s=0.02)
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < 2.0:  # a step every 10 ms: every flush has rows to send
        step += 1
        tracker.record_step(step, time.time() - 0.01, time.time())
        time.sleep(0.01)
    rounds = len(transport.batches)
    assert tracker.flush(10.0)
    assert sorted(s for r in transport.of_kind("steps") for s in r["step"]) == list(range(1, step + 1))
    # 2 s at 0.5 s a round: about 4 rounds (and the durable attempt start); chasing each flush's rows within a
    # round, as before, it was one post every 80 ms: ~25
    assert rounds <= 10, f"{rounds} posts in 2 s"
