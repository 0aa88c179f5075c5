"""The client says when it sent each request (Goodput-Sent-At, its own clock): a real `goodput serve` measures a
host whose clock is off against its own, and live detection judges the run on the collector's clock (issue 31,
point 5: a run 2 h behind the collector was shown hung at once)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import ingest_client.worker.tracker as tracker_module
from tests.ingest_client.fake_collector import FakeCollector
from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy

BEHIND_S = 7200.0


def test_every_request_says_the_senders_clock(make_tracker: Any) -> None:
    collector = FakeCollector()
    try:
        tracker = make_tracker(url=collector.url)
        before = time.time()
        for step in range(1, 21):
            tracker.record_step(step, time.time(), time.time())
        assert tracker.flush(5.0)
        sent = [float(r["sent_at"]) for r in collector.requests]
        assert sent and all(before <= s <= time.time() for s in sent)
    finally:
        collector.stop()


def test_a_client_2_hours_behind_the_collector_is_judged_on_the_collectors_clock(
        make_tracker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--no-dashboard"], cwd=tmp_path,
                            env=env_with(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() - BEHIND_S)  # this process's host clock, 2 h behind
        monkeypatch.setattr(tracker_module, "_time", time.time)
        tracker = make_tracker(url=url, run_id="behind")
        for step in range(1, 31):
            with tracker.step(step):
                time.sleep(0.02)
        assert tracker.flush(5.0)
        live = httpx.get(f"{url}/v1/runs/behind/live", timeout=30).json()
        assert live["hung"] is False and 0 <= live["seconds_since_progress"] < 10
        assert live["clock_offset_seconds"] == pytest.approx(-BEHIND_S, abs=2.0)
        assert live["last_progress_time"] == pytest.approx(real(), abs=10.0)  # on the collector's clock
        assert httpx.get(f"{url}/v1/runs/behind/waste", timeout=30).json()["provisional"] is None
    finally:
        proc.terminate()
        proc.wait(30)
