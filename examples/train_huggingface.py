"""A tiny Hugging Face ``Trainer`` job (CPU, a randomly initialised GPT-2 from a config, synthetic data) with goodput.

    GOODPUT_RUN_ID=my-run HF_HUB_OFFLINE=1 python examples/train_huggingface.py --steps 24 --save-steps 8
    GOODPUT_RUN_ID=my-run HF_HUB_OFFLINE=1 torchrun --standalone --nproc-per-node 2 examples/train_huggingface.py

The goodput part is one line: ``callbacks=[GoodputCallback()]`` (marked ``# goodput``). Relaunching the same
command resumes from the newest ``checkpoint-<step>`` with the Trainer's own ``resume_from_checkpoint``; goodput
counts the relaunch as the next attempt by itself. Nothing is downloaded. ``--kill-at-step S`` makes process 0
SIGKILL the job (its process group) once step S is done (after waiting ``--kill-delay`` seconds, longer than goodput's
flush interval, so that the steps done before the kill reached the spool). ``--eval-steps N`` evaluates every N steps
(goodput books it as ``eval``); ``--straggler-rank R`` slows process R by ``--straggler-sleep`` seconds per step
(goodput names it a straggler).

Each process appends one JSON line per event to ``<log-dir>/rank<R>.jsonl`` (``start``, ``resumed``, ``step``,
``save``, ``eval``, ``kill``, ``done``), measured by the job itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from ingest_client.integrations.huggingface import GoodputCallback


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save-steps", type=int, default=8)
    p.add_argument("--kill-at-step", type=int, default=0, help="process 0 SIGKILLs the job after this step")
    p.add_argument("--kill-delay", type=float, default=0.5)
    p.add_argument("--digest-every", type=int, default=0, help="goodput state digest every N steps (0: off)")
    p.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps (0: never)")
    p.add_argument("--eval-sleep", type=float, default=0.02, help="seconds of extra work per evaluation batch")
    p.add_argument("--straggler-rank", type=int, default=-1, help="this process sleeps --straggler-sleep more per step")
    p.add_argument("--straggler-sleep", type=float, default=0.05)
    p.add_argument("--output-dir", type=Path, default=Path("hf-out"))
    p.add_argument("--log-dir", type=Path, default=Path("hf-logs"))
    return p.parse_args()


class JobLog(TrainerCallback):
    """The job's own record, one unbuffered append per line (survives SIGKILL); process 0 kills at --kill-at-step."""

    def __init__(self, log_dir: Path, kill_at_step: int, kill_delay_s: float) -> None:
        self.log_dir = log_dir
        self.kill_at_step = kill_at_step
        self.kill_delay_s = kill_delay_s
        self.fd: int | None = None
        self.rank = 0
        self.step_start: float | None = None

    def write(self, event: str, **fields: Any) -> None:
        if self.fd is not None:
            line = json.dumps({"event": event, "rank": self.rank, "pid": os.getpid(), **fields}) + "\n"
            os.write(self.fd, line.encode())

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.rank = args.process_index
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.log_dir / f"rank{self.rank}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.write("start", world_size=args.world_size, time=time.time())

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.write("resumed", step=state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step_start is None:
            self.step_start = time.time()
        if self.kill_at_step and self.rank == 0 and state.global_step == self.kill_at_step:
            time.sleep(self.kill_delay_s)
            self.write("kill", step=state.global_step, time=time.time())
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step_start is not None:
            self.write("step", step=state.global_step, start=self.step_start, end=time.time())
            self.step_start = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.write("done", step=state.global_step, time=time.time())


class LoggedTrainer(Trainer):
    """The Trainer, with each checkpoint write and evaluation timed by the job itself, and its faults: a slower
    training step on ``--straggler-rank``, ``--eval-sleep`` more per evaluation batch."""

    joblog: JobLog
    job_args: argparse.Namespace

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        start = time.time()
        super()._save_checkpoint(model, trial)
        self.joblog.write("save", step=self.state.global_step, start=start, end=time.time())

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        start = time.time()
        metrics = super().evaluate(*args, **kwargs)
        self.joblog.write("eval", step=self.state.global_step, start=start, end=time.time())
        return metrics

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.args.process_index == self.job_args.straggler_rank:
            time.sleep(self.job_args.straggler_sleep)
        return super().training_step(*args, **kwargs)

    def prediction_step(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.job_args.eval_sleep)
        return super().prediction_step(*args, **kwargs)


class Synthetic(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)  # randomly initialised from the config: nothing downloaded
    joblog = JobLog(args.log_dir, args.kill_at_step, args.kill_delay)
    evaluation: dict[str, Any] = ({"eval_strategy": "steps", "eval_steps": args.eval_steps,
                                   "per_device_eval_batch_size": 8} if args.eval_steps else {})
    training = TrainingArguments(
        output_dir=str(args.output_dir), max_steps=args.steps, save_steps=args.save_steps, save_strategy="steps",
        logging_steps=1, per_device_train_batch_size=8, learning_rate=1e-3, report_to=[], use_cpu=True,
        dataloader_num_workers=0, seed=0, disable_tqdm=True, **evaluation,
    )
    trainer = LoggedTrainer(model=model, args=training, train_dataset=Synthetic(512, 16, 64),
                            eval_dataset=Synthetic(32, 16, 64) if args.eval_steps else None,
                            callbacks=[joblog,
                                       GoodputCallback(digest_every_n_steps=args.digest_every or None)])  # goodput
    trainer.joblog = joblog
    trainer.job_args = args
    last = get_last_checkpoint(str(args.output_dir)) if args.output_dir.is_dir() else None
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()
