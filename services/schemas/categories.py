"""Waste categories. The string values are stored and served: never rename them."""

from __future__ import annotations

from enum import Enum


class WasteCategory(str, Enum):
    STARTUP = "startup"
    CHECKPOINT = "checkpoint"
    REWORK = "rework"
    HANG = "hang"
    STRAGGLER = "straggler"
    IDLE = "idle"


WASTE_KEYS: tuple[str, ...] = tuple(c.value for c in WasteCategory)
PRODUCTIVE = "productive"  # the rest of the partition of allocated time: kept steps, net of stragglers
EVAL = "eval"  # validation / evaluation between steps: neither productive nor waste (docs/ledger.md)


class RunStatus(str, Enum):
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
