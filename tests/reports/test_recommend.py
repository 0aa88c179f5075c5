"""Recommendations from ledgers: each rule fires on its evidence and stays quiet without it."""

from __future__ import annotations

import pytest

from services.analysis.ledger_types import CheckpointSummary, Ledger
from services.reports import DEFAULT_PROVIDERS, Recommendation, ReportInput, recommend
from tests.reports import ledgers

CHECKPOINTS = CheckpointSummary(count=0, ok=0, failed=0, torn=0, median_blocking_seconds=30.0,
                                median_interval_seconds=300.0, median_interval_steps=100.0, last_ok_step=None)


def ledger(allocated: float = 100_000.0, **waste: float) -> Ledger:
    return ledgers.ledger(allocated, checkpoints=CHECKPOINTS, restarts=2, failures=2, **waste)


@pytest.mark.parametrize(("waste", "codes"), [
    ({}, []),
    ({"checkpoint": 8_000}, ["checkpoint_blocking"]),
    ({"checkpoint": 4_000}, []),  # under 5 %
    ({"hang": 3_000}, ["hang_detection"]),
    ({"rework": 9_000, "checkpoint": 1_000}, ["checkpoint_more_often"]),
    ({"rework": 9_000, "checkpoint": 6_000}, ["checkpoint_blocking"]),  # checkpoints are not cheap
    ({"startup": 6_000}, ["startup_time"]),
    ({"idle": 20_000, "hang": 5_000}, ["idle", "hang_detection"]),  # largest at stake first
])
def test_each_rule_fires_on_its_share_of_the_allocation(waste: dict[str, float], codes: list[str]) -> None:
    assert [r.code for r in recommend(ReportInput(ledger=ledger(**waste)))] == codes


def test_a_concentrated_straggler_is_named_with_its_host() -> None:
    lg = ledger(straggler=5_000).model_copy(update={"straggler_gpu_seconds_by_rank": {7: 4_000.0, 1: 1_000.0}})
    views = {"ranks": {"rows": [{"rank": 7, "host": "gpu-node-12"}, {"rank": 1, "host": "gpu-node-01"}],
                       "straggler_ranks": [7]}}
    (rec,) = recommend(ReportInput(ledger=lg, views=views))
    assert rec.code == "straggler_rank"
    assert "rank 7 on host gpu-node-12" in rec.title and "80%" in rec.detail


def test_a_rank_carrying_most_of_the_cost_is_not_named_unless_it_was_flagged() -> None:
    lg = ledger(straggler=5_000).model_copy(  # two healthy ranks: 59% / 41%
        update={"straggler_gpu_seconds_by_rank": {0: 2_950.0, 1: 2_050.0}})
    views = {"ranks": {"rows": [{"rank": 0}, {"rank": 1}], "straggler_ranks": []}}
    (rec,) = recommend(ReportInput(ledger=lg, views=views))
    assert rec.code == "straggler_spread" and "no rank was consistently slower" in rec.detail
    (rec,) = recommend(ReportInput(ledger=lg))
    assert rec.code == "straggler_spread" and "/stragglers" in rec.detail


def test_straggling_spread_over_ranks_gets_general_advice() -> None:
    lg = ledger(straggler=5_000).model_copy(update={"straggler_gpu_seconds_by_rank": dict.fromkeys(range(8), 625.0)})
    assert [r.code for r in recommend(ReportInput(ledger=lg))] == ["straggler_spread"]


def test_no_allocation_gives_no_advice() -> None:
    assert recommend(ReportInput(ledger=ledger(allocated=0.0))) == []


def test_a_new_provider_is_one_more_function_in_the_list() -> None:
    def interval_advisor(inp: ReportInput) -> list[Recommendation]:
        return [Recommendation(code="checkpoint_interval", title="t", detail="d", gpu_seconds=1e9)]

    recs = recommend(ReportInput(ledger=ledger(hang=3_000)), (*DEFAULT_PROVIDERS, interval_advisor))
    assert [r.code for r in recs] == ["checkpoint_interval", "hang_detection"]
