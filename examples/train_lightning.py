"""A tiny PyTorch Lightning job (CPU, DDP over gloo, synthetic data) instrumented with goodput's Lightning callback.

    GOODPUT_RUN_ID=my-run python examples/train_lightning.py --devices 2 --steps 40 --checkpoint-every 10
    GOODPUT_RUN_ID=my-run torchrun --standalone --nproc-per-node 2 examples/train_lightning.py --devices 2

The goodput part is one line: ``callbacks=[GoodputCallback()]`` (marked ``# goodput``). Relaunching the same
command resumes from ``last.ckpt`` with Lightning's own ``ckpt_path="last"``; goodput counts the relaunch as the
next attempt by itself. ``--kill-at-step S`` makes rank 0 SIGKILL the whole job (its process group, as a node
failure would) once step S is done, to show a crash and a relaunch.

The resume is exact, mid-epoch too: the training data comes from ``ResumableLoader`` (below; copy it), whose
order depends only on (seed, epoch) and whose position Lightning saves in the checkpoint and restores, so the
relaunch trains on the very batches the killed run would have (a plain shuffling ``DataLoader`` restarts its epoch
with another order: Lightning warns, and goodput's resume check flags the losses and digests that differ).
``--val-every N`` validates every N steps (goodput books it as ``eval``); ``--straggler-rank R`` slows rank R by
``--straggler-sleep`` seconds per step (goodput names it a straggler).

Each rank appends one JSON line per event to ``<log-dir>/rank<R>.jsonl`` (``start``, ``resumed``, ``step``,
``save``, ``done``), measured by the job itself, so tests can compare goodput's figures with the job's own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

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
    p.add_argument("--val-every", type=int, default=0, help="validate every N steps (0: never)")
    p.add_argument("--val-sleep", type=float, default=0.02, help="seconds of extra work per validation batch")
    p.add_argument("--straggler-rank", type=int, default=-1, help="this rank sleeps --straggler-sleep more per step")
    p.add_argument("--straggler-sleep", type=float, default=0.05)
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


class EpochSampler(Sampler[int]):
    """This rank's share of an epoch shuffled by (seed, epoch) alone, as ``DistributedSampler`` shares it out, from
    any position: ``start`` samples of the epoch are skipped once (a resumed epoch), then it starts at 0 again.
    Lightning calls ``set_epoch`` before every epoch."""

    def __init__(self, size: int, *, rank: int, world_size: int, seed: int = 0) -> None:
        self.size, self.rank, self.world_size, self.seed = size, rank, world_size, seed
        self.per_rank = math.ceil(size / world_size)
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.start = epoch, 0

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        order += order[: self.per_rank * self.world_size - self.size]  # every rank gets as many samples
        start, self.start = self.start, 0
        return iter(order[self.rank :: self.world_size][start:])

    def __len__(self) -> int:
        return self.per_rank  # the whole epoch's, also when resumed part way: Lightning counts from where it was


class ResumableLoader(DataLoader):  # type: ignore[type-arg]  # a DataLoader of (x, y) batches
    """A training DataLoader that resumes mid-epoch: Lightning saves the ``state_dict()`` of a training loader that
    has one in every checkpoint and hands it back to ``load_state_dict`` on resume (the epoch and the batches handed
    out in it, counted as they leave the loader, so worker prefetching does not matter)."""

    def __init__(self, dataset: Dataset[Any], *, sampler: EpochSampler, batch_size: int) -> None:
        super().__init__(dataset, batch_size=batch_size, sampler=sampler)
        self.epoch_sampler = sampler
        self.batches_out = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator over DataLoader's own iterator
        self.batches_out = self.epoch_sampler.start // (self.batch_size or 1)
        for batch in super().__iter__():
            self.batches_out += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch_sampler.epoch, "batches": self.batches_out}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch_sampler.epoch = int(state["epoch"])
        self.epoch_sampler.start = int(state["batches"]) * (self.batch_size or 1)


class TinyRegression(L.LightningModule):
    def __init__(self, data: TensorDataset, args: argparse.Namespace) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.data = data
        self.args = args

    def train_dataloader(self) -> ResumableLoader:
        sampler = EpochSampler(len(self.data), rank=self.trainer.global_rank, world_size=self.trainer.world_size)
        return ResumableLoader(self.data, sampler=sampler, batch_size=16)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.args.step_sleep)
        if self.global_rank == self.args.straggler_rank:
            time.sleep(self.args.straggler_sleep)
        return nn.functional.mse_loss(self.net(x), y)

    def val_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        return DataLoader(TensorDataset(*self.data[:32]), batch_size=16)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        time.sleep(self.args.val_sleep)
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

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
    """The job's own record of starts, resumes, steps and validations; rank 0 kills the job at ``--kill-at-step``."""

    def __init__(self, log: JobLog, kill_at_step: int, kill_delay_s: float) -> None:
        self.joblog = log
        self.kill_at_step = kill_at_step
        self.kill_delay_s = kill_delay_s
        self.step_start: float | None = None
        self.val_start = 0.0
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

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.val_start = time.time()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.joblog.write("eval", step=trainer.global_step, start=self.val_start, end=time.time())

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
    validation: dict[str, Any] = ({"val_check_interval": args.val_every, "check_val_every_n_epoch": None}
                                  if args.val_every else {"limit_val_batches": 0})
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, use_distributed_sampler=False, **validation,  # ResumableLoader shards the data
        callbacks=[
            KillAfterSave(events), events,
            GoodputCallback(digest_every_n_steps=args.digest_every or None),  # goodput
            LoggedCheckpoint(log, dirpath=args.ckpt_dir, every_n_train_steps=args.checkpoint_every, save_top_k=-1,
                             save_last=True),
        ],
    )
    L.seed_everything(0, workers=True, verbose=False)
    trainer.fit(TinyRegression(data, args), ckpt_path="last")


if __name__ == "__main__":
    main()
