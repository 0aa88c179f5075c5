from __future__ import annotations

import math

import pytest

from services.analysis.advice import AdviceInput, build_advice, failure_rate, restart_seconds
from services.analysis.interval import (
    daly_interval,
    first_order_goodput,
    first_order_waste,
    simulate_interval,
    young_interval,
)
from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.reports.advice import formats_for
from services.schemas.ledger import Ledger
from services.simulate import SimConfig, simulate


def test_young_and_daly_formulas() -> None:
    assert young_interval(60, 21600) == pytest.approx(math.sqrt(2 * 60 * 21600))
    x = 60 / (2 * 21600)
    assert daly_interval(60, 21600) == pytest.approx(math.sqrt(2 * 60 * 21600) * (1 + math.sqrt(x) / 3 + x / 9) - 60)
    assert daly_interval(5000, 2000) == 2000  # delta >= 2M: checkpoint once per MTBF
    assert first_order_waste(1000, 60, 300, 21600) == pytest.approx(60 / 1000 + (500 + 300) / 21600)
    assert first_order_goodput(1000, 60, 300, 21600) == pytest.approx(1 / (1 + 60 / 1000 + 800 / 21600))


def test_the_model_has_its_optimum_at_youngs_interval() -> None:
    delta, restart, mtbf = 60.0, 300.0, 21600.0
    best = young_interval(delta, mtbf)
    for other in (best * 0.5, best * 0.8, best * 1.25, best * 2):
        assert first_order_goodput(best, delta, restart, mtbf) > first_order_goodput(other, delta, restart, mtbf)


def test_simulation_and_model_agree_near_the_optimum_when_costs_are_small() -> None:
    delta, restart, mtbf = 60.0, 300.0, 6 * 3600.0
    for interval in (young_interval(delta, mtbf), daly_interval(delta, mtbf)):
        sim = simulate_interval(interval=interval, delta=delta, restart=restart, mtbf=mtbf, work=100 * 3600,
                                replicates=300, seed=1)
        model = first_order_goodput(interval, delta, restart, mtbf)
        assert sim.goodput == pytest.approx(model, abs=0.01)
        assert sim.goodput_stderr < 0.002
        # the simulation's own books balance: useful + checkpoint + rework + restart = wall
        fractions = sim.useful_fraction + sim.checkpoint_fraction + sim.rework_fraction + sim.restart_fraction
        assert fractions == pytest.approx(1.0, rel=1e-9)


def test_the_model_runs_high_when_checkpoint_and_restart_are_not_small_next_to_the_mtbf() -> None:
    delta, restart, mtbf = 1800.0, 1800.0, 3 * 3600.0
    interval = daly_interval(delta, mtbf)
    sim = simulate_interval(interval=interval, delta=delta, restart=restart, mtbf=mtbf, work=100 * 3600,
                            replicates=200, seed=2)
    model = first_order_goodput(interval, delta, restart, mtbf)
    assert model - sim.goodput > 0.05
    assert model - sim.goodput > 10 * sim.goodput_stderr


def test_simulation_without_failures_only_pays_for_checkpoints() -> None:
    sim = simulate_interval(interval=100, delta=10, restart=50, mtbf=1e12, work=1000, replicates=5)
    assert sim.failures_per_run == 0
    assert sim.goodput == pytest.approx(1000 / (1000 + 9 * 10))  # the last chunk writes no checkpoint


def _ledger(**kwargs: object) -> Ledger:
    result = simulate(SimConfig(**kwargs))  # type: ignore[arg-type]
    return build_ledger(run_data_from_events(result.config.run_id, result.events))


def test_advice_uses_the_runs_measured_costs_and_failure_rate() -> None:
    ledger = _ledger(run_id="adv", ranks=16, hours=2, step_s=1.0, mtbf_s=1800, checkpoint_every=100,
                     checkpoint_s=30, startup_s=120, detect_s=60, relaunch_s=5, comm_s=0.0, seed=3)
    advice = build_advice(AdviceInput(ledger=ledger), formats_for(ledger))
    (rec,) = [r for r in advice.recommendations if r.code == "checkpoint_interval"]
    evidence = {e.key: e.value for e in rec.evidence}
    assert evidence["median_checkpoint_seconds"] == pytest.approx(30)
    assert evidence["mtbf_seconds"] == pytest.approx(ledger.mtbf_seconds)
    assert rec.confidence.failure_rate_source == "run" and rec.confidence.failures == ledger.failures
    assert evidence["compute_interval_seconds"] == pytest.approx(100, rel=1e-6)  # 100 steps of 1 s
    # restart cost per failure: the hang (detection) plus the startup of the attempts that followed a failure
    attempts = ledger.attempts
    lost = sum(a.gpu_seconds.get("hang", 0) for a in attempts)
    lost += sum(a.gpu_seconds.get("startup", 0) for a in attempts[1:])
    restart = restart_seconds(ledger)
    assert restart is not None and restart == pytest.approx(lost / 16 / ledger.failures)
    assert 60 + 5 + 120 - 60 < restart < 60 + 5 + 120 + 5  # torn writes count as checkpoint
    assert ledger.mtbf_seconds is not None
    assert evidence["young_seconds"] == pytest.approx(math.sqrt(2 * 30 * ledger.mtbf_seconds))
    assert rec.gain.bound == "expected" and rec.gain.gpu_seconds is not None and rec.gain.gpu_seconds > 0
    assert "instead of every 1 min 40 s of compute (about 100 steps)" in rec.wording


def test_advice_takes_the_failure_rate_from_similar_runs_when_the_run_rarely_failed() -> None:
    quiet = _ledger(run_id="quiet", ranks=16, hours=0.5, mtbf_s=None, seed=1)
    fleet = [_ledger(run_id=f"peer{i}", ranks=size, hours=1, mtbf_s=600, seed=i)
             for i, size in enumerate((8, 16, 32, 256))]
    rate = failure_rate(quiet, fleet)
    similar = [r for r in fleet if 8 <= max(a.world_size for a in r.attempts) <= 32]
    expected = sum(r.allocated_wall_seconds for r in similar) + quiet.allocated_wall_seconds
    expected /= sum(r.failures for r in similar)
    assert rate is not None and rate.source == "project" and rate.runs == 4 and rate.world_range == (8, 32)
    assert rate.mtbf_seconds == pytest.approx(expected)
    assert failure_rate(quiet, []) is None  # alone, it cannot say
