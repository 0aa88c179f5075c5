"""NCCL's own collective timers under ``tracker.time_collectives(model)``, on one GPU (world size 1).

No Python comm hook: DDP's built-in all-reduce, ProcessGroupNCCL's completion hook hands every bucket's collective
(enqueue time, active GPU duration) to the tracker off the training thread. Each lands in the step the host
enqueued it in, every step carries every bucket, and the rows' time is within the step. DDP's first two iterations
are its own: the first runs on the buckets built from the parameters' order, the second rebuilds them from the
order the gradients came in (broadcasting the new layout); from the third on every step issues the same all-reduces.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import REPO, env_with, free_port

pytestmark = pytest.mark.gpu

STEPS, LAYERS = 20, 8

WORKER = r'''
import os, sys
import torch, torch.distributed as dist
import ingest_client as goodput

torch.cuda.set_device(0)
dist.init_process_group("nccl")
tracker = goodput.init(run_id="nccl-timers", mode="offline", spool_dir=sys.argv[1], install_handlers=False)
layers = int(sys.argv[3])
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(layers)]).cuda(), bucket_cap_mb=4)
assert tracker.time_collectives(model, max_overhead=None) == "nccl"
x = torch.randn(64, 1024, device="cuda")
for step in range(1, int(sys.argv[2]) + 1):
    with tracker.step(step) as s:
        loss = model(x).pow(2).mean()
        loss.backward()
        s.loss = loss
tracker.finish()
dist.destroy_process_group()
'''


def test_every_buckets_allreduce_is_timed_by_nccl_in_its_step(tmp_path: Path) -> None:
    from tests.ingest_client.conftest import spooled_records

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = env_with(PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
         "--master-port", str(free_port()), str(script), str(tmp_path / "spool"), str(STEPS), str(LAYERS)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = spooled_records(tmp_path)
    steps = {s: (a, b) for r in records if r["kind"] == "steps"
             for s, a, b in zip(r["step"], r["start"], r["end"], strict=True)}
    per_step: dict[int, list[tuple[str, float, float]]] = {}
    for r in records:
        if r["kind"] == "collectives":
            for s, op, a, b in zip(r["step"], r["op"], r["start"], r["end"], strict=True):
                per_step.setdefault(s, []).append((op, a, b))
    assert sorted(per_step) == list(range(1, STEPS + 1)), sorted(per_step)
    ops = {s: sorted(op for op, _, _ in rows) for s, rows in per_step.items()}
    print(f"\ncollectives of steps 1-3: {ops[1]}, {ops[2]}, {ops[3]}")
    steady = {s: len(rows) for s, rows in per_step.items() if s >= 3}
    assert len(set(steady.values())) == 1 and steady[3] >= LAYERS // 2, steady  # every bucket of every step
    for step, rows in per_step.items():
        assert all(b > a for _, a, b in rows), rows
        expected = {"all_reduce"} if step != 2 else {"all_reduce", "broadcast"}  # the bucket rebuild's broadcasts
        assert {op for op, _, _ in rows} <= expected and "all_reduce" in ops[step], (step, ops[step])
        assert sum(b - a for _, a, b in rows) < steps[step][1] - steps[step][0] + 0.05
    stats = [r for r in records if r["kind"] == "client_stats"]
    assert stats[-1]["collective_clock"] == "nccl" and stats[-1]["step_clock"] == "cuda"
