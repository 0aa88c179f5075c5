"""Recommendations from ledgers: each rule fires on its evidence and stays quiet without it."""

from __future__ import annotations

from typing import Any

import pytest

from services.analysis.ledger_types import CheckpointSummary, Ledger
from services.analysis.view_types import Heatmap, RankCompute, RankRow, RunViews
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


def views_of(hosts: dict[int, str | None], straggler_ranks: list[int]) -> RunViews:
    """Views that hold only what the straggler advice reads: the rank rows (rank, host) and the flagged ranks."""
    rows = [RankRow(rank=rank, host=host, steps=10, median_compute_s=1.0, p90_compute_s=1.0, mean_compute_s=1.0,
                    straggler_gpu_seconds=0.0, is_straggler=rank in straggler_ranks) for rank, host in hosts.items()]
    heatmap = Heatmap(rank_labels=[], ranks_per_row=1, step_centers=[], step_edges=[], z=[])
    only: dict[str, Any] = {"ranks": RankCompute(rows=rows, rows_total=len(rows), rows_truncated=False,
                                                    median_compute_s=1.0, heatmap=heatmap,
                                                    compute_source="step duration", straggler_ranks=straggler_ranks)}
    return RunViews.model_construct(**only)  # the rest of the views: not read by the advice


def test_a_concentrated_straggler_is_named_with_its_host() -> None:
    lg = ledger(straggler=5_000).model_copy(update={"straggler_gpu_seconds_by_rank": {7: 4_000.0, 1: 1_000.0}})
    views = views_of({7: "gpu-node-12", 1: "gpu-node-01"}, [7])
    (rec,) = recommend(ReportInput(ledger=lg, views=views))
    assert rec.code == "straggler_rank"
    assert "rank 7 on host gpu-node-12" in rec.title and "80%" in rec.detail


def test_a_rank_carrying_most_of_the_cost_is_not_named_unless_it_was_flagged() -> None:
    lg = ledger(straggler=5_000).model_copy(  # two healthy ranks: 59% / 41%
        update={"straggler_gpu_seconds_by_rank": {0: 2_950.0, 1: 2_050.0}})
    views = views_of({0: None, 1: None}, [])
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
