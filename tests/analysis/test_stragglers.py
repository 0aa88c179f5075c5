from __future__ import annotations

import random

import pytest

from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.straggler_report import build_straggler_report
from services.analysis.stragglers import projected_step_factor
from services.simulate import SimConfig, simulate


def _report(**kwargs: object) -> tuple[dict, dict]:  # type: ignore[type-arg]
    result = simulate(SimConfig(**kwargs))  # type: ignore[arg-type]
    data = run_data_from_events(result.config.run_id, result.events)
    ledger = build_ledger(data).to_dict()
    return build_straggler_report(data, ledger), ledger


def test_a_persistent_straggler_is_named_with_its_host_and_cost() -> None:
    report, ledger = _report(run_id="slow5", ranks=16, hours=0.1, mtbf_s=None, straggler_rank=5,
                             straggler_factor=1.5, jitter=0.02, seed=1)
    top = report["ranks"][0]
    assert top["rank"] == 5 and top["host"] == "node000"
    assert top["pattern"] == "persistent" and top["flagged"]
    assert top["straggler_gpu_seconds"] == pytest.approx(ledger["straggler_gpu_seconds_by_rank"]["5"], rel=1e-9)
    assert top["slowest_steps"] == top["steps"] == ledger["steps"]["kept"]
    assert sum(r["straggler_gpu_seconds"] for r in report["ranks"]) == pytest.approx(
        ledger["waste_gpu_seconds"]["straggler"], rel=1e-9)
    assert [h["host"] for h in report["hosts"] if h["flagged"]] == ["node000"]
    assert not any(r["flagged"] for r in report["ranks"][1:])


def test_a_sporadic_straggler_is_called_sporadic() -> None:
    report, _ = _report(run_id="spor", ranks=8, hours=0.1, mtbf_s=None, straggler_rank=2, straggler_factor=2.0,
                        straggler_prob=0.2, seed=2)
    top = report["ranks"][0]
    assert top["rank"] == 2 and top["pattern"] == "sporadic"
    assert top["slow_step_share"] == pytest.approx(0.2, abs=0.05)
    assert report["slowdown"] == pytest.approx(2.0, rel=0.01)


def test_no_straggler_no_flags() -> None:
    report, _ = _report(run_id="even", ranks=8, hours=0.05, mtbf_s=None, seed=3)
    assert report["straggler_gpu_seconds"] == 0
    assert not any(r["flagged"] for r in report["ranks"] + report["hosts"])


@pytest.mark.parametrize(("p", "n"), [(0.001, 64), (0.01, 8), (0.01, 256), (0.05, 32)])
def test_the_scale_projection_matches_a_simulation(p: float, n: int) -> None:
    """Each of n ranks is slow (2x) with probability p per step; a synchronous step takes its slowest rank."""
    rng = random.Random(7)
    steps = 20_000
    total = sum(2.0 if any(rng.random() < p for _ in range(n)) else 1.0 for _ in range(steps))
    simulated = total / steps
    expected = projected_step_factor(p, n)
    assert expected == pytest.approx(1 + (1 - (1 - p) ** n))
    # binomial standard error of the slow-step share, 4 sigma
    q = 1 - (1 - p) ** n
    assert simulated == pytest.approx(expected, abs=4 * (q * (1 - q) / steps) ** 0.5 + 1e-9)


def test_report_projects_the_measured_probability_to_other_scales() -> None:
    report, _ = _report(run_id="proj", ranks=8, hours=0.1, mtbf_s=None, straggler_rank=1, straggler_factor=2.0,
                        straggler_prob=0.1, seed=4)
    p = report["slow_step_probability"]
    assert p == pytest.approx(0.1 / 8, rel=0.3)  # one of 8 ranks slow in ~10% of steps
    by_scale = {row["ranks"]: row for row in report["projection"]}
    assert by_scale[4096]["step_time_factor"] == pytest.approx(projected_step_factor(p, 4096, report["slowdown"]))
    assert by_scale[4096]["step_time_factor"] > by_scale[8]["step_time_factor"]
