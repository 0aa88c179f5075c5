"""torch.distributed.checkpoint: only the blocking part of an async save is a checkpoint (integrations.dcp)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ingest_client.transport import InMemoryTransport

UPLOAD_S = 0.6


def test_an_async_save_counts_staging_and_not_the_upload_and_a_save_waits_for_the_previous_upload(
        tmp_path: Path, make_tracker: Any) -> None:
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint import FileSystemWriter

    from ingest_client.integrations.dcp import AsyncCheckpointer

    class SlowWriter(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            time.sleep(UPLOAD_S)
            return super().write_data(plan, planner)

    transport = InMemoryTransport()
    checkpointer = AsyncCheckpointer(make_tracker(transport=transport))
    state = {"w": torch.randn(256, 256)}
    t0 = time.time()
    checkpointer.save(state, step=1, checkpoint_id=str(tmp_path / "a"), storage_writer=SlowWriter(tmp_path / "a"),
                      no_dist=True)
    first_return_s = time.time() - t0
    checkpointer.save(state, step=2, checkpoint_id=str(tmp_path / "b"), storage_writer=SlowWriter(tmp_path / "b"),
                      no_dist=True)
    checkpointer.wait()
    assert checkpointer.last_completed == str(tmp_path / "b") and (tmp_path / "b" / ".metadata").exists()

    starts = {e["step"]: e["time"] for e in transport.of_kind("checkpoint_start")}
    ends = {e["step"]: e["time"] for e in transport.of_kind("checkpoint_end")}
    assert first_return_s < UPLOAD_S / 2  # the loop went on while the first upload ran
    assert ends[1] - starts[1] < UPLOAD_S / 2  # staging only
    assert ends[2] - starts[2] >= UPLOAD_S * 0.5  # waited for the first upload, still in flight: blocking
