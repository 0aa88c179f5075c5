"""GOODPUT_HTTP_TIMEOUT_S bounds a whole request, not each read (issue 31, point 7): a server that answers one byte
at a time, each in time for a per-read timeout, holds no request of the client past its deadline: not a batch, not
a signal poll, not a checkpoint request; and a trainer against it keeps trying instead of being held for the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest_client.launcher.launch import _checkpoint_requester
from ingest_client.transport.base import SendStatus
from ingest_client.transport.http import HttpTransport
from ingest_client.worker.poller import SignalPoller
from tests.ingest_client.conftest import WORKER, child_env
from tests.ingest_client.web_servers import Trickle

EVENT = b'{"event_id":"a-1","run_id":"r","kind":"heartbeat","time":1700000000.0,"attempt":0,"rank":0}'
TIMEOUT_S = 1.0
SLACK_S = 0.6  # the trickle notices a closed connection at its next byte or the one after


@pytest.fixture
def trickle() -> Iterator[Trickle]:
    server = Trickle(byte_every_s=0.3)  # its ~110-byte answer would take 33 s
    yield server
    server.stop()


def test_a_batch_to_a_trickling_server_gives_up_at_its_deadline(trickle: Trickle) -> None:
    started = time.monotonic()
    result = HttpTransport(trickle.url + "/v1/events", timeout_s=TIMEOUT_S).send([EVENT])
    elapsed = time.monotonic() - started
    assert result.status is SendStatus.RETRY and "TimeoutError" in result.message
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 0.3, elapsed


def test_a_signal_poll_to_a_trickling_server_gives_up_at_its_deadline(trickle: Trickle) -> None:
    poller = SignalPoller(trickle.url, "run-1", interval_s=1.0, timeout_s=TIMEOUT_S)
    started = time.monotonic()
    poller.poll_once()
    assert time.monotonic() - started < TIMEOUT_S + 0.3
    assert poller.failures == 1


def test_a_checkpoint_request_to_a_trickling_server_gives_up_at_its_deadline(
    trickle: Trickle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("ingest_client.launcher.launch.CHECKPOINT_REQUEST_TIMEOUT_S", TIMEOUT_S)
    started = time.monotonic()
    _checkpoint_requester({"GOODPUT_URL": trickle.url}, "run-1")("preemption warning")
    (asking,) = [t for t in threading.enumerate() if t.name == "goodput-checkpoint-request"]
    asking.join(30)
    assert time.monotonic() - started < 3 * (TIMEOUT_S + 0.3) + 3 * 0.5  # three tries, half a second apart
    assert "no whole answer within 1 s" in capsys.readouterr().err


def test_a_request_that_ends_in_time_is_answered_whole() -> None:
    from ingest_client.transport.request import exchange

    server = Trickle(byte_every_s=0.005)  # ~0.6 s for the whole answer
    try:
        answer = exchange(server.url + "/v1/events", method="POST", headers={}, data=b"{}", timeout_s=5.0)
    finally:
        server.stop()
    assert answer.status == 200 and answer.body == b'{"accepted":1,"duplicates":0}\r\n'


def test_a_trainer_against_a_trickling_collector_is_never_held_past_its_deadline(trickle: Trickle,
                                                                                  tmp_path: Path) -> None:
    """The real client at its defaults but for the deadline: every request it makes (batches, its signal polls as
    rank 0) ends within the deadline, so it keeps trying through the run instead of waiting on one answer."""
    trainer = subprocess.run(
        [sys.executable, str(WORKER), "60", "0.05", "2"], capture_output=True, text=True, timeout=300,
        env=child_env(GOODPUT_URL=trickle.url, GOODPUT_RUN_ID="trickle", GOODPUT_SPOOL_DIR=f"{tmp_path}/spool",
                     GOODPUT_HTTP_TIMEOUT_S=str(TIMEOUT_S), GOODPUT_SIGNAL_POLL_S="0.5", RANK="0", LOCAL_RANK="0",
                     WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT="0"))
    assert trainer.returncode == 0, trainer.stderr[-3000:]
    time.sleep(2 * SLACK_S)  # the last connections' ends reach the trickle
    held = sorted(closed - opened for opened, closed in trickle.connections)
    assert len(held) >= 8, f"{len(held)} requests in a 3 s run and 2 s of flushing: the sender was held"
    assert held[-1] < TIMEOUT_S + SLACK_S, held


def test_a_forked_child_keeps_its_deadlines(trickle: Trickle) -> None:
    """The deadlines' thread is the parent's; a forked child (a DataLoader worker that sends) starts its own."""
    assert HttpTransport(trickle.url + "/v1/events", timeout_s=0.3).send([EVENT]).status is SendStatus.RETRY
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        started = time.monotonic()
        result = HttpTransport(trickle.url + "/v1/events", timeout_s=TIMEOUT_S).send([EVENT])
        os._exit(0 if result.status is SendStatus.RETRY and time.monotonic() - started < TIMEOUT_S + 0.3 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
