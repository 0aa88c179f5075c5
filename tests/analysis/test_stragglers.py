from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from services.analysis.ledger import build_ledger
from services.analysis.medians import median_of_sorted_rows, others_median, others_median_by_step
from services.analysis.run_data import run_data_from_events
from services.analysis.straggler_report import build_straggler_report
from services.analysis.stragglers import (
    FlagRule,
    binomial_tail_half,
    culprits,
    flagged_ranks,
    projected_step_factor,
    step_straggle,
)
from services.schemas.ledger import Ledger
from services.schemas.stragglers import StragglerReport
from services.simulate import SimConfig, simulate


def _report(**kwargs: object) -> tuple[StragglerReport, Ledger]:
    result = simulate(SimConfig(**kwargs))  # type: ignore[arg-type]
    data = run_data_from_events(result.config.run_id, result.events)
    ledger = build_ledger(data)
    return build_straggler_report(data, ledger), ledger


def test_a_persistent_straggler_is_named_with_its_host_and_cost() -> None:
    report, ledger = _report(run_id="slow5", ranks=16, hours=0.1, mtbf_s=None, straggler_rank=5,
                             straggler_factor=1.5, jitter=0.02, seed=1)
    top = report.ranks[0]
    assert top.rank == 5 and top.host == "node000"
    assert top.pattern == "persistent" and top.flagged
    assert top.straggler_gpu_seconds == pytest.approx(ledger.straggler_gpu_seconds_by_rank[5], rel=1e-9)
    assert top.slowest_steps == top.steps == ledger.steps.kept
    assert sum(r.straggler_gpu_seconds for r in report.ranks) == pytest.approx(
        ledger.waste_gpu_seconds.straggler, rel=1e-9)
    assert [h.host for h in report.hosts if h.flagged] == ["node000"]
    assert not any(r.flagged for r in report.ranks[1:])


def test_a_sporadic_straggler_is_called_sporadic() -> None:
    report, _ = _report(run_id="spor", ranks=8, hours=0.1, mtbf_s=None, straggler_rank=2, straggler_factor=2.0,
                        straggler_prob=0.2, seed=2)
    top = report.ranks[0]
    assert top.rank == 2 and top.pattern == "sporadic"
    assert top.slow_step_share == pytest.approx(0.2, abs=0.05)
    assert report.slowdown == pytest.approx(2.0, rel=0.01)


def test_no_straggler_no_flags() -> None:
    report, _ = _report(run_id="even", ranks=8, hours=0.05, mtbf_s=None, seed=3)
    assert report.straggler_gpu_seconds == 0
    assert not any(r.flagged for r in report.ranks + report.hosts)


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
    p, slowdown = report.slow_step_probability, report.slowdown
    assert p is not None and slowdown is not None
    assert p == pytest.approx(0.1 / 8, rel=0.3)  # one of 8 ranks slow in ~10% of steps
    by_scale = {row.ranks: row for row in report.projection}
    assert by_scale[4096].step_time_factor == pytest.approx(projected_step_factor(p, 4096, slowdown))
    assert by_scale[4096].step_time_factor > by_scale[8].step_time_factor


# -- the flag rule on synthetic compute matrices (docs/ledger.md, "Straggler") -----------------------------


def _compute_matrix(ranks: int, steps: int, *, seed: int, noise: float = 0.02,
                    slow: Callable[[int, int], float] = lambda rank, step: 1.0) -> pd.DataFrame:
    """(attempt, rank, step, compute): 1 s of compute per step, Gaussian noise, times slow(rank, step)."""
    rng = np.random.default_rng(seed)
    rows = [(0, r, s, float(slow(r, s) * (1.0 + noise * rng.standard_normal())))
            for s in range(steps) for r in range(ranks)]
    return pd.DataFrame(rows, columns=["attempt", "rank", "step", "compute"])


def _flags(compute: pd.DataFrame) -> list[int]:
    straggle = step_straggle(None, compute, {0: int(compute["rank"].nunique())})  # type: ignore[arg-type]
    found = culprits(compute, straggle, {}, straggler_gpu_seconds=float(straggle["cost"].sum()))
    return sorted(r["rank"] for r in found["ranks"] if r["flagged"])


@pytest.mark.parametrize(("ranks", "steps", "slow", "expected"), [
    pytest.param(2, 200, lambda r, s: 1.0, [], id="2 ranks, healthy noise: none"),
    pytest.param(2, 200, lambda r, s: 1.10 if r == 1 and s % 10 else 1.0, [1],
                 id="2 ranks, one 10% slower in 90% of steps: that rank"),
    pytest.param(8, 200, lambda r, s: 1.10 if r == 5 else 1.0, [5], id="8 ranks, one slow: it"),
    pytest.param(4, 200, lambda r, s: 1.5 if r == s % 4 else 1.0, [], id="alternating slowest: none"),
    pytest.param(2, 10, lambda r, s: 1.2 if r == 0 else 1.0, [], id="too few steps to tell: none"),
    pytest.param(2, 200, lambda r, s: 1.01 if r == 0 else 1.0, [], id="consistently 1% slower, immaterial: none"),
    pytest.param(8, 200, lambda r, s: 1.3 if r == 2 and s % 3 == 0 else 1.0, [],
                 id="sporadic, 30% slower in a third of the steps: none"),
    pytest.param(8, 200, lambda r, s: 1.3 if r in (2, 6) else 1.0, [2, 6], id="two slow ranks of 8: both"),
])
def test_a_rank_is_flagged_only_when_it_is_consistently_and_materially_slower(
    ranks: int, steps: int, slow: Callable[[int, int], float], expected: list[int]
) -> None:
    assert _flags(_compute_matrix(ranks, steps, seed=11, slow=slow)) == expected


@pytest.mark.parametrize("ranks", [2, 3, 8, 64])
def test_healthy_runs_of_any_size_flag_no_rank_over_many_seeds(ranks: int) -> None:
    assert [seed for seed in range(20) if _flags(_compute_matrix(ranks, 50, seed=seed, noise=0.05))] == []


def test_a_host_is_flagged_when_one_of_its_ranks_is() -> None:
    compute = _compute_matrix(4, 100, seed=3, slow=lambda r, s: 1.2 if r == 3 else 1.0)
    straggle = step_straggle(None, compute, {0: 4})  # type: ignore[arg-type]
    found = culprits(compute, straggle, {0: "a", 1: "a", 2: "b", 3: "b"},
                     straggler_gpu_seconds=float(straggle["cost"].sum()))
    assert {h["host"]: (h["flagged"], h["flagged_ranks"]) for h in found["hosts"]} == {
        "a": (False, []), "b": (True, [3])}
    (top,) = [r for r in found["ranks"] if r["flagged"]]
    assert top["slower_steps"] == top["compared_steps"] == 100 and top["chance_p"] == pytest.approx(0.5**100, rel=1e-9)
    assert top["median_excess_share"] == pytest.approx(0.2, abs=0.02)


def test_others_median_is_the_median_of_the_rest_of_each_group() -> None:
    rng = np.random.default_rng(5)
    group = rng.integers(0, 40, 400)
    values = rng.normal(size=400).round(1)  # ties on purpose
    got = others_median(group, values)
    for i in range(len(values)):
        rest = np.delete(values, i)[np.delete(group, i) == group[i]]
        assert (np.isnan(got[i]) if rest.size == 0 else got[i] == np.median(rest)), i


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5, 8, 9])
def test_the_fast_path_for_full_step_matrices_agrees_with_the_general_one(ranks: int) -> None:
    matrix = np.random.default_rng(ranks).normal(size=(200, ranks)).round(1)  # ties on purpose
    general = others_median(np.repeat(np.arange(200), ranks), matrix.reshape(-1)).reshape(200, ranks)
    np.testing.assert_array_equal(others_median_by_step(matrix), general)
    frame = _compute_matrix(ranks, 60, seed=ranks, slow=lambda r, s: 1.2 if r == 0 else 1.0)
    by_rank = frame.sort_values(["rank", "attempt", "step"], ignore_index=True)  # the fast path's shape
    assert flagged_ranks(by_rank) == flagged_ranks(frame.sample(frac=1.0, random_state=1))


@pytest.mark.parametrize(("k", "n"), [(0, 5), (1, 1), (3, 5), (2, 5), (16, 20), (10, 20), (750, 1000),
                                      (480, 1000), (5_000, 10_000), (7_500, 10_000), (21, 20)])
def test_the_binomial_tail_matches_exact_integer_arithmetic(k: int, n: int) -> None:
    exact = sum(math.comb(n, i) for i in range(max(k, 0), n + 1)) / 2**n
    assert binomial_tail_half(k, n) == pytest.approx(exact, rel=1e-9, abs=1e-300)


def test_a_flag_rule_with_a_share_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"FlagRule\.consistent_share must be between 0 and 1, got 1\.5"):
        FlagRule(consistent_share=1.5)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 9])
def test_the_median_of_sorted_rows_is_numpys_median(n: int) -> None:
    rng = np.random.default_rng(n)
    matrix = np.round(rng.normal(1.0, 0.1, size=(50, n)), 3)  # ties included
    np.testing.assert_array_equal(median_of_sorted_rows(np.sort(matrix, axis=1)), np.median(matrix, axis=1))
