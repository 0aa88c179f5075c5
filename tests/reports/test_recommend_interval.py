from __future__ import annotations

import pytest

from services.analysis.advice import checkpoint_advice
from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.reports.recommend import ReportInput, recommend
from services.simulate import SimConfig, simulate


def test_report_recommends_the_daly_interval_when_it_pays() -> None:
    result = simulate(SimConfig(run_id="often", ranks=8, hours=2, mtbf_s=1800, checkpoint_every=20,
                                checkpoint_s=30, seed=3))
    ledger = build_ledger(run_data_from_events("often", result.events))
    advice = checkpoint_advice(ledger)
    rows = {r.name: r for r in advice.intervals}
    (rec,) = [r for r in recommend(ReportInput(ledger=ledger)) if r.code == "checkpoint_interval"]
    gain = rows["daly"].expected_goodput - rows["current"].expected_goodput
    assert gain > 0.01
    assert rec.gpu_seconds == pytest.approx(gain * ledger.allocated_gpu_seconds)
    assert "instead of every" in rec.detail


def test_no_interval_advice_without_failures() -> None:
    result = simulate(SimConfig(run_id="calm", ranks=8, hours=0.5, mtbf_s=None, seed=1))
    ledger = build_ledger(run_data_from_events("calm", result.events))
    assert not [r for r in recommend(ReportInput(ledger=ledger)) if r.code == "checkpoint_interval"]
