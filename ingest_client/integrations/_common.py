"""What the framework callbacks share: who this process is, when the tracker starts, opt-in state digests.

Digests (``digest_every_n_steps=N``, :class:`StateDigests`) are taken every N steps, at every checkpoint (so the
state a later resume loads has a digest of its writer to be compared with: it is recorded before the checkpoint
span, whose durable start puts it on disk), and of the state a resume loaded (``tracker.resumed(..., digest=)``),
always by the same function over the same objects.

No framework is imported here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import ingest_client
from ingest_client.worker.generation import LAUNCH_ID_ENV, is_torchrun_worker
from ingest_client.worker.tracker import Tracker


def name_this_launch() -> None:
    """Give a launch that no launcher named (``python train.py``) an id its spawned ranks inherit.

    Called when the callback is built, in the process that later spawns the other ranks (Lightning's own launcher
    re-runs the script with this environment): all ranks of the launch then count as one launch, and a second
    ``python train.py`` of the run id as the next (:mod:`ingest_client.worker.generation`). A torchrun worker is named
    by its agent instead, so it never sets one (each rank would get its own).
    """
    if not os.environ.get(LAUNCH_ID_ENV, "").strip() and not is_torchrun_worker(os.environ):
        os.environ[LAUNCH_ID_ENV] = f"script{uuid.uuid4().hex[:16]}"


def start_tracker(tracker: Tracker | None, init_kwargs: dict[str, Any], *, rank: int, world_size: int,
                  local_rank: int) -> Tracker:
    """The running tracker (or ``tracker``), else ``init()`` with the trainer's rank where the environment has none.

    Lightning's own launcher sets ``LOCAL_RANK`` and ``WORLD_SIZE`` but no ``RANK``; without it every process
    would report rank 0. The trainer's values are written with the names torchrun uses, only where unset.
    """
    if tracker is not None:
        return tracker
    running = ingest_client.get_tracker()
    if running is not None and running.enabled:
        return running
    if world_size > 1 and "RANK" not in os.environ:
        os.environ["RANK"] = str(rank)
        os.environ.setdefault("WORLD_SIZE", str(world_size))
        os.environ.setdefault("LOCAL_RANK", str(local_rank))
    return ingest_client.init(**init_kwargs)


def check_digest_every(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"digest_every_n_steps must be a positive integer or None, got {value!r}")
    return value


def digest_due(step: int, every: int | None) -> bool:
    return every is not None and step > 0 and step % every == 0


def state_of(*objects: Any) -> str:
    """``state_digest`` of modules and optimizers through their ``state_dict()`` (what a checkpoint saves)."""
    return ingest_client.state_digest(*(o.state_dict() if hasattr(o, "state_dict") else o for o in objects))


class StateDigests:
    """Opt-in digests of what a checkpoint saves: ``objects()`` (modules, optimizers: their ``state_dict()``) and
    the step counter, every ``every`` steps, at every checkpoint, and at a resume's load."""

    def __init__(self, every: object) -> None:
        self.every = check_digest_every(every)
        self._last_step: int | None = None  # the step last digested: a checkpoint there needs no second one

    def _digest(self, step: int, objects: Sequence[Any]) -> str:
        return state_of(*objects, {"step": step})

    def after_step(self, tracker: Tracker, step: int, objects: Callable[[], Sequence[Any]]) -> None:
        if digest_due(step, self.every):
            tracker.digest(step, self._digest(step, objects()))
            self._last_step = step

    def at_checkpoint(self, tracker: Tracker, step: int, objects: Callable[[], Sequence[Any]]) -> None:
        """Before the checkpoint span of ``step`` opens (its durable start then writes the digest to disk)."""
        if self.every is not None and self._last_step != step and tracker.enabled:
            tracker.digest(step, self._digest(step, objects()))
            self._last_step = step

    def at_load(self, step: int, objects: Callable[[], Sequence[Any]]) -> str | None:
        """The digest of the state a resume loaded, for ``tracker.resumed(step, ..., digest=...)``."""
        return None if self.every is None else self._digest(step, objects())
