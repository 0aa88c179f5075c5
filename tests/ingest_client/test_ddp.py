"""The DDP comm hook on a real 2-process gloo job (CPU)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.ingest_client.conftest import spooled_records

torch = pytest.importorskip("torch")


def _worker(rank: int, world_size: int, store: str, spool_dir: str) -> None:
    import torch.distributed as dist
    from torch import nn

    import ingest_client as goodput

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    # A file store: no TCP port to race for.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    tracker = goodput.init(run_id="ddp-run", mode="offline", spool_dir=spool_dir, install_handlers=False)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    model.register_comm_hook(state=None, hook=tracker.ddp_comm_hook())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 4):
        with tracker.step(step) as s:
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            s.loss = loss.item()
    tracker.finish()
    dist.destroy_process_group()


@pytest.mark.skipif(sys.platform != "linux", reason="gloo on Linux only in CI")
def test_ddp_comm_hook_records_allreduce_rows_per_rank(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, str(tmp_path / "store"), str(tmp_path / "spool")), nprocs=2, join=True)
    records = spooled_records(tmp_path)
    collectives = [r for r in records if r["kind"] == "collectives"]
    assert sorted({r["rank"] for r in collectives}) == [0, 1]
    for rank in (0, 1):
        rows = [(s, op) for r in collectives if r["rank"] == rank for s, op in zip(r["step"], r["op"])]
        assert {op for _, op in rows} == {"all_reduce"}
        assert sorted({s for s, _ in rows}) == [1, 2, 3], "each step's buckets carry that step's number"
        ends = [(a, b) for r in collectives if r["rank"] == rank for a, b in zip(r["start"], r["end"])]
        assert all(b >= a for a, b in ends)
    steps = [s for r in records if r["kind"] == "steps" for s in r["step"]]
    assert sorted(steps) == [1, 1, 2, 2, 3, 3]
