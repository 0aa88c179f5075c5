"""Invariants every ledger must satisfy; every ledger test calls these."""

from __future__ import annotations

from typing import Any

import pytest

WASTE_KEYS = {"startup", "checkpoint", "rework", "hang", "straggler", "idle"}


def assert_partition(ledger: Any) -> None:
    """productive + sum(waste) == allocated within 1e-9 relative; no negative category."""
    data = ledger if isinstance(ledger, dict) else ledger.to_dict()
    waste = data["waste_gpu_seconds"]
    assert set(waste) == WASTE_KEYS
    assert all(v >= -1e-9 * max(data["allocated_gpu_seconds"], 1.0) for v in waste.values()), waste
    assert data["productive_gpu_seconds"] >= -1e-9
    total = data["productive_gpu_seconds"] + sum(waste.values())
    assert total == pytest.approx(data["allocated_gpu_seconds"], rel=1e-9, abs=1e-9)
