"""The README's "Instrument a torchrun script" snippet, filled in with a tiny DDP model (gloo, CPU)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ingest_client as goodput

total_steps, checkpoint_every = 12, 5
dist.init_process_group("gloo")
torch.manual_seed(0)
model: nn.Module = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
x, y = torch.randn(16, 4), torch.randn(16, 1)


def load_checkpoint_if_any() -> int:
    return 0


def train_one_step() -> torch.Tensor:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def save_checkpoint(step: int) -> None:
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), os.path.join(os.environ["SNIPPET_CKPT_DIR"], f"ckpt-{step}.pt"))


# -- the snippet, as the README writes it -----------------------------------------------------------------------
tracker = goodput.init()                      # run id, rank, restart count from torchrun; GOODPUT_URL
model = DDP(model)
tracker.time_collectives(model)               # per-rank collective timing (stragglers)

start_step = load_checkpoint_if_any()
tracker.resumed(start_step)                   # 0 = fresh start
for step in range(start_step + 1, total_steps + 1):
    with tracker.step(step) as s:             # one optimizer step
        loss = train_one_step()
        s.loss, s.lr = loss.item(), scheduler.get_last_lr()[0]
    if step % checkpoint_every == 0:
        with tracker.checkpoint(step):        # time the loop is blocked writing
            save_checkpoint(step)
tracker.finish()
# ---------------------------------------------------------------------------------------------------------------
dist.barrier()
dist.destroy_process_group()
