"""`tracker.phase(name)`: a phase outside the steps, durable at both ends; and the `init_process_group` phase that
`init()` records around torch.distributed's, in real processes (one SIGKILLed while it waits for a peer)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ingest_client.transport import InMemoryTransport
from services.schemas.events import EVENT_ADAPTER
from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.wire import validate_event
from tests.test_cli import free_port

REPO = Path(__file__).resolve().parents[2]


def phases(records: list[dict[str, Any]]) -> list[tuple[str, str, int, bool | None]]:
    return [(r["kind"], r["name"], r["step"], r.get("ok")) for r in records if r["kind"].startswith("phase_")]


def test_a_phase_is_on_disk_before_it_runs_and_its_end_says_whether_it_raised(make_tracker: Any,
                                                                              tmp_path: Path) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.resumed(0)
    tracker.record_step(1, time.time() - 0.01, time.time())
    with tracker.phase("eval"):
        # durable: the start (and the step before it) reached the spool before the phase ran
        assert phases(spooled_records(tmp_path / "spool")) == [("phase_start", "eval", 1, None)]
    with pytest.raises(ValueError, match="bad batch"), tracker.phase("eval"):
        raise ValueError("bad batch")
    assert tracker.flush(5.0)
    assert phases(transport.events) == [("phase_start", "eval", 1, None), ("phase_end", "eval", 1, True),
                                        ("phase_start", "eval", 1, None), ("phase_end", "eval", 1, False)]
    for event in transport.events:
        assert validate_event(event) is None, event
        EVENT_ADAPTER.validate_python(event, strict=True)  # as the collector reads it


def test_an_unknown_phase_records_nothing_and_never_raises(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    with tracker.phase("validation"):
        pass
    assert tracker.flush(5.0)
    assert phases(transport.events) == []


def _spawn(code: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    child_env.update(GOODPUT_SPOOL_DIR=str(tmp_path / "spool"), GOODPUT_RUN_ID="run-pg", GOODPUT_MODE="offline",
                     PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                     OMP_NUM_THREADS="1", **env)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=child_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_init_process_group_imported_after_init_is_recorded_as_a_phase(tmp_path: Path) -> None:
    child = _spawn("""
        import ingest_client as goodput
        tracker = goodput.init()
        import torch.distributed as dist  # imported after init(): patched as it is imported
        from torch.distributed import init_process_group
        init_process_group("gloo", rank=0, world_size=1)
        dist.destroy_process_group()
        tracker.finish()
    """, tmp_path)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    records = spooled_records(tmp_path / "spool")
    assert phases(records) == [("phase_start", "init_process_group", 0, None),
                               ("phase_end", "init_process_group", 0, True)]
    start, end = (r["time"] for r in records if r["kind"].startswith("phase_"))
    assert 0 <= end - start < 30


def test_a_worker_killed_while_waiting_for_a_peer_in_init_process_group_left_the_phases_start(
        tmp_path: Path) -> None:
    child = _spawn("""
        import torch.distributed as dist  # imported before init(): patched by init()
        import ingest_client as goodput
        goodput.init()
        print("waiting", flush=True)
        dist.init_process_group("gloo", rank=0, world_size=2)  # rank 1 never comes
    """, tmp_path)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "waiting"
        deadline = time.monotonic() + 60
        while not phases(spooled_records(tmp_path / "spool")) and time.monotonic() < deadline:
            time.sleep(0.1)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert child.returncode == -signal.SIGKILL
    assert phases(spooled_records(tmp_path / "spool")) == [("phase_start", "init_process_group", 0, None)]
