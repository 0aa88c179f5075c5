"""A slow rank's wait, seen in the fast rank's collective time, on GPUs under torchrun.

Rank 1 spins on its GPU (torch.cuda._sleep) before each backward; rank 0 reaches the all-reduce early and waits
inside it. ``tracker.time_collectives(model)`` times it two ways:

- NCCL (2 GPUs): NCCL's own timers (the completion hook), no Python comm hook;
- gloo on one GPU (both ranks on cuda:0, CUDA tensors): the comm hook with CUDA events. With CPU clocks on a CUDA
  future the callback fires before the collective has run, so the wait would read as near zero
  (pytorch/pytorch#48305); with CUDA events it is the sleep (0.198 s of 0.2 s on an H200).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import REPO, env_with, free_port

SLEEP_S = 0.2
STEPS = 6

WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
import ingest_client as goodput

rank = int(os.environ["RANK"])
backend = sys.argv[4]
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) if backend == "nccl" else 0)
dist.init_process_group(backend)
tracker = goodput.init(run_id="slow-rank", mode="offline", spool_dir=sys.argv[1], install_handlers=False)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), bucket_cap_mb=1000)
assert tracker.time_collectives(model, max_overhead=None) == ("nccl" if backend == "nccl" else "hook")
sleep_s, steps = float(sys.argv[2]), int(sys.argv[3])
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record(); torch.cuda._sleep(50_000_000); end.record(); end.synchronize()
cycles = int(sleep_s * 50_000_000 / (start.elapsed_time(end) / 1000.0))
x = torch.randn(64, 1024, device="cuda")
slept = {}
for step in range(1, steps + 1):
    with tracker.step(step):
        loss = model(x).pow(2).mean()
        if rank == 1:
            start.record()
            torch.cuda._sleep(cycles)  # the slow rank: its gradients are ready sleep_s later on the GPU
            end.record()
        loss.backward()
        torch.cuda.synchronize()
    if rank == 1:
        slept[step] = start.elapsed_time(end) / 1000.0  # the clock rate moves: what it really slept
if rank == 1:
    with open(os.path.join(os.path.dirname(sys.argv[1]), "slept.json"), "w") as f:
        json.dump(slept, f)
tracker.finish()
dist.destroy_process_group()
'''


@pytest.mark.parametrize("backend", [pytest.param("nccl", marks=pytest.mark.gpu(devices=2)),
                                     pytest.param("gloo", marks=pytest.mark.gpu(devices=1))])
def test_the_fast_ranks_allreduce_time_includes_waiting_for_the_slow_rank(tmp_path: Path, backend: str) -> None:
    from tests.ingest_client.conftest import spooled_records

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    spool = tmp_path / "spool"
    env = env_with(PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(script), str(spool), str(SLEEP_S), str(STEPS), backend],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    records = spooled_records(tmp_path)
    by_rank: dict[int, dict[int, float]] = {0: {}, 1: {}}
    for r in records:
        if r["kind"] == "collectives":
            for step, start, end in zip(r["step"], r["start"], r["end"], strict=True):
                by_rank[r["rank"]][step] = by_rank[r["rank"]].get(step, 0.0) + (end - start)
    assert sorted(by_rank[0]) == sorted(by_rank[1]) == list(range(1, STEPS + 1)), json.dumps(by_rank)
    slept = {int(step): s for step, s in json.loads((tmp_path / "slept.json").read_text()).items()}
    print(f"\n{backend}: rank 1 slept {slept}; rank 0's collective seconds per step {by_rank[0]}, "
          f"rank 1's {by_rank[1]}")
    for step in range(2, STEPS + 1):  # step 1 includes the backend's warm-up
        assert by_rank[0][step] >= 0.8 * slept[step], (step, slept, by_rank)  # the fast rank waited for the slow one
        assert by_rank[1][step] < 0.5 * slept[step], (step, slept, by_rank)  # the slow rank found its peer waiting
