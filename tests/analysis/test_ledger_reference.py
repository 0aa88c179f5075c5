from __future__ import annotations

import random

import pytest

from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from tests.analysis.scenarios import reference_s1
from tests.ledger_checks import assert_partition


def test_reference_scenario_matches_the_hand_computed_ledger() -> None:
    ledger = build_ledger(run_data_from_events("s1", reference_s1()))
    assert ledger.allocated_gpu_seconds == pytest.approx(4160)
    assert ledger.productive_gpu_seconds == pytest.approx(2400)
    assert ledger.waste_gpu_seconds == pytest.approx(
        {"startup": 480, "checkpoint": 160, "rework": 400, "hang": 480, "straggler": 0, "idle": 240})
    assert ledger.queue_seconds == pytest.approx(100)
    assert ledger.goodput == pytest.approx(2400 / 4160)
    assert ledger.restarts == 1
    assert ledger.failures == 1
    assert ledger.mtbf_seconds == pytest.approx(520)
    assert ledger.steps.model_dump() == {"furthest": 300, "kept": 300, "reworked": 50, "computed": 350}
    assert ledger.checkpoints.count == 2
    assert ledger.checkpoints.median_blocking_seconds == pytest.approx(10)
    assert ledger.at_risk_gpu_seconds == 0
    assert [a.resume_step for a in ledger.attempts] == [0, 100]
    assert_partition(ledger)


def test_reference_scenario_ledger_does_not_depend_on_event_order() -> None:
    events = reference_s1()
    expected = build_ledger(run_data_from_events("s1", events))
    for seed in range(3):
        shuffled = events[:]
        random.Random(seed).shuffle(shuffled)
        assert build_ledger(run_data_from_events("s1", shuffled)) == expected
