"""A tiny PyTorch Lightning job (CPU, DDP over gloo, synthetic data) instrumented with goodput's Lightning callback.

    GOODPUT_RUN_ID=my-run python examples/train_lightning.py --devices 2 --steps 40 --checkpoint-every 10
    GOODPUT_RUN_ID=my-run torchrun --standalone --nproc-per-node 2 examples/train_lightning.py --devices 2

The goodput part is one line: ``callbacks=[GoodputCallback()]`` (marked ``# goodput``). Relaunching the same
command resumes from ``last.ckpt`` with Lightning's own ``ckpt_path="last"``; goodput counts the relaunch as the
next attempt by itself. ``--kill-at-step S`` makes rank 0 SIGKILL the whole job (its process group, as a node
failure would) once step S is done, to show a crash and a relaunch.

Each rank appends one JSON line per event to ``<log-dir>/rank<R>.jsonl`` (``start``, ``resumed``, ``step``,
``save``, ``done``), measured by the job itself, so tests can compare goodput's figures with the job's own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ingest_client.integrations.lightning import GoodputCallback


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps (max_steps)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="ModelCheckpoint every_n_train_steps")
    p.add_argument("--step-sleep", type=float, default=0.02, help="seconds of extra work per step")
    p.add_argument("--kill-at-step", type=int, default=0, help="rank 0 SIGKILLs the job after this step (0: never)")
    p.add_argument("--kill-delay", type=float, default=0.5,
                   help="seconds rank 0 waits at --kill-at-step before the kill (the other ranks wait in the next "
                        "step's all-reduce); longer than goodput's flush interval (0.2 s), so the steps done before "
                        "the kill reached the spool: a kill within the interval loses them")
    p.add_argument("--digest-every", type=int, default=0, help="goodput state digest every N steps (0: off)")
    p.add_argument("--ckpt-dir", type=Path, default=Path("lightning-ckpt"))
    p.add_argument("--log-dir", type=Path, default=Path("lightning-logs"))
    return p.parse_args()


class JobLog:
    """One JSON line per event, written with one unbuffered append (survives the process's SIGKILL)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.rank: int | None = None
        self.fd: int | None = None

    def open(self, rank: int) -> None:
        if self.fd is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.rank = rank
            self.fd = os.open(self.log_dir / f"rank{rank}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, **fields: Any) -> None:
        if self.fd is not None:
            os.write(self.fd, (json.dumps({"event": event, "rank": self.rank, "pid": os.getpid(), **fields}) + "\n")
                     .encode())


class TinyRegression(L.LightningModule):
    def __init__(self, step_sleep_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.step_sleep_s = step_sleep_s

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.step_sleep_s)
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class LoggedCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that logs each save's start and end, as the job measures it (every rank calls it)."""

    def __init__(self, log: JobLog, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.joblog = log

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        start = time.time()
        super()._save_checkpoint(trainer, filepath)
        self.joblog.write("save", step=trainer.global_step, start=start, end=time.time(),
                          path=os.path.basename(filepath))


class JobEvents(L.Callback):
    """The job's own record of starts, resumes and steps; rank 0 kills the job at ``--kill-at-step``."""

    def __init__(self, log: JobLog, kill_at_step: int, kill_delay_s: float) -> None:
        self.joblog = log
        self.kill_at_step = kill_at_step
        self.kill_delay_s = kill_delay_s
        self.step_start: float | None = None
        self.last_step = -1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.joblog.open(trainer.global_rank)
        self.joblog.write("start", world_size=trainer.world_size, time=time.time())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.last_step = trainer.global_step
        self.joblog.write("resumed", step=trainer.global_step, ckpt_path=trainer.ckpt_path)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.step_start is None:
            self.step_start = time.time()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step > self.last_step and self.step_start is not None:
            self.last_step = trainer.global_step
            self.joblog.write("step", step=trainer.global_step, start=self.step_start, end=time.time())
            self.step_start = None

    def on_train_batch_start_kill(self, trainer: L.Trainer) -> None:
        if self.kill_at_step and trainer.global_rank == 0 and trainer.global_step == self.kill_at_step:
            time.sleep(self.kill_delay_s)
            self.joblog.write("kill", step=trainer.global_step, time=time.time())
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.joblog.write("done", step=trainer.global_step, time=time.time())


class KillAfterSave(L.Callback):
    """Kills after ModelCheckpoint of the same batch (callbacks run in order; checkpoint callbacks last), i.e. at
    the start of the next batch."""

    def __init__(self, events: JobEvents) -> None:
        self.events = events

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.events.on_train_batch_start_kill(trainer)


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    log = JobLog(args.log_dir)
    events = JobEvents(log, args.kill_at_step, args.kill_delay)
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, use_distributed_sampler=True,
        callbacks=[
            KillAfterSave(events), events,
            GoodputCallback(digest_every_n_steps=args.digest_every or None),  # goodput
            LoggedCheckpoint(log, dirpath=args.ckpt_dir, every_n_train_steps=args.checkpoint_every, save_top_k=-1,
                             save_last=True),
        ],
    )
    L.seed_everything(0, workers=True, verbose=False)
    trainer.fit(TinyRegression(args.step_sleep), DataLoader(data, batch_size=16, shuffle=True), ckpt_path="last")


if __name__ == "__main__":
    main()
