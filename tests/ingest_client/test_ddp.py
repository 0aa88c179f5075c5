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
        rows = [(s, op) for r in collectives if r["rank"] == rank for s, op in zip(r["step"], r["op"], strict=True)]
        assert {op for _, op in rows} == {"all_reduce"}
        assert sorted({s for s, _ in rows}) == [1, 2, 3], "each step's buckets carry that step's number"
        ends = [(a, b) for r in collectives if r["rank"] == rank for a, b in zip(r["start"], r["end"], strict=True)]
        assert all(b >= a for a, b in ends)
    steps = [s for r in records if r["kind"] == "steps" for s in r["step"]]
    assert sorted(steps) == [1, 1, 2, 2, 3, 3]


def test_cpu_timer_reports_at_once_with_the_wall_start_and_the_perf_counter_duration() -> None:
    import time

    from ingest_client.worker.timing import CpuTimer, timer_for

    timer = timer_for(torch.zeros(1))
    assert isinstance(timer, CpuTimer) and timer.kind == "cpu"
    rows: list[tuple[float, float]] = []
    before = time.time()
    token = timer.start()
    time.sleep(0.05)
    timer.stop(token, lambda start, end: rows.append((start, end)))
    ((start, end),) = rows
    assert before <= start <= before + 0.01 and end - start == pytest.approx(0.05, abs=0.02)
    assert timer.drain(0.0)
    with pytest.raises(ValueError, match="clock must be 'auto', 'cpu' or 'cuda', got 'gpu'"):
        timer_for(torch.zeros(1), "gpu")


def test_cuda_timer_resolves_in_order_once_complete_and_anchors_gpu_times_to_wall_time() -> None:
    """The resolver's bookkeeping without a GPU: a simulated stream stands in for torch.cuda."""
    import time

    from ingest_client.worker.timing import PREFILLED_EVENTS, CudaTimer
    from tests.ingest_client.simulated_gpu import SimulatedGpu

    gpu = SimulatedGpu()
    timer = CudaTimer(cuda=gpu)
    rows: list[tuple[float, float, str]] = []

    def emit(start: float, end: float, name: str) -> None:
        rows.append((start, end, name))

    first = timer.start()
    gpu.launch(0.02)
    queued = gpu.idle_at()
    timer.stop(first, emit, "first")
    second = timer.start()
    gpu.launch(0.2)
    timer.stop(second, emit, "second")
    time.sleep(0.05)
    timer.resolve_ready()
    assert [name for *_, name in rows] == ["first"], "the second interval is still on the GPU"
    assert rows[0][1] == pytest.approx(queued, abs=0.002)
    assert timer.drain(1.0) and rows[1][1] - rows[1][0] == pytest.approx(0.2, abs=0.002)
    assert rows[1][0] == pytest.approx(rows[0][1], abs=0.002), "back to back on the stream"
    assert timer.resolved == 2 and len(timer._free) == PREFILLED_EVENTS, "events go back to the pool"
    assert gpu.events_created == PREFILLED_EVENTS + 1, "intervals take the pool's events; one more for the anchor"
