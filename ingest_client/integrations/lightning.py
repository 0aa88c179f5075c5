"""PyTorch Lightning callback: ``Trainer(callbacks=[GoodputCallback()])``.

Records ``resume`` at the start of fitting and one step per optimizer step: from the first
micro-batch after the previous step to the batch end that advanced ``trainer.global_step``
(so gradient accumulation counts once). Checkpoints are not timed: Lightning has no hook around
the write; wrap your own saves in ``tracker.checkpoint()``.
"""

from __future__ import annotations

import time
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

import ingest_client
from ingest_client.tracker import Tracker


class GoodputCallback(Callback):  # type: ignore[misc]  # Callback comes from an untyped optional package
    def __init__(self, tracker: Tracker | None = None, **init_kwargs: Any) -> None:
        super().__init__()
        self._tracker = tracker
        self._init_kwargs = init_kwargs
        self._step_start: float | None = None
        self._last_step = -1

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = ingest_client.get_tracker() or ingest_client.init(**self._init_kwargs)
        return self._tracker

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_step = int(trainer.global_step)
        self.tracker.resumed(self._last_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._step_start is None:
            self._step_start = time.time()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if self._step_start is not None and step > self._last_step:
            self.tracker.record_step(step, self._step_start, time.time())
            self._last_step = step
            self._step_start = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.flush(5.0)
