"""A worker SIGKILLed while the client waits on something slow loses no more than when nothing is slow.

What the spool holds when a process is killed is what the next process replays, so it is what the collector will
ever know. The flusher thread sends and fsyncs; a collector that takes the whole HTTP timeout to answer, or a disk
that takes seconds to fsync, must not keep the steps recorded meanwhile, or a checkpoint's end, in memory. (A CI run
lost a killed Lightning job's last five steps and its checkpoint end this way: the flusher held the spool lock through
a slow fsync, the durable write of the checkpoint end gave up waiting and went to the buffer, and so did the steps.)
"""

from __future__ import annotations

import signal
import socket
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.test_process import _spawn

STEPS = """
    import time, ingest_client as goodput
    tracker = goodput.init()
    step = 0
    while True:
        step += 1
        with tracker.step(step):
            time.sleep(0.002)
        if step == 100:
            with tracker.checkpoint(step):
                time.sleep(0.01)
        if step == 150:
            print("ready", flush=True)
"""


class SilentCollector:
    """Accepts connections and reads requests but never answers: every send waits out the client's HTTP timeout."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self.connected = threading.Event()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._held.append(conn)
            self.connected.set()

    def close(self) -> None:
        self._server.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent_collector() -> Iterator[SilentCollector]:
    c = SilentCollector()
    yield c
    c.close()


def _kill_and_read(child: subprocess.Popen[str], tmp_path: Path) -> tuple[float, list[dict[str, Any]]]:
    killed_at = time.time()
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    assert child.returncode == -signal.SIGKILL
    return killed_at, spooled_records(tmp_path / "spool")


def _assert_nothing_but_the_last_interval_lost(killed_at: float, records: list[dict[str, Any]]) -> None:
    steps = [r for r in records if r["kind"] == "steps"]
    numbers = sorted(s for r in steps for s in r["step"])
    assert numbers == list(range(1, len(numbers) + 1)), "no gaps in the spooled steps"
    last_end = max(end for r in steps for end in r["end"])
    assert killed_at - last_end < 0.5, f"lost {killed_at - last_end:.3f} s of steps to the kill"
    ends = [r for r in records if r["kind"] == "checkpoint_end"]
    assert [r["step"] for r in ends] == [100], "the checkpoint's end is in the spool"


def test_killed_while_a_send_waits_on_a_silent_collector(tmp_path: Path,
                                                         silent_collector: SilentCollector) -> None:
    child = _spawn(STEPS, tmp_path, GOODPUT_URL=silent_collector.url)  # default HTTP timeout: 2 s
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    assert silent_collector.connected.wait(10), "the client never tried to send"
    time.sleep(1.0)  # a send is in flight for longer than this
    _assert_nothing_but_the_last_interval_lost(*_kill_and_read(child, tmp_path))


def test_killed_while_the_disk_takes_seconds_to_fsync(tmp_path: Path) -> None:
    stalled_disk = """
        import os, time
        _fsync = os.fsync
        def slow_fsync(fd):  # a disk busy with someone else's writes
            time.sleep(2.5)
            _fsync(fd)
        os.fsync = slow_fsync
    """
    child = _spawn(textwrap.dedent(stalled_disk) + textwrap.dedent(STEPS), tmp_path, GOODPUT_MODE="offline")
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    time.sleep(2.0)  # the flusher spends most of this in fsync
    _assert_nothing_but_the_last_interval_lost(*_kill_and_read(child, tmp_path))
