"""transformers callback: ``Trainer(..., callbacks=[GoodputCallback()])``.

``on_step_begin``/``on_step_end`` bracket one optimizer step (with gradient accumulation,
``on_step_begin`` fires per micro-batch; the first one after a step starts the timing).
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

import ingest_client
from ingest_client.tracker import Tracker


class GoodputCallback(TrainerCallback):  # type: ignore[misc]  # TrainerCallback is an optional import
    def __init__(self, tracker: Tracker | None = None, **init_kwargs: Any) -> None:
        self._tracker = tracker
        self._init_kwargs = init_kwargs
        self._step_start: float | None = None

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = ingest_client.get_tracker() or ingest_client.init(**self._init_kwargs)
        return self._tracker

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.resumed(int(state.global_step))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step_start is None:
            self._step_start = time.time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step_start is not None:
            self.tracker.record_step(int(state.global_step), self._step_start, time.time())
            self._step_start = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.flush(5.0)
