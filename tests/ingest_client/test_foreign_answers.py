"""An acknowledgement must be the collector's (issue 31, point 1): a web page's 200, a login redirect or an answer
with other counts keeps the records in the spool, and the log says once what answered and what to check.

The whole story with real processes (300 steps against such a server, then `goodput sync` to a real collector) is
tests/faults/test_foreign_answers.py."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest_client.tools.sync import sync_directory
from ingest_client.transport.base import SendStatus
from ingest_client.transport.http import HttpTransport
from ingest_client.worker.poller import SignalPoller
from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.fake_collector import FakeCollector, Reply
from tests.ingest_client.web_servers import error_page, login_redirect, web_page

EVENT = b'{"event_id":"a-1","run_id":"r","kind":"heartbeat","time":1700000000.0,"attempt":0,"rank":0}'


@pytest.fixture
def page() -> Iterator[Any]:
    server = web_page()
    yield server
    server.stop()


@pytest.fixture
def sso() -> Iterator[Any]:
    server = login_redirect()
    yield server
    server.stop()


def test_a_web_pages_200_is_not_an_acknowledgement_and_says_what_answered(page: Any) -> None:
    result = HttpTransport(page.url + "/v1/events").send([EVENT])
    assert result.status is SendStatus.RETRY and result.foreign_answer and result.http_status == 200
    assert "text/html" in result.message and "Welcome to nginx!" in result.message
    assert "not the collector's answer" in result.message


def test_a_redirect_is_not_followed_and_the_token_never_reaches_the_login_page(sso: Any) -> None:
    result = HttpTransport(sso.url + "/v1/events", token="gpw_secret").send([EVENT])
    assert result.status is SendStatus.RETRY and result.foreign_answer and result.http_status == 302
    assert "/login" in result.message
    assert [(s.method, s.path, s.authorization) for s in sso.seen] == [("POST", "/v1/events", "Bearer gpw_secret")]


@pytest.mark.parametrize("body", [
    {}, {"ok": True}, {"accepted": 1}, {"accepted": 2, "duplicates": 0}, {"accepted": 0, "duplicates": 0},
    {"accepted": "1", "duplicates": 0}, {"accepted": -1, "duplicates": 2}, {"accepted": True, "duplicates": 0}, [1],
])
def test_only_the_collectors_counts_for_this_batch_acknowledge_it(body: object) -> None:
    from ingest_client.transport.http import acknowledged

    assert acknowledged(json.dumps(body).encode(), 1) is None
    assert acknowledged(b'{"accepted":1,"duplicates":0}', 1) == (1, 0)
    assert acknowledged(b'{"accepted": 0, "duplicates": 3}', 3) == (0, 3)


@pytest.mark.parametrize("status", [400, 422])
def test_a_web_servers_error_page_quarantines_nothing(status: int) -> None:
    """400 and 422 make the client isolate and quarantine records: only the collector's error envelope does."""
    collector = FakeCollector()
    server = error_page(status)
    try:
        collector.script = [Reply(status, {"error": {"code": "x", "message": "bad"}})]
        assert HttpTransport(collector.url + "/v1/events").send([EVENT]).status is SendStatus.REJECTED
        result = HttpTransport(server.url + "/v1/events").send([EVENT])
        assert result.status is SendStatus.RETRY and result.foreign_answer and f"<h1>{status}</h1>" in result.message
    finally:
        collector.stop()
        server.stop()


@pytest.mark.parametrize("server_kind", ["page", "sso"])
def test_a_tracker_keeps_its_spool_and_says_once_what_answered(
    server_kind: str, make_tracker: Any, caplog: pytest.LogCaptureFixture, tmp_path: Path, request: Any
) -> None:
    server = request.getfixturevalue(server_kind)
    caplog.set_level(logging.WARNING, logger="ingest_client")
    tracker = make_tracker(url=server.url, flush_interval_s=0.01, token="gpw_secret")
    for step in range(1, 31):
        tracker.record_step(step, time.time(), time.time())
        assert tracker.flush(1.0) is False  # nothing is acknowledged
    assert tracker.stats().sent_events == 0 and tracker.stats().send_failures >= 1
    tracker.shutdown(0.5)
    kept = [s for r in spooled_records(tmp_path / "spool") if r["kind"] == "steps" for s in r["step"]]
    assert kept == list(range(1, 31)), "every step is still in the spool"
    said = [r.getMessage() for r in caplog.records if "GOODPUT_URL" in r.getMessage()]
    assert len(said) == 1, said
    assert server.url in said[0] and ("Welcome to nginx!" in said[0] or "/login" in said[0])
    assert "goodput sync" in said[0]
    assert all(s.path != "/login" or s.authorization is None for s in server.seen)
    assert not any(s.method == "GET" and s.path.startswith("/login") for s in server.seen)


@pytest.mark.parametrize("server_kind", ["page", "sso"])
def test_goodput_sync_keeps_everything_and_says_what_to_check(server_kind: str, make_tracker: Any, tmp_path: Path,
                                                              request: Any) -> None:
    server = request.getfixturevalue(server_kind)
    offline = make_tracker(mode="offline")
    for step in range(1, 11):
        offline.record_step(step, time.time(), time.time())
    offline.shutdown(1.0)
    before = spooled_records(tmp_path / "spool")
    result = sync_directory(tmp_path / "spool", server.url, max_attempts=3)
    assert result.sent == 0 and result.failed == len(before)
    (reason,) = result.not_sent
    assert reason.endswith("not the collector's answer")
    assert len(server.seen) == 1, "a wrong URL stays wrong: not retried"
    assert spooled_records(tmp_path / "spool") == before


@pytest.mark.parametrize("server_kind", ["page", "sso"])
def test_the_signal_poller_takes_no_page_for_signals_and_follows_no_redirect(
    server_kind: str, caplog: pytest.LogCaptureFixture, request: Any
) -> None:
    server = request.getfixturevalue(server_kind)
    caplog.set_level(logging.WARNING, logger="ingest_client")
    poller = SignalPoller(server.url, "run-1", interval_s=1.0, timeout_s=2.0, token="gpw_secret")
    for _ in range(3):
        poller.poll_once()
    assert poller.failures == 3 and poller.pending is None
    assert [s.path for s in server.seen] == ["/v1/runs/run-1/signals"] * 3
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "not the collector" in said[0] and "GOODPUT_URL" in said[0]
