"""Collective timing for the framework callbacks: ``tracker.time_collectives`` on the trainer's DDP model.

On NCCL that is NCCL's own timers (no Python on the gradient path); on gloo, the tracker's DDP comm hook. With it
each collective is a `collective` row, so a step's compute (its time minus its collectives) is
known per rank and a slow rank is charged and named (docs/ledger.md, "Straggler") under a framework's trainer as
under a plain torchrun loop. torch is imported only when a model is given.
"""

from __future__ import annotations

import logging
from typing import Any

from ingest_client.worker.tracker import Tracker

logger = logging.getLogger("ingest_client")
_MARK = "_goodput_comm_hook"


def time_collectives(tracker: Tracker, model: Any) -> bool:
    """``tracker.time_collectives`` for ``model`` when it is a ``DistributedDataParallel`` (once per model); True
    when the model's collectives are timed by the tracker. A model with a comm hook of its own keeps it (DDP takes
    one): said once, and its steps are then not charged for stragglers."""
    if model is None or not tracker.records_in_this_process:
        return False
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return False
    if getattr(model, _MARK, False):
        return True
    try:
        if tracker.time_collectives(model, process_group=getattr(model, "process_group", None)) == "off":
            return False
    except RuntimeError as exc:  # "register_comm_hook or register_builtin_comm_hook can only be called once"
        logger.warning("goodput: the DDP model has a communication hook of its own (%s); collectives are not timed, "
                       "so stragglers are not charged for this run", exc)
        return False
    setattr(model, _MARK, True)
    return True
