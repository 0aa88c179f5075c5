"""transformers callback: ``Trainer(..., callbacks=[GoodputCallback()])``.

What it reports, on every process:

- the tracker starts in ``on_init_end`` (when the ``Trainer`` is built, before ``train()`` restores a checkpoint),
  with ``args.process_index`` / ``args.world_size`` when the environment has no ``RANK``;
- ``resume`` at ``on_train_begin``: the restored ``state.global_step`` and, when it is not 0, the checkpoint it
  came from (``<output_dir>/checkpoint-<step>``, the name ``resume_from_checkpoint=True`` picks);
- one step per optimizer step: ``on_step_begin`` fires per micro-batch with gradient accumulation, so the first one
  after a step starts the timing and ``on_step_end`` ends it. The step carries the loss and learning rate of the
  ``on_log`` that follows it (the mean loss since the previous log, as the Trainer logs it), so only logged steps
  have them (``logging_steps=1`` for every step);
- checkpoints: ``control.should_save`` at ``on_step_end`` announces a save; the span starts after the log and the
  evaluation that come first in the same step (``on_log`` / ``on_evaluate``) and ends at ``on_save``, which the
  Trainer calls once the checkpoint is written on every process;
- with ``digest_every_n_steps=N``, a digest of the model's and optimizer's ``state_dict()`` and the step every N
  steps and at every save, and of the state a resume loaded (``resume``'s ``digest``: the resume check compares it
  with the digest of that checkpoint's step); off by default; costs a pass over the state;
- evaluation as the phase ``eval``: from the end of the step (or of its training log) that announced it
  (``control.should_evaluate``), or from the first prediction step of an evaluation no step announced
  (``eval_on_start``, ``trainer.evaluate()`` called by the script), to ``on_evaluate`` (``on_predict`` for a
  prediction); the ledger shows it apart from idle and from waste;
- collectives under DDP: ``tracker.time_collectives()`` on the Trainer's ``DistributedDataParallel`` model
  (``model_wrapped``) at the first ``on_step_begin``, before the first backward, so a slow rank is charged and named
  (callbacks get no reference to the Trainer: it is the ``self`` of the Trainer method a few frames up that calls
  the callbacks);
- ``finish()`` at ``on_train_end`` (``finish_at_train_end=False`` to keep the run open).
"""

from __future__ import annotations

import os
import sys
import time
from types import FrameType
from typing import Any

from transformers import TrainerCallback

from ingest_client.integrations._collectives import time_collectives
from ingest_client.integrations._common import StateDigests, name_this_launch, start_tracker
from ingest_client.worker.phases import PhaseSpan
from ingest_client.worker.tracker import CheckpointSpan, Tracker


class GoodputCallback(TrainerCallback):
    def __init__(self, tracker: Tracker | None = None, *, digest_every_n_steps: int | None = None,
                 finish_at_train_end: bool = True, **init_kwargs: Any) -> None:
        self._tracker = tracker
        self._init_kwargs = init_kwargs
        self._digests = StateDigests(digest_every_n_steps)
        self._finish_at_train_end = finish_at_train_end
        self._step_start: float | None = None
        self._pending: tuple[int, float, float] | None = None  # a step waiting for the on_log that may follow
        self._save_span: CheckpointSpan | None = None
        self._eval: PhaseSpan | None = None
        self._collectives_checked = False
        name_this_launch()

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = start_tracker(None, self._init_kwargs, rank=0, world_size=1, local_rank=0)
        return self._tracker

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._tracker = start_tracker(self._tracker, self._init_kwargs, rank=int(args.process_index),
                                      world_size=int(args.world_size), local_rank=max(int(args.local_process_index), 0))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if step == 0:
            self.tracker.resumed(0)
            return
        path = os.path.join(str(args.output_dir), f"checkpoint-{step}")
        self.tracker.resumed(step, checkpoint_step=step, checkpoint=path if os.path.isdir(path) else None,
                             digest=self._digests.at_load(step, lambda: _state(kwargs)))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._collectives_checked:  # before the first backward; the Trainer has wrapped its model by now
            self._collectives_checked = True
            time_collectives(self.tracker, getattr(_calling_trainer(), "model_wrapped", None))
        if self._step_start is None:
            self._record_pending()
            self._step_start = time.time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step_start is None:
            return
        step = int(state.global_step)
        self._pending = (step, self._step_start, time.time())
        self._step_start = None
        self._digests.after_step(self.tracker, step, lambda: _state(kwargs))
        if control.should_save:  # the state the save will write: digested before its span opens
            self._digests.at_checkpoint(self.tracker, step, lambda: _state(kwargs))
        if control.should_save and not control.should_log and not control.should_evaluate:
            self._open_save(step)
        if control.should_evaluate and not control.should_log:
            self._open_eval()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self._pending is not None and self._pending[0] == int(state.global_step) and logs:
            step, start, end = self._pending
            self._pending = None
            self.tracker.record_step(step, start, end, _number(logs.get("loss")), _number(logs.get("learning_rate")))
        if control.should_save and not control.should_evaluate:
            self._open_save(int(state.global_step))
        if control.should_evaluate:  # the training log that comes before the evaluation (or the evaluation's own)
            self._open_eval()

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._open_eval()  # an evaluation or prediction no step announced (trainer.evaluate() called by the script)

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self._end_eval()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_eval()
        if control.should_save:
            self._open_save(int(state.global_step))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._digests.at_checkpoint(self.tracker, int(state.global_step), lambda: _state(kwargs))
        self._open_save(int(state.global_step))  # no announcement seen (a save outside the step loop): no length
        span, self._save_span = self._save_span, None
        if span is not None:
            span.__exit__(None, None, None)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._record_pending()
        if self._finish_at_train_end:
            self.tracker.finish()
        else:
            self.tracker.flush(5.0)

    def _record_pending(self) -> None:
        if self._pending is not None:
            step, start, end = self._pending
            self._pending = None
            self.tracker.record_step(step, start, end)

    def _open_eval(self) -> None:
        if self._eval is None and self.tracker.enabled:
            self._record_pending()
            self._eval = self.tracker.phase("eval")
            self._eval.__enter__()

    def _end_eval(self) -> None:
        span, self._eval = self._eval, None
        if span is not None:
            span.__exit__(None, None, None)

    def _open_save(self, step: int) -> None:
        if self._save_span is None and self.tracker.enabled:
            self._record_pending()
            self._save_span = self.tracker.checkpoint(step)
            self._save_span.__enter__()


def _state(kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What a Trainer checkpoint saves of the training state, from a callback's arguments: model and optimizer."""
    return tuple(kwargs[k] for k in ("model", "optimizer") if kwargs.get(k))


def _calling_trainer() -> Any:
    """The ``transformers.Trainer`` whose callback handler called this callback (the ``self`` of a Trainer method a
    few frames up), or None."""
    from transformers import Trainer

    frame: FrameType | None = sys._getframe(1)
    for _ in range(_TRAINER_FRAMES):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


_TRAINER_FRAMES = 8  # callback <- CallbackHandler.call_event <- CallbackHandler.on_* <- Trainer method, and wrappers


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
