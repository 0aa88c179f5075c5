"""torch.distributed.checkpoint: only the blocking part of an async save is a checkpoint (integrations.dcp)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import ingest_client
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


def test_with_digests_a_save_digests_the_state_and_a_load_reports_the_loaded_state_s_digest(
        tmp_path: Path, make_tracker: Any) -> None:
    torch = pytest.importorskip("torch")
    from ingest_client.integrations.dcp import AsyncCheckpointer

    transport = InMemoryTransport()
    checkpointer = AsyncCheckpointer(make_tracker(transport=transport), digests=True)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()  # momentum buffers exist
    checkpointer.save({"model": model, "optim": optimizer}, step=5, checkpoint_id=str(tmp_path / "s5"), no_dist=True)
    checkpointer.wait()
    exact_model = torch.nn.Linear(8, 4)  # other initial weights, no momentum yet: all of it comes from the load
    exact_optim = torch.optim.SGD(exact_model.parameters(), lr=0.1, momentum=0.9)
    for p in exact_model.parameters():
        p.grad = torch.zeros_like(p)
    exact_optim.step()  # allocates the momentum buffers (zeros) that dcp loads into, weights unchanged
    assert ingest_client.state_digest({"model": exact_model, "optim": exact_optim}) != ingest_client.state_digest(
        {"model": model, "optim": optimizer})
    checkpointer.load({"model": exact_model, "optim": exact_optim}, step=5, checkpoint_id=str(tmp_path / "s5"),
                      no_dist=True)
    partial = torch.nn.Linear(8, 4)  # a resume that loads the model only: its digest cannot be the saved one
    checkpointer.load({"model": partial}, step=5, checkpoint_id=str(tmp_path / "s5"), no_dist=True)

    assert checkpointer._tracker.flush(5.0)
    (saved,) = transport.of_kind("digest")
    assert saved["step"] == 5 and saved["time"] <= transport.of_kind("checkpoint_start")[0]["time"]
    exact, partial_resume = transport.of_kind("resume")
    assert (exact["step"], exact["checkpoint_step"], exact["checkpoint"]) == (5, 5, str(tmp_path / "s5"))
    assert exact["digest"] == saved["value"] and partial_resume["digest"] != saved["value"]
    assert torch.equal(exact_model.weight, model.weight) and torch.equal(partial.weight, model.weight)
