"""One corrupt frame costs itself, not the rest of its spool segment (issue 31, point 8). A trainer records a run
offline (the real client, one frame per step, ending with attempt_end and run_end finished); frame 81 of its
segment gets a flipped payload byte, or a flipped length byte; `goodput sync` to a real collector sends every other
record, run_end included, says what it skipped, and the run is finished with every step but the corrupt frame's.

Real processes: the trainer, `goodput sync`, a `goodput serve` on SQLite."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest_client.worker.frames import FRAME_HEADER
from tests.faults.conftest import Collector, stored_steps
from tests.test_cli import GOODPUT, env_with

STEPS = 158
TRAINER = f"""
import time
import ingest_client as goodput
tracker = goodput.init()
tracker.resumed(0)
for step in range(1, {STEPS} + 1):
    with tracker.step(step):
        time.sleep(0.001)
    tracker.flush(5.0)  # offline: one frame per step
tracker.finish("finished")
"""


@pytest.fixture
def sqlite_collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(f"sqlite:///{tmp_path / 'collector.db'}", tmp_path)
    yield c
    c.stop()


def _frames(path: Path) -> list[tuple[int, dict[str, object]]]:
    data, frames, pos = path.read_bytes(), [], 0
    while pos < len(data):
        length, _ = FRAME_HEADER.unpack_from(data, pos)
        frames.append((pos, json.loads(data[pos + FRAME_HEADER.size:pos + FRAME_HEADER.size + length])))
        pos += FRAME_HEADER.size + length
    return frames


@pytest.mark.parametrize("where", ["payload", "length"])
def test_a_corrupt_frame_in_the_middle_of_a_segment_costs_only_itself(where: str, sqlite_collector: Collector,
                                                                      tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    subprocess.run([sys.executable, "-c", TRAINER], check=True, timeout=300,
                   env=env_with(GOODPUT_MODE="offline", GOODPUT_SPOOL_DIR=str(spool), GOODPUT_RUN_ID="corrupt",
                                RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT="0"))
    (segment,) = spool.rglob("*.spool")
    frames = _frames(segment)
    assert len(frames) >= 162 and "run_end" in [f["kind"] for _, f in frames[81:]]
    offset, bad = frames[80]  # frame 81
    assert bad["kind"] == "steps"
    data = bytearray(segment.read_bytes())
    data[offset + (FRAME_HEADER.size + 20 if where == "payload" else 2)] ^= 0x01
    segment.write_bytes(bytes(data))

    sqlite_collector.start()
    synced = subprocess.run([*GOODPUT, "sync", str(spool), "--url", sqlite_collector.url], capture_output=True,
                            text=True, timeout=300, env=env_with())
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert synced.stdout.startswith(f"sent {len(frames) - 1} records"), synced.stdout
    assert "skipped 1 corrupt frame(s)" in synced.stdout
    lost = bad["step"]
    assert isinstance(lost, list)
    assert stored_steps(sqlite_collector.db_url, "corrupt") == {0: [s for s in range(1, STEPS + 1) if s not in lost]}
    run = httpx.get(f"{sqlite_collector.url}/v1/runs/corrupt", timeout=60).json()
    assert run["status"] == "finished", run
