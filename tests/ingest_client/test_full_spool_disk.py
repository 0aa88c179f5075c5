"""A full spool disk is not silent (issue 31, point 8): the client says so once (stderr, where the application has
not configured logging) and counts what its spool could not take in client_stats (``unspooled_events``), which
reaches the collector; the records themselves go to the collector directly meanwhile."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ingest_client.conftest import WORKER, child_env
from tests.ingest_client.fake_collector import FakeCollector

SAID = "cannot write the spool"


def test_a_spool_that_cannot_be_written_is_said_once_and_counted_in_client_stats(
    make_tracker: Any, collector: FakeCollector, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ingest_client")
    tracker = make_tracker(url=collector.url, flush_interval_s=0.01, stats_interval_s=0.05)
    tracker.record_step(1, time.time(), time.time())
    assert tracker.flush(5.0)

    def disk_full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("ingest_client.worker.spool.os.write", disk_full)
    for step in range(2, 51):
        tracker.record_step(step, time.time(), time.time())
        tracker.flush(1.0)
        time.sleep(0.01)
    stats = tracker.stats()
    assert stats.unspooled_events >= 49 and stats.dropped_events == 0  # sent directly: none lost
    assert collector.step_numbers() == list(range(1, 51))
    assert collector.wait_for(lambda c: any(e.get("unspooled_events") for e in c.of_kind("client_stats")))
    reported = max(e.get("unspooled_events", 0) for e in collector.of_kind("client_stats"))
    assert 0 < reported <= tracker.stats().unspooled_events
    said = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    assert len(said) == 1 and "No space left on device" in said[0] and "GOODPUT_SPOOL_DIR" in said[0]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    spool = tmp_path / "spool"
    spool.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(spool)], capture_output=True,
                             check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield spool
    subprocess.run(["umount", "-l", str(spool)], check=False)


def test_a_trainer_whose_spool_disk_fills_says_it_once_on_stderr_and_tells_the_collector(
    tiny_disk: Path, collector: FakeCollector
) -> None:
    steps = 20_000  # about 1.2 MB of spool; the disk holds 1 MiB
    trainer = subprocess.run(
        [sys.executable, str(WORKER), str(steps), "0.0002", "30"], capture_output=True, text=True, timeout=300,
        env=child_env(GOODPUT_URL=collector.url, GOODPUT_RUN_ID="full-disk", GOODPUT_SPOOL_DIR=str(tiny_disk),
                     RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT="0"))
    assert trainer.returncode == 0, trainer.stderr[-3000:]
    said = [line for line in trainer.stderr.splitlines() if SAID in line]
    assert len(said) == 1 and "No space left on device" in said[0], trainer.stderr[-3000:]
    stats = json.loads([line for line in trainer.stdout.splitlines() if line.startswith("{")][-1])["stats"]
    assert stats["unspooled_events"] > 0
    reported = [e.get("unspooled_events", 0) for e in collector.of_kind("client_stats")]
    # the final client_stats carries the count; the worker took its snapshot before its attempt's end, and what it
    # records after the snapshot (that end, a heartbeat or stats row of a tick) meets the same full disk: on a loaded
    # machine one of them lands in the count too (CI, 2026-12-05: 5,590 reported against 5,589 in the snapshot)
    assert stats["unspooled_events"] <= max(reported) <= stats["unspooled_events"] + 3, (
        "the final client_stats carries the count")
    lost = stats["dropped_events"] + stats["spool_dropped_events"]
    assert len(set(collector.step_numbers())) == steps - lost
