"""PyTorch Lightning callback: ``Trainer(callbacks=[GoodputCallback()])``.

What it reports, on every rank:

- the tracker starts in ``setup`` (after Lightning's launcher and process group, before the checkpoint is restored),
  with the trainer's ``global_rank`` / ``world_size`` when the environment has no ``RANK`` (Lightning's own
  launcher, ``python train.py`` with ``devices=2``, sets none);
- ``resume`` at ``on_train_start``: the restored ``trainer.global_step``, with the checkpoint it was loaded from
  (``trainer.ckpt_path``) and the step saved in it (``on_load_checkpoint``);
- one step per optimizer step, from the first micro-batch after the previous step to the batch end that advanced
  ``trainer.global_step`` (gradient accumulation counts once), with the last micro-batch's loss and the first
  optimizer's learning rate;
- checkpoints: ``trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls) is wrapped on this trainer, so the
  span is what every rank blocks for: collecting the state, rank 0's write through the ``CheckpointIO`` plugin and
  the barrier after it. A ``save_last`` copy at the same step is part of the same checkpoint (the collector merges
  the spans of one step);
- with ``digest_every_n_steps=N``, a digest of the module's and optimizers' ``state_dict()`` and the step every N
  steps and at every checkpoint, and of the state a resume loaded (``resume``'s ``digest``: the resume check compares
  it with the digest of that checkpoint's step); costs a pass over the state; off by default;
- validation (the sanity check, and every validation between steps) as the phase ``eval``, from
  ``on_validation_start`` to ``on_validation_end``: the ledger shows it apart from idle and from waste;
- under a DDP strategy, collectives: ``tracker.time_collectives()`` on the strategy's ``DistributedDataParallel``
  model at ``on_fit_start`` (NCCL's own timers, or the comm hook on gloo), so a slow rank is charged and named (a
  model with a comm hook of its own keeps it, and its steps are not charged);
- ``finish()`` at ``teardown`` after a fit that reached ``on_train_end`` (after ``ModelCheckpoint``'s last save;
  ``finish_at_train_end=False`` keeps the run open for another ``fit``); after an exception, only a flush (the
  exit hooks end the attempt as failed).
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    if not TYPE_CHECKING:  # the same class under its former package, typed apart
        from pytorch_lightning.callbacks import Callback

from ingest_client.integrations._collectives import time_collectives
from ingest_client.integrations._common import StateDigests, name_this_launch, start_tracker
from ingest_client.worker.phases import PhaseSpan
from ingest_client.worker.tracker import Tracker


class GoodputCallback(Callback):
    def __init__(self, tracker: Tracker | None = None, *, digest_every_n_steps: int | None = None,
                 finish_at_train_end: bool = True, **init_kwargs: Any) -> None:
        super().__init__()
        self._tracker = tracker
        self._init_kwargs = init_kwargs
        self._digests = StateDigests(digest_every_n_steps)
        self._finish_at_train_end = finish_at_train_end
        self._step_start: float | None = None
        self._last_step = -1
        self._loaded_step: int | None = None
        self._train_ended = False
        self._eval: PhaseSpan | None = None
        name_this_launch()

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = start_tracker(None, self._init_kwargs, rank=0, world_size=1, local_rank=0)
        return self._tracker

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._tracker = start_tracker(self._tracker, self._init_kwargs, rank=int(trainer.global_rank),
                                      world_size=int(trainer.world_size), local_rank=int(trainer.local_rank))
        self._wrap_save_checkpoint(trainer)

    def _wrap_save_checkpoint(self, trainer: Any) -> None:
        save = trainer.save_checkpoint
        if getattr(save, "_goodput_wrapped", False):
            return

        @functools.wraps(save)
        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            tracker = self.tracker
            if not tracker.enabled:  # disabled, or finished at on_train_end: a save after fit is not timed
                return save(*args, **kwargs)
            self._digests.at_checkpoint(tracker, int(trainer.global_step), lambda: _state(trainer))
            with tracker.checkpoint(int(trainer.global_step)):
                return save(*args, **kwargs)

        save_checkpoint._goodput_wrapped = True  # type: ignore[attr-defined]  # a marker, read back with getattr
        trainer.save_checkpoint = save_checkpoint

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        time_collectives(self.tracker, getattr(trainer.strategy, "model", None))  # wrapped in DDP by now

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self._eval is None:
            self._eval = self.tracker.phase("eval")
            self._eval.__enter__()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._end_eval(None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._end_eval(exception)

    def _end_eval(self, error: BaseException | None) -> None:
        span, self._eval = self._eval, None
        if span is not None:
            span.__exit__(type(error) if error is not None else None, error, None)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        step = checkpoint.get("global_step")
        self._loaded_step = int(step) if isinstance(step, int) else None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_step = int(trainer.global_step)
        path = getattr(trainer, "ckpt_path", None)
        if path is not None or self._loaded_step is not None:
            self.tracker.resumed(self._last_step, checkpoint_step=self._loaded_step,
                                 checkpoint=str(path) if path is not None else None,
                                 digest=self._digests.at_load(self._last_step, lambda: _state(trainer)))
        else:
            self.tracker.resumed(self._last_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._step_start is None:
            self._step_start = time.time()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if self._step_start is None or step <= self._last_step:
            return
        tracker = self.tracker
        tracker.record_step(step, self._step_start, time.time(), _loss_of(outputs), _lr_of(trainer))
        self._last_step = step
        self._step_start = None
        self._digests.after_step(tracker, step, lambda: _state(trainer))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._train_ended = True  # ModelCheckpoint may still save `last` in its own on_train_end: finish at teardown

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._tracker is None:
            return
        if self._train_ended and self._finish_at_train_end:
            self._tracker.finish()
        else:
            self._tracker.flush(5.0)
        self._train_ended = False


def _state(trainer: Any) -> tuple[Any, ...]:
    """What a Lightning checkpoint saves of the training state: the module and the optimizers."""
    return (trainer.lightning_module, *getattr(trainer, "optimizers", ()))


def _loss_of(outputs: Any) -> Any:
    """The loss ``training_step`` returned (a tensor, detached; the flusher converts it), or None."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    detach = getattr(loss, "detach", None)
    if detach is not None:
        return detach()
    return loss if isinstance(loss, (int, float)) and not isinstance(loss, bool) else None


def _lr_of(trainer: Any) -> float | None:
    try:
        return float(trainer.optimizers[0].param_groups[0]["lr"])
    except (IndexError, KeyError, TypeError, AttributeError, ValueError):
        return None
