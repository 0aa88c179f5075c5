"""examples/train_ddp.py's checkpoint loader and data sampler, in-process (no torchrun, fast)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ingest_client.launcher.launch import launch_main
from tests.torchrun.conftest import EXAMPLE

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_ddp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ListLog:
    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []

    def write(self, event: str, **fields: object) -> None:
        self.lines.append({"event": event, **fields})


def test_loader_takes_the_newest_checkpoint_that_verifies(example: ModuleType, tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        example.save_checkpoint(tmp_path, step, {"step": step}, keep=3)
    assert [p.name for p in example.published_checkpoints(tmp_path)] == ["ckpt-40", "ckpt-30", "ckpt-20"]
    with open(tmp_path / "ckpt-40" / example.STATE_FILE, "r+b") as f:  # a flipped byte
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    (tmp_path / "ckpt-30" / example.MANIFEST).unlink()  # published without its manifest
    (tmp_path / ".tmp-ckpt-50-123").mkdir()  # a write killed before the rename
    log = ListLog()
    found = example.find_checkpoint(tmp_path, log)
    assert found is not None and found.name == "ckpt-20"
    reasons = {str(line["path"]): str(line["reason"]) for line in log.lines}
    assert reasons == {
        ".tmp-ckpt-50-123": "never published (write interrupted)",
        "ckpt-40": "state.pt does not match its sha256 in the manifest",
        "ckpt-30": "no manifest",
    }
    assert json.loads((found / example.MANIFEST).read_text())["step"] == 20


def test_sampler_position_restores_the_exact_batch_sequence(example: ModuleType) -> None:
    a = example.ShardedSampler(256, rank=1, world_size=2, batch_size=16, seed=3)
    for _ in range(11):  # past an epoch boundary (8 batches per epoch)
        a.next_indices()
    b = example.ShardedSampler(256, rank=1, world_size=2, batch_size=16, seed=3)
    b.load_state_dict(a.state_dict())
    for _ in range(10):
        assert torch.equal(a.next_indices(), b.next_indices())


def test_goodput_launch_tells_workers_it_reports_run_end(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    code = launch_main(["--run-id", "r", "--spool-dir", str(tmp_path / "spool"), "--gpus", "1", "--",
                        sys.executable, "-c",
                        f"import os; open({str(seen)!r}, 'w').write(os.environ.get('GOODPUT_LAUNCHED', ''))"])
    assert code == 0
    assert seen.read_text() == "1"
