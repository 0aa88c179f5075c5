"""The signal path: a checkpoint request posted to a real collector reaches `tracker.should_checkpoint()` within
seconds, and the checkpoint that follows is linked to it (the request is marked fulfilled with that step)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ingest_client.fake_collector import closed_port_url


@pytest.fixture
def real_collector(tmp_path: Path) -> Iterator[str]:
    pytest.importorskip("fastapi")
    uvicorn = pytest.importorskip("uvicorn")
    from services.collector.app import create_app
    from services.settings import ServerSettings, ServiceSettings
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    settings = ServiceSettings(server=ServerSettings(database_url=f"sqlite:///{tmp_path / 'goodput.db'}",
                                                     serve_dashboard=False))
    engine = make_engine(settings.server.database_url)
    upgrade(engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings, engine=engine), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    engine.dispose()


def wait(predicate: Any, timeout_s: float) -> float:
    """Seconds until `predicate()` held (fails after `timeout_s`)."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s, "timed out"
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_posted_request_turns_should_checkpoint_true_and_the_next_checkpoint_fulfils_it(
    make_tracker: Any, real_collector: str
) -> None:
    import httpx

    tracker = make_tracker(url=real_collector, run_id="ckpt-req", signal_poll_s=0.5)
    tracker.resumed(0)
    for step in range(1, 4):
        tracker.record_step(step, time.time() - 0.01, time.time())
    assert tracker.flush(5.0)
    assert tracker.should_checkpoint() is False
    made = httpx.post(f"{real_collector}/v1/runs/ckpt-req/checkpoint-request", json={"reason": "preempt"}).json()

    assert wait(tracker.should_checkpoint, 5.0) < 3.0  # within a few seconds (polls every 0.5 s here)
    with tracker.checkpoint(3) as ck:
        pass
    assert ck.request_id == made["id"]
    assert tracker.should_checkpoint() is False
    assert tracker.flush(5.0)
    time.sleep(1.2)  # two more polls: the honoured request is not signalled again
    assert tracker.should_checkpoint() is False

    (request,) = httpx.get(f"{real_collector}/v1/runs/ckpt-req/checkpoint-request").json()["requests"]
    assert request["pending"] is False and request["fulfilled_step"] == 3
    assert httpx.get(f"{real_collector}/v1/runs/ckpt-req/signals").json()["checkpoint_request"] is None


def test_polling_a_collector_that_is_down_never_blocks_or_raises(make_tracker: Any) -> None:
    tracker = make_tracker(url=closed_port_url(), run_id="down", signal_poll_s=0.05)
    started = time.perf_counter()
    for _ in range(1000):
        tracker.should_checkpoint()
    assert time.perf_counter() - started < 0.05
    time.sleep(0.3)
    assert tracker._poller.failures >= 2 and tracker.should_checkpoint() is False
    with tracker.checkpoint(1) as ck:
        pass
    assert ck.request_id is None


def test_only_rank_zero_polls_unless_told_otherwise(make_tracker: Any) -> None:
    url = closed_port_url()
    assert make_tracker(url=url, rank=0)._poller is not None
    assert make_tracker(url=url, rank=1)._poller is None
    assert make_tracker(url=url, rank=1, poll_all_ranks=True)._poller is not None
    assert make_tracker(url=url, rank=0, signal_poll_s=0)._poller is None
    assert make_tracker(mode="offline")._poller is None
