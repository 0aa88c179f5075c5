"""A one-GPU training job for tests/gpu/test_gpu_step_timing.py, with its own CUDA-event truth.

A bf16 MLP (4 x Linear, ~20 ms of GPU a step on an H200), checkpoints every ``--every`` steps inside
``tracker.checkpoint()`` (``torch.save`` of the state dict, or ``dcp.async_save`` through the client's
``AsyncCheckpointer``). The loop reads the loss back every step, every 10 steps, or never (``--read-back``), as the
issue's three loops do. Truth, written to ``--truth`` as JSON, comes from the job's own CUDA events, recorded at the
start and end of every step on the current stream and anchored to ``time.time()`` by an event on an idle stream:

- a step is its interval on the GPU's timeline (start event to end event);
- a checkpoint blocks from when the GPU finished the work queued before it (the end event of the step before) to
  the end of the save on the host.

Usage: ``python step_timing_job.py --truth OUT.json --read-back every|tenth|none [--save torch|dcp]`` with
``GOODPUT_URL`` and ``GOODPUT_RUN_ID`` set.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

import torch
from torch import nn

import ingest_client as goodput


def anchor(stream: torch.cuda.Stream) -> tuple[torch.cuda.Event, float]:
    event = torch.cuda.Event(enable_timing=True)
    before = time.time()
    event.record(stream)
    return event, (before + time.time()) / 2.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--truth", required=True)
    parser.add_argument("--read-back", choices=["every", "tenth", "none"], default="none")
    parser.add_argument("--save", choices=["torch", "dcp"], default="torch")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8192)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    model = nn.Sequential(*[nn.Linear(args.width, args.width, bias=False) for _ in range(4)]).to(device, torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=device, dtype=torch.bfloat16)
    for _ in range(3):  # warm-up: kernels chosen and memory allocated before anything is timed
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()

    checkpointer: Any = None
    if args.save == "dcp":
        import torch.distributed as dist

        from ingest_client.integrations.dcp import AsyncCheckpointer

        store = tempfile.mktemp(prefix="goodput-dcp-store-")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)

    tracker = goodput.init()
    if args.save == "dcp":
        checkpointer = AsyncCheckpointer(tracker)
    idle = torch.cuda.Stream(device=device)
    anchor_event, anchor_wall = anchor(idle)
    ckpt_dir = tempfile.mkdtemp(prefix="goodput-gpu-ckpt-")
    marks: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []
    saves: list[tuple[int, int, float]] = []  # (step, index of the step before in marks, host end of the save)
    tracker.resumed(0)
    for step in range(1, args.steps + 1):
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with tracker.step(step) as s:
            start_ev.record()
            loss = model(x).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            end_ev.record()
            if args.read_back == "every" or (args.read_back == "tenth" and step % 10 == 0):
                s.loss = loss.item()
        marks.append((step, start_ev, end_ev))
        if step % args.every == 0:
            state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
            if checkpointer is not None:
                checkpointer.save(state, step=step, checkpoint_id=os.path.join(ckpt_dir, f"dcp-{step}"))
            else:
                with tracker.checkpoint(step):
                    torch.save(state, os.path.join(ckpt_dir, f"ckpt-{step}.pt"))
            saves.append((step, len(marks) - 1, time.time()))
    if checkpointer is not None:
        checkpointer.wait()
    torch.cuda.synchronize()
    tracker.finish("finished")

    def wall(event: torch.cuda.Event) -> float:
        return anchor_wall + anchor_event.elapsed_time(event) / 1000.0

    steps = [(step, wall(a), wall(b)) for step, a, b in marks]
    checkpoints = [(step, steps[i][2], done) for step, i, done in saves]
    with open(args.truth, "w") as out:
        json.dump({"steps": steps, "checkpoints": checkpoints,
                   "productive_s": sum(b - a for _, a, b in steps),
                   "checkpoint_s": sum(done - ready for _, ready, done in checkpoints),
                   "step_clock": tracker.step_clock, "torch": torch.__version__}, out)


if __name__ == "__main__":
    main()
