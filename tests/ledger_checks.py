"""Invariants every ledger must satisfy; every ledger test calls these."""

from __future__ import annotations

from typing import Any

import pytest

from services.schemas.ledger import Ledger

WASTE_KEYS = {"startup", "checkpoint", "rework", "hang", "straggler", "idle"}


def assert_partition(ledger: Any) -> None:
    """productive + sum(waste) + eval == allocated within 1e-9 relative; no negative category."""
    data = ledger if isinstance(ledger, dict) else ledger.model_dump(mode="json")
    waste = data["waste_gpu_seconds"]
    assert set(waste) == WASTE_KEYS
    assert all(v >= -1e-9 * max(data["allocated_gpu_seconds"], 1.0) for v in waste.values()), waste
    assert data["productive_gpu_seconds"] >= -1e-9
    evaluation = data.get("eval_gpu_seconds", 0.0)
    assert evaluation >= -1e-9 * max(data["allocated_gpu_seconds"], 1.0), evaluation
    total = data["productive_gpu_seconds"] + sum(waste.values()) + evaluation
    assert total == pytest.approx(data["allocated_gpu_seconds"], rel=1e-9, abs=1e-9)


def ledger_of_events(events: list[dict[str, Any]], run_id: str = "s1") -> Ledger:
    """The ledger of hand-built events (tests/analysis/scenarios.py), checked for the partition."""
    from services.analysis.ledger import build_ledger
    from services.analysis.run_data import run_data_from_events

    ledger = build_ledger(run_data_from_events(run_id, events))
    assert_partition(ledger)
    return ledger


def assert_ledger(ledger: Ledger, productive: float, *, eval: float = 0.0, **waste: float) -> None:
    """Productive GPU-seconds, eval and every waste category; the ones not named are 0."""
    want = {key: 0.0 for key in WASTE_KEYS} | waste
    assert ledger.productive_gpu_seconds == pytest.approx(productive)
    assert ledger.eval_gpu_seconds == pytest.approx(eval)
    assert dict(ledger.waste_gpu_seconds.items()) == pytest.approx(want)
